"""Who may do what is written once, in apps/broker/access.py (docs/decisions/0046, issue 26).

Read from the source: outside the access module, no code in apps/ or txhub/ matches scopes
itself. Each pattern below is how a copy of the rule looks (each was in the tree before the
access module): comparing with a scope string ("admin", "produce:<group>"), testing membership
in a token's scopes or taking them apart in a loop, or building a scope prefix (`kind + ":"`).
The doors' auth modules hand their credentials to the access module."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ACCESS = ROOT / "apps" / "broker" / "access.py"
DOORS = (
    ROOT / "apps" / "broker" / "api" / "auth.py",
    ROOT / "apps" / "broker" / "grpc" / "auth.py",
)
# The syntax of a scope ("admin" or "<kind>:<name>") is an input limit, checked where a token is
# written; what a scope allows is the access module's.
SYNTAX_ONLY = {ROOT / "apps" / "broker" / "limits.py": "check_scope"}
SCOPE_PREFIXES = ("produce:", "consume:")


def _is_scope_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr) and node.values:
        node = node.values[0]
    return isinstance(node, ast.Constant) and (
        node.value == "admin"
        or (isinstance(node.value, str) and node.value.startswith(SCOPE_PREFIXES))
    )


def _mentions_scopes(node: ast.AST) -> bool:
    return any(
        (isinstance(inner, ast.Attribute) and inner.attr == "scopes")
        or (isinstance(inner, ast.Name) and inner.id == "scopes")
        for inner in ast.walk(node)
    )


# Reading a scope's parts: what a loop over scopes does when it matches them (not when it only
# checks each one's syntax, as a form does with limits.check_scope).
SPLITTING = {"startswith", "partition", "split", "removeprefix"}


def _takes_scopes_apart(node: ast.AST) -> bool:
    body: list[ast.AST]
    if isinstance(node, ast.For):
        iters, body = [node.iter], list(node.body)
    elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
        iters, body = [g.iter for g in node.generators], [node]
    else:
        return False
    return any(_mentions_scopes(i) for i in iters) and any(
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Attribute)
        and inner.func.attr in SPLITTING
        for part in body
        for inner in ast.walk(part)
    )


def scope_matching(tree: ast.AST, allowed_function: str = "") -> list[str]:
    """Where `tree` matches scopes itself: (line, what) for each place."""
    found: list[str] = []
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == allowed_function:
            skipped |= {id(inner) for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_scope_literal(o) or _mentions_scopes(o) for o in operands):
                found.append(f"{node.lineno}: compares with a scope or a token's scopes")
        elif _takes_scopes_apart(node):
            found.append(f"{getattr(node, 'lineno', 0)}: takes a token's scopes apart")
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Add)
            and isinstance(node.right, ast.Constant)
            and node.right.value == ":"
        ):
            found.append(f"{node.lineno}: builds a scope prefix")
    return found


def sources() -> list[Path]:
    return [
        path
        for package in ("apps", "txhub")
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts and path != ACCESS
    ]


def test_no_module_but_the_access_module_matches_scopes() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in sources()
        if (found := scope_matching(ast.parse(path.read_text()), SYNTAX_ONLY.get(path, "")))
    }
    assert offenders == {}


def test_the_doors_hand_their_credentials_to_the_access_module() -> None:
    for door in DOORS:
        tree = ast.parse(door.read_text())
        imported = {
            f"{node.module}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        assert "apps.broker.access" in imported, door


def test_the_check_sees_a_copy_of_the_rule() -> None:
    """The patterns above find the copies that were in the tree before the access module."""
    copies = """
def groups(self, kind):
    if "admin" in self.principal.scopes:
        return None
    prefix = kind + ":"
    return frozenset(s[len(prefix):] for s in self.principal.scopes if s.startswith(prefix))

def stream_may_check(token, producer_group):
    return token is not None and f"produce:{producer_group}" in token.scopes
"""
    assert len(scope_matching(ast.parse(copies))) == 4
    # And the access module itself is where they are.
    assert scope_matching(ast.parse(ACCESS.read_text()))
