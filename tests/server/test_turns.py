"""Turns end (SPEC 10): a turn's owner, parked turns, and leases that let any hub finish a turn
whose worker went away, on the hub's real core and stores."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from fakelink import CONVERSATION, NOW, FakeHub, Link, run_now, settle

from client.session import ReplicaSession
from server.store import (
    ClientMark,
    Lease,
    LeaseChange,
    LogMoved,
    LogStore,
    MemoryStore,
    SeqTaken,
    StoreError,
)
from sync import (
    Aside,
    AsideChange,
    Assistant,
    Author,
    Conversation,
    Halt,
    Message,
    Stop,
    Text,
    ToolCall,
    TurnEnd,
    TurnOwner,
    User,
)
from sync.approvals import ask_value, parked
from sync.entries import Failed, Stopped
from sync.errors import Unavailable
from sync.ids import default_minter
from sync.protocol import DraftOp
from sync.steer import STEP_KIND, STOP_KIND, WENT_AWAY, step_value, turn_owner

CALL = Assistant([Text("looking"), ToolCall("c1", "search", {"q": "x"})])
RESULT = Message.tool_result("c1", "search", "found")

WORKER = TurnOwner("anonymous", "worker")


def _asked() -> Conversation:
    conversation = Conversation()
    conversation.push(Message.user("find x"))
    return conversation


# ---------------------------------------------------------------------- the pure rules


def test_the_open_turn_names_its_owner_until_it_ends() -> None:
    """`turn_owner` is who runs the open turn, and nobody once it ended."""
    conversation = _asked()
    assert turn_owner(conversation) is None
    conversation.open_turn(WORKER)
    assert turn_owner(conversation) == WORKER
    conversation.push(Message.assistant("x"))
    conversation.end_turn(TurnEnd.answered(None))
    assert turn_owner(conversation) is None
    assert conversation.turns()[-1][1].owner == WORKER  # the ended record keeps it


def test_a_turn_record_without_an_owner_encodes_as_before() -> None:
    """A turn opened with no owner has the three fields it always had (old logs unchanged)."""
    conversation = _asked()
    conversation.open_turn()
    [(_, aside)] = conversation.asides()
    assert set(aside.value) == {"index", "start", "end"}


def test_a_turn_waiting_on_an_open_approval_or_a_frontend_tool_is_parked() -> None:
    """Parked: an open approval of the turn, or only frontend tools pending, and no model call."""
    conversation = _asked()
    conversation.open_turn(WORKER)
    assert not parked(conversation)
    conversation.push(Assistant([Text("asking"), ToolCall("c1", "pick_date", {})]))
    assert not parked(conversation)  # a tool the worker runs
    tools = conversation.add_aside(Aside("rig.tools", None, Author.rig(), {"tools": ["pick_date"]}))
    assert parked(conversation)  # only a person's frontend tool is pending
    step = conversation.add_aside(Aside(STEP_KIND, None, Author.rig(), step_value(0, 1)))
    assert not parked(conversation)  # a model call is under way
    conversation.remove_aside(step)
    conversation.remove_aside(tools)
    value = ask_value(turn=0, key="c1", call="c1", asked_by="anonymous", asked_client="worker")
    approval = conversation.add_aside(Aside("rig.approval", None, Author.rig(), value))
    assert parked(conversation)
    conversation.replace_aside(
        approval, Aside("rig.approval", None, Author.rig(), {**value, "state": "approved"})
    )
    assert not parked(conversation)


# ---------------------------------------------------------------------- the stores


@pytest.fixture
async def any_store(backend: Callable[[], LogStore]) -> AsyncIterator[LogStore]:
    async with backend() as made:
        yield made


async def test_a_store_keeps_leases_and_finds_those_due(any_store: LogStore) -> None:
    """Leases are kept per turn, found once due, and a stop's deadline never moves later."""
    store = any_store
    await store.put_lease(Lease("c", 0, "worker", 1_000))
    await store.put_lease(Lease("d", 2, "other", None))  # parked: never due by its own
    assert await store.leases_due(999) == []
    assert await store.leases_due(1_000) == [Lease("c", 0, "worker", 1_000)]
    await store.put_lease(Lease("c", 0, "worker", 5_000))  # renewed
    assert await store.leases_due(4_999) == []
    await store.put_lease(Lease("d", 2, "other", None, stop_expires=3_000))  # a stop stands
    await store.put_lease(Lease("d", 2, "other", None, stop_expires=9_000))  # never later
    assert await store.leases_due(4_999) == [Lease("d", 2, "other", None, 3_000)]
    await store.put_lease(Lease("c", 0, "worker", 1), replace=False)  # a repair: none missing
    assert await store.leases_due(4_999) == [Lease("d", 2, "other", None, 3_000)]
    await store.drop_lease("d", 2)
    await store.drop_lease("d", 2)  # gone already: nothing
    assert await store.leases_due(10_000) == [Lease("c", 0, "worker", 5_000)]


async def test_an_append_and_its_lease_writes_commit_together_or_not_at_all(
    any_store: LogStore,
) -> None:
    """Lease writes given to `append` land in its transaction (SPEC 10): with the records,
    and not at all when the append is refused or fails after its records were written."""
    store = any_store
    opened = LeaseChange(put=Lease("c", 0, "worker", 1_000))
    assert await store.append("c", 7, 0, [b"open"], lease=opened) == 1
    assert await store.leases_due(1_000) == [Lease("c", 0, "worker", 1_000)]
    ended = LeaseChange(put=Lease("c", 1, "worker", 2_000), drop=0)
    with pytest.raises(LogMoved):  # refused: neither the drop nor the put
        await store.append("c", 7, 0, [b"late"], lease=ended)
    await store.append("c", 7, 1, [b"step"], "w", ClientMark(1, 1, 2))
    with pytest.raises(SeqTaken):
        await store.append("c", 7, 2, [b"again"], "w", ClientMark(1, 2, 3), lease=ended)
    assert await store.leases_due(10_000) == [Lease("c", 0, "worker", 1_000)]
    if not isinstance(store, MemoryStore):  # (in memory nothing can fail after the checks)
        # The lease's write fails after the records went in: the records go back out too.
        broken = LeaseChange(put=Lease("c", 1, None, 2_000), drop=0)  # type: ignore[arg-type]
        with pytest.raises(Exception):  # noqa: B017 (the backend's own NOT NULL error)
            await store.append("c", 7, 2, [b"torn"], lease=broken)
        assert await store.read("c", 7, 0) == [b"open", b"step"]
        assert await store.leases_due(10_000) == [Lease("c", 0, "worker", 1_000)]
    assert await store.append("c", 7, 2, [b"next"], lease=ended) == 3
    assert await store.leases_due(10_000) == [Lease("c", 1, "worker", 2_000)]


# ---------------------------------------------------------------------- the core, no sockets

GRACE = 30_000


def _working(
    hub: FakeHub | None = None, *, owner: TurnOwner = WORKER
) -> tuple[FakeHub, Link, Link]:
    """A UI asked; the worker opened a turn it owns and called a tool that has not answered."""
    hub = hub or FakeHub(turn_grace=GRACE)
    ui = hub.link(ReplicaSession("ui"))
    worker = hub.link(ReplicaSession("worker"))
    settle([ui, worker])
    ui.session.local.push(Message.user("find x"))
    settle([ui, worker])
    worker.session.local.open_turn(owner)
    worker.session.local.push(CALL)
    settle([ui, worker])
    return hub, ui, worker


def _due(hub: FakeHub, at: int) -> list[Lease]:
    return run_now(hub.store.leases_due(at))


def _finish_due(hub: FakeHub, at: int) -> None:
    """What a hub's lease loop does at `at`: end every turn whose lease lapsed."""
    for lease in _due(hub, at):
        hub.carry_out(hub.core.finish_expired(lease, at))


def test_an_open_turn_has_a_lease_that_ends_with_it() -> None:
    """Opening a turn writes its lease; ending it drops the lease."""
    hub, ui, worker = _working()
    [lease] = _due(hub, NOW + GRACE)
    assert (lease.turn, lease.owner, lease.expires) == (0, "worker", NOW + GRACE)
    worker.session.local.push(RESULT)
    worker.session.local.push(Message.assistant("found"))
    worker.session.local.end_turn(TurnEnd.answered(None))
    settle([ui, worker])
    assert _due(hub, NOW + 10 * GRACE) == []


def _recording_appends(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every lease change the hub's appends carry, and "put"/"drop" for lease writes on their
    own."""
    store, seen = hub.store, []
    append, put, drop = store.append, store.put_lease, store.drop_lease

    async def appending(*args: Any, lease: LeaseChange | None = None, **kwargs: Any) -> int:
        if lease is not None:
            seen.append(lease)
        return await append(*args, lease=lease, **kwargs)

    async def putting(lease: Lease, *, replace: bool = True) -> None:
        seen.append("put")
        await put(lease, replace=replace)

    async def dropping(conversation_id: str, turn: int) -> None:
        seen.append("drop")
        await drop(conversation_id, turn)

    monkeypatch.setattr(store, "append", appending)
    monkeypatch.setattr(store, "put_lease", putting)
    monkeypatch.setattr(store, "drop_lease", dropping)
    return seen


def test_a_turn_opens_and_ends_with_its_lease_in_the_same_append(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The push that opens a turn carries its lease in its own append, and the push that ends
    it the lease's drop: no lease write of its own that a crash could separate from them."""
    hub = FakeHub(turn_grace=GRACE)
    seen = _recording_appends(hub, monkeypatch)
    hub, ui, worker = _working(hub)
    opened = LeaseChange(put=Lease(CONVERSATION, 0, "worker", NOW + GRACE))
    assert seen == [opened]
    worker.session.local.push(RESULT)
    worker.session.local.push(Message.assistant("found"))
    worker.session.local.end_turn(TurnEnd.answered(None))
    settle([ui, worker])
    assert seen == [opened, LeaseChange(drop=0)]
    assert _due(hub, NOW + 10 * GRACE) == [] and not hub.core.has_open_turn


def test_an_append_that_fails_leaves_no_turn_and_no_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store fails the append that opens a turn: the room keeps no open turn, the store
    no lease (they were one transaction)."""
    hub = FakeHub(turn_grace=GRACE)
    append = hub.store.append

    async def failing(*args: Any, lease: LeaseChange | None = None, **kwargs: Any) -> int:
        if lease is not None:
            raise StoreError("the disk is full")
        return await append(*args, **kwargs)

    monkeypatch.setattr(hub.store, "append", failing)
    with pytest.raises(Unavailable):  # the worker is told; it would reconnect and resend
        _working(hub)
    assert len(hub.log) == 1  # the request only
    assert not hub.core.has_open_turn
    assert _due(hub, NOW + 10 * GRACE) == []


def test_a_lapsed_turn_ends_failed_and_the_request_stays_owed() -> None:
    """The worker went away: the turn ends `failed`, its call answered with an error, no halt."""
    hub, ui, worker = _working()
    worker.cut()
    _finish_due(hub, NOW + GRACE - 1)
    assert len(hub.log) == 3  # not yet
    _finish_due(hub, NOW + GRACE)
    settle([ui])
    conversation = ui.session.local
    result = conversation.messages()[-1]
    assert isinstance(result, User) and result.tool_results()[0].is_error
    assert WENT_AWAY in str(result.tool_results()[0])
    end = conversation.turns()[-1][1].end
    assert isinstance(end, Failed) and end.why == WENT_AWAY
    assert conversation.halted() is None and conversation.awaits_model()
    assert all(record.by == Author.rig() for record in hub.log[3:])
    conversation.validate()
    assert _due(hub, NOW + 10 * GRACE) == []  # the lease went with the turn
    assert conversation == hub.refolded()


def test_a_connected_owner_keeps_its_turn_and_a_stale_one_is_refused() -> None:
    """While the owner is connected its lease is renewed, not lapsed; once a hub ended its
    turn, the old owner's pushes are refused `turn_ended` until it opens a new turn."""
    hub, ui, worker = _working()
    [lease] = _due(hub, NOW + GRACE)
    hub.carry_out(hub.core.finish_expired(lease, NOW + GRACE))
    assert len(hub.log) == 3  # the owner is here: renewed instead
    assert _due(hub, NOW + GRACE) == []
    worker.cut()
    _finish_due(hub, NOW + 2 * GRACE)
    settle([ui])
    # The worker comes back with an answer it made while away: too late.
    worker.session.local.push(RESULT)
    settle([ui, worker])
    assert hub.rejected[-1] == "turn_ended"
    assert worker.session.local == ui.session.local and len(hub.log) == 5
    # It starts over: a new turn is accepted.
    worker.session.local.open_turn(WORKER)
    worker.session.local.push(Message.assistant("x is found"))
    settle([ui, worker])
    assert len(hub.log) == 7 and ui.session.local.messages()[-1] == Message.assistant("x is found")


def test_a_turn_record_naming_another_owner_is_refused() -> None:
    """A connection cannot open a turn in another client's name."""
    hub = FakeHub(turn_grace=GRACE)
    ui = hub.link(ReplicaSession("ui"))
    settle([ui])
    ui.session.local.push(Message.user("find x"))
    ui.session.local.open_turn(TurnOwner("anonymous", "worker"))
    settle([ui])
    assert hub.rejected == ["forbidden"] and hub.log == []


def test_a_stop_not_finished_in_time_is_finished_by_the_hub_with_the_drafts_text() -> None:
    """A stopped turn its worker does not finish within `stop_grace`: the hub finishes it
    `stopped`, keeping the text the worker was streaming as the aborted answer."""
    hub = FakeHub(turn_grace=GRACE, stop_grace=5_000)
    ui = hub.link(ReplicaSession("ui", features=["drafts"]))
    worker = hub.link(ReplicaSession("worker", features=["drafts"]))
    settle([ui, worker])
    ui.session.local.push(Message.user("write a poem"))
    settle([ui, worker])
    worker.session.local.open_turn(WORKER)
    settle([ui, worker])
    draft = default_minter.message_id()
    hub.carry_out(hub.core.draft(worker, DraftOp(draft, "open"), NOW))
    append = DraftOp(draft, "append", part="text", offset=0, text="Roses are red")
    hub.carry_out(hub.core.draft(worker, append, NOW))
    stop = Aside(STOP_KIND, None, Author.user(), step_value(0, NOW))
    ui.session.local.add_aside(stop)
    settle([ui, worker])
    assert ui.session.live.drafts[draft].text == "Roses are red"  # still shown
    assert draft not in worker.session.live.drafts  # its producer was told `stopping`
    more = DraftOp(draft, "append", part="text", offset=13, text=", violets")
    hub.carry_out(hub.core.draft(worker, more, NOW))
    assert hub.core.drafts.text(draft) == "Roses are red"  # no more appends
    _finish_due(hub, NOW + 4_999)
    assert not any(record.by == Author.rig() for record in hub.log[-1:])
    _finish_due(hub, NOW + 5_000)  # the worker is connected, but the stop lapsed
    settle([ui, worker])
    conversation = ui.session.local
    answer = conversation.messages()[-1]
    assert answer == Assistant([Text("Roses are red")], Stop("aborted", "stopped"))
    assert isinstance(conversation.turns()[-1][1].end, Stopped)
    assert conversation.halted() is Halt.STOPPED
    assert not any(aside.kind == STOP_KIND for _, aside in conversation.asides())


def test_a_parked_turn_does_not_lapse_while_its_owner_is_away() -> None:
    """A turn waiting only for a person (a frontend tool) is kept, its lease parked."""
    hub = FakeHub(turn_grace=GRACE)
    ui = hub.link(ReplicaSession("ui"))
    worker = hub.link(ReplicaSession("worker"))
    settle([ui, worker])
    ui.session.local.push(Message.user("pick a date"))
    settle([ui, worker])
    local = worker.session.local
    local.open_turn(WORKER)
    local.add_aside(Aside("rig.tools", None, Author.rig(), {"tools": ["pick_date"]}))
    local.push(Assistant([ToolCall("c1", "pick_date", {})]))
    settle([ui, worker])
    worker.cut()
    assert _due(hub, NOW + 100 * GRACE) == []  # parked: never due
    revision = len(hub.log)
    ui.session.local.push(Message.tool_result("c1", "pick_date", "tomorrow"))  # the person
    settle([ui])
    assert _due(hub, NOW + GRACE)  # unparked: the clock runs again
    _finish_due(hub, NOW + GRACE)
    assert len(hub.log) == revision + 2  # the result, then the turn ended failed
    assert isinstance(hub.conversation.turns()[-1][1].end, Failed)


def test_of_two_hubs_finishing_one_lapsed_turn_exactly_one_does() -> None:
    """Two hubs sharing a store both find the lapsed lease: one append, the other folds it."""
    first, ui, worker = _working()
    second = FakeHub(store=first.store, turn_grace=GRACE)
    second.carry_out(second.core.log_moved(NOW))  # it has heard of everything so far
    other = second.link(ReplicaSession("other-ui"))
    settle([other])
    worker.cut()
    [lease] = _due(first, NOW + GRACE)
    second.carry_out(second.core.finish_expired(lease, NOW + GRACE))
    first.carry_out(first.core.finish_expired(lease, NOW + GRACE))
    log = first.log
    ended = [
        r
        for r in log
        if type(r.change) is AsideChange
        and r.change.aside is not None
        and r.change.aside.kind == "rig.turn"
        and r.change.aside.value.get("end")
    ]
    assert len(ended) == 1 and len(log) == 5
    settle([ui, other])
    assert ui.session.local == other.session.local == first.conversation == second.conversation
    assert _due(first, NOW + 10 * GRACE) == []


# ---------------------------------------------------------------------- who stops (auth)


def test_with_auth_welcome_names_the_sub_and_a_stop_must_name_it_too() -> None:
    """The hub tells a replica its `sub`; a stop request whose author names another user is
    refused `forbidden` (checked, never overwritten), one naming the token's user lands."""
    from server.auth import Grant
    from server.core import AppendRecords, CoreConfig, RoomCore, Send
    from sync import ChangeRecord, Lineage
    from sync.protocol import Hello, PushBatch, Reject, Welcome, decode_hub_message

    room: RoomCore[str] = RoomCore("c", CoreConfig(max_frame=1 << 20, auth=True))
    room.load(None)
    alice = Grant("alice", frozenset({"read", "write"}), ("*",), exp=NOW / 1000 + 600)
    actions = room.join("a", Hello("ui", Lineage.EMPTY, 0), NOW, alice)
    [welcome] = [decode_hub_message(a.frame) for a in actions if isinstance(a, Send)]
    assert isinstance(welcome, Welcome) and welcome.sub == "alice"

    def stop_by(name: str, seq: int) -> list[object]:
        aside = Aside(STOP_KIND, None, Author("user", name=name), step_value(None, NOW))
        put = ChangeRecord(AsideChange(f"aside_01a2345e1bff7387848aaba78257{seq:04d}", aside))
        return room.push("a", PushBatch(seq, room.lineage, room.revision, [put]), NOW)

    [refused] = [decode_hub_message(a.frame) for a in stop_by("mallory", 1) if isinstance(a, Send)]
    assert isinstance(refused, Reject) and refused.reason == "forbidden"
    assert isinstance(stop_by("alice", 2)[-1], AppendRecords)
