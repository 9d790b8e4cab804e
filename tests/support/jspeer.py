"""The JS peer (`js_peer.mjs`, the JavaScript replica run by node) as the tests run it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
from conftest import bound

PEER = Path(__file__).resolve().parent / "js_peer.mjs"
NODE = shutil.which("node")


async def run_peer(*args: str) -> Any:
    """Run the JS peer to its end (bounded); return the JSON line it printed."""
    assert NODE is not None
    with anyio.fail_after(bound(30)):
        result = await anyio.run_process(
            [NODE, "--no-warnings", "--experimental-websocket", str(PEER), *args],
            check=False,
            stderr=subprocess.PIPE,
        )
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout.decode().strip().splitlines()[-1])
