"""The model's provider fields (§11): reasoning signatures, redacted data, `provider_data` and
token usage read from old logs unchanged, survive the codec, import and a snapshot (which
leaves usage out and says so)."""

from __future__ import annotations

import json

from client.transfer import read_conversation, snapshot_leaves_out
from sync import (
    Assistant,
    ChangeRecord,
    Conversation,
    Message,
    Origin,
    Reasoning,
    Stop,
    Text,
    ToolCall,
    Usage,
    decode_message,
    decode_record,
    encode,
)
from sync.snapshot import ConversationSnapshot

# A push record as a log written before these fields existed holds it, byte for byte.
OLD_LOG_RECORD = (
    b'{"change":{"type":"push","entries":[{"id":"msg_0192d3a4b5c67d8e9f00112233445566",'
    b'"message":{"role":"assistant","content":[{"type":"reasoning","text":"hmm",'
    b'"redacted":false},{"type":"text","text":"hi"},{"type":"tool_call","id":"c1",'
    b'"name":"f","arguments":{"x":1}}],"stop":{"reason":"tool_use","detail":null},'
    b'"origin":{"provider":"anthropic","model":"m","response_id":null}},"author":null,'
    b'"source_id":null}]},"by":null,"at":1700000000000}'
)

FULL = Assistant(
    [
        Reasoning("think", signature="sig=="),
        Reasoning("", redacted=True, data="opaque-bytes"),
        Reasoning("summary", provider_data={"id": "rs_1", "encrypted_content": "enc"}),
        Text("answer"),
        ToolCall("c1", "f", {"x": 1}, provider_data={"id": "fc_1"}),
    ],
    stop=Stop("tool_use"),
    origin=Origin("openai-responses", "m", "resp_1"),
    usage=Usage(10, 5, cache_read_tokens=3, cache_write_tokens=None, reasoning_tokens=2),
)


def test_an_old_log_reads_unchanged_with_the_defaults() -> None:
    """A record written before the fields existed decodes with every new field at its default,
    and its message equals one built without them."""
    record = decode_record(OLD_LOG_RECORD)
    conversation = Conversation()
    conversation.apply(record)
    message = conversation.messages()[0]
    assert isinstance(message, Assistant)
    assert message.usage is None
    reasoning = message.content[0]
    assert isinstance(reasoning, Reasoning)
    assert (reasoning.signature, reasoning.data, reasoning.provider_data) == (None, None, None)
    call = message.content[2]
    assert isinstance(call, ToolCall) and call.provider_data is None
    assert message == Assistant(
        [Reasoning("hmm"), Text("hi"), ToolCall("c1", "f", {"x": 1})],
        stop=Stop("tool_use"),
        origin=Origin("anthropic", "m"),
    )


def test_the_fields_survive_the_codec() -> None:
    """Encoding and decoding keeps every opaque field and the usage exactly."""
    assert decode_message(encode(FULL)) == FULL
    wire = json.loads(encode(FULL))
    assert wire["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_tokens": 3,
        "cache_write_tokens": None,
        "reasoning_tokens": 2,
    }
    assert wire["content"][0]["signature"] == "sig=="
    assert wire["content"][1]["data"] == "opaque-bytes"


def test_import_accepts_the_fields() -> None:
    """Import of a state with the new fields keeps them (no "unknown key" refusal)."""
    source = Conversation.from_messages([Message.user("q"), FULL])
    copy = read_conversation(encode(source), "state")
    assert copy.messages() == source.messages()
    snapshot = ConversationSnapshot.new([Message.user("q"), FULL], [False, False]).encode()
    assert read_conversation(snapshot, "snapshot").messages()[1] == FULL


def test_snapshot_leaves_out_usage_and_says_so() -> None:
    """A snapshot v1 keeps signatures and provider data but not the usage, and
    `snapshot_leaves_out` names the replies whose usage it drops."""
    conversation = Conversation.from_messages([Message.user("q"), FULL, Message.assistant("x")])
    snapshot = ConversationSnapshot.from_conversation(conversation)
    reply = snapshot.messages[1]
    assert isinstance(reply, Assistant)
    assert reply.usage is None
    assert reply.content == FULL.content
    assert "the token usage of 1 reply" in snapshot_leaves_out(conversation)
    assert not any("usage" in what for what in snapshot_leaves_out(snapshot.to_conversation()))


def test_a_record_with_the_fields_folds_in_both_directions() -> None:
    """A push of a message with the fields folds, and the fold's outbox re-encodes to it."""
    conversation = Conversation()
    conversation.push(FULL)
    (record,) = conversation.unsaved()
    again = decode_record(encode(record))
    assert isinstance(again, ChangeRecord)
    other = Conversation()
    other.apply(again)
    assert other.messages() == [FULL]
