"""A queued entry lands once (SPEC 10 with SPEC 16's rebase), on the hub's real core without
sockets: a pending put of a queued aside the log has landed meanwhile is not replayed."""

from __future__ import annotations

import msgspec
from fakelink import FakeHub, settle

from client.session import Conflict, ReplicaSession
from sync import Aside, AsideChange, Assistant, Author, Message, Push, Text, ToolCall
from sync.steer import QUEUED_KIND, mid_step, queued_id

CALL = Assistant([Text("looking"), ToolCall("c1", "search", {"q": "x"})])
RESULT = Message.tool_result("c1", "search", "found")


def test_a_queued_aside_moved_while_its_queue_lands_is_not_landed_twice() -> None:
    """The sender moves its queued aside (as `normalize` moves asides) and sends user text
    while the worker's result lands the queue: the move is reported `landed`, the queued
    entry lands once, the text beside the move lands (chaos seed 82 of stop 33: twice)."""
    hub = FakeHub()
    ui = hub.link(ReplicaSession("ui"))
    worker = hub.link(ReplicaSession("worker"))
    ui.session.local.push(Message.user("find x"))
    settle([ui, worker])
    worker.session.local.push(CALL)
    settle([ui, worker])
    assert mid_step(hub.conversation)
    ui.session.local.push(Message.user("again"))
    settle([ui, worker])
    [(queued, aside)] = [(id_, a) for id_, a in ui.session.local.asides() if a.kind == QUEUED_KIND]
    ui.session.local.replace_aside(queued, msgspec.structs.replace(aside, after=None))
    ui.session.local.push(Message.user("hi"))  # user text in the same batch
    worker.session.local.push(RESULT)
    worker.pump()
    worker.deliver_to_hub()  # the result lands, and the queue with it, before the move
    settle([ui, worker])
    log = hub.log
    puts = [r for r in log if isinstance(r.change, AsideChange) and r.change.id == queued]
    assert [r.change.aside is None for r in puts] == [False, True]  # put once, removed once
    pushed = [e for r in log if isinstance(r.change, Push) for e in r.change.entries]
    assert [e.message for e in pushed].count(Message.user("again")) == 1
    assert any(isinstance(e, Conflict) and e.reason == "landed" for e in ui.events)
    assert [e.message for e in pushed].count(Message.user("hi")) == 1  # and its neighbour lands
    assert ui.session.local == worker.session.local == hub.conversation


def test_a_queued_aside_for_a_landed_entry_beside_user_text_is_refused() -> None:
    """A push of user text with a put of a queued aside for an entry the log holds (made on
    the current log: no rebase to drop it) is refused `invalid`, as it is alone."""
    hub = FakeHub()
    ui = hub.link(ReplicaSession("ui"))
    ui.session.local.push(Message.user("hello"))
    settle([ui])
    held = hub.conversation.entry(0)
    assert held is not None and held.id is not None
    value = {"message": {"role": "user", "content": [{"type": "text", "text": "x"}]}}
    value |= {"id": held.id, "author": None, "source_id": None}
    again = Aside(QUEUED_KIND, None, Author.user(), value)
    ui.session.local._put_aside(queued_id(held.id), again, again.author)
    ui.session.local.push(Message.user("more"))
    settle([ui])
    assert "invalid" in hub.rejected
    assert not [id_ for id_, a in hub.conversation.asides() if a.kind == QUEUED_KIND]
