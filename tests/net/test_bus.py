"""Drafts and presence across hubs (SPEC 9): the pure mirror, then hubs on Redis and on NOTIFY."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from cliproc import Running, run
from conftest import bound, hub_config
from hubprocess import HubProcess

from client import Replica, connect
from client.live import DraftChanged, DraftEnded
from server import Hub, HubConfig
from server.bus import NOTIFY_LIMIT
from server.core import CoreConfig, RoomCore
from server.drafts import DraftBoard, DraftConfig
from server.metrics import Metrics
from server.mirror import (
    BusAsk,
    BusDraft,
    BusEnd,
    BusGrow,
    BusMessage,
    BusPresence,
    Mirror,
    decode_bus,
    pack,
)
from server.presence import PresenceBoard
from server.remote import answer_ask
from server.store import PostgresStore
from sync import Message, UsageError
from sync.protocol import (
    DraftEnd,
    DraftOp,
    DraftState,
    PresenceDiff,
    PresenceEntry,
    decode_hub_message,
)

TOKENS = [f"tok{i} " for i in range(60)]
FULL = "".join(TOKENS)
META = BusDraft("msg_a", "assistant", "anonymous", "worker", 5)


# ---------------------------------------------------------------------- the pure mirror


def test_the_mirror_applies_remote_deltas_by_offset_once() -> None:
    """A resent or overlapping delta adds only the text the mirror lacks; its own echo is
    ignored."""
    mirror = Mirror("b")
    heard = mirror.receive(BusMessage("a", "c1", [META, BusGrow("msg_a", "text", 0, "hel")]), 1)
    assert [type(change.op) for change in heard.changes] == [BusDraft, BusGrow]
    heard = mirror.receive(BusMessage("a", "c1", [BusGrow("msg_a", "text", 1, "ello")]), 2)
    assert [change.op for change in heard.changes] == [BusGrow("msg_a", "text", 3, "lo")]
    assert (
        mirror.receive(BusMessage("a", "c1", [BusGrow("msg_a", "text", 0, "he")]), 3).changes == []
    )
    assert (
        mirror.receive(BusMessage("b", "c1", [BusGrow("msg_a", "text", 5, "!")]), 3).changes == []
    )
    assert mirror.text("c1", "msg_a") == "hello"


def test_a_gap_asks_the_producers_hub_once_and_its_snapshot_heals_it() -> None:
    """A delta past the mirror's length asks hub `a` for the draft (once per `ask_again`),
    and the answer (the draft whole) restores every character exactly once."""
    mirror = Mirror("b", ask_again=1000)
    mirror.receive(BusMessage("a", "c1", [META, BusGrow("msg_a", "text", 0, "ab")]), 0)
    heard = mirror.receive(BusMessage("a", "c1", [BusGrow("msg_a", "text", 4, "ef")]), 10)
    assert heard.changes == []
    assert heard.send == [BusMessage("b", "c1", [BusAsk("msg_a")], "a")]
    again = mirror.receive(BusMessage("a", "c1", [BusGrow("msg_a", "text", 6, "g")]), 20)
    assert again.send == [] and again.changes == []
    snapshot = [META, BusGrow("msg_a", "text", 0, "abcdefg")]
    heard = mirror.receive(BusMessage("a", "c1", snapshot), 30)
    assert [change.op for change in heard.changes] == [BusGrow("msg_a", "text", 2, "cdefg")]
    assert mirror.text("c1", "msg_a") == "abcdefg"
    # A delta for a draft never seen open (opened before this hub listened) asks too.
    unknown = mirror.receive(BusMessage("a", "c2", [BusGrow("msg_z", "text", 3, "x")]), 40)
    assert unknown.send == [BusMessage("b", "c2", [BusAsk("msg_z")], "a")]


def test_a_hub_that_stops_heartbeating_loses_its_drafts_and_presence() -> None:
    """`expire` ends every draft of a hub not alive (`timeout`) and drops its presence; the
    drafts and presence of a live hub stay."""
    mirror = Mirror("c")
    entry = PresenceEntry(1, "anonymous", "worker", 5, status="thinking")
    mirror.receive(BusMessage("a", "c1", [META, BusPresence([entry])]), 0)
    other = BusDraft("msg_b", "assistant", "anonymous", "w2", 5)
    mirror.receive(BusMessage("b", "c1", [other, BusPresence([entry])]), 0)
    changes = mirror.expire({"b", "c"})
    assert {(change.hub, type(change.op)) for change in changes} == {
        ("a", BusEnd),
        ("a", BusPresence),
    }
    end = next(change.op for change in changes if isinstance(change.op, BusEnd))
    assert end.status == "timeout" and end.id == "msg_a"
    assert set(mirror.presence["c1"]) == {"b"} and set(mirror.drafts["c1"]) == {"msg_b"}
    assert mirror.expire({"b", "c"}) == []


def test_a_silent_remote_draft_is_asked_for_and_a_gone_one_is_answered_with_its_end() -> None:
    """A mirrored draft nothing was heard of for `after` ms is asked for once (its end may
    have been lost); a hub asked for a draft it does not produce answers with its end, which
    removes the draft from the asker's mirror."""
    mirror = Mirror("b")
    mirror.receive(BusMessage("a", "c1", [META, BusGrow("msg_a", "text", 0, "hi")]), 0)
    assert mirror.silent(29_999, 30_000) == []
    assert mirror.silent(30_000, 30_000) == [BusMessage("b", "c1", [BusAsk("msg_a")], "a")]
    assert mirror.silent(30_001, 30_000) == []
    producer: RoomCore[str] = RoomCore("c1", CoreConfig(max_frame=1 << 20))
    answer = answer_ask(producer, "msg_a")
    assert answer == [BusEnd("msg_a", "aborted", "the producer's hub does not hold it")]
    heard = mirror.receive(BusMessage("a", "c1", answer), 30_002)
    assert [change.op for change in heard.changes] == answer
    assert mirror.drafts == {}


def test_packed_payloads_fit_notify_and_rebuild_the_text_exactly() -> None:
    """A long delta with escapes and wide characters splits into payloads under NOTIFY's
    limit, and a mirror fed them holds exactly the text."""
    text = "".join(f'é"\n\x01 🙂{i}\\' for i in range(3000))
    payloads = pack("a", "c1", [META, BusGrow("msg_a", "text", 0, text, None)], NOTIFY_LIMIT)
    assert len(payloads) > 5
    assert all(len(payload) <= NOTIFY_LIMIT for payload in payloads)
    mirror = Mirror("b")
    for payload in payloads:
        message = decode_bus(payload)
        assert message is not None
        mirror.receive(message, 0)
    assert mirror.text("c1", "msg_a") == text
    assert decode_bus(b'{"conversation": 3}') is None


def board() -> DraftBoard[str]:
    return DraftBoard(
        DraftConfig(interval=0, timeout=1000, grace=100, relay=True), Metrics(), 1 << 20
    )


def test_a_foreign_draft_never_times_out_here_and_its_producer_can_take_it_over() -> None:
    """A draft mirrored from another hub outlives this hub's timeout (its own hub decides);
    an append from its owner here is refused `unknown` until the owner opens it, which takes
    it over with the text so far and relays it whole."""
    drafts = board()
    drafts.subscribe("ui")
    drafts.foreign_open("a", META, 0)
    drafts.foreign_grow(BusGrow("msg_a", "text", 0, "so far"), 0)
    assert drafts.tick(10_000) == [] and drafts.next_deadline() is None
    assert drafts.take_relay() == []  # never relayed back
    owner = ("anonymous", "worker")
    refused = drafts.receive("w", owner, DraftOp("msg_a", "append", part="text", text="x"), 1)
    assert [decode_hub_message(out.frame) for out in refused] == [
        DraftEnd("msg_a", "unknown", "the draft is held by another hub")
    ]
    answer = drafts.receive("w", owner, DraftOp("msg_a", "open"), 2)
    assert decode_hub_message(answer[0].frame) == DraftState("msg_a", {"text": 6})
    assert drafts.take_relay() == [
        BusDraft("msg_a", "assistant", "anonymous", "worker", 5),
        BusGrow("msg_a", "text", 0, "so far"),
    ]
    assert drafts.next_deadline() == 2 + 1000  # now this hub's to time out


def test_foreign_presence_joins_changes_and_leaves_under_local_ids() -> None:
    """Another hub's list of sockets shows as presence entries with ids of this board;
    a later list is diffed (a status change, a socket gone), and [] removes them all."""
    presence: PresenceBoard[str] = PresenceBoard(Metrics(), throttle=0)
    presence.join("local", "anonymous", "ui", None, None, 0)
    presence.subscribe("local")
    presence.tick(0)
    remote = [PresenceEntry(1, "anonymous", "w", 5), PresenceEntry(2, "anonymous", "x", 5)]
    presence.set_foreign("a", remote)
    [(_, frame)] = presence.tick(1)
    joined = decode_hub_message(frame)
    assert isinstance(joined, PresenceDiff)
    assert sorted(e.client for e in joined.joined) == ["w", "x"]
    assert {e.connection for e in joined.joined}.isdisjoint({1})  # the local socket's id
    ids = {e.client: e.connection for e in joined.joined}
    presence.set_foreign("a", [PresenceEntry(1, "anonymous", "w", 5, status="thinking")])
    [(_, frame)] = presence.tick(2)
    diff = decode_hub_message(frame)
    assert isinstance(diff, PresenceDiff)
    assert diff.left == [ids["x"]] and [e.status for e in diff.changed] == ["thinking"]
    presence.set_foreign("a", [])
    [(_, frame)] = presence.tick(3)
    assert decode_hub_message(frame) == PresenceDiff([], [ids["w"]], [])
    assert presence.take_relay() == [presence.entries["local"].wire()]


def test_bad_bus_settings_are_refused() -> None:
    """A bus that is not Redis, or a TTL under two heartbeat intervals, is a clear error."""
    with pytest.raises(UsageError, match="redis://"):
        HubConfig(bus="http://nope")
    with pytest.raises(UsageError, match="twice"):
        HubConfig(heartbeat_interval=1.0, heartbeat_ttl=1.5)
    assert HubConfig.from_env({"CONVSYNC_BUS": "redis://r:6379/1"}).bus == "redis://r:6379/1"


# ---------------------------------------------------------------------- hubs on a bus


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """Wait, bounded, until `check()` holds (polling the replicas' state)."""
    with anyio.fail_after(bound(seconds)):
        # A bounded poll of the replicas' state, as a UI's redraw loop would do.
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.005)


@pytest.fixture(params=["redis", "notify"])
def bus(request: pytest.FixtureRequest) -> str | None:
    """The bus under test: a Redis URL, or None for NOTIFY through PostgreSQL."""
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        return url
    return None


@contextlib.asynccontextmanager
async def bus_hubs(
    dsn: str, schema: str, bus: str | None, count: int = 2, **config: Any
) -> AsyncIterator[list[Hub]]:
    """`count` in-process hubs on one schema, relaying drafts and presence over `bus`."""
    settings: dict[str, Any] = {"bus_interval": 0.01, "bus": bus, **config}
    async with contextlib.AsyncExitStack() as stack:
        running = []
        for _ in range(count):
            hub = Hub(PostgresStore(dsn, schema=schema), config=hub_config(**settings))
            running.append(await stack.enter_async_context(hub))
        yield running


def prefixes(ui: Replica, draft_id: str, seen: list[str]) -> Callable[[], None]:
    """Record the draft's text after each event the UI got (to check it only grows)."""

    def look() -> None:
        for event in ui.events_nowait():
            if isinstance(event, DraftChanged) and event.id == draft_id:
                draft = ui.drafts.get(draft_id)
                if draft is not None:
                    seen.append(draft.text)

    return look


async def test_a_draft_through_hub_a_reaches_uis_on_hub_b(
    postgres_dsn: str, pg_schema: str, bus: str | None
) -> None:
    """A worker streams through hub A; a UI on hub B watching from the start and one joining
    hub B mid-draft (its room not loaded yet) both see the text grow to exactly the draft's,
    then one committed message and no draft."""
    async with (
        bus_hubs(postgres_dsn, pg_schema, bus) as (a, b),
        connect(a.url, "streamed", client="worker", draft_interval=0.01) as worker,
        connect(b.url, "streamed", client="early") as early,
        worker.draft() as d,
    ):
        seen: list[str] = []
        look = prefixes(early, d.id, seen)
        for i, token in enumerate(TOKENS[:30]):
            d.append(token)
            if i == 0:
                # The first delta reaches B before the rest is written, so the text grows in
                # place there; without this wait a loaded machine could coalesce the first 30
                # tokens into one delta, and "grew in place" would measure the scheduler.
                await until(lambda: d.id in early.drafts and bool(early.drafts[d.id].text))
            await anyio.sleep(0.002)
            look()
        half = "".join(TOKENS[:30])
        await until(lambda: d.id in early.drafts and early.drafts[d.id].text == half)
        async with connect(b.url, "streamed", client="late") as late:
            assert late.drafts[d.id].text == half  # the text so far, with the snapshot
            for token in TOKENS[30:]:
                d.append(token)
                await anyio.sleep(0.002)
                look()
            for ui in (early, late):
                await until(lambda ui=ui: d.id in ui.drafts and ui.drafts[d.id].text == FULL)  # type: ignore[misc]
            look()
            assert seen[-1] == FULL and all(FULL.startswith(text) for text in seen)
            assert any(len(text) < len(half) for text in seen)  # it grew in place on B
            await d.commit(Message.assistant(FULL))
            await worker.flush()
            for ui in (early, late):
                await until(lambda ui=ui: not ui.drafts and len(ui.conversation) == 1)  # type: ignore[misc]
                assert list(ui.conversation.messages()) == [Message.assistant(FULL)]


async def test_a_ui_joining_hub_b_mid_draft_gets_the_text_so_far(
    postgres_dsn: str, pg_schema: str, bus: str | None
) -> None:
    """No UI on hub B until the draft is half written: the first one to join gets the text
    so far from B's mirror, then the rest, none of it twice."""
    async with (
        bus_hubs(postgres_dsn, pg_schema, bus) as (a, b),
        connect(a.url, "midway", client="worker", draft_interval=0.01) as worker,
        worker.draft() as d,
    ):
        for token in TOKENS[:40]:
            d.append(token)
        await worker.flush()
        async with connect(a.url, "midway", client="witness") as witness:
            await until(lambda: witness.drafts[d.id].text == "".join(TOKENS[:40]))
        await anyio.sleep(0.05)  # B's mirror has it by now (the witness saw A relay it)
        async with connect(b.url, "midway", client="late") as late:
            assert d.id in late.drafts
            assert FULL.startswith(late.drafts[d.id].text)
            for token in TOKENS[40:]:
                d.append(token)
            await until(lambda: late.drafts[d.id].text == FULL)


async def test_a_hub_started_mid_draft_learns_it_from_the_producers_hub(
    postgres_dsn: str, pg_schema: str, bus: str | None
) -> None:
    """Hub B starts while a draft streams through hub A: B asks every hub for its state as it
    starts listening, so a UI on B sees the text so far and then the rest."""
    async with (
        bus_hubs(postgres_dsn, pg_schema, bus, 1) as (a,),
        connect(a.url, "started", client="worker", draft_interval=0.01) as worker,
        worker.draft() as d,
    ):
        d.append(FULL[:100])
        await worker.flush()
        async with (
            bus_hubs(postgres_dsn, pg_schema, bus, 1) as (b,),
            connect(b.url, "started", client="ui") as ui,
        ):
            await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == FULL[:100])
            d.append(FULL[100:])
            await until(lambda: ui.drafts[d.id].text == FULL)


async def test_a_message_lost_on_the_bus_is_asked_for_again(
    postgres_dsn: str, pg_schema: str, bus: str | None
) -> None:
    """Hub A's bus drops some of its messages mid-draft: hub B sees the gap, asks A for the
    draft, and its UI ends with exactly the draft's text."""
    async with (
        bus_hubs(postgres_dsn, pg_schema, bus) as (a, b),
        connect(b.url, "lossy", client="ui") as ui,
        connect(a.url, "lossy", client="worker", draft_interval=0.01) as worker,
        worker.draft() as d,
    ):
        d.append(TOKENS[0])
        await until(lambda: d.id in ui.drafts)
        relay = a._relay
        assert relay is not None
        publish = relay.bus.publish
        calls = 0

        async def lossy(payloads: list[bytes]) -> None:
            nonlocal calls
            calls += 1
            if calls in (2, 3):
                return  # lost
            await publish(payloads)

        relay.bus.publish = lossy  # type: ignore[method-assign]
        for token in TOKENS[1:]:
            d.append(token)
            await anyio.sleep(0.004)
        await until(lambda: ui.drafts[d.id].text == FULL)
        assert calls > 3


async def test_deltas_cross_the_bus_coalesced_per_interval_not_one_per_token(
    postgres_dsn: str, pg_schema: str, bus: str | None
) -> None:
    """A producer sending every token at once (no replica throttle): hub A publishes at most
    one bus message per `bus_interval` for the conversation, and B still gets every token."""
    async with (
        bus_hubs(postgres_dsn, pg_schema, bus, bus_interval=0.05) as (a, b),
        connect(b.url, "coalesced", client="ui") as ui,
        connect(a.url, "coalesced", client="worker", draft_interval=0) as worker,
        worker.draft() as d,
    ):
        relay = a._relay
        assert relay is not None
        publish = relay.bus.publish
        sent: list[int] = []

        async def counted(payloads: list[bytes]) -> None:
            sent.append(len(payloads))
            await publish(payloads)

        relay.bus.publish = counted  # type: ignore[method-assign]
        started = time.monotonic()
        for token in TOKENS * 3:
            d.append(token)
            await anyio.sleep(0.002)
        elapsed = time.monotonic() - started
        await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == FULL * 3)
        assert sum(sent) <= elapsed / 0.05 + 3 < len(TOKENS) * 3


async def test_presence_on_hub_a_shows_on_hub_b(
    postgres_dsn: str, pg_schema: str, bus: str | None
) -> None:
    """A worker connected to hub A appears in the presence of a UI on hub B, with its status;
    when it leaves, it is gone there too."""
    async with (
        bus_hubs(postgres_dsn, pg_schema, bus) as (a, b),
        connect(b.url, "here", client="ui") as ui,
    ):
        async with connect(a.url, "here", client="worker", kind="agent") as worker:
            await until(lambda: "worker" in ui.presence, 2)
            assert ui.presence["worker"].kind == "agent"
            await worker.set_status("thinking", {"step": 1})
            await until(lambda: ui.presence["worker"].status == "thinking", 2)
            assert ui.presence["worker"].detail == {"step": 1}
        await until(lambda: "worker" not in ui.presence, 2)
        assert set(ui.presence) == {"ui"}


async def test_a_publish_that_fails_is_sent_again(
    postgres_dsn: str, pg_schema: str, bus: str | None
) -> None:
    """Hub A's bus refuses a publish (a Redis or PostgreSQL hiccup): what it held is sent on
    the next try, so a status set at that moment still shows on hub B."""
    async with (
        bus_hubs(postgres_dsn, pg_schema, bus) as (a, b),
        connect(b.url, "retried", client="ui") as ui,
        connect(a.url, "retried", client="worker") as worker,
    ):
        await until(lambda: "worker" in ui.presence, 2)
        relay = a._relay
        assert relay is not None
        publish = relay.bus.publish
        failed = 0

        async def flaky(payloads: list[bytes]) -> None:
            nonlocal failed
            if failed < 2:
                failed += 1
                raise ConnectionError("the bus is down")
            await publish(payloads)

        relay.bus.publish = flaky  # type: ignore[method-assign]
        await worker.set_status("thinking")
        await until(lambda: ui.presence["worker"].status == "thinking", 3)
        assert failed == 2


async def test_a_hub_killed_mid_draft_ends_its_draft_on_other_hubs(
    postgres_dsn: str, pg_schema: str, bus: str | None
) -> None:
    """`kill -9` of the worker's hub mid-draft: a UI on another hub sees `draft_end timeout`
    within the heartbeat TTL, and the worker's presence goes."""
    ttl, interval = 1.0, 0.2
    env = {
        "CONVSYNC_HEARTBEAT_TTL": str(ttl),
        "CONVSYNC_HEARTBEAT_INTERVAL": str(interval),
        "CONVSYNC_DRAFT_INTERVAL": "0.01",
    }
    if bus is not None:
        env["CONVSYNC_BUS"] = bus
    process = HubProcess(f"{postgres_dsn}?schema={pg_schema}", env)
    process.start()
    try:
        async with (
            bus_hubs(
                postgres_dsn, pg_schema, bus, 1, heartbeat_ttl=ttl, heartbeat_interval=interval
            ) as (b,),
            connect(b.url, "killed", client="ui") as ui,
            connect(process.url, "killed", client="worker", draft_interval=0.01) as worker,
        ):
            d = worker.draft()
            await d.open()
            d.append("half an answer")
            await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == "half an answer")
            await until(lambda: "worker" in ui.presence, 2)
            ui.events_nowait()
            process.kill()
            killed = time.monotonic()
            await until(lambda: d.id not in ui.drafts, ttl + 3)
            took = time.monotonic() - killed
            ended = [e for e in ui.events_nowait() if isinstance(e, DraftEnded) and e.id == d.id]
            assert [e.status for e in ended] == ["timeout"]
            assert took < ttl + bound(0.3)  # within the TTL, plus the test's own polling
            await until(lambda: "worker" not in ui.presence, 1)
    finally:
        process.stop()


async def test_convsync_serve_bus_relays_drafts_to_another_hub(
    postgres_dsn: str, pg_schema: str, redis_url: str
) -> None:
    """`convsync serve --db postgresql://... --bus redis://...`: a draft streamed through
    that process reaches a UI on another hub of the same database and bus."""
    db = f"{postgres_dsn}?schema={pg_schema}"
    serving = Running("serve", "--db", db, "--port", "0", "--bus", redis_url)
    try:
        url = await anyio.to_thread.run_sync(serving.url)
        async with (
            bus_hubs(postgres_dsn, pg_schema, redis_url, 1) as (b,),
            connect(b.url, "cli", client="ui") as ui,
            connect(url, "cli", client="worker", draft_interval=0.01) as worker,
            worker.draft() as d,
        ):
            d.append("through the cli hub")
            await until(lambda: d.id in ui.drafts and ui.drafts[d.id].text == "through the cli hub")
    finally:
        code, err = serving.stop()
        assert code == 0, err


def test_convsync_serve_refuses_a_bus_that_is_not_redis(capsys: pytest.CaptureFixture[str]) -> None:
    """`--bus` takes a redis:// URL; anything else exits 2 with the reason, serving nothing."""
    code, out, err = run(capsys, "serve", "--db", ":memory:", "--bus", "http://nope")
    assert code == 2 and out == ""
    assert "redis://" in err
