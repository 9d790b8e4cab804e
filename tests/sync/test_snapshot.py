"""`ConversationSnapshot` v1: strict on version and lengths, pins both ways."""

from __future__ import annotations

import pytest

from sync import Conversation, Message, SnapshotError
from sync.snapshot import VERSION, ConversationSnapshot


def test_new_rejects_mismatched_lengths() -> None:
    """Building a snapshot whose lists differ in length says so, with both lengths."""
    with pytest.raises(SnapshotError) as caught:
        ConversationSnapshot.new([Message.user("a")], [True, False])
    assert caught.value.reason == "length_mismatch"
    assert "1 messages" in caught.value.message and "2 pin" in caught.value.message


def test_round_trip_through_json() -> None:
    """A snapshot encodes to the v1 JSON shape and decodes back equal."""
    snapshot = ConversationSnapshot.new([Message.user("a"), Message.assistant("b")], [True, False])
    data = snapshot.encode()
    assert data.startswith(b'{"version":1,"messages":[')
    assert ConversationSnapshot.decode(data) == snapshot
    assert snapshot.version == VERSION == ConversationSnapshot.VERSION


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"version":2,"messages":[],"pinned":[]}', "version"),
        (b'{"version":2,"messages":[{"role":"robot"}],"pinned":[]}', "version"),
        (b'{"version":1,"messages":[],"pinned":[true]}', "length_mismatch"),
        (b'{"version":1,"messages":', "malformed"),
        (b'{"version":1,"messages":[{"role":"user","content":"x"}],"pinned":[1]}', "malformed"),
        (b"[1, 2]", "malformed"),
    ],
)
def test_decode_rejects_bad_input_clearly(data: bytes, reason: str) -> None:
    """Wrong version, mismatched lengths and malformed JSON each give their own error."""
    with pytest.raises(SnapshotError) as caught:
        ConversationSnapshot.decode(data)
    assert caught.value.reason == reason
    assert caught.value.message


def test_conversion_keeps_pins() -> None:
    """Pins go to a "pins" aside and come back from it."""
    snapshot = ConversationSnapshot.new(
        [Message.user("a"), Message.assistant("b"), Message.user("c")], [False, True, True]
    )
    conversation = snapshot.to_conversation()
    pins = [aside for _, aside in conversation.asides() if aside.kind == "pins"]
    assert pins and pins[0].value == [conversation.id(1), conversation.id(2)]
    assert ConversationSnapshot.from_conversation(conversation) == snapshot


def test_unpinned_conversation_has_no_pins_aside() -> None:
    """A snapshot without pins makes no aside; a conversation without one exports no pins."""
    conversation = ConversationSnapshot.new([Message.user("a")], [False]).to_conversation()
    assert conversation.asides() == []
    plain = Conversation.from_messages([Message.user("x")])
    assert ConversationSnapshot.from_conversation(plain).pinned == [False]
