"""Deprecated alias of `impala_api.manifest` (the package warns once on import)."""

import sys

from impala_api import manifest as _moved

sys.modules[__name__] = _moved
