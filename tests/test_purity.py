"""`sync/` is pure: it imports no networking, event loop or I/O library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("websockets", "anyio", "asyncio", "sqlite3", "socket", "server", "client")


def test_sync_imports_nothing_with_io() -> None:
    """Importing every module of `sync` loads none of websockets, anyio, asyncio, sqlite3."""
    modules = sorted(path.stem for path in (ROOT / "sync").glob("*.py") if path.stem != "__init__")
    script = (
        "import sys, importlib\n"
        f"for name in {modules!r}: importlib.import_module('sync.' + name)\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
