"""`sync/` is pure: it imports no networking, event loop or I/O library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sourcetree

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    *("websockets", "anyio", "asyncio", "sqlite3", "socket", "server", "client"),
    *("openai", "anthropic", "httpx"),  # the provider converters take plain dicts (§11)
)


def test_sync_imports_nothing_with_io() -> None:
    """Importing every module of `sync` (`sync.providers` too) loads none of websockets,
    anyio, asyncio, sqlite3, nor a provider SDK."""
    modules = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "sync").rglob("*.py")
        if path.stem != "__init__"
    )
    script = (
        "import sys, importlib\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout


IO_LIBRARIES = (
    "websockets",
    "anyio",
    "asyncio",
    "sqlite3",
    "socket",
    "asyncpg",
    "redis",
    "os",
    "io",
)
PURE_SERVER = ("server.core", "server.session", "server.mirror", "server.remote")


def _imports(module: str) -> list[str]:
    """The absolute names of the modules `module`'s source imports (relative ones resolved)."""
    path = ROOT / (module.replace(".", "/") + ".py")
    package = module.rsplit(".", 1)[0]
    names = []
    for node in ast.walk(sourcetree.parse(path)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.append(base)
    return names


def test_hub_core_imports_nothing_with_io() -> None:
    """The hub's core and session, and every server module they use, import no networking,
    event loop, database or file library (the room and hub shells do the I/O)."""
    seen: set[str] = set()
    todo = list(PURE_SERVER)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _imports(module):
            assert name.split(".")[0] not in IO_LIBRARIES, f"{module} imports {name}"
            if name.startswith("server.") and (ROOT / (name.replace(".", "/") + ".py")).exists():
                todo.append(name)
    assert {"server.core", "server.store.base", "server.metrics"} <= seen
