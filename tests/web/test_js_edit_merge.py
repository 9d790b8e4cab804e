"""Concurrent edits of one message or note merge, or conflict, never vanish (SPEC 16): the
issue's case through the JavaScript replica's public API, two JS replicas on a real hub."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import bound, hub_config

from server import Hub, MemoryStore
from sync import encode

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "js_edit.mjs"
NODE = shutil.which("node")
FOX = "The quick brown fox jumps over the lazy dog."
MERGED = "The quick RED fox jumps over the SLEEPY dog."

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


async def two_js_edits(conversation_id: str, mode: str, *words: str) -> tuple[Any, Any]:
    """Run js_edit.mjs against a fresh hub; its JSON line and the hub's value as JSON."""
    assert NODE is not None
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub:
        command = [NODE, "--no-warnings", "--experimental-websocket", str(SCRIPT), hub.url]
        with anyio.fail_after(bound(30)):
            result = await anyio.run_process(
                [*command, conversation_id, mode, *words], check=False, stderr=subprocess.PIPE
            )
        assert result.returncode == 0, result.stderr.decode()
        room = await hub.room_for_read(conversation_id)
        assert room is not None
        found = json.loads(result.stdout.decode().strip().splitlines()[-1])
        return found, json.loads(encode(room.conversation.state()))


async def test_the_issues_case_merges_in_two_js_replicas() -> None:
    """A changes "brown" to "RED", B "lazy" to "SLEEPY" at once: both JS replicas and the hub
    hold "The quick RED fox jumps over the SLEEPY dog.", no Conflict on either side."""
    found, hub_state = await two_js_edits("js.fox", "message", "brown", "RED", "lazy", "SLEEPY")
    assert (found["a"], found["b"], found["conflicts"]) == (MERGED, MERGED, [])
    assert found["state"] == hub_state


async def test_both_changing_brown_in_js_is_one_conflict_with_both_versions() -> None:
    """Both change "brown": exactly one Conflict(edited), carrying both versions; the log keeps
    the version that landed first, whole, on both replicas."""
    found, hub_state = await two_js_edits("js.clash", "message", "brown", "RED", "brown", "BLUE")
    [conflict] = found["conflicts"]
    assert conflict["reason"] == "edited"
    versions = {FOX.replace("brown", "RED"), FOX.replace("brown", "BLUE")}
    assert {conflict["theirs"], conflict["ours"]} == versions
    assert found["a"] == found["b"] == conflict["theirs"]
    assert found["state"] == hub_state


async def test_two_js_edits_of_one_note_merge() -> None:
    """The same on a note's text: the note holds both edits."""
    found, hub_state = await two_js_edits("js.note", "note", "brown", "RED", "lazy", "SLEEPY")
    assert (found["a"], found["b"], found["conflicts"]) == (MERGED, MERGED, [])
    assert found["state"] == hub_state
