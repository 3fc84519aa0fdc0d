"""The test cache outside the repository (`IMPALA_TEST_CACHE`, default ~/.cache/impalajob), where
what is slow to make and safe to keep lives between sessions: the Go binaries (build.sh reads the
same variable), the image archives, the real node's containerd store, the lowest-versions
environment."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache's root (not created here)."""
    return Path(os.environ.get("IMPALA_TEST_CACHE") or Path.home() / ".cache" / "impalajob")
