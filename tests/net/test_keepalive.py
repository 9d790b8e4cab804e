"""A hub that goes silent (frozen with SIGSTOP: its socket stays open in the kernel) is
noticed within the replica's `keepalive`, with one state change per transition."""

from __future__ import annotations

import inspect
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import bound
from hubprocess import HubProcess
from websockets.asyncio.client import connect as ws_connect

from client import Connected, Disconnected, Replica, connect
from server import Hub
from sync import Message, UsageError
from sync.protocol import SUBPROTOCOL


@pytest.fixture
def hub_process(tmp_path: Path) -> Iterator[HubProcess]:
    process = HubProcess(tmp_path / "convsync.db")
    process.start()
    try:
        yield process
    finally:
        thaw(process)
        process.stop()


def freeze(process: HubProcess) -> None:
    assert process.process is not None
    os.kill(process.process.pid, signal.SIGSTOP)


def thaw(process: HubProcess) -> None:
    if process.running:
        assert process.process is not None
        os.kill(process.process.pid, signal.SIGCONT)


def changes(events: list[object]) -> list[object]:
    return [event for event in events if isinstance(event, Connected | Disconnected)]


async def test_a_frozen_hub_is_noticed_within_keepalive_and_once(hub_process: HubProcess) -> None:
    """SIGSTOP the hub: within `keepalive` the replica says `Disconnected` ("keepalive timed
    out") and `connected` is False while `flush()` keeps waiting; the failed attempts that
    follow add no event; after SIGCONT one `Connected` and the edit lands."""
    keepalive = 1.0
    async with connect(
        hub_process.url, "frozen", keepalive=keepalive, connect_timeout=bound(5), max_backoff=0.2
    ) as replica:
        replica.conversation.push(Message.user("before"))
        with anyio.fail_after(bound(10)):
            await replica.flush()
        replica.events_nowait()
        freeze(hub_process)
        frozen_at = time.monotonic()
        replica.conversation.push(Message.user("while frozen"))
        async with anyio.create_task_group() as group:
            flushed = anyio.Event()

            async def flush() -> None:
                await replica.flush()
                flushed.set()

            group.start_soon(flush)
            with anyio.fail_after(bound(keepalive + 2)):
                event = await anext(replica.events())
            noticed = time.monotonic() - frozen_at
            assert isinstance(event, Disconnected), event
            assert event.reason.startswith("keepalive timed out"), event.reason
            assert noticed <= keepalive + 0.5 * bound(1)
            assert not replica.connected
            assert replica.failure == event.reason
            # Reconnect attempts against the frozen hub time out one after another.
            replica._connect_timeout = 0.3  # shorter attempts: more of them fail meanwhile
            await anyio.sleep(2.0)
            assert not flushed.is_set(), "flush() waits for the ack while disconnected"
            assert changes(replica.events_nowait()) == []
            assert replica.failure is not None and "keepalive" not in replica.failure
            thaw(hub_process)
            with anyio.fail_after(bound(10)):
                await flushed.wait()
        assert replica.connected
        assert [type(e) for e in changes(replica.events_nowait())] == [Connected]
        assert replica.failure is None
        assert replica.conversation.messages()[-1] == Message.user("while frozen")


async def test_without_keepalive_a_frozen_hub_goes_unnoticed(hub_process: HubProcess) -> None:
    """The control: with `keepalive=None` the same freeze shows nothing for as long (the
    kernel keeps the hub's socket open), which is what the keepalive is for."""
    async with connect(hub_process.url, "unnoticed", keepalive=None) as replica:
        replica.events_nowait()
        freeze(hub_process)
        await anyio.sleep(2.0)
        assert replica.connected
        assert changes(replica.events_nowait()) == []


def test_the_default_keepalive_notices_within_ten_seconds() -> None:
    default = inspect.signature(Replica).parameters["keepalive"].default
    assert default is not None and 0 < default <= 10


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"keepalive": 0}, "keepalive must be None (no pings) or a number of seconds, at least"),
        ({"keepalive": float("nan")}, "keepalive must be None"),
        ({"keepalive": "5"}, "(got '5')"),
        ({"backoff": 0}, "backoff must be a number of seconds, more than 0 (got 0)"),
        ({"backoff": 2.0, "max_backoff": 1.0}, "max_backoff must be at least backoff"),
        ({"connect_timeout": -1}, "connect_timeout must be a number of seconds, more than 0"),
        ({"draft_interval": -0.1}, "draft_interval must be a number of seconds, at least 0"),
        ({"keep_every": float("inf")}, "keep_every must be a number of seconds, more than 0"),
    ],
)
def test_timing_options_out_of_range_are_refused(options: dict[str, object], says: str) -> None:
    with pytest.raises(UsageError) as caught:
        Replica("ws://127.0.0.1:1", "c", **options)  # type: ignore[arg-type]
    assert caught.value.reason == "bad_option"
    assert says in caught.value.message


# ---------------------------------------------------------------------- ping messages


async def test_the_hub_answers_ping_messages_of_a_replica_that_lists_the_feature(hub: Hub) -> None:
    """A replica listing `ping` sees it in the welcome, and each `ping` gets a `pong`; a ping
    before the hello is refused like any other message before it."""
    url = f"{hub.url}/v1/conversations/pings"
    options: dict[str, Any] = {"subprotocols": [SUBPROTOCOL], "ping_interval": None}
    async with ws_connect(url, **options) as ws:
        hello = {"type": "hello", "client": "p", "lineage": 0, "revision": 0, "features": ["ping"]}
        await ws.send(json.dumps(hello))
        with anyio.fail_after(bound(5)):
            welcome = json.loads(await ws.recv())
            assert "ping" in welcome["features"]
            for _ in range(3):
                await ws.send('{"type":"ping"}')
                while (answer := json.loads(await ws.recv()))["type"] != "pong":
                    assert answer["type"] in ("presence", "presence_diff")
    async with ws_connect(url, **options) as ws:
        await ws.send('{"type":"ping"}')
        with anyio.fail_after(bound(5)):
            assert json.loads(await ws.recv())["code"] == "no_hello"
    async with ws_connect(url, **options) as ws:  # not listed: not offered
        await ws.send(json.dumps({"type": "hello", "client": "q", "lineage": 0, "revision": 0}))
        with anyio.fail_after(bound(5)):
            assert "ping" not in json.loads(await ws.recv()).get("features", [])


# ---------------------------------------------------------------------- the JS replica

NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_js_replica_notices_a_frozen_hub_with_ping_messages(hub_process: HubProcess) -> None:
    """A browser cannot send websocket pings: the JS replica sends `ping` messages, so a hub
    frozen with SIGSTOP is noticed within its keepalive too, once, and it reconnects."""
    assert NODE is not None
    keepalive_ms = 1000
    script = Path(__file__).resolve().parents[1] / "support" / "js_keepalive.mjs"
    args = [hub_process.url, "js", str(keepalive_ms)]
    node = subprocess.Popen(
        [NODE, "--no-warnings", "--experimental-websocket", str(script), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[dict[str, object] | None] = queue.Queue()

    def read() -> None:
        assert node.stdout is not None
        for line in node.stdout:
            lines.put(json.loads(line))
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def next_line(within: float) -> dict[str, object]:
        line = lines.get(timeout=within)
        assert line is not None, "node exited"
        return line

    try:
        while next_line(bound(20)) != {"ready": True}:
            pass
        freeze(hub_process)
        frozen_at = time.monotonic()
        seen = [next_line(bound(keepalive_ms / 1000 + 2))]
        assert time.monotonic() - frozen_at <= keepalive_ms / 1000 + 0.5 * bound(1)
        seen.append(next_line(bound(1)))
        assert {"event": "disconnected"} in seen
        [state] = [line for line in seen if "state" in line]
        assert state == {
            "state": "disconnected",
            "reason": "keepalive timed out: a ping went unanswered for 0.5s",
        }
        time.sleep(2.0)  # reconnect attempts fail against the frozen hub: nothing printed
        assert lines.empty()
        thaw(hub_process)
        back = {"event": "connected"}, {"state": "connected", "reason": ""}
        assert next_line(bound(20)) in back
        assert node.wait(timeout=bound(20)) == 0
    finally:
        if node.poll() is None:
            node.kill()
        node.wait()
        reader.join(timeout=bound(5))
        assert node.stdout is not None
        node.stdout.close()
