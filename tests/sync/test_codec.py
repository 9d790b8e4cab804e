"""The codec: exact JSON, clear errors that say where, and no crash on hostile input."""

from __future__ import annotations

import pytest

from sync import (
    ChangeRecord,
    DecodeError,
    Entry,
    Message,
    Push,
    decode_message,
    decode_record,
    decode_state,
    encode,
)
from sync.protocol import decode_client_message


def test_message_json_is_the_documented_shape() -> None:
    """Messages encode exactly as SPEC 1.1 lists them, with §11's `usage` beside `origin`."""
    assert encode(Message.user("hi")) == b'{"role":"user","content":[{"type":"text","text":"hi"}]}'
    assert encode(Message.assistant("ok")) == (
        b'{"role":"assistant","content":[{"type":"text","text":"ok"}],"stop":null,"origin":null,'
        b'"usage":null}'
    )
    assert decode_message(encode(Message.system("s"))) == Message.system("s")


def test_decode_errors_say_where() -> None:
    """A wrong field type is reported with its JSON path."""
    with pytest.raises(DecodeError) as caught:
        decode_record(
            b'{"change":{"type":"push","entries":[{"message":{"role":"user","content":7}}]}}'
        )
    assert "$.change.entries[0].message.content" in caught.value.message


def test_unknown_fields_are_ignored() -> None:
    """Fields added by a newer peer are ignored on decode (forward compatibility)."""
    record = ChangeRecord(Push([Entry(Message.user("x"), id="msg_" + "0" * 12 + "7" + "0" * 19)]))
    data = encode(record)[:-1] + b',"future":{"x":1}}'
    assert decode_record(data) == record


@pytest.mark.parametrize(
    "decode", [decode_record, decode_message, decode_state, decode_client_message]
)
def test_deep_nesting_is_a_decode_error(decode: object) -> None:
    """Found by fuzzing: deep nesting inside a free-form value raised RecursionError."""
    deep = b"[" * 100_000 + b"]" * 100_000
    data = (
        b'{"type":"push","seq":1,"lineage":0,"revision":0,"records":[{"change":{"type":"push",'
        b'"entries":[{"message":{"role":"assistant","content":[{"type":"tool_call","id":"c",'
        b'"name":"f","arguments":{"a":' + deep + b"}}]}}]}}]}"
    )
    with pytest.raises(DecodeError):
        decode(data)  # type: ignore[operator]
