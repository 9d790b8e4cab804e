"""The hub's rules in `RoomCore`, without sockets, store or event loop: actions out."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import server.actions
import server.roomlog
from server.core import (
    SNAPSHOT_SPAN,
    AppendRecords,
    Broadcast,
    Close,
    CoreConfig,
    LoadLog,
    Raise,
    ReadRecords,
    RewriteLog,
    RoomCore,
    Send,
    SendFrames,
    WriteSnapshot,
    deliver,
)
from server.roomlog import STATE_CACHE_MS
from server.store import ClientMark, Loaded, LogMoved, SeqTaken, StoreError
from sync import (
    Assistant,
    Author,
    ChangeRecord,
    Conversation,
    Lineage,
    Message,
    Push,
    Reset,
    Splice,
    Stop,
    ToolCall,
    decode_state,
    encode,
)
from sync.entries import Entry
from sync.frames import MIN_FRAME
from sync.protocol import (
    Ack,
    Hello,
    HubMessage,
    PushBatch,
    Records,
    Reject,
    State,
    Welcome,
    decode_hub_message,
)

NOW = 1_700_000_000_000


def core(**config: Any) -> RoomCore[str]:
    room: RoomCore[str] = RoomCore("c", CoreConfig(**{"max_frame": 1 << 20, **config}))
    room.load(None)
    return room


def record(text: str) -> ChangeRecord:
    """A push record of one user message, with a fresh id."""
    maker = Conversation()
    maker.push(Message.user(text))
    [made] = maker.take_unsaved()
    return made


def frames_to(actions: list[Any], conn: str) -> list[HubMessage]:
    """The messages `conn` is sent by `actions`, decoded, in order."""
    out = []
    for action in actions:
        if isinstance(action, Send) and action.to == conn:
            out.append(decode_hub_message(action.frame))
        elif isinstance(action, Broadcast) and conn in action.to:
            out.append(decode_hub_message(action.frame))
        elif isinstance(action, SendFrames) and action.to == conn:
            out += [decode_hub_message(frame) for frame in action.frames]
    return out


def fresh_state(room: RoomCore[str], conn: str, now: int = NOW) -> list[Any]:
    """The encoded state frames a fresh replica `conn` joining `room` is sent (after the
    welcome), whether encoded already (`Send`) or as they are written (`SendFrames`)."""
    frames: list[Any] = []
    for action in room.join(conn, Hello(conn, Lineage.EMPTY, 0), now):
        if isinstance(action, Send) and action.to == conn:
            frames.append(action.frame)
        elif isinstance(action, SendFrames) and action.to == conn:
            frames += list(action.frames)
    return frames[1:]


def joined(room: RoomCore[str], *conns: str) -> None:
    for conn in conns:
        actions = room.join(conn, Hello(conn, room.lineage, room.revision))
        assert isinstance(frames_to(actions, conn)[0], Welcome)


def land(room: RoomCore[str], conn: str, seq: int, *texts: str) -> list[Any]:
    """Push `texts` from `conn` at the room's head and let the store accept it."""
    batch = PushBatch(seq, room.lineage, room.revision, [record(t) for t in texts])
    actions = room.push(conn, batch, NOW)
    call = actions[-1]
    assert isinstance(call, AppendRecords)
    return room.resume(call.from_ + len(call.records))


def test_accepted_push_is_appended_with_the_mark_then_acked_and_broadcast() -> None:
    """A push on the head asks the store to append it with the client's mark, then acks the
    pusher and broadcasts to everyone else, never echoing the records to the pusher."""
    room = core()
    joined(room, "a", "b")
    batch = PushBatch(1, room.lineage, 0, [record("hi")])
    actions = room.push("a", batch, NOW)
    assert actions == [actions[-1]] and room.waiting
    call = actions[-1]
    assert isinstance(call, AppendRecords)
    assert (call.client, call.mark) == ("a", ClientMark(1, 0, 1))
    assert msgspec.json.decode(call.records[0])["at"] == NOW  # stamped by the hub
    after = room.resume(1)
    assert frames_to(after, "a") == [Ack(1, 0, 1)]
    [records] = frames_to(after, "b")
    assert isinstance(records, Records) and records.origin is not None
    assert (records.from_, records.origin.client) == (0, "a")
    assert room.revision == 1 and not room.waiting


def test_a_snapshot_is_encoded_after_the_ack_and_records_of_the_push_that_asked_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The push that reaches `snapshot_every` gets its ack and its records out first; the
    whole conversation is encoded only when the snapshot call is carried out, and then as
    it was when the core asked for it."""
    room = core(snapshot_every=3)
    joined(room, "a", "b")
    land(room, "a", 1, "one", "two")
    order: list[str] = []
    encode_now = server.actions.encode

    def encoding(value: object) -> bytes:
        if isinstance(value, Conversation):
            order.append("state encoded")
        return encode_now(value)

    monkeypatch.setattr(server.actions, "encode", encoding)
    after = land(room, "a", 2, "three")
    call = deliver(after, lambda to, frame, _: order.append(f"frame to {to}"), _no_close)
    assert order == ["frame to a", "frame to b"]  # the ack, then the records
    assert isinstance(call, WriteSnapshot) and (call.lineage, call.revision) == (room.lineage, 3)
    assert decode_state(call.data()) == room.conversation
    assert order[-1] == "state encoded"


def _snapshot_asked(actions: list[Any]) -> WriteSnapshot | None:
    return actions[-1] if actions and isinstance(actions[-1], WriteSnapshot) else None


def test_a_snapshot_waits_until_the_records_after_the_last_one_outweigh_it() -> None:
    """`snapshot_every` records are not enough once the conversation is large: the records
    since the latest snapshot must also weigh as much as it did, so that the cost of writing
    snapshots per record stays about the size of a record however long the conversation."""
    room = core(snapshot_every=2)
    joined(room, "a")
    assert _snapshot_asked(land(room, "a", 1, "x" * 100)) is None
    first = _snapshot_asked(land(room, "a", 2, "y" * 100))
    assert first is not None  # no snapshot yet: the first comes after `snapshot_every`
    weight = len(first.data())
    assert room.resume(weight) == []
    # Records of ~150 bytes each: past `snapshot_every`, but lighter than the snapshot.
    since, pushes = 0, 0
    while True:
        batch = PushBatch(3 + pushes, room.lineage, room.revision, [record("z" * 40)])
        call = room.push("a", batch, NOW)[-1]
        assert isinstance(call, AppendRecords)
        before = since
        since += sum(map(len, call.records))
        pushes += 1
        actions = room.resume(call.from_ + len(call.records))
        if _snapshot_asked(actions) is not None:
            break
        assert since < weight  # not due while lighter
    assert before < weight <= since and pushes > 2  # due the push it weighs as much
    assert decode_state(actions[-1].data()) == room.conversation


def _heavy(*texts: str) -> list[bytes]:
    maker = Conversation()
    for text in texts:
        maker.push(Message.user(text))
    return [encode(made) for made in maker.take_unsaved()]


def test_a_loaded_room_weighs_the_records_after_its_snapshot() -> None:
    """After a load, the snapshot it came from and the records after it count as if this
    room had written them: a tail heavier than the snapshot makes the next push due, a tail
    lighter than it does not, though either push alone is lighter than the snapshot."""
    lineage = Lineage.fresh()
    state = Conversation()
    state.push(Message.user("s" * 500))
    snapshot = encode(state)
    for tail, due in ((_heavy("t" * 1000), True), (_heavy("t" * 10), False)):
        room: RoomCore[str] = RoomCore("c", CoreConfig(max_frame=1 << 20, snapshot_every=1))
        room.load(Loaded(lineage, 2, snapshot, 1, tail, {}))
        joined(room, "a")
        assert (_snapshot_asked(land(room, "a", 1, "d")) is not None) is due


def test_records_another_hub_appended_count_toward_the_next_snapshot() -> None:
    """Records forwarded from a store other hubs share weigh like the room's own appends."""
    room = core(snapshot_every=1)
    joined(room, "a")
    first = _snapshot_asked(land(room, "a", 1, "s" * 500))
    assert first is not None
    assert room.resume(len(first.data())) == []
    # Another hub appended a heavy record: the room reads and forwards it...
    read = room.log_moved()[-1]
    assert isinstance(read, ReadRecords)
    room.resume(_heavy("t" * 1000))
    # ...so a light push of this room's own is enough for the next snapshot.
    assert _snapshot_asked(land(room, "a", 2, "d")) is not None


def test_a_snapshot_comes_after_a_span_of_records_however_light() -> None:
    """Records cheap to store may be dear to fold (a splice near the start shifts every entry
    after it), so `SNAPSHOT_SPAN` x `snapshot_every` records bring a snapshot regardless."""
    room = core(snapshot_every=2)
    joined(room, "a")
    land(room, "a", 1, "s" * 5000)
    first = _snapshot_asked(land(room, "a", 2, "s" * 5000))
    assert first is not None
    assert room.resume(len(first.data())) == []
    asked = [_snapshot_asked(land(room, "a", seq, "x")) for seq in range(3, 3 + 2 * SNAPSHOT_SPAN)]
    assert asked[-1] is not None and not any(asked[:-1])  # light, but the span is reached


def _no_close(to: str, code: str, detail: str) -> None:
    raise AssertionError(f"closed {to}: {code} {detail}")


def test_records_go_to_exactly_the_connections_joined_at_the_time() -> None:
    """Every push reaches every other connection joined then: one that joined after an earlier
    push gets the later ones, one that left gets nothing more."""
    room = core()

    def reached(actions: list[Any]) -> list[int]:
        return [len(frames_to(actions, conn)) for conn in "abc"]  # the ack counts for the pusher

    joined(room, "a", "b")
    assert reached(land(room, "a", 1, "one")) == [1, 1, 0]
    joined(room, "c")
    assert reached(land(room, "a", 2, "two")) == [1, 1, 1]
    room.leave("b")
    assert reached(land(room, "a", 3, "three")) == [1, 0, 1]
    assert reached(land(room, "c", 1, "four")) == [1, 0, 1]


def test_resend_of_a_landed_push_gets_its_ack_and_appends_nothing() -> None:
    """The same seq again is answered with the first ack, with no store call."""
    room = core()
    joined(room, "a")
    land(room, "a", 1, "once")
    again = room.push("a", PushBatch(1, room.lineage, 0, [record("once")]), NOW)
    assert frames_to(again, "a") == [Ack(1, 0, 1)]
    assert not any(isinstance(action, AppendRecords) for action in again)
    assert len(room.conversation) == 1


def test_stale_push_is_rejected_behind_and_changes_nothing() -> None:
    """A push made on an older revision is rejected `behind`; nothing is folded."""
    room = core()
    joined(room, "a", "b")
    land(room, "a", 1, "first")
    before = room.conversation.copy()
    actions = room.push("b", PushBatch(1, room.lineage, 0, [record("late")]), NOW)
    [reject] = frames_to(actions, "b")
    assert isinstance(reject, Reject) and (reject.reason, reject.revision) == ("behind", 1)
    assert room.conversation == before and not room.waiting


def test_push_on_another_lineage_is_rejected_and_gets_the_state() -> None:
    """A push made on a rewritten log's old lineage: `reject lineage`, then the state."""
    room = core()
    joined(room, "a")
    land(room, "a", 1, "x")
    actions = room.push("a", PushBatch(2, Lineage.fresh(), 1, [record("y")]), NOW)
    reject, state = frames_to(actions, "a")
    assert isinstance(reject, Reject) and reject.reason == "lineage"
    assert isinstance(state, State) and state.revision == 1


def test_invalid_and_strict_pairing_pushes_are_rejected_and_leave_no_trace() -> None:
    """A record that does not fit, and a result answering no call, are `invalid`; the
    conversation is exactly as before (the batch is undone)."""
    room = core()
    joined(room, "a")
    land(room, "a", 1, "x")
    before = room.conversation.copy()
    held = room.conversation.id(0)
    assert held is not None
    refit = ChangeRecord(Push([Entry(Message.user("dup"), id=held)]))
    maker = Conversation()
    maker.push(Message.tool_result("nope", "t", "r"))
    [orphan] = maker.take_unsaved()
    for seq, records in ((2, [record("ok"), refit]), (3, [record("ok"), orphan])):
        actions = room.push("a", PushBatch(seq, room.lineage, 1, records), NOW)
        [reject] = frames_to(actions, "a")
        assert isinstance(reject, Reject) and reject.reason == "invalid"
        assert room.conversation == before and room.revision == 1


def test_a_push_reusing_a_tool_call_id_is_rejected_invalid_and_leaves_no_trace() -> None:
    """Strict pairing: a turn whose call takes an id an earlier call of the conversation
    used is `invalid` with a reason naming the id; nothing is folded, stored or broadcast.
    The same turn with an id of its own lands, and a hub without strict pairing takes it."""

    def records_of(*messages: Any) -> list[ChangeRecord]:
        maker = Conversation()
        maker.extend(messages)
        return maker.take_unsaved()

    def turn(call_id: str) -> list[ChangeRecord]:
        call = Assistant([ToolCall(call_id, "weather", {"city": "Lisbon"})], Stop("tool_use"))
        return records_of(call, Message.tool_result(call_id, "weather", "18°C"))

    for strict in (True, False):
        room = core(strict_pairing=strict)
        joined(room, "a", "b")
        land(room, "a", 1, "weather?")
        first = room.push("a", PushBatch(2, room.lineage, 1, turn("c1")), NOW)
        assert isinstance(first[-1], AppendRecords)
        room.resume(2)
        before = room.conversation.copy()
        actions = room.push(
            "a", PushBatch(3, room.lineage, 2, [record("again?"), *turn("c1")]), NOW
        )
        if not strict:
            assert isinstance(actions[-1], AppendRecords)
            continue
        [reject] = frames_to(actions, "a")
        assert isinstance(reject, Reject) and reject.reason == "invalid"
        assert reject.detail == (
            "strict pairing: tool call 'c1' of message 4 reuses the id of an earlier call; "
            "each call needs an id of its own"
        )
        assert not frames_to(actions, "b")
        assert not any(isinstance(action, AppendRecords) for action in actions)
        assert room.conversation == before and room.revision == 2
        fresh = room.push("a", PushBatch(4, room.lineage, 2, [record("again?"), *turn("c2")]), NOW)
        assert isinstance(fresh[-1], AppendRecords)


def test_a_splice_or_a_reset_bringing_no_pairing_message_is_still_checked_for_pairing() -> None:
    """Strict pairing looks at a splice or a reset whatever entries it brings (the hub skips
    it only for pushes holding no pairing message): a splice that takes a call out from
    under its result, and a reset to a state with an orphan result, are `invalid`."""
    room = core()
    joined(room, "a", "b")
    land(room, "a", 1, "weather?")
    maker = Conversation()
    call = Assistant([ToolCall("c1", "weather", {"city": "Lisbon"})], Stop("tool_use"))
    maker.extend([call, Message.tool_result("c1", "weather", "18°C")])
    room.push("a", PushBatch(2, room.lineage, room.revision, maker.take_unsaved()), NOW)
    room.resume(2)
    edit = room.conversation.copy()
    edit.splice(slice(1, 2), [], Author.plugin("s"))  # the call goes, its result stays
    [splice] = edit.take_unsaved()
    orphan = Conversation.from_messages([Message.user("x"), Message.tool_result("c9", "t", "r")])
    reset = ChangeRecord(Reset(orphan.state()), Author.rig(), NOW)
    before = room.conversation.copy()
    for seq, bad, call_id in ((3, splice, "c1"), (4, reset, "c9")):
        actions = room.push("a", PushBatch(seq, room.lineage, room.revision, [bad]), NOW)
        [reject] = frames_to(actions, "a")
        assert isinstance(reject, Reject) and reject.reason == "invalid"
        assert reject.detail.startswith(f"strict pairing: tool result '{call_id}'")
        assert room.conversation == before and room.revision == 2


def test_catch_up_by_records_by_state_and_from_the_store() -> None:
    """A replica behind gets the missing records; a fresh one a state when that is smaller;
    one behind the in-memory tail waits for a store read, and a gone log gives the state."""
    room = core(recent_records=2)
    joined(room, "w")
    for seq in range(1, 7):
        land(room, "w", seq, f"m{seq}")
    # recent_records=2 keeps between 2 and 4 records in memory.
    near = room.join("r1", Hello("r1", room.lineage, 5))
    assert [type(m) for m in frames_to(near, "r1")] == [Welcome, Records]
    far = room.join("r2", Hello("r2", room.lineage, 1))
    assert isinstance(far[-1], ReadRecords) and far[-1].from_ == 1
    gone = room.resume(None)  # compacted away meanwhile
    assert [type(m) for m in frames_to(gone, "r2")] == [State]
    # A fresh replica of a log whose state is no larger than its records gets the state.
    fresh = room.join("r3", Hello("r3", Lineage.EMPTY, 0))
    assert [type(m) for m in frames_to(fresh, "r3")] == [Welcome, State]


def test_fresh_replicas_share_the_state_frames_until_the_log_moves() -> None:
    """The first fresh replica at a revision gets its state encoded as it is written; once
    all of it was, the next fresh replica gets the same frames (made once); after a push
    lands, the next gets the new revision's state, with the new message."""
    room = core()
    joined(room, "w")
    land(room, "w", 1, "first")

    first = room.join("f0", Hello("f0", Lineage.EMPTY, 0))
    assert [type(a) for a in first if getattr(a, "to", None) == "f0"] == [Send, SendFrames]
    one, two = fresh_state(room, "f1"), fresh_state(room, "f2")
    assert one and all(a is b for a, b in zip(one, two, strict=True))
    land(room, "w", 2, "second")
    three = fresh_state(room, "f3")
    state = decode_hub_message(three[0])
    assert isinstance(state, State) and state.revision == room.revision == 2
    assert [e.message.content[0].text for e in state.state.entries] == ["first", "second"]


def test_a_room_lets_go_of_its_state_frames_after_a_while() -> None:
    """The frames made for fresh replicas are kept `STATE_CACHE_MS` (the deadline says so),
    shared until then, and let go of at the tick that passes it: the next fresh replica gets
    a state made anew, as good."""
    room = core()
    joined(room, "w")
    land(room, "w", 1, "first")
    assert room.next_deadline() is None  # nothing made yet: nothing to let go of

    made = fresh_state(room, "f1", NOW)
    assert room.next_deadline() == NOW + STATE_CACHE_MS
    room.tick(NOW + STATE_CACHE_MS - 1)
    kept = fresh_state(room, "f2", NOW + STATE_CACHE_MS - 1)
    assert all(a is b for a, b in zip(made, kept, strict=True))
    room.tick(NOW + STATE_CACHE_MS)
    assert room.next_deadline() is None
    anew = fresh_state(room, "f3", NOW + STATE_CACHE_MS)
    assert anew == made and not any(a is b for a, b in zip(made, anew, strict=True))


def lazy_joins(*conns: str) -> tuple[RoomCore[str], list[Any]]:
    """A room of 30 long messages in frames of `MIN_FRAME`, and the lazy state frames each
    of `conns` is handed as it joins fresh, none of them taken yet."""
    room = core(max_frame=MIN_FRAME)
    joined(room, "w")
    for k in range(1, 31):
        land(room, "w", k, f"message {k} " + "x" * 200)
    lazy = []
    for conn in conns:
        actions = room.join(conn, Hello(conn, Lineage.EMPTY, 0))
        lazy.append(next(a for a in actions if isinstance(a, SendFrames)).frames)
    return room, lazy


def test_fresh_replicas_joining_while_the_state_is_made_share_its_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replicas that join before the first one's state is all written (a burst after a hub
    restart) read the same frames as it is made: each frame is encoded once, not once per
    replica, whichever replica takes it first, and every one gets all of them in order."""
    encoded: list[int] = []
    make = server.roomlog.iter_state_frames

    def counted(*args: Any, **kwargs: Any) -> Any:
        for frame in make(*args, **kwargs):
            encoded.append(len(frame))
            yield frame

    monkeypatch.setattr(server.roomlog, "iter_state_frames", counted)
    room, lazy = lazy_joins("f0", "f1", "f2")
    first = next(lazy[1])  # the second replica's writer takes a frame first
    rest = [[first, *lazy[1]], list(lazy[0]), list(lazy[2])]
    assert len(rest[0]) > 2 and rest[0] == rest[1] == rest[2]
    assert len(encoded) == len(rest[0])  # each frame encoded once for the three
    later = fresh_state(room, "f3")  # made already: the same bytes, sent at once
    assert later == rest[0] and len(encoded) == len(rest[0])


def test_a_state_whose_encoding_failed_is_never_sent_cut_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The encoder raising on a frame fails the replicas reading it (their sockets go; they
    reconnect), and the next fresh replica gets the whole state made anew: never the frames
    made before the failure, sent as if they were all of it."""
    make = server.roomlog.iter_state_frames
    calls = 0

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        for k, frame in enumerate(make(*args, **kwargs)):
            if calls == 1 and k == 1:
                raise MemoryError("the encoder gave up")
            yield frame

    monkeypatch.setattr(server.roomlog, "iter_state_frames", failing_once)
    room, lazy = lazy_joins("f0", "f1")
    for frames in lazy:
        with pytest.raises(MemoryError):
            list(frames)
    later = [decode_hub_message(frame) for frame in fresh_state(room, "f2")]
    entries = [e for m in later for e in (m.state.entries if isinstance(m, State) else m.entries)]
    assert calls == 2 and len(entries) == 30 and later[-1].more is False


def test_a_state_encoded_as_it_is_written_is_the_log_at_the_join() -> None:
    """A fresh replica's state made frame by frame is the log as it was when the replica
    joined, though a push lands before the first frame is taken; the records after it
    follow it, and a later replica is not handed that older state."""
    room = core(max_frame=MIN_FRAME)
    joined(room, "w")
    for k in range(1, 41):
        land(room, "w", k, f"message {k} " + "x" * 200)
    joining = room.join("f", Hello("f", Lineage.EMPTY, 0))
    lazy = next(a for a in joining if isinstance(a, SendFrames))
    landed = land(room, "w", 41, "after the join")
    frames = [decode_hub_message(frame) for frame in lazy.frames]
    assert len(frames) > 2  # several frames, each made after the push landed
    assert isinstance(frames[0], State) and frames[0].revision == 40
    entries = [e for m in frames for e in (m.state.entries if isinstance(m, State) else m.entries)]
    assert len(entries) == 40 and entries[-1].message.content[0].text.startswith("message 40 ")
    assert [m.more for m in frames[1:]] == [True] * (len(frames) - 2) + [False]
    (records,) = frames_to(landed, "f")
    assert isinstance(records, Records) and records.from_ == 40
    later = frames_to(room.join("g", Hello("g", Lineage.EMPTY, 0)), "g")
    assert isinstance(later[1], State) and later[1].revision == 41


def test_log_moved_forwards_exactly_what_the_room_folds_then_rejects() -> None:
    """When another hub appended first, the room reads what it lacks, folds it, sends those
    records (and nothing past them) to every subscriber, then rejects the push `behind`."""
    room = core()
    joined(room, "a", "b")
    actions = room.push("a", PushBatch(1, room.lineage, 0, [record("mine")]), NOW)
    assert isinstance(actions[-1], AppendRecords)
    read = room.resume(LogMoved("c", room.lineage, 2))
    assert read == [ReadRecords(room.lineage, 0)]
    elsewhere = [encode(record("other 1")), encode(record("other 2"))]
    after = room.resume(elsewhere)
    for conn in ("a", "b"):
        records = frames_to(after, conn)[0]
        assert isinstance(records, Records) and len(records.records) == 2
    *_, reject = frames_to(after, "a")
    assert isinstance(reject, Reject) and (reject.reason, reject.revision) == ("behind", 2)
    assert room.revision == 2
    assert [m.content[0].text for m in room.conversation.messages()] == ["other 1", "other 2"]  # type: ignore[union-attr]


def test_seq_taken_answers_with_the_stored_ack_after_catching_up() -> None:
    """A push another hub already appended: the room catches up, then acks as the store says."""
    room = core()
    joined(room, "a")
    actions = room.push("a", PushBatch(1, room.lineage, 0, [record("mine")]), NOW)
    assert isinstance(actions[-1], AppendRecords)
    read = room.resume(SeqTaken("c", "a", ClientMark(1, 0, 1)))
    assert read == [ReadRecords(room.lineage, 0)]
    after = room.resume([encode(record("mine"))])
    messages = frames_to(after, "a")
    assert isinstance(messages[0], Records) and messages[-1] == Ack(1, 0, 1)


def test_store_failure_closes_the_pusher_and_reloads_before_the_next_operation() -> None:
    """A failed append undoes the batch, closes the pusher `unavailable`, and the next
    operation first reloads the log from the store (the write may have landed)."""
    room = core()
    joined(room, "a", "b")
    actions = room.push("a", PushBatch(1, room.lineage, 0, [record("lost?")]), NOW)
    assert isinstance(actions[-1], AppendRecords)
    failed = room.resume(StoreError("disk full"))
    assert failed == [Close("a", "unavailable", failed[0].detail)]  # type: ignore[union-attr]
    assert len(room.conversation) == 0
    nxt = room.join("c", Hello("c", Lineage.EMPTY, 0))
    assert nxt == [LoadLog()]
    landed = Conversation.from_messages([Message.user("lost?")])
    loaded = Loaded(room.lineage, 1, None, 0, [encode(r) for r in landed.unsaved()], {})
    after = room.resume(loaded)
    assert room.revision == 1 and isinstance(frames_to(after, "c")[0], Welcome)


def test_shutting_down_closes_everyone_and_refuses_pushes() -> None:
    """`shut_down` closes each subscriber `shutting_down`; a push after it is refused so."""
    room = core()
    joined(room, "a", "b")
    closes = room.shut_down()
    assert sorted(c.to for c in closes if isinstance(c, Close)) == ["a", "b"]
    later = room.push("a", PushBatch(1, room.lineage, 0, [record("x")]), NOW)
    assert [(c.code) for c in later if isinstance(c, Close)] == ["shutting_down"]


def test_a_rewrite_from_a_stale_room_erases_nothing_and_raises() -> None:
    """A rewrite names the log position the room knows; when another hub appended since, the
    store refuses it, the room forwards what it missed, and the caller gets `LogMoved`."""
    room = core()
    joined(room, "a")
    land(room, "a", 1, "mine")
    [call] = room.rewrite(Conversation(), Lineage.fresh(), NOW)
    assert isinstance(call, RewriteLog) and call.base == (room.lineage, 1)
    assert room.resume(LogMoved("c", room.lineage, 2)) == [ReadRecords(room.lineage, 1)]
    after = room.resume([encode(record("acknowledged elsewhere"))])
    assert isinstance(frames_to(after, "a")[0], Records)
    assert isinstance(after[-1], Raise) and isinstance(after[-1].error, LogMoved)
    assert room.revision == 2 and len(room.conversation) == 2


def test_a_stale_push_is_placed_for_a_replica_that_understands_it() -> None:
    """A push made on an older revision is placed by intent for a connection that listed
    `hub_rebase`: the pusher gets the landed records with its own origin, then the ack; a
    pure insertion (it needs its base) or a connection without the feature gets `behind`."""
    room = core()
    room.join("a", Hello("a", room.lineage, 0, features=["hub_rebase"]))
    room.join("b", Hello("b", room.lineage, 0))
    land(room, "b", 1, "from b")
    actions = room.push("a", PushBatch(1, room.lineage, 0, [record("from a")]), NOW)
    call = actions[-1]
    assert isinstance(call, AppendRecords) and call.from_ == 1
    placed = frames_to(room.resume(2), "a")
    assert [type(m) for m in placed] == [Records, Ack]
    records, ack = placed
    assert isinstance(records, Records) and records.origin is not None
    assert (records.from_, records.origin.client, records.origin.seq) == (1, "a", 1)
    assert ack == Ack(1, 1, 2)
    stale = room.push("b", PushBatch(2, room.lineage, 0, [record("late b")]), NOW)
    [reject] = frames_to(stale, "b")
    assert isinstance(reject, Reject) and reject.reason == "behind"
    maker = Conversation()
    maker.splice(range(0, 0), [Message.user("insert")], None)
    [insertion] = maker.take_unsaved()
    refused = room.push("a", PushBatch(2, room.lineage, 0, [insertion]), NOW)
    [reject] = frames_to(refused, "a")
    assert isinstance(reject, Reject) and reject.reason == "behind"
    assert len(room.conversation) == 2


def test_a_stale_push_that_would_land_changed_is_not_placed() -> None:
    """Placement is for records that replay unchanged: a splice the log moved (it would land
    at another index) is rejected `behind`, so an acknowledged batch is always exactly what
    its replica sent (a lost ack, a resend or a welcome name the very records in the log)."""
    room = core()
    room.join("a", Hello("a", room.lineage, 0, features=["hub_rebase"]), NOW)
    room.join("b", Hello("b", room.lineage, 0), NOW)
    land(room, "b", 1, "first")
    held = room.conversation.id(0)
    assert held is not None
    land(room, "b", 2, "second")
    # Made on revision 1: replace "first" (index 0) — still at index 0: lands unchanged.
    edit = ChangeRecord(Splice(0, 1, [held], [Entry(Message.user("FIRST"), id=held)]))
    same_place = room.push("a", PushBatch(1, room.lineage, 1, [edit]), NOW)
    assert isinstance(same_place[-1], AppendRecords)
    room.resume(3)
    # Made on revision 1: a splice of the entry now at index 1 would land re-targeted.
    second = room.conversation.id(1)
    assert second is not None
    moved = ChangeRecord(Splice(2, 3, [second], [Entry(Message.user("SECOND"), id=second)]))
    actions = room.push("a", PushBatch(2, room.lineage, 2, [moved]), NOW)
    [reject] = frames_to(actions, "a")
    assert isinstance(reject, Reject) and reject.reason == "behind"
    assert room.revision == 3
