"""One websocket shared by several replica sessions (`server.mux`, `/v1/mux`): each channel is
a session of its own with its own client, token and presence, on one socket; a bad frame
closes the socket; a channel's end leaves the others; the shared socket's own token is
given to no channel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from conftest import bound, hub_config
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

import server.mux
from server import Hub, MemoryStore
from server.auth import Key, KeyRing, mint_token
from sync.errors import CODES
from sync.protocol import SUBPROTOCOL

SECRET = b"s3cret-for-mux-tests-0123456789abcdef"


def push(seq: int, text: str, msg_id: str, lineage: int = 0, revision: int = 0) -> dict[str, Any]:
    message = {"role": "user", "content": [{"type": "text", "text": text}]}
    change = {"type": "push", "entries": [{"message": message, "id": msg_id}]}
    records = [{"change": change}]
    return {
        "type": "push",
        "seq": seq,
        "lineage": lineage,
        "revision": revision,
        "records": records,
    }


def hello(client: str, **more: Any) -> dict[str, Any]:
    features = ["hub_rebase", "drafts", "presence"]
    return {
        "type": "hello",
        "client": client,
        "lineage": 0,
        "revision": 0,
        "features": features,
        **more,
    }


class Mux:
    """The replica's side of a shared socket: open, send and read per channel."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.inbox: dict[int, list[Any]] = {}
        self.closed: dict[int, tuple[int, str]] = {}

    async def open(self, number: int, conversation: str) -> None:
        await self.ws.send(f"o{number} /v1/conversations/{conversation}")

    async def send(self, number: int, message: dict[str, Any]) -> None:
        await self.ws.send(f"m{number} " + json.dumps(message))

    async def read(self) -> None:
        data = await self.ws.recv()
        text = data if isinstance(data, str) else data.decode()
        head, _, body = text.partition(" ")
        number = int(head[1:])
        if head[0] == "m":
            self.inbox.setdefault(number, []).append(json.loads(body))
        else:
            assert head[0] == "c", text
            code, _, reason = body.partition(" ")
            self.closed[number] = (int(code), reason)

    async def until(self, number: int, kind: str) -> dict[str, Any]:
        """Read until channel `number` got a message of type `kind`; return it."""
        with anyio.fail_after(bound(5)):
            while True:
                for message in self.inbox.get(number, []):
                    if message.get("type") == kind:
                        self.inbox[number].remove(message)
                        return message
                await self.read()

    async def until_closed(self, number: int) -> tuple[int, str]:
        with anyio.fail_after(bound(5)):
            while number not in self.closed:
                await self.read()
        return self.closed[number]


@asynccontextmanager
async def shared(hub: Hub, **options: Any) -> AsyncIterator[Mux]:
    url = f"{hub.url}{server.mux.MUX_PATH}"
    async with ws_connect(url, subprotocols=[SUBPROTOCOL], ping_interval=None, **options) as ws:  # type: ignore[list-item]
        yield Mux(ws)


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as running:
        yield running


async def test_two_sessions_share_one_socket_and_see_each_other(hub: Hub) -> None:
    async with shared(hub) as mux:
        await mux.open(1, "tabs")
        await mux.open(2, "tabs")
        await mux.send(1, hello("tab-a"))
        await mux.send(2, hello("tab-b"))
        welcome = await mux.until(1, "welcome")
        await mux.until(2, "welcome")
        assert (hub.metrics.connections, hub.metrics.channels) == (1, 2)
        lineage = welcome["lineage"]
        presence = await mux.until(2, "presence")
        await mux.send(1, push(1, "from a", "msg_0190a5b2c3d47e0f8a1b2c3d4e5f6071", lineage))
        ack = await mux.until(1, "ack")
        assert ack["seq"] == 1
        record = await mux.until(2, "records")
        assert record["records"][0]["change"]["entries"][0]["message"]["content"][0]["text"] == (
            "from a"
        )
        clients = {entry["client"] for entry in presence["connections"]}
        assert clients <= {"tab-a", "tab-b"} and "tab-b" in clients
        # One tab goes: the other stays live on the same socket.
        await mux.ws.send("c1 1000 ")
        with anyio.fail_after(bound(5)):
            while hub.metrics.channels != 1:  # noqa: ASYNC110 - a gauge, no event
                await anyio.sleep(0.01)
        await mux.send(2, push(1, "from b", "msg_0190a5b2c3d47e0f8a1b2c3d4e5f6072", lineage, 1))
        assert (await mux.until(2, "ack"))["seq"] == 1
    with anyio.fail_after(bound(5)):
        while hub.metrics.connections or hub.metrics.channels:  # noqa: ASYNC110 - gauges
            await anyio.sleep(0.01)
    room = await hub.room_for_read("tabs")
    assert room is not None and room.revision == 2


async def test_a_session_refused_closes_its_channel_only(hub: Hub) -> None:
    async with shared(hub) as mux:
        await mux.open(1, "x")
        await mux.open(2, "bad id!")
        await mux.send(1, hello("tab-a"))
        await mux.send(2, hello("tab-b"))
        await mux.until(1, "welcome")
        error = await mux.until(2, "error")
        assert error["code"] == "bad_conversation_id"
        code, reason = await mux.until_closed(2)
        assert (code, reason) == (1008, "bad_conversation_id")
        await mux.send(1, push(1, "still here", "msg_0190a5b2c3d47e0f8a1b2c3d4e5f6073"))
        assert (await mux.until(1, "ack"))["seq"] == 1


@pytest.mark.parametrize(
    "frame",
    ["hello", "m1", "x1 /v1/conversations/a", "o01234567890 /v1/conversations/a"],
)
async def test_a_frame_that_breaks_the_mux_rules_closes_the_socket(hub: Hub, frame: str) -> None:
    async with shared(hub) as mux:
        await mux.ws.send(frame)
        with anyio.fail_after(bound(5)):
            error = json.loads(await mux.ws.recv())
            with pytest.raises(ConnectionClosed) as closed:
                await mux.ws.recv()
    assert error["code"] == "bad_message"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_channel_numbers_are_not_used_twice(hub: Hub) -> None:
    async with shared(hub) as mux:
        await mux.open(5, "x")
        await mux.ws.send("c5 1000 ")
        await mux.open(5, "x")
        with anyio.fail_after(bound(5)):
            error = json.loads(await mux.ws.recv())
        assert error["code"] == "bad_message" and "opened already" in error["detail"]


async def test_a_socket_holds_at_most_max_channels(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server.mux, "MAX_CHANNELS", 2)
    async with shared(hub) as mux:
        for number in (1, 2, 3):
            await mux.open(number, "x")
        code, reason = await mux.until_closed(3)
        assert code == CODES["rate_limited"].close and "too many channels" in reason
        await mux.send(1, hello("tab-a"))
        await mux.until(1, "welcome")


async def test_the_shared_sockets_token_is_given_to_no_channel() -> None:
    """A tab with a read-only token must not write through the shared socket's own
    `Authorization` header: each channel's session sees only its hello's token."""
    keys = KeyRing.of(Key.secret(SECRET))
    writer = mint_token(SECRET, "alice", ["read", "write"], ["*"], 300)
    reader = mint_token(SECRET, "alice", ["read"], ["*"], 300)
    async with Hub(MemoryStore(), port=0, config=hub_config(), keys=keys) as hub:
        headers = {"Authorization": f"Bearer {writer}"}
        async with shared(hub, additional_headers=headers) as mux:
            await mux.open(1, "x")
            await mux.send(1, hello("no-token"))
            assert (await mux.until(1, "error"))["code"] == "unauthorized"
            await mux.open(2, "x")
            await mux.send(2, hello("reader", token=reader))
            await mux.until(2, "welcome")
            await mux.send(2, push(1, "nope", "msg_0190a5b2c3d47e0f8a1b2c3d4e5f6074"))
            reject = await mux.until(2, "reject")
            assert reject["reason"] == "forbidden"
            await mux.open(3, "x")
            await mux.send(3, hello("writer", token=writer))
            await mux.until(3, "welcome")
            await mux.send(3, push(1, "yes", "msg_0190a5b2c3d47e0f8a1b2c3d4e5f6075"))
            assert (await mux.until(3, "ack"))["seq"] == 1


async def test_the_tabs_of_one_socket_show_it_in_their_presence(hub: Hub) -> None:
    """Presence lists each tab's session (each has its own status), and each entry names the
    shared socket, so a view shows the tabs of one browser as one person (SPEC 14)."""
    async with shared(hub) as mux:
        for number, client in ((1, "tab-a"), (2, "tab-b")):
            await mux.open(number, "seen")
            await mux.send(number, hello(client))
            await mux.until(number, "welcome")
        url = f"{hub.url}/v1/conversations/seen"
        async with ws_connect(url, subprotocols=[SUBPROTOCOL], ping_interval=None) as own:  # type: ignore[list-item]
            await own.send(json.dumps(hello("own")))
            with anyio.fail_after(bound(5)):
                while (message := json.loads(await own.recv()))["type"] != "presence":
                    pass
    sockets = {entry["client"]: entry.get("socket") for entry in message["connections"]}
    assert set(sockets) == {"tab-a", "tab-b", "own"}
    assert sockets["tab-a"] == sockets["tab-b"] and isinstance(sockets["tab-a"], int)
    assert sockets["own"] is None  # a socket of its own: no `socket` on the wire


async def test_a_channel_ended_with_a_full_inbox_freezes_no_other() -> None:
    """A channel the hub closes (a flood: `rate_limited`) while its inbox is full and the
    reader waits to hand it one more message: the shared socket is read on, the other channel
    still answers, and when the socket closes every gauge goes back to 0. (The reader once
    waited on that inbox for good: the other channels froze, and so did the hub's shutdown.)"""
    config = hub_config(rate=2.0, rate_burst=1.0, flood_after=1.0)
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub:
        async with shared(hub) as mux:
            for number, client in ((1, "flood"), (2, "calm")):
                await mux.open(number, f"room-{number}")
                await mux.send(number, hello(client))
                await mux.until(number, "welcome")
            for seq in range(1, 40):
                message_id = f"msg_0190a5b2c3d47e0f8a1b2c3d4e5f{seq:04d}"
                await mux.send(1, push(seq, f"x{seq}", message_id))
            closed = await mux.until_closed(1)
            assert closed == (CODES["rate_limited"].close, "rate_limited")
            await mux.send(2, push(1, "still read", "msg_0190a5b2c3d47e0f8a1b2c3d4e5f9999"))
            with anyio.fail_after(bound(10)):
                answer = await mux.until(2, "ack")
            assert answer["seq"] == 1
        with anyio.fail_after(bound(10)):
            while hub.metrics.connections or hub.metrics.channels:  # noqa: ASYNC110 - gauges
                await anyio.sleep(0.01)
