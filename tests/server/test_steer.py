"""Steering a running agent (SPEC 10), on the hub's real core without sockets: mid-step,
queued input and its landing, withdrawal, `superseded`, and the pure rules of `sync.steer`."""

from __future__ import annotations

import pytest
from fakelink import FakeHub, Link, settle

from client.session import Conflict, Queued, ReplicaSession, StopRequested
from sync import (
    Aside,
    AsideChange,
    Assistant,
    Author,
    ChangeRecord,
    Conversation,
    Message,
    Push,
    Stop,
    Text,
    ToolCall,
    TurnEnd,
    User,
    pairing,
)
from sync.entries import Stopped, is_stopped_note
from sync.steer import (
    QUEUED_KIND,
    STEP_KIND,
    STOP_KIND,
    Steering,
    finish_stopped,
    keep_superseded,
    mid_step,
    queue_records,
    queued_entry,
    queued_id,
    step_pending,
    step_value,
)

CALL = Assistant([Text("looking"), ToolCall("c1", "search", {"q": "x"})])
RESULT = Message.tool_result("c1", "search", "found")


def _texts(conversation: Conversation) -> list[str]:
    return [
        "".join(p.text for p in m.content if isinstance(p, Text))
        for m in conversation.messages()
        if isinstance(m, User | Assistant)
    ]


def _queued(conversation: Conversation) -> list[str]:
    return [id_ for id_, aside in conversation.asides() if aside.kind == QUEUED_KIND]


def _mid_call() -> tuple[FakeHub, Link, Link]:
    """A UI and a worker; the user asked, the worker called a tool that has not answered."""
    hub = FakeHub()
    ui = hub.link(ReplicaSession("ui"))
    worker = hub.link(ReplicaSession("worker"))
    settle([ui, worker])
    ui.session.local.push(Message.user("find x"))
    settle([ui, worker])
    worker.session.local.push(CALL)
    settle([ui, worker])
    assert mid_step(hub.conversation)
    return hub, ui, worker


# ---------------------------------------------------------------------- the pure rules


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [Message.user("a")],
        [Message.user("a"), CALL],
        [Message.user("a"), CALL, RESULT],
        [Message.user("a"), CALL, Message.user("more")],
        [Message.user("a"), Assistant([ToolCall("c1", "f"), ToolCall("c2", "f")]), RESULT],
        [Message.user("a"), CALL, Message.assistant("cut", stop=None)],
        [Message.user("a"), Assistant([ToolCall("c1", "f")], stop=None), RESULT, CALL],
    ],
)
def test_step_pending_reads_the_tail_as_pending_calls_reads_it(messages: list[Message]) -> None:
    """The hub's O(last step) read agrees with `pairing.pending_calls` over the whole history."""
    conversation = Conversation.from_messages(messages)
    assert step_pending(conversation) == bool(pairing.pending_calls(conversation.messages()))


def test_mid_step_is_a_step_marker_or_a_pending_call() -> None:
    conversation = Conversation.from_messages([Message.user("a")])
    assert not mid_step(conversation)
    marker = conversation.add_aside(Aside(STEP_KIND, None, Author.rig(), step_value(0, 1)))
    assert mid_step(conversation)
    conversation.remove_aside(marker)
    assert not mid_step(conversation)
    conversation.push(CALL)
    assert mid_step(conversation)
    conversation.push(RESULT)
    assert not mid_step(conversation)


def test_queue_records_replays_user_text_as_queued_asides_in_order() -> None:
    conversation = Conversation.from_messages([Message.user("a"), Message.user("b")])
    records = conversation.unsaved()
    queued = queue_records(records, "msg_0190b0a0000070008000000000000001")
    assert queued is not None
    entries = [conversation.entry(0), conversation.entry(1)]
    assert [r.change.id for r in queued] == [queued_id(e.id) for e in entries]  # type: ignore[union-attr, arg-type]
    assert [queued_entry(r.change.aside) for r in queued] == entries  # type: ignore[union-attr, arg-type]
    assert all(r.change.aside.author == Author.user() for r in queued)  # type: ignore[union-attr]
    # Not user text: a tool result, or any other record, is never queued.
    assert queue_records(Conversation.from_messages([RESULT]).unsaved(), None) is None
    assert queue_records([], None) is None


def test_the_steering_index_follows_records() -> None:
    conversation = Conversation.from_messages([Message.user("a")])
    steering = Steering()
    step = conversation.add_aside(Aside(STEP_KIND, None, Author.rig(), step_value(None, 1)))
    stop = conversation.add_aside(Aside(STOP_KIND, None, Author.user(), step_value(None, 1)))
    steering.track(conversation, conversation.unsaved())
    assert steering.steps == {step} and steering.stops == {stop}
    assert steering.mid_step(conversation) and not steering.lands(conversation)
    conversation.take_unsaved()
    conversation.remove_aside(step)
    conversation.remove_aside(stop)
    steering.track(conversation, conversation.unsaved())
    assert not steering.steps and not steering.stops and not steering.mid_step(conversation)


# ---------------------------------------------------------------------- queued input


def test_user_text_mid_step_is_queued_then_lands_right_after_the_step_ending_append() -> None:
    hub, ui, worker = _mid_call()
    ui.session.local.push(Message.user("also y"))
    ui.session.local.push(Message.user("and z"))
    settle([ui, worker])
    assert "queued" in hub.rejected
    # Refused, replayed as queued asides: the log holds no such entry, and neither does the UI.
    assert _texts(hub.conversation) == ["find x", "looking"]
    assert len(_queued(hub.conversation)) == 2
    assert _texts(ui.session.local) == ["find x", "looking"]
    assert _queued(ui.session.local) == _queued(hub.conversation)
    assert any(isinstance(e, Queued) and e.mine for e in ui.events)
    assert any(isinstance(e, Queued) and not e.mine for e in worker.events)
    before = hub.core.revision
    worker.session.local.push(RESULT)
    settle([ui, worker])
    # The result lands, then the queue in the order queued, with the ids and authors they had.
    assert _texts(hub.conversation) == ["find x", "looking", "", "also y", "and z"]
    assert not _queued(hub.conversation)
    hub.conversation.validate()
    # One append: the worker's mark spans the result, both entries and both aside removals.
    mark = hub.core.marks["worker"]
    assert (mark.ack_from, mark.ack_revision) == (before, before + 5) == (before, hub.core.revision)
    log = hub.log
    assert [type(r.change) for r in log[before:]] == [Push, Push, AsideChange, Push, AsideChange]
    assert log[before + 1].by is None  # the user's own, as pushed
    for link in (ui, worker):
        assert link.session.local == hub.conversation == hub.refolded()
        assert link.session.revision == hub.core.revision


def test_queued_input_keeps_its_ids_and_lands_only_once() -> None:
    hub, ui, worker = _mid_call()
    id_ = ui.session.local.push(Message.user("also y"))
    settle([ui, worker])
    worker.session.local.push(RESULT)
    settle([ui, worker])
    assert hub.conversation.id(3) == id_
    assert [e.id for e in hub.conversation.state().entries].count(id_) == 1


def test_a_step_marker_queues_input_until_the_answer_removes_it() -> None:
    hub = FakeHub()
    ui = hub.link(ReplicaSession("ui"))
    worker = hub.link(ReplicaSession("worker"))
    ui.session.local.push(Message.user("hi"))
    settle([ui, worker])
    local = worker.session.local
    marker = local.add_aside(Aside(STEP_KIND, local.id(0), Author.rig(), step_value(None, 1)))
    settle([ui, worker])
    ui.session.local.push(Message.user("wait"))
    settle([ui, worker])
    assert "queued" in hub.rejected and _texts(hub.conversation) == ["hi"]
    local.push(Message.assistant("hello"))
    local.remove_aside(marker)
    settle([ui, worker])
    # The answer lands first, the steer after it: it reads as input the model owes.
    assert _texts(hub.conversation) == ["hi", "hello", "wait"]
    assert hub.conversation.awaits_model()


def test_input_when_not_mid_step_lands_at_once() -> None:
    hub = FakeHub()
    ui = hub.link(ReplicaSession("ui"))
    ui.session.local.push(Message.user("hi"))
    settle([ui])
    assert not hub.rejected and _texts(hub.conversation) == ["hi"]


def test_only_the_sender_withdraws_and_a_landed_one_is_a_conflict() -> None:
    hub, ui, worker = _mid_call()
    other = hub.link(ReplicaSession("other"))
    ui.session.local.push(Message.user("a"))
    ui.session.local.push(Message.user("b"))
    settle([ui, worker, other])
    first, second = _queued(hub.conversation)
    # Someone else may not withdraw it.
    other.session.local.remove_aside(first)
    settle([ui, worker, other])
    assert "forbidden" in hub.rejected and _queued(hub.conversation) == [first, second]
    # The sender may: it never lands.
    ui.session.local.remove_aside(first)
    settle([ui, worker, other])
    assert _queued(hub.conversation) == [second]
    # The sender withdraws the other one while the step ends: too late, `landed`.
    ui.session.local.remove_aside(second)
    worker.session.local.push(RESULT)
    worker.pump()
    worker.deliver_to_hub()  # the result lands, and the queue with it, before the withdrawal
    settle([ui, worker, other])
    assert _texts(hub.conversation) == ["find x", "looking", "", "b"]
    assert any(isinstance(e, Conflict) and e.reason == "landed" for e in ui.events)
    assert ui.session.local == hub.conversation


def test_a_bad_queued_aside_is_rejected_invalid() -> None:
    hub, ui, worker = _mid_call()
    held = hub.conversation.entry(0)
    assert held is not None and held.id is not None
    value = {"message": {"role": "user", "content": [{"type": "text", "text": "x"}]}}
    bad = Aside(QUEUED_KIND, None, Author.user(), value)  # no id
    ui.session.local._put_aside(queued_id(held.id), bad, bad.author)
    settle([ui, worker])
    assert "invalid" in hub.rejected and not _queued(hub.conversation)


def test_a_lost_reject_of_a_queued_push_never_reports_it_landed() -> None:
    hub, ui, worker = _mid_call()
    landed: list[list[ChangeRecord]] = []
    ui.session.on_landed = lambda seq, records: landed.append(records)
    id_ = ui.session.local.push(Message.user("also y"))
    ui.pump()
    ui.deliver_to_hub()
    assert hub.rejected == ["queued"]
    ui.cut()  # the reject is lost with the connection
    settle([ui, worker])
    # Resent, refused again, queued: only aside records were ever reported landed.
    pushed = [r for records in landed for r in records if isinstance(r.change, Push)]
    assert not pushed and hub.rejected == ["queued", "queued"]
    assert _queued(hub.conversation) == [queued_id(id_)]
    worker.session.local.push(RESULT)
    settle([ui, worker])
    assert hub.conversation.id(3) == id_ and len(hub.conversation) == 4
    assert ui.session.local == hub.conversation


def test_a_lost_ack_of_the_landing_push_loses_nothing_and_lands_once() -> None:
    hub, ui, worker = _mid_call()
    ui.session.local.push(Message.user("also y"))
    settle([ui, worker])
    worker.session.local.push(RESULT)
    worker.pump()
    worker.deliver_to_hub()
    worker.cut()  # the ack and the queue's records are lost with the connection
    settle([ui, worker])
    assert _texts(hub.conversation) == ["find x", "looking", "", "also y"]
    assert worker.session.local == hub.conversation == ui.session.local


# ---------------------------------------------------------------------- superseded and stop


def test_an_answer_made_before_a_request_landed_is_superseded() -> None:
    hub = FakeHub()
    ui = hub.link(ReplicaSession("ui"))
    worker = hub.link(ReplicaSession("worker"))
    ui.session.local.push(Message.user("hi"))
    settle([ui, worker])
    ui.session.local.push(Message.user("actually, bye"))
    ui.pump()
    ui.deliver_to_hub()  # lands; the worker has not seen it
    worker.session.local.push(Message.assistant("hello"))
    worker.pump()
    worker.deliver_to_hub()
    assert hub.rejected == ["superseded"]
    assert _texts(hub.conversation) == ["hi", "actually, bye"]
    settle([ui, worker])
    assert any(isinstance(e, Conflict) and e.reason == "superseded" for e in worker.events)
    assert worker.session.local == hub.conversation
    # The helper keeps what it wrote as an aborted message; the model still owes an answer.
    refused = [e.record for e in worker.events if isinstance(e, Conflict)]
    assert len(keep_superseded(worker.session.local, refused)) == 1
    settle([ui, worker])
    assert _texts(hub.conversation) == ["hi", "actually, bye", "hello"]
    kept = hub.conversation.messages()[-1]
    assert isinstance(kept, Assistant) and kept.stop == Stop("aborted", "superseded")
    assert hub.conversation.awaits_model() and hub.rejected == ["superseded"]


def test_a_stop_for_an_ended_turn_is_rejected_and_a_stop_is_reported() -> None:
    hub = FakeHub()
    ui = hub.link(ReplicaSession("ui"))
    worker = hub.link(ReplicaSession("worker"))
    ui.session.local.push(Message.user("hi"))
    settle([ui, worker])
    local = worker.session.local
    local.open_turn()
    local.end_turn(TurnEnd.answered(None))
    settle([ui, worker])
    ui.session.local.add_aside(Aside(STOP_KIND, None, Author.user(), step_value(0, 1)))
    settle([ui, worker])
    assert hub.rejected == ["turn_ended"]
    assert not any(a.kind == STOP_KIND for _, a in hub.conversation.asides())
    ui.session.local.add_aside(Aside(STOP_KIND, None, Author.user(), step_value(None, 1)))
    settle([ui, worker])
    assert any(isinstance(e, StopRequested) and e.turn is None for e in worker.events)


def test_the_pusher_holds_the_queue_before_its_flush_settles() -> None:
    """The ack counts the queue that landed with the push; the replica is settled (and pushes
    again) only once those records, sent right after the ack, are in."""
    hub, ui, worker = _mid_call()
    ui.session.local.push(Message.user("also y"))
    settle([ui, worker])
    session = worker.session
    session.local.push(RESULT)
    worker.pump()
    worker.deliver_to_hub()
    worker.deliver_to_replica()  # the ack alone
    assert session.revision < hub.core.revision and not session.settled
    session.local.push(Message.assistant("on it"))
    assert not worker.pump()  # made on what it holds; it waits for the queue first
    while worker.deliver_to_replica():
        pass
    assert session.revision == hub.core.revision and session.ready
    settle([ui, worker])
    assert _texts(hub.conversation)[-2:] == ["also y", "on it"]


def test_input_waits_while_a_stop_stands_and_lands_after_the_stopped_note() -> None:
    """No call pending, no marker: a stop request alone holds input back, and the helper's
    one push finishes the turn the way the seed reads a stopped turn."""
    hub = FakeHub()
    ui = hub.link(ReplicaSession("ui"))
    worker = hub.link(ReplicaSession("worker"))
    ui.session.local.push(Message.user("hi"))
    settle([ui, worker])
    worker.session.local.open_turn()
    settle([ui, worker])
    ui.session.local.add_aside(Aside(STOP_KIND, None, Author.user(), step_value(0, 1)))
    settle([ui, worker])
    ui.session.local.push(Message.user("more"))
    settle([ui, worker])
    assert "queued" in hub.rejected and _texts(hub.conversation) == ["hi"]
    before = hub.core.revision
    assert finish_stopped(worker.session.local, "Hel")
    settle([ui, worker])
    conversation = hub.conversation
    assert _texts(conversation) == ["hi", "Hel", "STOPPED", "more"]
    partial = conversation.messages()[1]
    assert isinstance(partial, Assistant) and partial.stop == Stop("aborted", "stopped")
    note = conversation.entry(2)
    assert note is not None and is_stopped_note(note.message, note.author)
    assert conversation.awaits_model() and conversation.halted() is None
    assert isinstance(conversation.turns()[-1][1].end, Stopped)
    assert not any(a.kind in (STOP_KIND, QUEUED_KIND) for _, a in conversation.asides())
    mark = hub.core.marks["worker"]
    assert (mark.ack_from, mark.ack_revision) == (before, hub.core.revision)  # one append
    assert ui.session.local == worker.session.local == conversation == hub.refolded()


def test_a_queued_aside_arriving_after_the_step_ended_lands_at_once() -> None:
    """The step ends between the `queued` reject and the aside's push: the aside's own push
    leaves the log not mid-step, so the entry lands in that same append."""
    hub, ui, worker = _mid_call()
    id_ = ui.session.local.push(Message.user("also y"))
    ui.pump()
    ui.deliver_to_hub()  # refused `queued`; the reject is on its way
    worker.session.local.push(RESULT)
    worker.pump()
    worker.deliver_to_hub()  # the step ends, nothing queued yet
    settle([ui, worker])
    assert _texts(hub.conversation) == ["find x", "looking", "", "also y"]
    assert hub.conversation.id(3) == id_ and not _queued(hub.conversation)
    assert ui.session.local == worker.session.local == hub.conversation


def test_an_edit_made_on_top_of_a_queued_batch_merges_with_what_overtook_it() -> None:
    """A UI's message goes out mid-step and an edit of an earlier entry follows it; another
    replica's edit of the same entry lands first and reaches the UI before the `queued`
    reject. The UI's edit merges with it (both changes kept, no conflict): it was made on the
    text before that edit, and the rebase must know it (it used to replay it by ids over it)."""
    fox = "The quick brown fox jumps over the lazy dog."
    hub = FakeHub()
    ui = hub.link(ReplicaSession("ui"))
    worker = hub.link(ReplicaSession("worker"))
    settle([ui, worker])
    ui.session.local.push(Message.user(fox))
    settle([ui, worker])
    worker.session.local.push(CALL)
    settle([ui, worker])
    assert mid_step(hub.conversation)

    def edit(link: Link, old: str, new: str) -> None:
        link.session.local.edit_each(
            Author.user(),
            lambda ref: Message.user(fox.replace(old, new)) if ref.index == 0 else None,
        )

    edit(worker, "brown", "RED")  # lands first; its records wait on the way to the UI
    assert worker.pump() and worker.deliver_to_hub()
    ui.session.local.push(Message.user("also y"))  # mid-step: refused `queued`
    assert ui.pump() and ui.deliver_to_hub()
    edit(ui, "lazy", "SLEEPY")  # made on top of it, on the text before the worker's edit
    settle([ui, worker])
    assert "queued" in hub.rejected
    merged = "The quick RED fox jumps over the SLEEPY dog."
    assert _texts(hub.conversation)[0] == merged
    assert not [e for e in ui.events + worker.events if isinstance(e, Conflict)]
    assert ui.session.local == worker.session.local == hub.conversation


def test_a_lost_ack_of_the_queued_aside_never_lands_the_entry_twice() -> None:
    """The replay of a refused push (the queued aside) lands but its ack is lost: on the
    next welcome the replica takes the aside as landed, resends nothing, and the entry lands
    once when the step ends."""
    hub, ui, worker = _mid_call()
    id_ = ui.session.local.push(Message.user("also y"))
    ui.pump()
    ui.deliver_to_hub()  # refused `queued`
    ui.deliver_to_replica()  # the reject: replayed as an aside
    ui.pump()
    ui.deliver_to_hub()  # the aside lands...
    assert _queued(hub.conversation) == [queued_id(id_)]
    ui.cut()  # ...and its ack is lost
    settle([ui, worker])
    assert _queued(ui.session.local) == [queued_id(id_)] and ui.session.pending == 0
    worker.session.local.push(RESULT)
    settle([ui, worker])
    assert _texts(hub.conversation).count("also y") == 1 and hub.conversation.id(3) == id_
    assert ui.session.local == hub.conversation == worker.session.local


def test_a_stop_too_late_is_the_only_conflict_and_the_message_typed_with_it_lands() -> None:
    """Stop pressed as the turn ended, a message typed right after, in one push: the hub
    refuses it `turn_ended`; the stop comes back as a conflict, the message still lands."""
    hub = FakeHub()
    ui = hub.link(ReplicaSession("ui"))
    worker = hub.link(ReplicaSession("worker"))
    ui.session.local.push(Message.user("find x"))
    settle([ui, worker])
    worker.session.local.open_turn()
    settle([ui, worker])
    stop = Aside(STOP_KIND, None, Author.user(), step_value(0, 5))
    ui.session.local.add_aside(stop)
    typed = ui.session.local.push(Message.user("and y"))
    answer = worker.session.local.push(Message.assistant("x"))
    worker.session.local.end_turn(TurnEnd.answered(answer))
    settle([worker])  # the turn ends before the UI's push arrives
    settle([ui, worker])
    assert "turn_ended" in hub.rejected
    conflicts = [e for e in ui.events if isinstance(e, Conflict)]
    assert [e.reason for e in conflicts] == ["turn_ended"]
    assert hub.conversation.holds(typed) and _texts(hub.conversation)[-1] == "and y"
    assert ui.session.local == hub.conversation
