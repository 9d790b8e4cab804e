"""What one client, room or caller must not do to the others: a peer that stops reading or
floods pings, a socket still open when the hub shuts down, a summary feed, a room whose tick
waits, a read cancelled while a room loads, reads of names with no log. Each ends in bounded
time and memory on the hub, without holding a slot or a task others need."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from conftest import bound, hub_config
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode

import server.subscriber
from client import connect
from server import Hub, MemoryStore
from server.room import Room
from sync import Message
from sync.protocol import SUBPROTOCOL


class Silent:
    """A websocket client on a plain socket that never reads unless asked: its receive
    buffer is small, so the hub's writes to it soon stop going through."""

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(bound(5))
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n"
            ).encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = self.sock.recv(1)
            assert chunk, "the hub closed the socket during the handshake"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 101"), answer

    def flood_pings(self, seconds: float) -> int:
        """Send pings (never reading the pongs) until a send blocks for `seconds`: the hub
        stopped reading. A loaded machine may reach the hub's deadlines first and the hub cut
        the socket meanwhile: that ends the flood too. Returns the bytes sent."""
        burst = Frame(Opcode.PING, b"p" * 125).serialize(mask=True, extensions=[]) * 1000
        self.sock.settimeout(seconds)
        sent = 0
        try:
            while sent < 400 * 1024 * 1024:
                self.sock.sendall(burst)
                sent += len(burst)
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass
        return sent

    def closed_by_peer(self) -> bool:
        """Whether the hub has closed or cut the connection (reading what is left)."""
        self.sock.settimeout(bound(5))
        try:
            while self.sock.recv(1 << 16):
                pass
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()


@asynccontextmanager
async def running(**settings: object) -> AsyncIterator[Hub]:
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config(**settings)) as hub:
        yield hub


async def test_a_ping_flood_from_a_peer_that_never_reads_stays_bounded() -> None:
    """websockets answers every ping with a pong whatever the backlog, and pings reach no
    rate limit: a peer that floods pings and reads nothing once grew the hub's write buffer
    by every pong. The hub now stops reading such a peer while its replies are not read."""
    async with running(ping_interval=None, hello_timeout=30) as hub:
        silent = await asyncio.to_thread(Silent, hub.port, "/v1/conversations/flood")
        try:
            sent = await asyncio.to_thread(silent.flood_pings, 1.0)
            assert hub._sockets.server is not None
            (connection,) = hub._sockets.server.all_connections
            backlog = connection.transport.get_write_buffer_size()
            # Without the pause every ping's pong waits here: `sent` bytes of pings (a pong is
            # as long as its ping). With it, what one read brings in, at most.
            assert backlog < 1024 * 1024 < sent, (backlog, sent)
        finally:
            silent.close()


async def test_a_socket_whose_peer_stopped_reading_is_cut_when_it_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A peer that never reads and never says hello: its hello deadline closes the socket,
    but the close cannot be sent to it, so it used to stay open for good, holding one of its
    address's waiting slots (and one of `max_connections`). It is cut after the close
    deadline."""
    monkeypatch.setattr(server.subscriber, "CLOSE_DEADLINE", 0.5)
    async with running(ping_interval=None, hello_timeout=0.5, max_waiting_per_address=1) as hub:
        silent = await asyncio.to_thread(Silent, hub.port, "/v1/conversations/silent")
        try:
            await asyncio.to_thread(silent.flood_pings, 0.5)  # the hub's writes now block
            with anyio.fail_after(bound(10)):
                assert await asyncio.to_thread(silent.closed_by_peer)
                while hub.metrics.connections:  # noqa: ASYNC110 - a counter, no event
                    await asyncio.sleep(0.05)
            # Its address may open a socket again (the waiting slot was given back).
            url = f"{hub.url}/v1/conversations/silent"
            async with ws_connect(url, subprotocols=[SUBPROTOCOL], ping_interval=None) as ws:  # type: ignore[list-item]
                hello = {"type": "hello", "client": "w", "lineage": 0, "revision": 0}
                await ws.send(json.dumps(hello))
                with anyio.fail_after(bound(5)):
                    assert json.loads(await ws.recv())["type"] == "welcome"
        finally:
            silent.close()


async def test_shutting_down_closes_sockets_that_are_in_no_room() -> None:
    """A summary feed and a socket still waiting for its hello are in no room: shutdown
    closed only rooms' sockets and left these open (and waited out its timeout). Both are
    closed with 1001 now."""
    hub = Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config(hello_timeout=30))
    await hub.__aenter__()
    options = {"subprotocols": [SUBPROTOCOL], "ping_interval": None}
    try:
        async with (
            ws_connect(f"ws://127.0.0.1:{hub.port}/v1/summary", **options) as summary,  # type: ignore[arg-type]
            ws_connect(f"{hub.url}/v1/conversations/quiet", **options) as quiet,  # type: ignore[arg-type]
        ):
            await summary.send(json.dumps({"type": "hello"}))
            with anyio.fail_after(bound(5)):
                assert json.loads(await summary.recv())["type"] == "summary"
            with anyio.fail_after(bound(8)):
                await hub.aclose()
                for ws in (summary, quiet):
                    with pytest.raises(ConnectionClosed):
                        while True:
                            await ws.recv()
                    assert ws.protocol.close_rcvd is not None
                    assert ws.protocol.close_rcvd.code == 1001
    finally:
        await hub.aclose()


async def test_summary_feeds_count_toward_the_connection_caps() -> None:
    """A summary socket counts toward `max_connections`, and until its hello toward the
    sockets its address may hold waiting, as a replica's socket does (they counted toward
    neither)."""
    async with running(max_connections=2, max_waiting_per_address=1) as hub:
        url = f"ws://127.0.0.1:{hub.port}/v1/summary"
        options = {"subprotocols": [SUBPROTOCOL], "ping_interval": None}
        async with ws_connect(url, **options) as first:  # type: ignore[arg-type]
            await asyncio.sleep(0.05)
            with pytest.raises(InvalidStatus) as waiting:  # one waits for its hello already
                async with ws_connect(url, **options):  # type: ignore[arg-type]
                    pass
            assert waiting.value.response.status_code == 503
            await first.send(json.dumps({"type": "hello"}))
            with anyio.fail_after(bound(5)):
                assert json.loads(await first.recv())["type"] == "summary"
            async with ws_connect(url, **options) as second:  # type: ignore[arg-type]
                await second.send(json.dumps({"type": "hello"}))
                with anyio.fail_after(bound(5)):
                    assert json.loads(await second.recv())["type"] == "summary"
                assert hub.metrics.connections == 2
                with pytest.raises(InvalidStatus) as full:
                    async with ws_connect(url, **options):  # type: ignore[arg-type]
                        pass
                assert full.value.response.status_code == 503


async def test_a_room_whose_tick_waits_holds_up_no_other_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The room timer ran each due room's tick in turn and waited for it: one room whose
    tick waited (behind a slow store call) held up every other room's drafts and presence.
    Ticks are tasks of their own now: another room's presence still goes out meanwhile."""
    entered, release = asyncio.Event(), asyncio.Event()
    tick = Room.tick

    async def stuck(room: Room) -> None:
        if room.id == "stuck":
            entered.set()
            await release.wait()
        await tick(room)

    monkeypatch.setattr(Room, "tick", stuck)
    async with (
        running() as hub,
        connect(hub.url, "stuck", client="s") as in_stuck,
        connect(hub.url, "free", client="b1") as b1,
        connect(hub.url, "free", client="b2") as b2,
    ):
        await in_stuck.set_status("busy")  # the stuck room now has a presence diff due
        with anyio.fail_after(bound(5)):
            await entered.wait()
            for status in ("one", "two"):
                # The first goes out at once; the second, within the presence throttle of
                # the first, waits for the room timer.
                await b1.set_status(status)
                while "b1" not in b2.presence or b2.presence["b1"].status != status:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
        release.set()


class GatedLoads(MemoryStore):
    """A memory store whose loads wait until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.loads = 0

    async def load(self, conversation_id: str) -> object:  # type: ignore[override]
        self.loads += 1
        self.entered.set()
        await self.release.wait()
        return await super().load(conversation_id)


@asynccontextmanager
async def hello_behind_a_read(
    hub: Hub, store: GatedLoads, conversation_id: str
) -> AsyncIterator[tuple[asyncio.Task[Room | None], ClientConnection]]:
    """A read of `conversation_id` starts its (gated) load, then a replica's hello waits on
    the same load: the read's task and the replica's socket, both waiting."""
    read = asyncio.create_task(hub.room_for_read(conversation_id))
    url = f"{hub.url}/v1/conversations/{conversation_id}"
    options = {"subprotocols": [SUBPROTOCOL], "ping_interval": None}
    async with ws_connect(url, **options) as ws:  # type: ignore[arg-type]
        with anyio.fail_after(bound(5)):
            await store.entered.wait()
            hello = {"type": "hello", "client": "reader", "lineage": 0, "revision": 0}
            await ws.send(json.dumps(hello))
            while hub._rooms.awaiting.get(conversation_id, 0) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # both wait on the load
        yield read, ws


async def test_a_caller_cancelled_while_a_room_loads_does_not_fail_the_others() -> None:
    """A room is loaded once for everyone who needs it meanwhile. The load ran in the first
    caller's task: an HTTP read cancelled past its handshake timeout cancelled it, and a
    replica waiting on the same load was closed with no reason. It is the hub's task now."""
    store = GatedLoads()
    async with Hub(store, host="127.0.0.1", port=0, config=hub_config()) as hub:
        async with hello_behind_a_read(hub, store, "slow") as (read, ws):
            read.cancel()
            await asyncio.sleep(0.05)
            store.release.set()
            with anyio.fail_after(bound(5)):
                assert json.loads(await ws.recv())["type"] == "welcome"
        with pytest.raises(asyncio.CancelledError):
            await read


async def test_a_read_of_a_conversation_with_no_log_keeps_no_room() -> None:
    """A read of a name that has no log answers 'none' and unloads the room it made at once:
    reads of made-up names kept a room each for `idle_unload`."""
    async with running(idle_unload=60) as hub:
        for k in range(20):
            assert await hub.room_for_read(f"nothing-{k}") is None
        assert hub.metrics.conversations_loaded == 0
        async with connect(hub.url, "real", client="w") as writer:
            writer.conversation.push(Message.user("hello"))
            await writer.flush()
            assert await hub.room_for_read("real") is not None  # a live room stays
        assert hub.metrics.conversations_loaded == 1


async def test_a_read_of_a_name_with_no_log_does_not_unload_a_room_being_joined() -> None:
    """A read of a conversation with no log and a replica's hello wait on the same load; the
    read, woken first, unloaded the room the replica then joined, so the next socket loaded a
    second room and the first never saw its records (a review of this stop's changes)."""
    store = GatedLoads()
    async with Hub(store, host="127.0.0.1", port=0, config=hub_config(idle_unload=60)) as hub:
        async with hello_behind_a_read(hub, store, "fresh") as (read, ws):
            store.release.set()
            with anyio.fail_after(bound(5)):
                assert await read is None
                assert json.loads(await ws.recv())["type"] == "welcome"
                async with connect(hub.url, "fresh", client="writer") as writer:
                    writer.conversation.push(Message.user("hello"))
                    await writer.flush()
                assert store.loads == 1
                assert json.loads(await ws.recv())["type"] == "records"


def _frames_over(size: int) -> list[int]:
    """The lengths of websockets frames over `size` bytes alive in this process."""
    gc.collect()
    return [len(o.data) for o in gc.get_objects() if type(o) is Frame and len(o.data) > size]


def _large_push(seq: int, lineage: int) -> dict[str, object]:
    """A push of one message of 200 KiB (over `LET_GO`), a fresh id per `seq`."""
    return {
        "type": "push",
        "seq": seq,
        "lineage": lineage,
        "revision": seq - 1,
        "records": [
            {
                "change": {
                    "type": "push",
                    "entries": [
                        {
                            "message": {
                                "role": "user",
                                "content": [{"type": "text", "text": "z" * (200 << 10)}],
                            },
                            "id": f"msg_0190a5b2c3d47e0f8a1b2c3d4e5f6{seq:03x}",
                        }
                    ],
                }
            }
        ],
    }


async def test_a_writer_idle_after_a_large_push_leaves_no_frame_on_the_hub() -> None:
    """websockets' parser keeps the last frame it read until the next comes: an idle writer's
    last push (up to `max_size`) stayed alive on the hub for each connection (issue 32: 100
    idle writers held 47 MiB). The hub pings after a large frame; the pong replaces it."""
    async with running(ping_interval=None, max_frame=1 << 20) as hub:
        url = f"{hub.url}/v1/conversations/idle-writer"
        async with ws_connect(url, subprotocols=[SUBPROTOCOL], ping_interval=None) as ws:  # type: ignore[list-item]
            await ws.send(json.dumps({"type": "hello", "client": "w", "lineage": 0, "revision": 0}))
            await ws.send(json.dumps(_large_push(1, 0)))
            with anyio.fail_after(bound(5)):
                kinds = [json.loads(await ws.recv())["type"]]
                while kinds[-1] not in ("ack", "reject", "error"):
                    kinds.append(json.loads(await ws.recv())["type"])
            assert kinds[-1] == "ack", kinds
            # The writer now sends nothing more (its own side answers the hub's ping).
            with anyio.fail_after(bound(5)):
                while _frames_over(100 << 10):  # noqa: ASYNC110 - no event tells a frame is freed
                    await asyncio.sleep(0.02)
            assert not _frames_over(100 << 10)
            assert hub.metrics.pushes_accepted == 1


async def test_a_writer_sending_large_pushes_back_to_back_is_pinged_once_it_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ping that lets go of a large frame waits for the writer to go quiet: five large
    pushes back to back cost one ping, after the last, not one each."""
    import server.sockets

    pings: list[int] = []
    let_go = server.sockets.let_go

    async def counted(ws: object) -> None:
        pings.append(1)
        await let_go(ws)  # type: ignore[arg-type]

    monkeypatch.setattr(server.sockets, "let_go", counted)
    # A quiet time no stall of this test's own sends reaches (the rule, not the tuning).
    monkeypatch.setattr(server.sockets, "LET_GO_AFTER", 1.0)
    async with running(ping_interval=None, max_frame=1 << 20) as hub:
        url = f"{hub.url}/v1/conversations/busy-writer"
        async with ws_connect(url, subprotocols=[SUBPROTOCOL], ping_interval=None) as ws:  # type: ignore[list-item]
            await ws.send(json.dumps({"type": "hello", "client": "w", "lineage": 0, "revision": 0}))
            with anyio.fail_after(bound(10)):
                welcome = json.loads(await ws.recv())
                for seq in range(1, 6):
                    await ws.send(json.dumps(_large_push(seq, welcome["lineage"])))
                acks = 0
                while acks < 5:
                    answer = json.loads(await ws.recv())
                    kind = answer["type"]
                    assert kind == "ack", answer
                    acks += kind == "ack"
                while not pings:  # noqa: ASYNC110 - the ping is the hub's own, a second later
                    await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)
            assert len(pings) == 1
            assert hub.metrics.pushes_accepted == 5
