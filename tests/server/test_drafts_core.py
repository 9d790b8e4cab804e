"""Drafts and presence in the hub's pure core: no sockets, no store, an injected clock."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from server.core import (
    AppendRecords,
    Broadcast,
    CoreConfig,
    RewriteLog,
    RoomCore,
    Send,
    SendDraft,
    SendFrames,
)
from server.drafts import DraftConfig
from server.store import Loaded
from sync import ChangeRecord, Conversation, Entry, Halt, HaltChange, Message, Push
from sync.frames import FRAME_FILL
from sync.ids import IdMinter
from sync.protocol import (
    DraftEnd,
    DraftOp,
    Drafts,
    DraftState,
    DraftUpdate,
    Hello,
    HubMessage,
    PresenceDiff,
    PresenceSnapshot,
    PushBatch,
    Records,
    Reject,
    StatusUpdate,
    Welcome,
    decode_hub_message,
    encode_message,
)

T0 = 1_700_000_000_000
FEATURES = ["drafts", "presence"]
_ids = IdMinter()


def core(**drafts: Any) -> RoomCore[str]:
    config = CoreConfig(max_frame=1 << 20, drafts=DraftConfig(**drafts))
    room: RoomCore[str] = RoomCore("c", config)
    room.load(None)
    return room


def frames_to(actions: list[Any], conn: str) -> list[HubMessage]:
    """The messages `conn` is sent by `actions`, decoded, in order."""
    out = []
    for action in actions:
        if isinstance(action, Send) and action.to == conn:
            out.append(decode_hub_message(action.frame))
        elif isinstance(action, Broadcast | SendDraft) and conn in action.to:
            out.append(decode_hub_message(action.frame))
        elif isinstance(action, SendFrames) and action.to == conn:
            out += [decode_hub_message(frame) for frame in action.frames]
    return out


def join(room: RoomCore[str], conn: str, now: int = T0, client: str | None = None) -> list[Any]:
    hello = Hello(client or conn, room.lineage, room.revision, features=FEATURES)
    return room.join(conn, hello, now)


def op(id_: str, kind: str = "append", **fields: Any) -> DraftOp:
    return DraftOp(id_, kind, **fields)  # type: ignore[arg-type]


class UI:
    """What a UI rebuilds from the frames it is sent: each draft's parts."""

    def __init__(self) -> None:
        self.parts: dict[tuple[str, str], str] = {}
        self.ended: dict[str, str] = {}

    def take(self, messages: list[HubMessage]) -> None:
        for message in messages:
            match message:
                case Drafts(drafts):
                    for info in drafts:
                        for part, text in info.parts.items():
                            self.parts[(info.id, part)] = text
                case DraftUpdate(id=id_, op="append", part=part, offset=offset, text=text):
                    have = self.parts.get((id_, part), "")
                    assert offset == len(have), f"delta at {offset}, have {len(have)}"
                    self.parts[(id_, part)] = have + text
                case DraftEnd(id_, status):
                    self.ended[id_] = status


def test_appends_use_code_point_offsets_and_resends_apply_from_the_overlap() -> None:
    """An append below the current length adds only what is new; a full resend adds nothing;
    offsets count code points (an emoji is one)."""
    room = core(interval=0)
    join(room, "worker")
    join(room, "ui")
    ui = UI()
    d = _ids.message_id()
    ui.take(frames_to(room.draft("worker", op(d, "open"), T0), "ui"))
    for offset, text in [(0, "h😀l"), (2, "llo"), (0, "h😀llo"), (5, " w")]:
        ui.take(frames_to(room.draft("worker", op(d, offset=offset, text=text), T0), "ui"))
    assert room.drafts.text(d) == "h😀llo w"
    assert ui.parts[(d, "text")] == "h😀llo w"


def test_a_gap_is_answered_to_the_sender_only_and_the_draft_goes_on() -> None:
    """An append past the hub's length gets `draft_end gap` (sender only); nothing changes,
    and reopening answers with the lengths the hub holds."""
    room = core(interval=0)
    join(room, "worker")
    join(room, "ui")
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), T0)
    room.draft("worker", op(d, text="abc"), T0)
    actions = room.draft("worker", op(d, offset=5, text="xyz"), T0)
    assert frames_to(actions, "worker") == [DraftEnd(d, "gap", "text holds 3 code points")]
    assert frames_to(actions, "ui") == []
    assert room.drafts.text(d) == "abc"
    reopened = frames_to(room.draft("worker", op(d, "open"), T0), "worker")
    assert reopened == [DraftState(d, {"text": 3})]


def test_an_op_on_a_draft_the_hub_does_not_hold_gets_draft_end_unknown() -> None:
    """Append, keep or abort on an unknown draft: `draft_end unknown`, never a close."""
    room = core()
    join(room, "worker")
    d = _ids.message_id()
    for kind in ("append", "keep", "abort"):
        [answer] = frames_to(room.draft("worker", op(d, kind, text="x"), T0), "worker")
        assert isinstance(answer, DraftEnd) and answer.status == "unknown"


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(min_size=1, max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=12),
    resend=st.lists(st.integers(0, 5), max_size=12),
    gaps=st.lists(st.integers(0, 80), max_size=12),
    interval=st.sampled_from([0, 20, 50]),
)
def test_any_split_and_any_coalescing_gives_the_same_text(
    text: str, cuts: list[int], resend: list[int], gaps: list[int], interval: int
) -> None:
    """Cut a text into appends anywhere (some resent with an overlap), deliver them at any
    times with any coalescing: a UI rebuilds exactly the text, no character twice or lost."""
    room = core(interval=interval)
    join(room, "worker")
    join(room, "early")
    uis = {"early": UI()}

    def take(actions: list[Any]) -> None:
        for conn, ui in uis.items():
            ui.take(frames_to(actions, conn))

    d = _ids.message_id()
    now = T0
    take(room.draft("worker", op(d, "open"), now))
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    for step, (start, stop) in enumerate(itertools.pairwise(points)):
        back = min(resend[step] if step < len(resend) else 0, start)
        now += gaps[step] if step < len(gaps) else 1
        take(room.tick(now))
        take(room.draft("worker", op(d, offset=start - back, text=text[start - back : stop]), now))
        if step == 1:  # a UI joining mid-draft: the text so far, then the rest
            uis["late"] = UI()
            uis["late"].take(frames_to(join(room, "late", now), "late"))
    while (deadline := room.next_deadline()) is not None and deadline < now + 1000:
        now = max(now, deadline)
        take(room.tick(now))
    for ui in uis.values():
        assert ui.parts[(d, "text")] == text


def test_deltas_are_coalesced_per_interval_and_merged_per_part() -> None:
    """Within `draft_interval` a UI gets the first delta at once, then one merged delta per
    draft part when the interval is over (`next_deadline` says when)."""
    room = core(interval=50)
    join(room, "worker")
    join(room, "ui")
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), T0)
    first = frames_to(room.draft("worker", op(d, text="a"), T0), "ui")
    assert [m.text for m in first if isinstance(m, DraftUpdate)] == ["a"]
    assert frames_to(room.draft("worker", op(d, offset=1, text="b"), T0 + 10), "ui") == []
    assert frames_to(room.draft("worker", op(d, offset=2, text="c"), T0 + 20), "ui") == []
    assert room.next_deadline() == T0 + 50
    assert frames_to(room.tick(T0 + 49), "ui") == []
    [merged] = frames_to(room.tick(T0 + 50), "ui")
    assert merged == DraftUpdate(d, "append", "text", 1, "bc")


def record_of(*entries: Entry) -> ChangeRecord:
    return ChangeRecord(Push(list(entries)))


def land(room: RoomCore[str], conn: str, seq: int, records: list[ChangeRecord]) -> list[Any]:
    """Push `records` from `conn` and let the store accept them; every action of the step."""
    actions = room.push(conn, PushBatch(seq, room.lineage, room.revision, records), T0)
    call = actions[-1]
    assert isinstance(call, AppendRecords), actions
    return actions[:-1] + room.resume(call.from_ + len(call.records))


def test_commit_ends_the_draft_in_the_same_step_that_broadcasts_its_record() -> None:
    """The owner's push of an entry with the draft's id: the same action list carries the
    record to the UI and then `draft_end committed`."""
    room = core()
    join(room, "worker")
    join(room, "ui")
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), T0)
    room.draft("worker", op(d, text="hi"), T0)
    step = land(room, "worker", 1, [record_of(Entry(Message.assistant("hi"), id=d))])
    to_ui = frames_to(step, "ui")
    assert [type(m) for m in to_ui] == [Records, DraftEnd]
    assert to_ui[1] == DraftEnd(d, "committed")
    assert d not in room.drafts
    assert room.metrics.drafts_open == 0


def test_another_clients_append_commit_or_open_is_refused() -> None:
    """Only the owner may append, abort or commit: another client's ops get `refused` and its
    push of the draft's id is rejected `invalid`; the draft is untouched."""
    room = core()
    join(room, "worker")
    join(room, "intruder")
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), T0)
    room.draft("worker", op(d, text="mine"), T0)
    for kind in ("open", "append", "abort"):
        [answer] = frames_to(room.draft("intruder", op(d, kind, text="x"), T0), "intruder")
        assert answer == DraftEnd(d, "refused", "the draft belongs to another client")
    batch = PushBatch(1, room.lineage, room.revision, [record_of(Entry(Message.user("x"), id=d))])
    [reject] = frames_to(room.push("intruder", batch, T0), "intruder")
    assert isinstance(reject, Reject) and reject.reason == "invalid"
    assert room.drafts.text(d) == "mine" and len(room.conversation) == 0


def test_an_owners_rejected_push_carrying_the_id_ends_the_draft_aborted() -> None:
    """A push of the draft's id that does not apply is rejected and the draft ends aborted."""
    room = core()
    join(room, "worker")
    join(room, "ui")
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), T0)
    bad = ChangeRecord(Push([Entry(Message.assistant("x"), id=d), Entry(Message.user("y"), id=d)]))
    actions = room.push("worker", PushBatch(1, room.lineage, room.revision, [bad]), T0)
    assert DraftEnd(d, "aborted", "the push carrying it was rejected") in frames_to(actions, "ui")


def test_a_stop_landing_ends_every_open_draft_stopped() -> None:
    """A halt record `stopped` landing ends the open drafts `stopped`, in the same step."""
    room = core()
    join(room, "worker")
    join(room, "ui")
    room.draft("worker", op(d := _ids.message_id(), "open"), T0)
    step = land(room, "ui", 1, [ChangeRecord(HaltChange(Halt.STOPPED))])
    assert frames_to(step, "worker")[-1] == DraftEnd(d, "stopped")
    assert frames_to(step, "ui")[-1] == DraftEnd(d, "stopped")


def test_silence_ends_a_draft_timeout_and_keep_holds_it_open() -> None:
    """A producer silent for `draft_timeout` ends `timeout`; `keep` restarts the wait."""
    room = core(timeout=1000)
    join(room, "worker")
    join(room, "ui")
    t = T0 + 100
    room.tick(t)  # the presence diff of the joins goes; nothing else is due
    assert room.next_deadline() is None
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), t)
    room.tick(t + 100)  # the presence diff (`drafting`) goes
    assert room.next_deadline() == t + 1000
    room.draft("worker", op(d, "keep"), t + 900)
    assert room.next_deadline() == t + 1900
    assert frames_to(room.tick(t + 1899), "ui") == []
    end = frames_to(room.tick(t + 1900), "ui")[0]
    assert end == DraftEnd(d, "timeout", "the producer went silent")


def test_grace_lets_a_reconnecting_producer_resume_and_ends_the_draft_after_it() -> None:
    """When the producer's socket closes the draft waits `draft_grace`: a reopen from a new
    socket resumes it with its lengths; otherwise it ends `timeout` when grace is over."""
    room = core(grace=500)
    join(room, "worker")
    join(room, "ui")
    t = T0 + 100
    room.tick(t)
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), t)
    room.draft("worker", op(d, text="abc"), t)
    room.leave("worker", t + 100)
    room.tick(t + 100)
    assert room.next_deadline() == t + 600
    join(room, "worker2", t + 200, client="worker")
    reopened = frames_to(room.draft("worker2", op(d, "open", epoch=1), t + 200), "worker2")
    assert reopened == [DraftState(d, {"text": 3})]
    assert DraftEnd(d, "timeout") not in frames_to(room.tick(t + 700), "ui")
    room.leave("worker2", t + 1000)
    assert not any(isinstance(m, DraftEnd) for m in frames_to(room.tick(t + 1499), "ui"))
    end = frames_to(room.tick(t + 1500), "ui")[0]
    assert end == DraftEnd(d, "timeout", "the producer disconnected")


def test_caps_bytes_per_draft_and_drafts_per_owner() -> None:
    """A draft over its UTF-8 byte cap ends aborted (nothing of the oversize append kept);
    the ninth open draft of one client is refused."""
    room = core(max_bytes=10, max_per_owner=8)
    join(room, "worker")
    join(room, "ui")
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), T0)
    room.draft("worker", op(d, text="ééééé"), T0)  # 10 bytes: at the cap
    ended = frames_to(room.draft("worker", op(d, offset=5, text="x"), T0), "ui")
    assert ended == [DraftEnd(d, "aborted", "over 10 bytes")]
    ids = [_ids.message_id() for _ in range(9)]
    for id_ in ids[:8]:
        room.draft("worker", op(id_, "open"), T0)
    [refused] = frames_to(room.draft("worker", op(ids[8], "open"), T0), "worker")
    assert refused == DraftEnd(ids[8], "refused", "at most 8 open drafts per client")
    assert len(room.drafts.drafts) == 8


def test_every_field_of_a_draft_counts_against_its_cap() -> None:
    """A tool name, the author's fields and `after` count with the text against
    `max_bytes`: 200 one-character appends with 4 MiB names, or 7 MiB author names, took a hub
    to 858 MiB (issue 27). `after` must be a message id; parts per draft and drafts per
    conversation are capped too."""
    from sync import Author

    room = core(max_bytes=100, max_parts=3, max_per_conversation=4)
    join(room, "worker")
    join(room, "ui")
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), T0)
    room.draft("worker", op(d, part="call:a", text="x", name="n" * 90), T0)  # 91 bytes
    ended = frames_to(room.draft("worker", op(d, part="call:b", text="y", name="m" * 9), T0), "ui")
    assert ended == [DraftEnd(d, "aborted", "over 100 bytes")]
    assert d not in room.drafts
    # The author's fields and `after` count too: an open over the cap is refused, holds nothing.
    big = Author.agent("a" * 60, request="r" * 41)
    e = _ids.message_id()
    [refused] = frames_to(room.draft("worker", op(e, "open", author=big), T0), "worker")
    assert refused == DraftEnd(e, "refused", "author and after over 100 bytes")
    assert e not in room.drafts
    after = _ids.message_id()
    room.draft("worker", op(e, "open", author=Author.agent("a" * 30), after=after), T0)
    room.draft("worker", op(e, text="t" * 30), T0)  # 30 + 36 + 30 = 96 bytes
    ended = frames_to(room.draft("worker", op(e, offset=30, text="12345"), T0), "ui")
    assert ended == [DraftEnd(e, "aborted", "over 100 bytes")]
    f = _ids.message_id()
    [refused] = frames_to(room.draft("worker", op(f, "open", after="not-an-id"), T0), "worker")
    assert refused == DraftEnd(f, "refused", "a draft's after is a msg_ id")
    # Parts per draft.
    room.draft("worker", op(f, "open"), T0)
    for part in ("text", "reasoning", "call:1"):
        room.draft("worker", op(f, part=part, text="p"), T0)
    ended = frames_to(room.draft("worker", op(f, part="call:2", text="p"), T0), "ui")
    assert ended == [DraftEnd(f, "aborted", "over 3 parts")]
    # Drafts per conversation, whoever owns them (each client stays under its own cap).
    for n in range(4):
        join(room, f"w{n}")
        room.draft(f"w{n}", op(_ids.message_id(), "open"), T0)
    join(room, "w4")
    g = _ids.message_id()
    [refused] = frames_to(room.draft("w4", op(g, "open"), T0), "w4")
    assert refused == DraftEnd(g, "refused", "at most 4 open drafts per conversation")
    assert len(room.drafts.drafts) == 4


def test_drafts_snapshot_chunks_are_sized_from_what_is_encoded() -> None:
    """Text that JSON escapes six times over (control characters) still makes `drafts`
    frames within `max_frame`: chunks are sized from the encoded drafts, and a draft's cap
    counts its text as encoded (issue 27)."""
    config = CoreConfig(max_frame=64 * 1024, drafts=DraftConfig(max_bytes=32 * 1024))
    room: RoomCore[str] = RoomCore("c", config)
    room.load(None)
    for n in range(6):
        join(room, f"w{n}")
        d = _ids.message_id()
        room.draft(f"w{n}", op(d, "open"), T0)
        room.draft(f"w{n}", op(d, text="\x01" * 5_000), T0)  # 30,000 bytes encoded
    # The cap counts text as encoded, so one draft always fits a frame: 6,000 escaped
    # characters are 36,000 bytes, over the cap, though 6,000 bytes of UTF-8.
    d = _ids.message_id()
    join(room, "w6")
    room.draft("w6", op(d, "open"), T0)
    ended = frames_to(room.draft("w6", op(d, text="\x01" * 6_000), T0), "w6")
    assert ended == [DraftEnd(d, "aborted", f"over {32 * 1024} bytes")]
    frames = [frame for a in join(room, "ui") if isinstance(a, SendFrames) for frame in a.frames]
    assert len(frames) > 1 and all(len(frame) <= 64 * 1024 for frame in frames)
    infos = [info for frame in frames for info in decode_hub_message(frame).drafts]  # type: ignore[union-attr]
    assert len(infos) == 6 and all(info.parts["text"] == "\x01" * 5_000 for info in infos)


def test_a_joining_ui_gets_open_drafts_and_presence_after_its_catch_up() -> None:
    """Welcome, catch-up, then `drafts` with the text so far, then `presence`."""
    room = core()
    join(room, "worker")
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), T0)
    room.draft("worker", op(d, text="so far"), T0)
    room.draft("worker", op(d, part="call:c1", text='{"ci', name="weather"), T0)
    messages = frames_to(join(room, "ui"), "ui")
    drafts = next(m for m in messages if isinstance(m, Drafts))
    [info] = drafts.drafts
    assert info.parts == {"text": "so far", "call:c1": '{"ci'} and info.names == {
        "call:c1": "weather"
    }
    assert isinstance(messages[messages.index(drafts) + 1], PresenceSnapshot)


def test_presence_join_status_drafting_and_leave_throttled() -> None:
    """Presence diffs: a join, a status, `drafting` while a draft is open, a leave; at most
    one diff per 100 ms."""
    room = core()
    join(room, "ui", T0)
    join(room, "worker", T0)
    [diff] = frames_to(room.tick(T0 + 100), "ui")
    assert isinstance(diff, PresenceDiff) and [c.client for c in diff.joined] == ["worker"]
    actions = room.status("worker", StatusUpdate("thinking"), T0 + 110)
    assert frames_to(actions, "ui") == []  # throttled
    [diff] = frames_to(room.tick(T0 + 200), "ui")
    assert isinstance(diff, PresenceDiff) and [c.status for c in diff.changed] == ["thinking"]
    room.status("worker", StatusUpdate(None), T0 + 250)
    room.draft("worker", op(_ids.message_id(), "open"), T0 + 250)
    [diff] = frames_to(room.tick(T0 + 300), "ui")
    assert isinstance(diff, PresenceDiff) and [c.status for c in diff.changed] == ["drafting"]
    worker_id = diff.changed[0].connection
    room.leave("worker", T0 + 350)
    [diff] = frames_to(room.tick(T0 + 400), "ui")
    assert isinstance(diff, PresenceDiff) and diff.left == [worker_id]
    assert room.metrics.presence == 1


def test_a_late_close_of_an_old_socket_never_removes_its_successor() -> None:
    """The same client reconnects on a new socket before the old one's close is seen: the
    old close removes the old entry only."""
    room = core()
    join(room, "ui", T0)
    join(room, "old", T0, client="worker")
    join(room, "new", T0 + 10, client="worker")
    room.leave("old", T0 + 20)
    room.tick(T0 + 500)
    present = [e.client for e in room.presence.entries.values()]
    assert present == ["ui", "worker"]
    [snapshot] = [
        m for m in frames_to(join(room, "ui2", T0 + 600), "ui2") if isinstance(m, PresenceSnapshot)
    ]
    assert sorted(c.client for c in snapshot.connections) == ["ui", "ui2", "worker"]


def test_a_rewrite_ends_every_open_draft() -> None:
    """A log rewrite: every subscriber rereads the state and every draft ends."""
    room = core()
    join(room, "worker")
    join(room, "ui")
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), T0)
    [call] = room.rewrite(Conversation(), 42, T0)
    assert isinstance(call, RewriteLog)
    actions = room.resume(None)  # the store rewrote
    fresh = Loaded(42, len(call.records), None, 0, call.records, {})
    actions = room.resume(fresh)  # ...and the reload finds the fresh log
    assert DraftEnd(d, "aborted") in frames_to(actions, "ui")
    assert not room.drafts.drafts


def test_a_connection_without_the_features_gets_no_drafts_or_presence() -> None:
    """A hello without `drafts`/`presence` gets none of those messages and no features."""
    room = core(interval=0)
    join(room, "worker")
    plain = room.join("plain", Hello("plain", room.lineage, room.revision), T0)
    welcome = frames_to(plain, "plain")[0]
    assert isinstance(welcome, Welcome)
    assert "drafts" not in welcome.features and "presence" not in welcome.features
    d = _ids.message_id()
    actions = room.draft("worker", op(d, "open"), T0) + room.draft("worker", op(d, text="x"), T0)
    assert frames_to(actions + room.tick(T0 + 200), "plain") == []


def test_a_late_tick_keeps_the_flush_grid() -> None:
    """A flush that the timer runs late does not delay the next delta: deltas stay on a grid
    of `draft_interval` (a producer throttling at the same interval is never held twice)."""
    room = core(interval=50)
    join(room, "worker")
    join(room, "ui")
    d = _ids.message_id()
    room.draft("worker", op(d, "open"), T0)
    room.draft("worker", op(d, text="a"), T0)  # at once
    room.draft("worker", op(d, offset=1, text="b"), T0 + 40)  # held until T0 + 50
    [late] = [m for m in frames_to(room.tick(T0 + 70), "ui") if isinstance(m, DraftUpdate)]
    assert late.text == "b"
    sent = frames_to(room.draft("worker", op(d, offset=2, text="c"), T0 + 100), "ui")
    [next_] = [m for m in sent if isinstance(m, DraftUpdate)]
    assert next_ == DraftUpdate(d, "append", "text", 2, "c")  # at once, not held to T0 + 120


def test_a_snapshot_read_late_shows_the_drafts_as_they_were_at_the_join() -> None:
    """The `drafts` frames are built only when the shell reads them, yet hold each draft as
    it was when the UI joined: the deltas and ends sent after the join complete them, with
    no text twice and none missing (issue 27: the snapshot is streamed)."""
    room = core(interval=0)
    join(room, "worker")
    d1, d2 = _ids.message_id(), _ids.message_id()
    for d, text in ((d1, "abc"), (d2, "x")):
        room.draft("worker", op(d, "open"), T0)
        room.draft("worker", op(d, text=text), T0)
    [snapshot] = [a for a in join(room, "ui") if isinstance(a, SendFrames)]
    later = frames_to(room.draft("worker", op(d1, offset=3, text="def"), T0), "ui")
    later += frames_to(room.draft("worker", op(d2, "abort"), T0), "ui")
    ui = UI()
    ui.take([decode_hub_message(frame) for frame in snapshot.frames])
    assert ui.parts == {(d1, "text"): "abc", (d2, "text"): "x"}
    ui.take(later)
    assert ui.parts[(d1, "text")] == "abcdef" and ui.ended == {d2: "aborted"}


def test_a_large_snapshot_comes_in_frames_of_at_most_a_mebibyte() -> None:
    """64 drafts at their 512 KiB cap reach a joining UI in `drafts` frames of at most 1 MiB
    each (`FRAME_FILL`, not `max_frame`), all but the last saying `more`, each exactly the
    `Drafts` message of the drafts it holds."""
    room: RoomCore[str] = RoomCore("c", CoreConfig(max_frame=16 << 20))
    room.load(None)
    for client in range(8):
        join(room, f"w{client}")
        for _ in range(8):
            d = _ids.message_id()
            room.draft(f"w{client}", op(d, "open"), T0)
            room.draft(f"w{client}", op(d, text="y" * (500 << 10)), T0)
    [snapshot] = [a for a in join(room, "ui") if isinstance(a, SendFrames)]
    frames = list(snapshot.frames)
    messages = [decode_hub_message(frame) for frame in frames]
    assert len(frames) > 1 and all(len(frame) <= FRAME_FILL for frame in frames)
    assert [m.more for m in messages] == [True] * (len(frames) - 1) + [False]  # type: ignore[union-attr]
    assert frames == [encode_message(m) for m in messages]
    assert sum(len(m.drafts) for m in messages) == 64  # type: ignore[union-attr]
