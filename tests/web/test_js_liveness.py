"""The JS socket shells' liveness against a real hub process (client/web/test/liveness.test.mjs,
run by `node --test` on Node's own WebSocket with this Python for the hub): a hub killed -9
and restarted on its port is reconnected to; a frozen hub is noticed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import bound

NODE = shutil.which("node")
ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "client" / "web" / "test" / "liveness.test.mjs"


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_js_shells_survive_a_killed_and_a_frozen_hub() -> None:
    assert NODE is not None
    # Node 20 has the global WebSocket behind this flag; Node 22 accepts and ignores it.
    env = dict(os.environ, CONVSYNC_PYTHON=sys.executable)
    command = [NODE, "--no-warnings", "--experimental-websocket", "--test", str(TESTS)]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=bound(120), check=False
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout
    assert "# skipped 0" in done.stdout, "the Node liveness tests must run here, not skip"
