"""The test tree's layout, checked on the source with `ast` (nothing here imports the files):

- tests import shared code from `tests/support/` (or a conftest.py), never from another test
  module: importing a `test_*` module runs its module-level setup and pulls its autouse fixtures
  and tests into the importer;
- `tests/unit/` mirrors the packages: `tests/unit/<pkg>/` holds the tests of `impala_<pkg>` (and
  `tests/unit/harness/` those of `harness`), each of which imports (or runs) it; the repository-wide
  tests at `tests/unit/` itself import none of them;
- `tests/unit`, `tests/integration` and `tests/e2e` hold test modules only (and conftest.py);
- `bench/` and `tests/` share code only through `harness/`: neither imports the other, and
  `harness/` imports neither.
"""

from __future__ import annotations

import ast
import itertools
import textwrap
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "bench")


def _is_test_module(name: str) -> bool:
    return name.startswith("test_")


def imports_of_test_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, what) for each import of a `test_*` module in `tree`: as a dotted component of the
    module (`from tests.unit.test_x import f`, `import tests.unit.test_x`, `from .test_x import f`),
    as an imported name (`from tests.unit import test_x`), or as the literal argument of
    `importlib.import_module` / `__import__`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if any(_is_test_module(part) for part in alias.name.split(".")):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            names = [alias.name for alias in node.names]
            parts = (node.module or "").split(".")
            if any(_is_test_module(part) for part in parts) or any(map(_is_test_module, names)):
                yield node.lineno, f"from {module} import {', '.join(names)}"
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (
                called in ("import_module", "__import__")
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and any(_is_test_module(part.lstrip(".")) for part in first.value.split("."))
            ):
                yield node.lineno, f"{called}({first.value!r})"


def _python_files() -> Iterator[Path]:
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def test_no_file_under_tests_or_bench_imports_a_test_module() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _python_files()
        for line, what in imports_of_test_modules(ast.parse(path.read_text(), str(path)))
    ]
    assert not offenders, (
        "test modules import from other test modules; move the shared helpers to tests/support/ "
        "(or a conftest.py):\n" + "\n".join(offenders)
    )


def test_the_check_sees_every_form_of_importing_a_test_module() -> None:
    source = "\n".join(
        [
            "from tests.unit.trainer.test_learner import make_batch",
            "from .test_plan import SPEC",
            "from tests.e2e import test_crd_validation",
            "from . import test_plan",
            "import tests.e2e.test_operator_helm",
            "import tests.unit.test_packaging as packaging",
            "importlib.import_module('tests.unit.operator.test_plan')",
            # allowed: helper modules, whatever their package or the names they hold
            "from tests.support.learner import make_batch, one_torch_thread",
            "from tests.unit.operator.crd_cases import VALID",
            "from .conftest import REAL_NODE_REPORT",
            "import tests.support.plans",
            "importlib.import_module(command_module(name))",
        ]
    )
    lines = sorted(line for line, _ in imports_of_test_modules(ast.parse(source)))
    assert lines == [1, 2, 3, 4, 5, 6, 7]


# --- tests/unit mirrors the packages ---------------------------------------------------------

UNIT = ROOT / "tests" / "unit"
SUBJECTS = {
    "api": "impala_api",
    "trainer": "impala_trainer",
    "operator": "impala_operator",
    "cli": "impala_cli",
    "harness": "harness",
}
"""tests/unit/<folder>/ -> the package its tests test."""
PACKAGES = frozenset(SUBJECTS.values())
TEST_LAYERS = ("unit", "integration", "e2e")
NOT_A_TEST_MODULE_ALLOWED = frozenset({"__init__.py", "conftest.py"})


def _parse(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), str(path))


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every absolute import in `tree`, wherever the statement sits, and
    of `importlib.import_module` / `__import__` called with a literal."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (
                called in ("import_module", "__import__")
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and not first.value.startswith(".")
            ):
                yield node.lineno, first.value


def run_modules(tree: ast.AST) -> Iterator[str]:
    """The modules a test runs as `python -m MODULE` (a literal "-m" then a literal name in one
    list or tuple, as an argv is written)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            for flag, module in itertools.pairwise(node.elts):
                if (
                    isinstance(flag, ast.Constant)
                    and flag.value == "-m"
                    and isinstance(module, ast.Constant)
                    and isinstance(module.value, str)
                ):
                    yield module.value


def embedded_programs(tree: ast.AST) -> Iterator[ast.AST]:
    """The Python programs a test holds as string literals to run in a fresh process
    (`python -c CODE`): every literal that parses as code with an import in it."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if "import" not in node.value:
            continue
        try:
            program = ast.parse(textwrap.dedent(node.value))
        except SyntaxError:
            continue
        if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(program)):
            yield program


def packages_used(tree: ast.AST) -> set[str]:
    """Which of the packages (and the harness) `tree` imports or runs: in the module itself, as
    `python -m MODULE`, or in a program it runs as `python -c CODE`."""
    names = [name for _, name in imported_modules(tree)] + list(run_modules(tree))
    for program in embedded_programs(tree):
        names += [name for _, name in imported_modules(program)]
    return {name.split(".")[0] for name in names} & PACKAGES


def test_unit_folders_mirror_the_packages_and_their_tests_use_them() -> None:
    offenders = []
    for folder in sorted(p for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__"):
        subject = SUBJECTS.get(folder.name)
        if subject is None:
            offenders.append(f"{folder.relative_to(ROOT)}/: mirrors no package {sorted(SUBJECTS)}")
            continue
        for path in sorted(folder.rglob("test_*.py")):
            used = packages_used(_parse(path))
            if subject not in used:
                offenders.append(
                    f"{path.relative_to(ROOT)}: neither imports nor runs {subject}"
                    f" (it uses {sorted(used) or 'none of the packages'})"
                )
    assert not offenders, (
        "a test under tests/unit/<pkg>/ tests impala_<pkg> (tests/unit/harness/: harness); move "
        "it to the folder of the package it tests:\n" + "\n".join(offenders)
    )


def test_repository_wide_unit_tests_import_no_package() -> None:
    """tests/unit/test_*.py are about the repository (its layout, structure, packaging, locks,
    import weight): a test that imports one of the packages belongs in that package's folder."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: import {name}"
        for path in sorted(UNIT.glob("test_*.py"))
        for line, name in imported_modules(_parse(path))
        if name.split(".")[0] in PACKAGES
    ]
    assert not offenders, (
        "a test at tests/unit/ imports a package; move it to tests/unit/<pkg>/:\n"
        + "\n".join(offenders)
    )


def test_the_test_layers_hold_test_modules_only() -> None:
    """Helpers live in tests/support/ (or the harness), not beside the tests."""
    offenders = [
        str(path.relative_to(ROOT))
        for layer in TEST_LAYERS
        for path in sorted((ROOT / "tests" / layer).rglob("*.py"))
        if "__pycache__" not in path.parts
        and not path.name.startswith("test_")
        and path.name not in NOT_A_TEST_MODULE_ALLOWED
    ]
    assert not offenders, (
        "modules that are neither tests nor conftest.py in the test layers; move them to "
        "tests/support/:\n" + "\n".join(offenders)
    )


# --- bench/ and tests/ share only harness/ ---------------------------------------------------


def _top_level_names(folder: Path) -> set[str]:
    """What `import X` finds with `folder` on sys.path: its modules and packages."""
    return {
        p.stem if p.suffix == ".py" else p.name
        for p in folder.iterdir()
        if (p.suffix == ".py" or p.is_dir()) and p.name != "__pycache__"
    }


def foreign_imports(tree: ast.AST, other: str, other_names: set[str]) -> Iterator[tuple[int, str]]:
    """(line, name) of each import in `tree` of the tree `other` (`tests`, `bench`): by its
    package name (`from tests.support import x`, `import bench.common`), or by a name of its own
    that only resolves with that folder on sys.path (`from cluster import Kube`,
    `from common import table`)."""
    for line, name in imported_modules(tree):
        top = name.split(".")[0]
        if top == other or top in other_names:
            yield line, name


FORBIDDEN = {"bench": ("tests",), "tests": ("bench",), "harness": ("tests", "bench")}
"""Each tree and the trees it must not import."""


def test_bench_tests_and_harness_import_nothing_of_each_other() -> None:
    names = {tree: _top_level_names(ROOT / tree) for tree in ("tests", "bench")}
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name} (from {other}/)"
        for tree, others in FORBIDDEN.items()
        for path in sorted((ROOT / tree).rglob("*.py"))
        if "__pycache__" not in path.parts
        for other in others
        for line, name in foreign_imports(_parse(path), other, names[other] - {"__init__"})
    ]
    assert not offenders, (
        "bench/ and tests/ share code only through harness/ (which imports neither); move what "
        "both need there:\n" + "\n".join(offenders)
    )


def test_the_cross_import_check_sees_every_form() -> None:
    source = "\n".join(
        [
            "from tests.support import queues",
            "import tests.support.jobs",
            "from cluster import Kube",
            "import support.net",
            "importlib.import_module('tests.support.plans')",
            "def f():\n    from support.queues import quota_for",
            # allowed: the harness, the product, relative imports, names tests/ does not hold
            "from harness.cluster import Kube",
            "from impala_api.spec import ImpalaJob",
            "from .common import table",
            "import testsuite",
        ]
    )
    names = {"support", "unit", "cluster"}
    lines = sorted(line for line, _ in foreign_imports(ast.parse(source), "tests", names))
    assert lines == [1, 2, 3, 4, 5, 7]
