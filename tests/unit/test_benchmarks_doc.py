"""docs/benchmarks.md's tables are rendered from bench/published.json by bench/render_doc.py: a
number edited in the doc by hand, or a record published without rendering, fails here. Run as the
script it is (tests import nothing from bench/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmarks_doc_is_rendered_from_published_json() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "render_doc.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, (
        "docs/benchmarks.md and bench/published.json disagree; run `python bench/render_doc.py` "
        f"and commit both:\n{proc.stdout}{proc.stderr}"
    )
