"""A copy of a rejected push must not be placed later (found by chaos seed 90)."""

from __future__ import annotations

from typing import Any

from server.core import AppendRecords, CoreConfig, RoomCore, Send
from sync import Assistant, ChangeRecord, Conversation, Message, Stop, Text
from sync.protocol import Ack, Hello, PushBatch, Reject, decode_hub_message

NOW = 1_700_000_000_000


def made(message: Message | None = None, *, halt: str | None = None) -> ChangeRecord:
    """One record: a push of `message`, or a halt (made on a log whose last message is the
    user's, as a replica makes it)."""
    maker = Conversation()
    if halt is not None:
        maker.push(Message.user("question"))
        maker.take_unsaved()
        assert maker.halt(halt)
    else:
        assert message is not None
        maker.push(message)
    [record] = maker.take_unsaved()
    return record


def answers(actions: list[Any], conn: str) -> list[Any]:
    return [decode_hub_message(a.frame) for a in actions if isinstance(a, Send) and a.to == conn]


def landed(room: RoomCore[str], conn: str, seq: int, record: ChangeRecord) -> None:
    """Push `record` from `conn` at the room's head and let the store accept it."""
    actions = room.push(conn, PushBatch(seq, room.lineage, room.revision, [record]), NOW)
    call = actions[-1]
    assert isinstance(call, AppendRecords)
    assert isinstance(answers(room.resume(call.from_ + len(call.records)), conn)[-1], Ack)


def test_a_duplicated_push_rejected_once_is_not_placed_when_the_log_would_take_it() -> None:
    """A push the hub rejected `behind` (its halt no longer fit) and that the network then
    delivers again after the log moved (the halt fits again) is rejected again, not placed:
    its replica already rebased those records, so placing the copy would land them twice."""
    room: RoomCore[str] = RoomCore("c", CoreConfig(max_frame=1 << 20))
    room.load(None)
    room.join("a", Hello("a", room.lineage, 0, features=["hub_rebase"]))
    room.join("b", Hello("b", room.lineage, 0))
    landed(room, "b", 1, made(Message.user("question")))
    halt = PushBatch(1, room.lineage, 1, [made(halt="kept")])  # a halts, at revision 1
    landed(room, "b", 2, made(Assistant([Text("answer")], stop=Stop("stop"))))
    [reject] = answers(room.push("a", halt, NOW), "a")  # the model owes nothing now
    assert isinstance(reject, Reject) and reject.reason == "behind"
    landed(room, "b", 3, made(Message.user("again")))  # now it owes an answer again
    copy = room.push("a", halt, NOW)  # the same frame, delivered twice
    assert not any(isinstance(action, AppendRecords) for action in copy)
    [again] = answers(copy, "a")
    assert isinstance(again, Reject) and again.seq == 1
    assert room.revision == 3 and room.conversation.halted() is None
