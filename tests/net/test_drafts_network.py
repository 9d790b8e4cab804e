"""Drafts and presence over real sockets: a worker streams, UIs watch, things fail."""

from __future__ import annotations

import io
import os
import signal
import sys
import textwrap
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from conftest import bound, drop_connection, hub_config
from terminal import last_frame

from client import Replica, connect
from client.live import DraftChanged, DraftEnded
from client.tail import tail
from server import Hub, HubConfig, MemoryStore
from server.store import SqliteStore
from sync import Entry, Halt, Message

ROOT = Path(__file__).resolve().parents[2]
TOKENS = [f"tok{i} " for i in range(60)]
FULL = "".join(TOKENS)


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """Wait, bounded, until `check()` holds (polling the replicas' state)."""
    with anyio.fail_after(bound(seconds)):
        # Drafts and presence change with no event a test can hold; a bounded poll of the
        # replicas' state every 5 ms is what a UI's redraw loop would do.
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.005)


def watch_prefixes(ui: Replica, draft_id: str, seen: list[str]) -> Callable[[], None]:
    """Record the draft's text after each event the UI got (to check it only grows)."""

    def look() -> None:
        for event in ui.events_nowait():
            if isinstance(event, DraftChanged) and event.id == draft_id:
                draft = ui.drafts.get(draft_id)
                if draft is not None:
                    seen.append(draft.text)

    return look


async def test_a_ui_joining_mid_draft_gets_the_text_so_far_then_the_rest(hub: Hub) -> None:
    """A UI that connects halfway sees the text so far, then every later token, none twice
    and none missing; the commit leaves one message and no draft."""
    async with connect(hub.url, "mid", client="worker", draft_interval=0.01) as worker:
        async with worker.draft() as d:
            for token in TOKENS[:30]:
                d.append(token)
                await anyio.sleep(0.002)
            async with connect(hub.url, "mid", client="ui") as ui:
                seen: list[str] = []
                look = watch_prefixes(ui, d.id, seen)
                for token in TOKENS[30:]:
                    d.append(token)
                    await anyio.sleep(0.002)
                    look()
                await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == FULL)
                look()
                assert seen and seen[-1] == FULL
                assert all(FULL.startswith(text) for text in seen)
                assert any(len(text) < len(FULL) for text in seen)  # it grew in place
                await d.commit(Message.assistant(FULL))
                await worker.flush()
                await until(lambda: ui.conversation.index_of(d.id) is not None)
                await until(lambda: not ui.drafts)
                assert [ref.message for ref in ui.conversation.entries()] == [
                    Message.assistant(FULL)
                ]


async def test_a_ui_reconnecting_mid_draft_ends_with_one_message_and_no_draft(hub: Hub) -> None:
    """The UI's socket drops while the draft grows; after the commit it holds exactly one
    message with the draft's id and no leftover draft."""
    async with (
        connect(hub.url, "recon", client="worker", draft_interval=0.01) as worker,
        connect(hub.url, "recon", client="ui") as ui,
    ):
        async with worker.draft() as d:
            for at, token in enumerate(TOKENS):
                d.append(token)
                await anyio.sleep(0.002)
                if at == 20:
                    drop_connection(ui)
            await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == FULL)
            await d.commit(Message.assistant(FULL))
        await worker.flush()
        await until(lambda: ui.conversation.index_of(d.id) is not None and not ui.drafts)
        assert len(ui.conversation) == 1
        assert ui.conversation.entry(0) == Entry(Message.assistant(FULL), d.id)


async def test_a_tool_calls_arguments_stream_and_the_ui_shows_them(hub: Hub) -> None:
    """`call:<id>` parts stream a tool call's arguments, with the tool's name."""
    async with (
        connect(hub.url, "call", client="worker", draft_interval=0) as worker,
        connect(hub.url, "call", client="ui") as ui,
    ):
        async with worker.draft() as d:
            d.append("Let me check.")
            for piece in ['{"ci', 'ty": "Lis', 'bon"}']:
                d.append(piece, part="call:c1", name="weather")
            await until(
                lambda: (
                    d.id in ui.drafts
                    and ui.drafts[d.id].parts.get("call:c1") == '{"city": "Lisbon"}'
                )
            )
            assert ui.drafts[d.id].names == {"call:c1": "weather"}
            assert ui.drafts[d.id].text == "Let me check."


async def test_another_client_cannot_take_over_append_or_commit_a_draft(hub: Hub) -> None:
    """An intruder opening (to append to) the worker's draft is refused, and its push of an
    entry with the draft's id is rejected as a conflict; the draft goes on untouched."""
    async with (
        connect(hub.url, "own", client="worker", draft_interval=0) as worker,
        connect(hub.url, "own", client="intruder") as intruder,
    ):
        async with worker.draft() as d:
            d.append("mine")
            await until(lambda: d.id in intruder.drafts and intruder.drafts[d.id].text == "mine")
            fake = intruder.draft()
            fake.id = d.id
            await fake.open()
            fake.append("theirs")
            with anyio.fail_after(bound(5)):
                assert await fake.wait_ended() == "refused"
            intruder.events_nowait()
            intruder.conversation.push(Entry(Message.assistant("stolen"), d.id))
            with anyio.fail_after(bound(5)):
                async for event in intruder.events():
                    if type(event).__name__ == "Conflict":
                        assert event.reason == "invalid"  # type: ignore[union-attr]
                        break
            assert intruder.drafts[d.id].text == "mine"
            assert worker.drafts[d.id].text == "mine"
            assert d.status is None
            await d.commit(Message.assistant("mine"))
        await worker.flush()
        assert [ref.id for ref in worker.conversation.entries()] == [d.id]


async def test_a_stop_reaches_the_worker_and_cancels_its_model_call(hub: Hub) -> None:
    """The UI halts `stopped` mid-draft: the worker's draft ends `stopped` within a round
    trip and the model call running under `cancel_on_end()` is cancelled."""
    async with (
        connect(hub.url, "stop", client="worker", draft_interval=0) as worker,
        connect(hub.url, "stop", client="ui") as ui,
    ):
        worker.conversation.push(Message.user("write a long story"))
        await worker.flush()
        produced = 0
        async with worker.draft() as d:
            with d.cancel_on_end():
                for token in TOKENS * 100:
                    d.append(token)
                    produced += 1
                    if produced == 20:
                        await until(lambda: d.id in ui.drafts)
                        ui.conversation.halt(Halt.STOPPED)
                    await anyio.sleep(0.005)
            assert d.status == "stopped"
        assert produced < 1000
        await until(lambda: not ui.drafts)
        await ui.flush()
        await until(lambda: worker.conversation.halted() is Halt.STOPPED)


async def test_presence_join_status_and_leave_reach_a_ui_quickly(hub: Hub) -> None:
    """A worker joining, setting a status, drafting and leaving shows in a UI's presence
    within 100 ms plus the throttle."""
    async with connect(hub.url, "here", client="ui") as ui:
        assert set(ui.presence) == {"ui"}
        worker = await connect(hub.url, "here", client="worker", kind="agent").__aenter__()
        try:
            started = time.monotonic()
            await until(lambda: "worker" in ui.presence, 1)
            assert time.monotonic() - started < bound(0.3)
            assert ui.presence["worker"].kind == "agent"
            started = time.monotonic()
            await worker.set_status("thinking", {"step": 1})
            await until(lambda: ui.presence["worker"].status == "thinking", 1)
            assert time.monotonic() - started < bound(0.3)
            assert ui.presence["worker"].detail == {"step": 1}
            await worker.set_status(None)
            async with worker.draft():
                await until(lambda: ui.presence["worker"].status == "drafting", 1)
            await until(lambda: ui.presence["worker"].status is None, 1)
        finally:
            await worker.aclose()
        started = time.monotonic()
        await until(lambda: "worker" not in ui.presence, 1)
        assert time.monotonic() - started < bound(0.3)


async def test_a_late_close_of_an_old_socket_keeps_its_successor(hub: Hub) -> None:
    """The same client on a new socket, then its old socket closes: it stays online."""
    async with connect(hub.url, "late", client="ui") as ui:
        old = await connect(hub.url, "late", client="worker").__aenter__()
        async with connect(hub.url, "late", client="worker") as new:
            await new.set_status("fresh")
            await until(
                lambda: (
                    ui.presence.get("worker") is not None
                    and len(ui.presence["worker"].connections) == 2
                )
            )
            await old.aclose()
            await until(lambda: len(ui.presence["worker"].connections) == 1)
            await anyio.sleep(0.3)  # past the throttle: nothing else goes
            assert ui.presence["worker"].status == "fresh"


WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from client import connect

    async def main(url):
        async with connect(url, "killed", client="doomed", draft_interval=0) as worker:
            async with worker.draft() as d:
                print(d.id, flush=True)
                n = 0
                while True:
                    d.append(f"part{n} ")
                    n += 1
                    await asyncio.sleep(0.01)

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_worker_killed_mid_draft_ends_it_timeout_and_the_log_holds_none_of_it() -> None:
    """SIGKILL of the worker process mid-draft: every UI sees `draft_end timeout` within
    grace + timeout, and the log holds no part of the draft."""
    config = hub_config(draft_grace=0.3, draft_timeout=1.0)
    async with Hub(MemoryStore(), port=0, config=config) as hub:
        async with (
            connect(hub.url, "killed", client="ui1") as ui1,
            connect(hub.url, "killed", client="ui2") as ui2,
        ):
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            proc = await anyio.open_process([sys.executable, "-c", WORKER_SCRIPT, hub.url], env=env)
            try:
                assert proc.stdout is not None
                line = b""
                with anyio.fail_after(bound(20)):
                    while not line.endswith(b"\n"):
                        line += await proc.stdout.receive()
                draft_id = line.decode().strip()
                await until(
                    lambda: draft_id in ui1.drafts and len(ui1.drafts[draft_id].text) > 20, 10
                )
                ui1.events_nowait()
                ui2.events_nowait()
                os.kill(proc.pid, signal.SIGKILL)
                killed = time.monotonic()
                for ui in (ui1, ui2):
                    with anyio.fail_after(bound(1.3 + 1.0)):
                        async for event in ui.events():
                            if isinstance(event, DraftEnded) and event.id == draft_id:
                                assert event.status == "timeout"
                                break
                assert time.monotonic() - killed < bound(1.3 + 1.0)
            finally:
                if proc.returncode is None:
                    proc.kill()
                await proc.aclose()
            assert not ui1.drafts and not ui2.drafts
            assert hub.metrics.drafts_open == 0
            rendered = hub.metrics.render()
            assert "convsync_drafts_open 0" in rendered
            assert "convsync_presence 2" in rendered  # the two UIs
            assert hub.metrics.draft_bytes_relayed > 0
            room = await hub.room_for_read("killed")
            assert room is None or len(room.conversation) == 0


async def test_a_worker_whose_hub_restarts_mid_draft_reopens_it(tmp_path: Path) -> None:
    """The hub restarts (same store, same port) mid-draft: the worker reopens the draft on
    the new hub and resends it; the UI ends with the whole text once, as one message."""
    path = tmp_path / "hub.db"
    config = hub_config()
    async with Hub(SqliteStore(path), port=0, config=config) as first:
        port = first.port
        worker = Replica(
            first.url,
            "restart",
            client="worker",
            draft_interval=0.01,
            backoff=0.02,
            max_backoff=0.1,
        )
        ui = Replica(first.url, "restart", client="ui", backoff=0.02, max_backoff=0.1)
        await worker.__aenter__()
        await ui.__aenter__()
        d = await worker.draft().open()
        for token in TOKENS[:30]:
            d.append(token)
        await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == "".join(TOKENS[:30]))
    try:
        async with Hub(SqliteStore(path), port=port, config=config):
            for token in TOKENS[30:]:
                d.append(token)
                await anyio.sleep(0.002)
            await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == FULL, 10)
            await d.commit(Message.assistant(FULL))
            with anyio.fail_after(bound(10)):
                await worker.flush()
            await until(lambda: ui.conversation.index_of(d.id) is not None and not ui.drafts)
            assert [ref.message for ref in ui.conversation.entries()] == [Message.assistant(FULL)]
    finally:
        await worker.aclose()
        await ui.aclose()


@pytest.mark.parametrize("interval", [0.0, 0.05])
async def test_slow_appends_arrive_in_order_with_or_without_coalescing(
    interval: float,
) -> None:
    """With `draft_interval` 0 (each delta at once) or 50 ms, the UI ends with the text."""
    config = hub_config(draft_interval=interval)
    async with Hub(MemoryStore(), port=0, config=config) as hub:
        async with (
            connect(hub.url, "c", client="worker", draft_interval=interval) as worker,
            connect(hub.url, "c", client="ui") as ui,
        ):
            async with worker.draft() as d:
                for token in TOKENS:
                    d.append(token)
                await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == FULL)
            await until(lambda: not ui.drafts)


async def test_a_fast_model_is_paced_within_the_hubs_draft_budget_and_nothing_is_lost(
    hub: Hub,
) -> None:
    """With the defaults (no fixed coalescing on either side) a worker appending far faster
    than the hub's draft budget sends each append while the paced burst lasts, then what
    gathered while it waits: the hub relays no more deltas than the budget lets in (the
    replica paces at 180 a second with a burst of 200; each delta goes to the UI and back to
    the producer) and the UI ends with the whole text."""
    tokens = [f"t{i} " for i in range(1500)]
    async with (
        connect(hub.url, "fast", client="worker") as worker,
        connect(hub.url, "fast", client="ui") as ui,
    ):
        async with worker.draft() as d:
            started = time.monotonic()
            for token in tokens:
                d.append(token)
                await anyio.lowlevel.checkpoint()  # the worker's sender may run after each
            await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == "".join(tokens))
            elapsed = time.monotonic() - started
            relayed = hub.metrics.draft_deltas_relayed
    assert 2 < relayed <= 2 * (200 + 180 * elapsed + 2), (relayed, elapsed)
    assert relayed < 2 * len(tokens), (relayed, elapsed)


async def test_tail_draws_a_draft_growing_under_the_last_message_and_who_is_online(
    hub: Hub,
) -> None:
    """`convsync tail` on a terminal redraws with the draft's text so far under the last
    entry, and a line of who is online with their status."""
    out = io.StringIO()
    async with (
        connect(hub.url, "tailed", client="worker", kind="agent", draft_interval=0) as worker,
        connect(hub.url, "tailed", client="viewer") as viewer,
    ):
        worker.conversation.push(Message.user("hello?"))
        await worker.flush()
        await viewer.wait_for(worker.revision)
        async with anyio.create_task_group() as group:
            group.start_soon(partial(tail, viewer, out, once=False, tty=True))
            async with worker.draft() as d:
                d.append("Hello the")
                await until(lambda: "Hello the▌" in out.getvalue())
                d.append("re, friend")
                await until(lambda: "Hello there, friend▌" in out.getvalue())
                await until(lambda: "worker (agent, drafting)" in out.getvalue())
                screen = last_frame(out.getvalue())
                assert screen[1].startswith("#0   user  hello?")
                assert screen[2] == "...  assistant [worker]  Hello there, friend▌"
                assert screen[3] == "online: viewer · worker (agent, drafting)"
                await d.commit(Message.assistant("Hello there, friend"))
            await until(lambda: "#1   assistant  Hello there, friend" in out.getvalue())
            group.cancel_scope.cancel()


async def test_an_unread_event_queue_holds_one_draft_change_per_draft(hub: Hub) -> None:
    """A UI that reads no events while a draft streams gets one `DraftChanged` for it, not
    one per delta; the text is in `drafts`."""
    async with (
        connect(hub.url, "quiet", client="worker", draft_interval=0) as worker,
        connect(hub.url, "quiet", client="ui") as ui,
    ):
        ui.events_nowait()
        async with worker.draft() as d:
            for token in TOKENS:
                d.append(token)
                await anyio.sleep(0.001)
            await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == FULL)
            changes = [e for e in ui.events_nowait() if isinstance(e, DraftChanged)]
            assert changes == [DraftChanged(d.id)]


async def test_the_draft_caps_are_settings_a_hub_keeps() -> None:
    """`CONVSYNC_DRAFT_MAX_PER_CLIENT`, `..._PER_CONVERSATION` and `..._PARTS` set how many
    drafts a client and a conversation may hold open and how many parts a draft may have:
    one more `open` is refused, one more part aborts the draft."""
    environ = {
        "CONVSYNC_DRAFT_MAX_PER_CLIENT": "1",
        "CONVSYNC_DRAFT_MAX_PER_CONVERSATION": "2",
        "CONVSYNC_DRAFT_MAX_PARTS": "2",
    }
    config = HubConfig.from_env(environ, ping_interval=None)
    async with (
        Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub,
        connect(hub.url, "caps", client="a", draft_interval=0) as a,
        connect(hub.url, "caps", client="b", draft_interval=0) as b,
        connect(hub.url, "caps", client="c", draft_interval=0) as c,
    ):
        first = await a.draft().open()
        first.append("one")
        first.append("hm", part="reasoning")
        await until(lambda: first.id in b.drafts and b.drafts[first.id].reasoning == "hm")
        second = await a.draft().open()  # a client's second draft
        with anyio.fail_after(bound(5)):
            assert await second.wait_ended() == "refused"
        other = await b.draft().open()
        other.append("two")
        await until(lambda: other.id in a.drafts)
        third = await c.draft().open()  # the conversation's third draft
        with anyio.fail_after(bound(5)):
            assert await third.wait_ended() == "refused"
        first.append("{}", part="call:c1", name="weather")  # its third part
        with anyio.fail_after(bound(5)):
            assert await first.wait_ended() == "aborted"
        assert other.status is None and set(c.drafts) == {other.id}
