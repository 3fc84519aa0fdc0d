"""Tests import shared code from `tests/support/` (or a conftest.py), never from another test
module: importing a `test_*` module runs its module-level setup and pulls its autouse fixtures and
tests into the importer. Checked on the source with `ast`; nothing here imports the files."""

from __future__ import annotations

import ast
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
