"""No import circles among txhub's modules (issue 26): a module-level import of one module by
another, followed through the graph, never comes back to where it started. Imports inside a
function (deferred on purpose, e.g. to break a circle at run time) are not counted, so a circle
hidden that way still shows here only if it is also at module level."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("apps", "txhub", "spark_jobs")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The known modules `path` imports at module level (not inside functions)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in known:
                found.add(node.module)
            found |= {
                f"{node.module}.{alias.name}"
                for alias in node.names
                if f"{node.module}.{alias.name}" in known
            }
    return found


def graph() -> dict[str, set[str]]:
    paths = [
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    ]
    known = {module_name(path) for path in paths}
    return {module_name(path): imports_of(path, known) - {module_name(path)} for path in paths}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                found.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return found


def test_the_finder_sees_a_circle() -> None:
    """The positive control: a circle of three is found."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_imports_itself_through_others() -> None:
    edges = graph()
    assert "apps.broker.services.checkback" in edges  # the graph is the code's
    assert circles(edges) == []
