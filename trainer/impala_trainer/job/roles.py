"""Deprecated alias of `impala_api.roles` (the package warns once on import)."""

import sys

from impala_api import roles as _moved

sys.modules[__name__] = _moved
