"""The little Markdown both reference pages are written in: table cells, code spans, anchors.

Text from docstrings and help strings goes into one-line table cells, so line breaks become
spaces and whatever Markdown would read as markup outside a code span (a pipe ends the cell,
`<job name>` is an HTML tag, `**config` starts bold text) is escaped; inside a code span only the
pipe is (GitHub's tables split cells on it even there).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

REGENERATE = "python -m impala_cli.reference docs/reference"
"""The command that rewrites both pages (each says so at its top; the drift test names it)."""

_CODE_SPAN = re.compile(r"(`[^`]*`)")
_MARKUP = re.compile(r"([*\\]|<(?=[A-Za-z/!?])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


def cell(text: str) -> str:
    """`text` (a description, a help string) as the content of one table cell."""
    text = " ".join(text.split())
    parts = _CODE_SPAN.split(text)
    return "".join(
        part if i % 2 else _MARKUP.sub(r"\\\1", part) for i, part in enumerate(parts)
    ).replace("|", "\\|")


def code(value: str) -> str:
    """`value` as a code span (a pipe in it escaped for a table cell)."""
    fence = "``" if "`" in value else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{value}{pad}{fence}".replace("|", "\\|")


def literal(value: Any) -> str:
    """A default or an example value as written in YAML/JSON, as a code span."""
    return code(value if isinstance(value, str) else json.dumps(value))


def anchor(heading: str) -> str:
    """The id GitHub (and MkDocs' default slugify) gives a heading: lower case, punctuation and
    backticks dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).strip().replace(" ", "-")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A GitHub-flavoured Markdown table; cells must already be escaped (`cell`, `code`)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
