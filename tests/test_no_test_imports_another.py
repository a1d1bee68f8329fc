"""No module under tests/ imports from a test module (issue 27): shared helpers live in
tests/support/ and shared fixtures in a conftest.py. Importing a test module ties its edits to
other files and collects its tests' module-level set-up again under another name. Imports inside
functions count too."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def is_test_module(dotted: str) -> bool:
    return dotted.rpartition(".")[2].startswith("test_")


def imported_test_modules(source: str, package: str) -> set[str]:
    """The test modules (`test_*`) that `source`, a module in `package`, imports anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if is_test_module(alias.name)}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if is_test_module(module):
                found.add(module)
            found |= {
                f"{module}.{alias.name}" for alias in node.names if is_test_module(alias.name)
            }
    return found


def offenders() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts)
        imported = imported_test_modules(path.read_text(), ".".join(parts[:-1])) - {name}
        if imported:
            found[str(path.relative_to(ROOT))] = imported
    return found


def test_the_finder_sees_an_import_of_a_test_module() -> None:
    """The positive control: each way of naming another test module is found."""
    source = (
        "from tests.broker.test_checkback import make_group\n"
        "import tests.grpc.test_push_consumer\n"
        "from tests.console import test_console_views\n"
        "from .test_sdk import Listener\n"
        "def later():\n"
        "    from tests.e2e.test_one_write_per_answer import data_segments_in\n"
        "from tests.support.transactions import prepare\n"
        "from tests.grpc.conftest import GrpcServer\n"
    )
    assert imported_test_modules(source, "tests.client") == {
        "tests.broker.test_checkback",
        "tests.grpc.test_push_consumer",
        "tests.console.test_console_views",
        "tests.client.test_sdk",
        "tests.e2e.test_one_write_per_answer",
    }


def test_no_module_under_tests_imports_a_test_module() -> None:
    assert (TESTS / "broker" / "test_checkback.py").exists()  # the walk sees the suite
    assert offenders() == {}
