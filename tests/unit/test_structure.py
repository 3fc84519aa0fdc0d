"""The tree's shape, checked: packages layered without cycles, functions short, the map true.

Read from the source with `ast` (nothing is imported), so a lazy import inside a function or a
TYPE_CHECKING import counts as a dependency as much as a top-level one: each is a place where one
room reaches into another.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"impala_api": "api", "impala_trainer": "trainer", "impala_operator": "operator",
           "impala_cli": "cli"}  # fmt: skip
LAYERS = {
    "impala_api": set(),
    "impala_trainer": {"impala_api"},
    "impala_operator": {"impala_api"},
    "impala_cli": {"impala_api", "impala_trainer", "impala_operator"},
}
"""Which of our packages each may import: the API below both sides, the CLI above them all."""
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
"""A module past this holds more than one concern: split it by role (models / acting /
model_factory; a process's parent, child and messages; a command, its transports, its output)."""


def modules() -> Iterator[tuple[str, Path]]:
    for package, folder in SOURCES.items():
        base = ROOT / folder
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def imports(name: str, path: Path) -> set[str]:
    """Every module of ours `name` imports, wherever the import statement sits."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] in SOURCES}


def unit(module: str, depth: int | None) -> str:
    """The room a module lives in: its first `depth` name parts (a package, a subpackage, or a
    top-level module of the package); None: the module itself."""
    return module if depth is None else ".".join(module.split(".")[:depth])


def graph(depth: int | None) -> dict[str, set[str]]:
    known = {name for name, _ in modules()}
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules():
        for target in imports(name, path):
            while target not in known and "." in target:  # `from pkg import Name`
                target = target.rpartition(".")[0]
            if target in known and unit(target, depth) != unit(name, depth):
                edges[unit(name, depth)].add(unit(target, depth))
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted({*edges, *(w for ws in edges.values() for w in ws)}):
        if v not in index:
            visit(v)
    return found


def test_packages_import_only_the_layers_below() -> None:
    edges = graph(depth=1)
    wrong = {p: sorted(t - LAYERS[p]) for p, t in edges.items() if t - LAYERS[p]}
    assert not wrong, f"package imports outside its layer: {wrong}"


@pytest.mark.parametrize("package", sorted(SOURCES))
def test_no_import_cycle_between_subpackages(package: str) -> None:
    edges = {k: v for k, v in graph(depth=2).items() if k.startswith(package + ".")}
    found = cycles(edges)
    detail = {c[0]: {v: sorted(edges[v] & set(c)) for v in c} for c in found}
    assert not found, f"import cycles among {package}'s rooms: {detail}"


def test_no_import_cycle_between_modules() -> None:
    # Within a room too: two modules that import each other (one of them lazily, inside a
    # function) are one concern split in two, or a third module's content held by both.
    edges = graph(depth=None)
    found = cycles(edges)
    detail = {c[0]: {v: sorted(edges[v] & set(c)) for v in c} for c in found}
    assert not found, f"import cycles among modules: {detail}"


def test_the_cycle_check_finds_a_cycle() -> None:
    # The check itself, on a made-up graph: a -> b -> c -> a, and d alone.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def third_party(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}  # fmt: skip
    return roots | {(n.module or "").split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom)}  # fmt: skip


@pytest.mark.parametrize(
    ("prefix", "banned"),
    [
        # The API: what the operator, the CRD generator and `validate` load, light and pure.
        ("impala_api", {"torch", "ray", "gymnasium", "kopf", "kubernetes", "fastapi"}),
        # The operator's decisions are pure; only runtime/ talks to the cluster.
        ("impala_operator.build", {"kopf", "kubernetes", "httpx"}),
        ("impala_operator.lifecycle", {"kopf", "kubernetes", "httpx"}),
        ("impala_operator.scale", {"kopf", "kubernetes", "httpx"}),
    ],
)
def test_pure_rooms_import_no_io(prefix: str, banned: set[str]) -> None:
    for name, path in modules():
        if name == prefix or name.startswith(prefix + "."):
            assert not third_party(path) & banned, f"{name} imports {third_party(path) & banned}"


def test_no_function_is_longer_than_80_lines() -> None:
    long = []
    for name, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert not long, f"split these: {long}"


def test_no_module_is_longer_than_600_lines() -> None:
    long = [
        f"{name}: {count} lines"
        for name, path in modules()
        if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"split these by concern: {long}"


def test_the_architecture_doc_lists_every_room() -> None:
    """docs/architecture.md has a table per package (under a heading naming it) whose rows name
    exactly the package's subpackages and top-level modules."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    for package in SOURCES:
        rooms = {name.split(".")[1] for name, _ in modules() if name.startswith(package + ".")}
        heading = re.search(rf"^### `{package}`.*$", text, flags=re.M)
        assert heading, f"docs/architecture.md has no `### `{package}`` section"
        section = re.split(r"^##", text[heading.end() :], maxsplit=1, flags=re.M)[0]
        listed = set(re.findall(r"^\| `(\w+)(?:/|\.py)?` \|", section, flags=re.M))
        assert listed == rooms, (
            f"docs/architecture.md lists {sorted(listed - rooms)} that {package} lacks and "
            f"misses {sorted(rooms - listed)}"
        )

