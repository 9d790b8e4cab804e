"""The JavaScript replica (client/web/convsync.js, run by node) against a real hub."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from conftest import bound, hub_config
from jspeer import NODE, run_peer

from client import connect
from server import Hub, MemoryStore
from sync import Message, encode

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


async def test_js_replica_catches_up_pushes_and_converges_with_python() -> None:
    """A JS replica takes the log by state (in chunks), pushes concurrently with a Python
    replica, and both end equal to the hub."""
    config = hub_config(max_frame=4096)  # the catch-up state comes in several frames
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub:
        url = f"ws://127.0.0.1:{hub.port}"
        async with connect(url, "web.1", client="py", max_frame=4096) as py:
            for n in range(30):
                py.conversation.push(Message.user(f"py {n} " + "x" * 200))
            with anyio.fail_after(bound(30)):
                await py.flush()
                async with anyio.create_task_group() as group:
                    found: list[Any] = []

                    async def peer() -> None:
                        found.append(await run_peer(url, "web.1", "mirror", "20", "70"))

                    group.start_soon(peer)
                    for n in range(20):
                        py.conversation.push(Message.user(f"py late {n}"))
                        await anyio.sleep(0.05)  # spread over the JS replica's run
                    await py.flush()
                result = found[0]
                assert "error" not in result, result
                await py.wait_for(result["revision"])
                await py.flush()
            assert json.loads(encode(py.conversation.state())) == result["state"]
            room = await hub.room_for_read("web.1")
            assert room is not None and room.conversation == py.conversation
            texts = [m.content[0].text for m in py.conversation.messages()]  # type: ignore[union-attr]
            assert [t for t in texts if t.startswith("js")] == [f"js {n}" for n in range(20)]
            assert "reset" in result["events"] and "conflict" not in result["events"]


async def test_js_replica_refused_for_good_is_not_retried(hub: Hub) -> None:
    """A conversation id the hub refuses closes the JS replica for good, after one socket."""
    result = await run_peer(f"ws://127.0.0.1:{hub.port}", "bad id", "refused")
    assert result == {"refused": "bad_conversation_id", "state": "closed", "sockets": 1}


async def test_js_replica_sends_and_takes_five_mib_records_by_default() -> None:
    """At the default settings a JS replica pushes a 5 MiB message and receives one from a
    Python replica; one over its limit throws at the call and changes nothing."""
    big = 5 * 2**20
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub:
        url = f"ws://127.0.0.1:{hub.port}"
        async with connect(url, "web.big", client="py") as py:
            py.conversation.push(Message.user("p" * big))
            with anyio.fail_after(bound(30)):
                await py.flush()
                result = await run_peer(url, "web.big", "large", str(big), "2")
                assert "error" not in result, result
                await py.wait_for(result["revision"])
            assert json.loads(encode(py.conversation.state())) == result["state"]
            texts = [m.content[0].text for m in py.conversation.messages()]  # type: ignore[union-attr]
            assert texts == ["p" * big, "x" * big]
            assert result["refused"]["reason"] == "too_large"
            assert "over the record limit of 16,777,088 bytes" in result["refused"]["message"]
            assert result["pending"] == 0 and result["length"] == 0
            assert not [e for e in result["events"] if e.startswith("conflict")]


async def test_a_js_worker_asks_a_python_ui_decides_and_answers_a_frontend_tool(
    hub: Hub,
) -> None:
    """SPEC 12 across languages: the JS replica's `ask` resolves with the Python UI's
    decision, and its `result` with the frontend tool's result the UI pushed."""
    url = f"ws://127.0.0.1:{hub.port}"
    async with connect(url, "js.ask", client="py-ui") as ui:
        async with anyio.create_task_group() as group:
            found: list[Any] = []

            async def peer() -> None:
                found.append(await run_peer(url, "js.ask", "ask"))

            group.start_soon(peer)
            with anyio.fail_after(bound(20)):
                while not any(a.is_open for a in ui.approvals.values()):
                    await ui.wait_for(ui.revision + 1)
            (id_,) = list(ui.approvals)
            ui.decide(id_, approve=False, reason="not today")
            ui.conversation.push(Message.tool_result("c1", "rm", "denied", is_error=True))
            ui.conversation.push(Message.tool_result("f1", "pick_file", "a.txt"))
            with anyio.fail_after(bound(20)):
                await ui.flush()
        (result,) = found
        assert "error" not in result, result
        decision = result["decision"]
        assert (decision["state"], decision["reason"], decision["decided_by"]) == (
            "denied",
            "not today",
            "anonymous",
        )
        assert result["approvals"] == 1
        assert result["result"]["content"][0]["text"] == "a.txt"
