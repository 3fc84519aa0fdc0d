"""The reference pages under docs/reference/, rendered from what the product builds: every
ImpalaJob field from the generated CRD (`spec_page`), every `impalajob` command and flag from its
argument parsers (`cli_page`). `python -m impala_cli.reference docs/reference` rewrites them; a
unit test fails when the committed pages differ from these, naming that command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from impala_cli.reference.cli_page import render_cli_reference
from impala_cli.reference.markdown import REGENERATE
from impala_cli.reference.spec_page import render_spec_reference

__all__ = ["REGENERATE", "main", "pages", "render_cli_reference", "render_spec_reference"]


def pages() -> dict[str, str]:
    """File name -> content of each page, as the product builds them now."""
    return {"impalajob.md": render_spec_reference(), "cli.md": render_cli_reference()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m impala_cli.reference", description=__doc__.splitlines()[0]
    )
    parser.add_argument("directory", type=Path, help="where to write the pages (docs/reference)")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a page differs"
    )
    args = parser.parse_args(argv)
    stale = []
    for name, text in pages().items():
        path = args.directory / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(str(path))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run: {REGENERATE}", file=sys.stderr)
        return 1
    for path in stale if not args.check else []:
        print(f"wrote {path}")
    return 0
