"""Message containers leave the garbage collector's lists, and nothing a caller sees changes."""

from __future__ import annotations

import gc
import sys

import msgspec
import pytest

from sync import (
    Aside,
    Assistant,
    Author,
    ChangeRecord,
    Conversation,
    Entry,
    IdMinter,
    Json,
    Message,
    Push,
    Stop,
    Text,
    ToolCall,
    ToolResult,
    TurnEnd,
    User,
    decode_message,
    decode_record,
    encode,
)

cpython_only = pytest.mark.skipif(
    sys.implementation.name != "cpython", reason="only CPython's collector tracks containers"
)


def _call(i: int = 0) -> ToolCall:
    return ToolCall(f"c{i}", "run", {"cmd": ["pytest", "-q"], "env": {"CI": "1"}, "n": i})


def _messages() -> list[User | Assistant]:
    return [
        User([Text("look"), Text("here")]),
        Assistant([Text("running"), _call()], stop=Stop("tool_use")),
        User([ToolResult("c0", "run", [Text("ok"), Json({"passed": [1, 2]})])]),
    ]


def test_constructors_take_lists_and_keep_them() -> None:
    """Content given as a list is held as an equal list, readable as before."""
    message = User([Text("a"), Text("b")])
    assert type(message.content) is list
    assert message.content == [Text("a"), Text("b")]
    assert Message.user("x").content == [Text("x")]
    result = ToolResult("c", "n", [Text("r")])
    assert result.content == [Text("r")] and type(result.content) is list
    assert Message.tool_result("c", "n", "r").tool_results() == [result]
    assert _call().arguments == {"cmd": ["pytest", "-q"], "env": {"CI": "1"}, "n": 0}


def test_tuple_built_messages_equal_list_built_ones() -> None:
    """A message built with a tuple of parts equals the one built with a list, and holds a list."""
    assert User((Text("a"),)) == User([Text("a")])
    assert type(User((Text("a"),)).content) is list
    assert Assistant((Text("a"), _call()), stop=Stop("stop")) == Assistant(
        [Text("a"), _call()], stop=Stop("stop")
    )
    assert ToolResult("c", "n", (Text("r"),)) == ToolResult("c", "n", [Text("r")])
    replaced = msgspec.structs.replace(User([Text("a")]), content=(Text("b"),))
    assert replaced == User([Text("b")])


def test_wire_round_trip_is_byte_identical() -> None:
    """Encoding a decoded message gives the same bytes, list-built or tuple-built."""
    for message in _messages():
        data = encode(message)
        assert encode(decode_message(data)) == data
        assert decode_message(data) == message
    tuple_built = User((Text("a"),))
    assert encode(tuple_built) == b'{"role":"user","content":[{"type":"text","text":"a"}]}'
    record = ChangeRecord(Push([Entry(m, IdMinter().message_id()) for m in _messages()]))
    assert encode(decode_record(encode(record))) == encode(record)


@cpython_only
def test_decoded_and_built_containers_are_not_tracked() -> None:
    """Content lists, tool call arguments and JSON values, decoded or built, are untracked."""
    for message in [*_messages(), *(decode_message(encode(m)) for m in _messages())]:
        assert not gc.is_tracked(message.content)
        for part in message.content:
            match part:
                case ToolCall(arguments=arguments):
                    assert not gc.is_tracked(arguments)
                    assert not gc.is_tracked(arguments["cmd"])
                    assert not gc.is_tracked(arguments["env"])
                case ToolResult(content=content):
                    assert not gc.is_tracked(content)
                    json_part = content[1]
                    assert isinstance(json_part, Json)
                    assert not gc.is_tracked(json_part.value)
                    assert not gc.is_tracked(json_part.value["passed"])


@cpython_only
def test_containers_holding_other_objects_stay_tracked() -> None:
    """A container holding a tracked object of the caller's stays tracked (no cycle is hidden)."""

    class Payload:
        pass

    odd = User([Text("a"), Payload()])  # type: ignore[list-item]
    assert gc.is_tracked(odd.content)
    call = ToolCall("c", "n", {"deep": [{"obj": Payload()}]})
    assert gc.is_tracked(call.arguments)
    assert gc.is_tracked(call.arguments["deep"])
    deep: list[object] = []
    for _ in range(150):
        deep = [deep]
    assert gc.is_tracked(Json(deep).value)


@cpython_only
def test_a_replica_state_adds_no_tracked_objects() -> None:
    """Folding 600 decoded records into two values adds no GC-tracked object per message."""
    writer = Conversation()
    for i in range(200):
        writer.open_turn()
        writer.push(Message.user(f"q{i}"))
        writer.push(Assistant([Text("t"), _call(i)], stop=Stop("tool_use")))
        writer.push(User([ToolResult(f"c{i}", "run", [Text("out")])]))
        writer.end_turn(TurnEnd.answered(None))
    wire = [encode(record) for record in writer.take_unsaved()]
    del writer
    gc.collect()
    before = len(gc.get_objects())
    confirmed, local = Conversation(), Conversation()
    for data in wire:
        record = decode_record(data)
        confirmed.apply(record)
        local.apply(record)
    del wire, record
    gc.collect()
    assert len(confirmed) == 600 and confirmed == local
    assert len(gc.get_objects()) - before < 50  # the two values' own lists and dicts


@cpython_only
def test_aside_values_are_untracked() -> None:
    """An ended turn record's nested value is untracked once the aside is put."""
    conversation = Conversation()
    conversation.open_turn()
    conversation.end_turn(TurnEnd.answered(conversation.push(Message.user("q"))))
    _, aside = conversation.asides()[0]
    assert isinstance(aside.value, dict) and isinstance(aside.value["end"], dict)
    assert not gc.is_tracked(aside.value)
    note = Aside("data", None, Author.rig(), {"rows": [[1, 2], [3]]})
    assert not gc.is_tracked(note.value) and not gc.is_tracked(note.value["rows"][0])


@cpython_only
def test_the_entry_list_stays_untracked_through_every_change() -> None:
    """A full collection visits every item of a tracked list, so the list holding a
    conversation's entries must stay untracked: when made, after pushes and a splice, after a
    reset record, a reread and a copy, and in values made from a state."""
    from sync import Reset, decode_state

    conversation = Conversation()
    conversation.push(Message.user("one"))
    conversation.push(Message.user("two"))
    conversation.splice(slice(0, 1), [Message.user("uno")], None)
    log = Conversation()
    for record in conversation.take_unsaved():
        log.apply(record)
    reread = Conversation()
    reread.reread(log)
    reset = Conversation()
    reset.apply(ChangeRecord(Reset(log.state()), Author.rig(), 0))
    made = [
        conversation,
        conversation.copy(),
        log,
        reread,
        reset,
        Conversation.from_state(log.state()),
        decode_state(encode(log)),
    ]
    for value in made:
        assert value.messages() == [Message.user("uno"), Message.user("two")]
        assert not gc.is_tracked(value._entries), value
