"""The reference pages under docs/reference/ are what the product renders now: a field added to
the spec or a flag added to a command without regenerating them fails here, naming the command
that does. And the renderers say what they must: a field's type, default and bounds, a rule next
to its object, a flag's value, default and help, and nothing argparse hides."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from impala_api.crd import build_crd
from impala_cli.main import COMMANDS
from impala_cli.reference import REGENERATE, main, pages, render_cli_reference
from impala_cli.reference.markdown import cell

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "reference"


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return pages()


@pytest.mark.parametrize("name", ["impalajob.md", "cli.md"])
def test_the_committed_page_is_what_the_product_renders(
    rendered: dict[str, str], name: str
) -> None:
    path = DOCS / name
    committed = path.read_text() if path.exists() else ""
    if committed != rendered[name]:
        diff = difflib.unified_diff(
            committed.splitlines(), rendered[name].splitlines(), "committed", "rendered", n=1
        )
        pytest.fail(
            f"docs/reference/{name} is stale: run `{REGENERATE}` and commit the result\n"
            + "\n".join(list(diff)[:40])
        )


def row(page: str, path: str) -> list[str]:
    """The cells of the table row of field (or flag) `path`."""
    lines = [line for line in page.splitlines() if line.startswith(f"| `{path}`")]
    assert len(lines) == 1, f"{path}: {len(lines)} rows"
    return [c.strip() for c in lines[0].strip("|").split(" | ")]


def test_a_field_has_its_type_default_bounds_and_description(rendered: dict[str, str]) -> None:
    page = rendered["impalajob.md"]
    field, kind, default, bounds, description = row(page, "spec.learner.replicas")
    assert (field, kind, default, bounds) == ("`spec.learner.replicas`", "integer", "`1`", "1–64")
    assert description.startswith("Learners that train one set of weights")
    assert row(page, "spec.training.lr")[1:4] == ["number", "`0.0005`", "> 0.0 and ≤ 1.0"]
    assert row(page, "spec.model.activation")[3] == "one of `tanh`, `relu`"
    assert row(page, "spec.model.hidden")[1:4] == [
        "array of integer",
        "`[256, 256]`",
        "1–8 items; each: 1–65536",
    ]
    assert row(page, "spec.stop")[0] == "`spec.stop` (required)"
    # A section absent unless given: the API server fills in its fields once it is given.
    assert row(page, "spec.evaluation.intervalTimesteps")[2] == "`50000`"


def leaves(node: dict[str, Any], path: str) -> Iterator[str]:
    for name, prop in node.get("properties", {}).items():
        yield f"{path}.{name}"
        yield from leaves(prop, f"{path}.{name}")
        if isinstance(prop.get("items"), dict):
            yield from leaves(prop["items"], f"{path}.{name}[]")


def test_every_field_of_the_crd_has_a_row(rendered: dict[str, str]) -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    page = rendered["impalajob.md"]
    fields = [
        *leaves(schema["properties"]["spec"], "spec"),
        *leaves(schema["properties"]["status"], "status"),
    ]
    assert len(fields) > 150
    missing = [f for f in fields if f"| `{f}`" not in page]
    assert not missing, f"fields without a row: {missing}"


def section(page: str, heading: str) -> str:
    start = page.index(f"\n{heading}\n")
    end = page.find("\n#", start + len(heading) + 2)
    return page[start : end if end >= 0 else None]


def test_a_rule_is_stated_under_the_object_it_sits_on(rendered: dict[str, str]) -> None:
    page = rendered["impalajob.md"]
    rollouts = section(page, "### `spec.rollouts`")
    assert "- spec.rollouts.minReplicas must be <= spec.rollouts.maxReplicas" in rollouts
    # A rule on a field without a table of its own (a schedule) sits under its object, by path.
    training = section(page, "### `spec.training`")
    assert "- on `spec.training.lrSchedule`: spec.training.lrSchedule timesteps must" in training
    assert "| Phase | string | `.status.phase` | always |" in page


def test_every_command_has_a_section(rendered: dict[str, str]) -> None:
    page = rendered["cli.md"]
    for name in COMMANDS:
        assert f"\n## `impalajob {name}`\n" in page
    train = section(page, "## `impalajob train`")
    assert row(train, "-f`, `--file")[1:3] == ["`FILE` (path)", "required"]


def test_the_cli_renderer_walks_the_parser_not_its_help() -> None:
    parser = argparse.ArgumentParser(prog="tool", description="A tool.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help="run it", description="run it | now")
    run.add_argument("job", nargs="?", metavar="NAME", help="a <job name>")
    run.add_argument("--format", required=True, choices=("a", "b"), help="the format")
    run.add_argument("--count", type=int, default=3, help="how many (default %(default)s)")
    run.add_argument("--old", help=argparse.SUPPRESS)
    where = run.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace", action="append", metavar="NS", help="namespace")
    where.add_argument("-A", "--all", action="store_true", help="everywhere")
    page = render_cli_reference(parser)

    assert "| [`run`](#tool-run) | run it |" in page
    assert "\ntool run [NAME] --format {a,b} [--count COUNT] [-n NS | -A]\n" in page
    assert row(page, "NAME") == ["`NAME`", "", "", r"a \<job name>"]
    assert row(page, "--format") == ["`--format`", "one of `a`, `b`", "required", "the format"]
    assert row(page, "--count")[1:] == ["`COUNT` (integer)", "`3`", "how many (default 3)"]
    assert row(page, "-n`, `--namespace")[1] == "`NS`, repeatable"
    assert row(page, "-A`, `--all")[1:3] == ["switch", "off"]
    assert "--old" not in page
    assert "`-n` and `-A` exclude each other." in page
    assert cell("run it | now") in page


def test_the_pages_are_deterministic_and_name_no_local_path(rendered: dict[str, str]) -> None:
    assert pages() == rendered
    for text in rendered.values():
        assert str(ROOT) not in text and str(Path.home()) not in text


def test_the_command_writes_the_pages_and_checks_them(tmp_path: Path) -> None:
    assert main([str(tmp_path / "reference"), "--check"]) == 1
    assert main([str(tmp_path / "reference")]) == 0
    assert sorted(p.name for p in (tmp_path / "reference").iterdir()) == ["cli.md", "impalajob.md"]
    assert main([str(tmp_path / "reference"), "--check"]) == 0
