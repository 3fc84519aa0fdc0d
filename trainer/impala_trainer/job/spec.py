"""Deprecated alias of `impala_api.spec` (the package warns once on import)."""

import sys

from impala_api import spec as _moved

sys.modules[__name__] = _moved
