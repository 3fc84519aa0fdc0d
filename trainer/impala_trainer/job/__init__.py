"""Deprecated: the job contract moved to the `impala_api` package (spec, manifest, roles). These
aliases keep code written against earlier releases importing, with a DeprecationWarning."""

import warnings

warnings.warn(
    "impala_trainer.job is deprecated: import impala_api (impala_api.spec, impala_api.manifest, "
    "impala_api.roles) instead",
    DeprecationWarning,
    stacklevel=2,
)
