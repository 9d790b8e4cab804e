"""Hub and replicas over real websockets on 127.0.0.1: convergence, faults, bad input."""

from __future__ import annotations

import contextlib
import random
import urllib.request
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest
from conftest import bound, hub_config
from faultproxy import FaultProxy
from strategies import Run, draw_op
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from client import Conflict, Replica, Reset, connect
from server import Hub, MemoryStore
from server.core import SNAPSHOT_SPAN
from sync import (
    Assistant,
    Author,
    Conversation,
    Entry,
    Message,
    Stop,
    ToolCall,
    encode,
)
from sync.frames import MAX_FRAME
from sync.protocol import SUBPROTOCOL


async def settle(replicas: list[Replica], hub: Hub, conversation_id: str) -> Conversation:
    """Flush every replica, wait until all saw the whole log; return the hub's value."""
    with anyio.fail_after(bound(20)):
        for replica in replicas:
            await replica.flush()
        room = await hub.room_for_read(conversation_id)
        assert room is not None
        for replica in replicas:
            await replica.wait_for(room.revision)
        for replica in replicas:  # a rebase late in the run may have pushed again
            await replica.flush()
        room = await hub.room_for_read(conversation_id)
        assert room is not None
        for replica in replicas:
            await replica.wait_for(room.revision)
        return room.conversation.copy()


def random_ops(seed: int, count: int) -> list[tuple[Any, ...]]:
    """`count` edits of every kind (reset excepted), drawn by seed."""
    rng = random.Random(seed)
    return [draw_op(rng) for _ in range(count)]


@pytest.mark.parametrize("count", [2, 5])
async def test_replicas_converge_after_concurrent_edits_of_every_kind(count: int) -> None:
    """Two and five replicas editing at once, in every way, end equal to the hub."""
    config = hub_config(strict_pairing=False)
    async with Hub(MemoryStore(), port=0, config=config) as hub:
        async with contextlib.AsyncExitStack() as stack:
            replicas = [
                await stack.enter_async_context(Replica(hub.url, "mix", client=f"r{k}"))
                for k in range(count)
            ]
            runs = [Run(conversation=replica.conversation) for replica in replicas]
            for round_ in range(8):
                for k, run in enumerate(runs):
                    for op in random_ops(round_ * 100 + k, 4):
                        run.do(op)
                await anyio.sleep(0.01)
            value = await settle(replicas, hub, "mix")
            for replica in replicas:
                assert replica.conversation == value
            assert len(value) > 0


async def test_worker_streams_while_ui_pushes_without_conflicts(hub: Hub) -> None:
    """A worker pushing 1,000 records while a UI pushes user messages: equal, no conflicts."""
    async with (
        connect(hub.url, "stream", client="worker") as worker,
        connect(hub.url, "stream", client="ui") as ui,
    ):

        async def work() -> None:
            for k in range(1000):
                if k % 3 == 0:
                    worker.conversation.add_aside(_note(f"progress {k}", None))
                else:
                    worker.conversation.push(
                        Entry(Message.user(f"step {k}"), author=Author.agent("worker"))
                    )
                if k % 50 == 0:
                    await anyio.lowlevel.checkpoint()

        async def steer() -> None:
            for k in range(40):
                ui.conversation.push(Message.user(f"user says {k}"))
                await anyio.sleep(0.002)

        async with anyio.create_task_group() as group:
            group.start_soon(work)
            group.start_soon(steer)
        value = await settle([worker, ui], hub, "stream")
        assert worker.conversation == ui.conversation == value
        assert len(value) == sum(1 for k in range(1000) if k % 3) + 40
        assert len(value.asides()) == sum(1 for k in range(1000) if k % 3 == 0)
        events = worker.events_nowait() + ui.events_nowait()
        assert not [event for event in events if isinstance(event, Conflict)]


def _note(text: str, after: str | None) -> Any:
    from sync import Aside

    return Aside.note("progress", text, after, Author.agent("worker"))


async def test_splice_conflict_surfaces_and_nothing_else_is_lost(hub: Hub) -> None:
    """A splice of entries another replica removed is a Conflict event; other edits land."""
    async with (
        connect(hub.url, "conflict", client="a") as a,
        connect(hub.url, "conflict", client="b") as b,
    ):
        a.conversation.extend([Message.user("one"), Message.user("two")])
        await settle([a, b], hub, "conflict")
        # b summarises both while a edits the first and adds one more, before either hears.
        async with FaultProxy(hub.url) as proxy:
            proxy.delay = 0.05
            async with connect(proxy.url, "conflict", client="slow-a") as slow:
                await slow.flush()
                b.conversation.splice(range(0, 2), [Message.user("summary")], Author.plugin("c"))
                slow.conversation.edit_each(
                    Author.user(), lambda ref: Message.user("ONE") if ref.index == 0 else None
                )
                slow.conversation.push(Message.user("three"))
                value = await settle([a, b, slow], hub, "conflict")
                events = slow.events_nowait()
        conflicts = [event for event in events if isinstance(event, Conflict)]
        assert [c.reason for c in conflicts] == ["removed_moved"]
        assert value.messages() == [Message.user("summary"), Message.user("three")]
        assert a.conversation == b.conversation == value


async def test_lost_ack_resend_lands_once(hub: Hub) -> None:
    """The ack is dropped and the connection cut: the replica reconnects, the hub holds the
    push's records once, and a raw resend of the same seq gets the original ack."""
    async with FaultProxy(hub.url) as proxy:
        dropped = proxy.drop_next(b'"type":"ack"')
        async with connect(proxy.url, "ack", client="writer") as writer:
            writer.conversation.extend([Message.user("a"), Message.user("b")])
            value = await settle([writer], hub, "ack")
            assert dropped, "the fault was not injected"
            assert writer.connects >= 2
            assert value.messages() == [Message.user("a"), Message.user("b")]
            room = await hub.room_for_read("ack")
            assert room is not None and room.revision == 1
    async with ws_connect(
        f"{hub.url}/v1/conversations/ack",
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
    ) as raw:
        await raw.send(b'{"type":"hello","client":"writer","lineage":0,"revision":0}', text=True)
        welcome = msgspec.json.decode(await raw.recv(decode=False))
        assert welcome["acked"] == 1
        await raw.recv(decode=False)  # the catch-up
        resend = {
            "type": "push",
            "seq": 1,
            "lineage": welcome["lineage"],
            "revision": 0,
            "records": [],
        }
        record = Conversation().copy()
        record.push(Message.user("again"))
        resend["records"] = [msgspec.json.decode(encode(r)) for r in record.unsaved()]
        await raw.send(msgspec.json.encode(resend), text=True)
        ack = msgspec.json.decode(await raw.recv(decode=False))
        assert ack == {"type": "ack", "seq": 1, "from": 0, "revision": 1}
    room = await hub.room_for_read("ack")
    assert room is not None and room.revision == 1


async def test_duplicated_pushes_are_appended_once(hub: Hub) -> None:
    """Every push frame sent twice by the network: the log still holds each record once."""
    async with FaultProxy(hub.url) as proxy:
        proxy.duplicate_to_hub = lambda frame: b'"type":"push"' in frame
        async with connect(proxy.url, "dup", client="writer") as writer:
            for k in range(20):
                writer.conversation.push(Message.user(f"m{k}"))
                await anyio.sleep(0.001)
            value = await settle([writer], hub, "dup")
    assert [m for m in value.messages()] == [Message.user(f"m{k}") for k in range(20)]
    assert writer.conversation == value


async def test_rewritten_log_sends_state_and_replicas_replay_pending(hub: Hub) -> None:
    """A log rewritten under a new lineage: replicas reread the state, replay pending edits."""
    async with FaultProxy(hub.url) as proxy:
        async with connect(proxy.url, "rewrite", client="a") as a:
            a.conversation.push(Message.user("old"))
            await settle([a], hub, "rewrite")
            proxy.cut()
            proxy.drop_to_hub = lambda frame: True  # a is offline while the log is rewritten
            a.conversation.push(Message.user("pending"))
            await hub.rewrite("rewrite", Conversation.from_messages([Message.user("new")]))
            proxy.drop_to_hub = lambda frame: False
            proxy.cut()
            value = await settle([a], hub, "rewrite")
            events = a.events_nowait()
    assert any(isinstance(event, Reset) for event in events)
    assert value.messages() == [Message.user("new"), Message.user("pending")]
    assert a.conversation == value


async def raw_session(hub: Hub, path: str = "/v1/conversations/bad") -> Any:
    return ws_connect(
        hub.url + path,
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        max_size=None,
        ping_interval=None,
    )


HELLO = b'{"type":"hello","client":"x","lineage":0,"revision":0}'


@pytest.mark.parametrize(
    ("frames", "code", "path"),
    [
        ([b"{not json"], "malformed_json", None),
        ([b'{"type":"subscribe"}'], "unknown_type", None),
        ([b'{"type":"hello","client":7,"lineage":"x","revision":0}'], "bad_message", None),
        ([b'{"type":"push","seq":1,"lineage":0,"revision":0,"records":[]}'], "no_hello", None),
        (
            [
                HELLO,
                b'{"type":"push","seq":1,"lineage":0,"revision":0,"records":["'
                + b"x" * MAX_FRAME  # over the default limit
                + b'"]}',
            ],
            "too_big",
            None,
        ),
        ([HELLO], "bad_conversation_id", "/v1/conversations/no spaces!"),
        ([HELLO, HELLO], "unexpected", None),
    ],
)
async def test_bad_input_gets_an_error_and_changes_nothing(
    hub: Hub, frames: list[bytes], code: str, path: str | None
) -> None:
    """Each kind of bad input gets `error` with its code on its own socket; the hub stays up,
    the conversation is unchanged, and another replica keeps working."""
    async with connect(hub.url, "bad", client="good") as good:
        good.conversation.push(Message.user("before"))
        before = await settle([good], hub, "bad")
        before_json = encode(before)
        target = path if path is not None else "/v1/conversations/bad"
        async with await raw_session(hub, target.replace(" ", "%20")) as raw:
            error = None
            with anyio.fail_after(bound(10)):
                for frame in frames:
                    try:
                        await raw.send(frame, text=True)
                    except ConnectionClosed:
                        break
                try:
                    while True:
                        message = msgspec.json.decode(await raw.recv(decode=False))
                        if message["type"] == "error":
                            error = message
                except ConnectionClosed:
                    pass
        assert error is not None and error["code"] == code
        good.conversation.push(Message.user("after"))
        after = await settle([good], hub, "bad")
        assert after.messages()[:1] == before.messages()
        assert encode(after) != before_json and len(after) == 2
        assert hub.metrics.protocol_errors[code] == 1


async def test_records_that_do_not_fit_or_break_pairing_are_rejected(hub: Hub) -> None:
    """A record that does not fit and a push breaking strict pairing get `reject invalid`;
    the conversation stays as it was."""
    async with connect(hub.url, "strict", client="good") as good:
        good.conversation.push(Message.user("q"))
        call = Assistant([ToolCall("c1", "f", {})], stop=Stop("tool_use"))
        good.conversation.push(call)
        before = await settle([good], hub, "strict")
        async with connect(hub.url, "strict", client="bad") as bad:
            bad.conversation.push(Message.tool_result("nope", "f", "orphan"))
            held = bad.conversation.entry(0)
            assert held is not None
            with anyio.fail_after(bound(10)):
                while bad.pending:  # noqa: ASYNC110 (polls the replica's count)
                    await anyio.sleep(0.01)
            conflicts = [e for e in bad.events_nowait() if isinstance(e, Conflict)]
            assert [c.reason for c in conflicts] == ["invalid"]
            assert "strict pairing" in conflicts[0].detail
            assert bad.conversation == before
        room = await hub.room_for_read("strict")
        assert room is not None and room.conversation == before
        assert hub.metrics.pushes_rejected["invalid"] == 1


async def test_slow_subscriber_is_resynced_and_others_unaffected() -> None:
    """A subscriber that stops reading is sent to resync; it then catches up, and the other
    subscriber's delivery went on meanwhile."""
    config = hub_config(send_queue=64 * 1024)
    async with Hub(MemoryStore(), port=0, config=config) as hub:
        async with (
            connect(hub.url, "slow", client="writer") as writer,
            connect(hub.url, "slow", client="reader") as reader,
            connect(hub.url, "slow", client="sleepy") as sleepy,
        ):
            ws = sleepy._ws
            assert ws is not None
            ws.transport.pause_reading()
            big = "x" * 20_000
            for k in range(400):
                writer.conversation.push(Message.user(f"{k} {big}"))
                if k % 10 == 0:
                    await writer.flush()
            with anyio.fail_after(bound(20)):
                await writer.flush()
                room = await hub.room_for_read("slow")
                assert room is not None
                await reader.wait_for(room.revision)
            assert reader.conversation == writer.conversation
            assert hub.metrics.send_queue_drops >= 1
            ws.transport.resume_reading()
            with anyio.fail_after(bound(20)):
                await sleepy.wait_for(room.revision)
            assert sleepy.conversation == writer.conversation
            assert sleepy.connects >= 2


async def test_catch_up_larger_than_a_frame_goes_in_chunks() -> None:
    """A state and a record run larger than the frame limit reach a fresh replica in chunks."""
    config = hub_config(max_frame=64 * 1024)
    async with Hub(MemoryStore(), port=0, config=config) as hub:
        async with connect(hub.url, "big", client="writer", max_frame=64 * 1024) as writer:
            for k in range(40):
                writer.conversation.extend(
                    [Message.user(f"{k}-{j} " + "y" * 300) for j in range(50)]
                )
                await writer.flush()
            value = await settle([writer], hub, "big")
        assert len(encode(value)) > 10 * 64 * 1024
        async with connect(hub.url, "big", client="fresh") as fresh:  # a state in chunks
            assert fresh.conversation == value
        replica = Replica(hub.url, "big", client="behind", max_frame=64 * 1024)
        replica.session.confirmed.continue_log(value.lineage, 0)  # behind from the start
        async with replica:  # records from revision 0 in chunks (or a state when cheaper)
            await replica.wait_for(40)
            assert replica.conversation == value


async def test_http_surface(hub: Hub) -> None:
    """/healthz, /metrics and GET /v1/conversations/{id} answer; unknown ids are 404."""
    async with connect(hub.url, "http", client="w") as writer:
        writer.conversation.push(Message.user("hello"))
        await settle([writer], hub, "http")
    base = hub.url.replace("ws://", "http://")

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(base + path, timeout=bound(5)) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    assert await anyio.to_thread.run_sync(get, "/healthz") == (200, b"ok\n")
    status, body = await anyio.to_thread.run_sync(get, "/metrics")
    assert status == 200 and b"convsync_records_appended_total 1" in body
    status, body = await anyio.to_thread.run_sync(get, "/v1/conversations/http")
    snapshot = msgspec.json.decode(body)
    assert status == 200 and snapshot["revision"] == 1
    assert snapshot["state"]["entries"][0]["message"]["content"][0]["text"] == "hello"
    assert (await anyio.to_thread.run_sync(get, "/v1/conversations/nobody"))[0] == 404
    assert (await anyio.to_thread.run_sync(get, "/v1/conversations/bad%20id"))[0] == 400
    assert (await anyio.to_thread.run_sync(get, "/elsewhere"))[0] == 404


async def test_idle_conversation_unloads_and_reloads(hub: Hub) -> None:
    """A conversation nobody uses is unloaded after the grace period and reloads intact."""
    async with connect(hub.url, "idle", client="w") as writer:
        writer.conversation.push(Message.user("kept"))
        value = await settle([writer], hub, "idle")
    with anyio.fail_after(bound(5)):
        while hub.metrics.conversations_loaded:  # noqa: ASYNC110 (a gauge, no event to wait on)
            await anyio.sleep(0.05)
    async with connect(hub.url, "idle", client="again") as again:
        assert again.conversation == value


async def test_graceful_shutdown_tells_replicas(hub: Hub) -> None:
    """Closing the hub closes replica sockets; the replica reports `Disconnected`."""
    from client import Disconnected

    replica = Replica(hub.url, "bye", client="r", max_backoff=0.05)
    async with replica:
        replica.conversation.push(Message.user("x"))
        await replica.flush()
        await hub.aclose()
        with anyio.fail_after(bound(5)):
            async for event in replica.events():
                if isinstance(event, Disconnected):
                    break


async def test_a_garbled_frame_from_the_hub_makes_the_replica_reconnect(hub: Hub) -> None:
    """A frame the replica cannot read ends that connection only (found in review: the error
    used to escape the connection loop, which then stopped for good)."""
    async with FaultProxy(hub.url) as proxy:
        garbled = proxy.corrupt_next(b'"type":"records"')
        async with (
            connect(hub.url, "garbled", client="writer") as writer,
            connect(proxy.url, "garbled", client="reader", backoff=0.01) as reader,
        ):
            writer.conversation.push(Message.user("one"))
            writer.conversation.push(Message.user("two"))
            value = await settle([writer, reader], hub, "garbled")
            assert garbled and reader.connects >= 2
            assert reader.conversation == value


async def test_a_client_id_reused_by_a_new_replica_keeps_pushing(hub: Hub) -> None:
    """A new replica under a client id the hub knows continues after its seqs (found in
    review: its first push was taken for a resend and never appended)."""
    async with connect(hub.url, "reuse", client="same") as first:
        first.conversation.push(Message.user("one"))
        await first.flush()
    async with connect(hub.url, "reuse", client="same") as second:
        second.conversation.push(Message.user("two"))
        value = await settle([second], hub, "reuse")
    assert value.messages() == [Message.user("one"), Message.user("two")]


async def test_catch_up_after_a_large_rewrite_keeps_frames_under_the_limit() -> None:
    """A rewrite's single reset record can exceed the frame limit; a replica catching up
    over it gets a chunked state instead (found by the catch-up benchmark)."""
    limit = 64 * 1024
    async with Hub(MemoryStore(), port=0, config=hub_config(max_frame=limit)) as hub:
        big = Conversation.from_messages([Message.user(f"{k} " + "z" * 300) for k in range(400)])
        await hub.rewrite("rewritten", big)
        sizes: list[int] = []
        async with ws_connect(
            f"{hub.url}/v1/conversations/rewritten",
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            max_size=None,
        ) as raw:
            await raw.send(HELLO, text=True)
            with anyio.fail_after(bound(10)):
                while True:
                    frame = await raw.recv(decode=False)
                    sizes.append(len(frame))
                    message = msgspec.json.decode(frame)
                    if message["type"] in ("state", "entries") and not message["more"]:
                        break
        assert len(sizes) > 3 and max(sizes) <= limit
        async with connect(hub.url, "rewritten", client="fresh", max_frame=limit) as fresh:
            assert fresh.conversation.messages() == big.messages()


async def test_a_closed_subscriber_leaves_nothing_on_the_conversation_it_held(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscriber that let its conversation stand for the log takes its hook off when it
    closes: the application's edits there afterwards copy nothing for the dead session."""
    with anyio.fail_after(bound(10)):
        async with (
            connect(hub.url, "kept", client="writer") as writer,
            connect(hub.url, "kept", client="viewer") as viewer,
        ):
            for k in range(100):
                writer.conversation.push(Message.user(f"m{k}"))
            await writer.flush()
            await viewer.wait_for(100)
            assert viewer.session.shares_local
        copies: list[Conversation] = []
        reread = Conversation.reread

        def counted(self: Conversation, from_log: Conversation) -> None:
            copies.append(from_log)
            reread(self, from_log)

        monkeypatch.setattr(Conversation, "reread", counted)
        viewer.conversation.push(Message.user("after the close"))
        assert copies == []
        assert viewer.conversation.messages()[-1] == Message.user("after the close")


async def test_a_snapshot_waits_until_the_tail_outweighs_the_last_one() -> None:
    """Through a real hub: the first snapshot comes after `snapshot_every` records; the next
    waits until the records after it weigh as much as it, and a fresh replica still gets the
    whole conversation."""
    store = MemoryStore()
    async with Hub(store, port=0, config=hub_config(snapshot_every=3)) as hub:
        async with connect(hub.url, "long", client="w") as writer:
            for k in range(3):
                writer.conversation.push(Message.user(f"{k} " + "x" * 1200))
                await writer.flush()
            first = await store.load("long")
            assert first is not None and first.snapshot_revision == 3 and first.snapshot
            pushed = 3
            while True:
                writer.conversation.push(Message.user(f"short {pushed}"))
                await writer.flush()
                pushed += 1
                loaded = await store.load("long")
                assert loaded is not None
                if loaded.snapshot_revision != 3:
                    break
                # Lighter than the snapshot so far: no new one, however many records.
                assert sum(map(len, loaded.records)) < len(first.snapshot)
            assert sum(map(len, loaded.records)) == 0 and loaded.snapshot_revision == pushed
            # Past `snapshot_every` by far, by weight: before the span would have brought it.
            assert 3 + 3 * 3 < pushed < 3 + SNAPSHOT_SPAN * 3
            writer.conversation.push(Message.user("after the snapshot"))
            value = await settle([writer], hub, "long")
        with anyio.fail_after(bound(5)):  # unloaded: the next replica loads snapshot + tail
            while hub.metrics.conversations_loaded:  # noqa: ASYNC110 (a gauge)
                await anyio.sleep(0.05)
        async with connect(hub.url, "long", client="fresh") as fresh:
            assert fresh.conversation == value
