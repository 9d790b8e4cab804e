"""No import circle among the project's own modules: every module of `sync/`, `server/` and
`client/` can be read after the modules it imports, with nothing imported late to dodge a
circle (issue 24)."""

from __future__ import annotations

import ast
from pathlib import Path

from sourcetree import parse

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sync", "server", "client")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
    return name == "TYPE_CHECKING"


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports when it runs: at module level and inside functions
    (a late import is still an import), leaving out `if TYPE_CHECKING:` blocks and the
    packages that contain `name` (Python imports those first anyway)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    source = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    source = child.module or ""
                found.add(source)
                found.update(f"{source}.{alias.name}" for alias in child.names)
            visit(child)

    visit(parse(path))
    inside = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    edges = set()
    for target in found:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name and target not in inside:
            edges.add(target)
    return edges


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return groups


def test_no_module_of_the_project_is_in_an_import_circle() -> None:
    """No two project modules import each other, directly or through others."""
    modules = _modules()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    assert graph["sync.conversation"], "the walk found no imports: it is not reading the files"
    assert _circles(graph) == []


def test_the_walk_finds_a_circle_made_by_a_late_import() -> None:
    """The check itself: a function-level import that closes a circle is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
