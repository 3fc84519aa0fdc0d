"""allocator.keep_freed_memory: freed large blocks are reused instead of faulted in again."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Page faults of allocating, touching and freeing a 64 MiB block 5 times, in a fresh process.
_PROBE = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from impala_trainer.node.allocator import keep_freed_memory
    if sys.argv[1] == "keep":
        assert keep_freed_memory() and keep_freed_memory()  # idempotent
    np.ones(2**24, np.float32)  # first use: faults either way
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        a = np.ones(2**24, np.float32)
        del a
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_freed_blocks_are_reused_without_page_faults() -> None:
    default, kept = _faults("default"), _faults("keep")
    # glibc's default maps and unmaps each 64 MiB block, so every round faults it in again
    # (16K 4-KiB pages; fewer where numpy gets transparent huge pages); kept memory is reused.
    assert default > 50
    assert kept <= default // 10
