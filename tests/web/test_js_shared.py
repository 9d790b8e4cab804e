"""Tabs sharing one socket (`shared: true`, SPEC 14) through the JavaScript replica's public
API, in one Node realm (tests/support/js_shared.mjs) on a real hub: one socket at the hub for
every tab, each tab live and editing, shown as one person (`people`), and the leader's tab
closing mid-edit hands the socket over without losing or repeating an edit."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest
from conftest import bound, hub_config

from server import Hub, MemoryStore

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "js_shared.mjs"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


async def test_tabs_share_one_socket_and_hand_it_over_without_losing_an_edit() -> None:
    assert NODE is not None
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub:
        command = [NODE, "--no-warnings", "--experimental-websocket", str(SCRIPT), hub.url, "tabs"]
        with anyio.fail_after(bound(40)):
            result = await anyio.run_process(command, check=False, stderr=subprocess.PIPE)
        assert result.returncode == 0, result.stdout.decode()[-2000:] + result.stderr.decode()
        steps = {line["step"]: line for line in map(json.loads, result.stdout.splitlines())}
        room = await hub.room_for_read("tabs")
        assert room is not None
        log = [message.content[0].text for message in room.conversation.messages()]  # type: ignore[union-attr]
    expected = ["from a", "from b", *(f"b{k}" for k in range(20))]
    assert steps["leaders"]["leaders"] == ["A"]  # the first tab leads, and only it
    assert steps["people"] == {"step": "people", "sessions": 2, "people": 1}
    assert steps["both"]["metrics"] == {"connections": 1, "channels": 2}
    assert steps["both"]["texts"] == {"a": ["from a", "from b"], "b": ["from a", "from b"]}
    # A (the leader) closed halfway through B's edits: B leads now, on a socket of its own.
    assert steps["handed over"]["metrics"] == {"connections": 1, "channels": 1}
    assert steps["handed over"]["texts"]["b"] == expected
    assert steps["joined"]["metrics"] == {"connections": 1, "channels": 2}
    assert steps["joined"]["texts"] == {"b": expected, "c": expected}
    assert log == expected  # every edit once, in order
