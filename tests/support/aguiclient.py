"""AG-UI's own client (`@ag-ui/client`, run by node) as the tests use it: events in, what the
client's schemas and lifecycle verifier say and the messages it accumulates out."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from conftest import bound

ROOT = Path(__file__).resolve().parents[2]
APPLY = Path(__file__).resolve().parent / "agui_apply.mjs"
PACKAGE = ROOT / "client" / "web" / "node_modules" / "@ag-ui" / "client"
NODE = shutil.which("node")


def require_client() -> str:
    """The node binary; fails (never skips) when node or the npm packages are missing."""
    assert NODE is not None, "node is not installed: the AG-UI tests need it"
    assert PACKAGE.is_dir(), f"{PACKAGE} is missing: run scripts/ensure-npm"
    return NODE


def apply_runs(runs: list[list[Any]], messages: list[Any] | None = None) -> dict[str, Any]:
    """Feed each run's events (dicts in wire form) to one client; its final state."""
    node = require_client()
    done = subprocess.run(
        [node, "--no-warnings", str(APPLY)],
        input=json.dumps({"messages": messages or [], "runs": runs}),
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
