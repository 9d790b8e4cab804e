"""`ConversationSnapshot` v1: the portable export of a conversation's messages and pins.

A snapshot holds only what rebuilds the history: the messages and a parallel pin mask. Ids,
authors and asides other than the pins are not part of it, and neither is a reply's token
`usage` (telemetry, the caller's concern: `from_conversation` leaves it out). What a provider
needs replayed (reasoning signatures, redacted data, `provider_data`) rebuilds the history, so
it stays.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

import msgspec

from .compact import pinned
from .conversation import Conversation
from .entries import PINS_KIND, Aside, Author
from .errors import SnapshotError
from .ids import IdMinter
from .messages import AnyMessage, Assistant

__all__ = ["VERSION", "ConversationSnapshot"]

VERSION: Final = 1


class _Raw(msgspec.Struct, frozen=True):
    version: int
    messages: list[AnyMessage]
    pinned: list[bool]


_decoder = msgspec.json.Decoder(_Raw)
_encoder = msgspec.json.Encoder()


class ConversationSnapshot(msgspec.Struct, frozen=True):
    """`{"version": 1, "messages": [...], "pinned": [...]}`; `pinned[i]` pins `messages[i]`.

    Build one with `new` (or `from_conversation`) so the lengths always agree.
    """

    version: int
    messages: list[AnyMessage]
    pinned: list[bool]

    VERSION: ClassVar[int] = VERSION

    @classmethod
    def new(cls, messages: list[AnyMessage], pinned: list[bool]) -> ConversationSnapshot:
        """A snapshot of the current version.

        Raises:
            SnapshotError: `length_mismatch` when the two lists differ in length.
        """
        if len(messages) != len(pinned):
            raise SnapshotError(
                "length_mismatch",
                f"{len(messages)} messages but {len(pinned)} pin flags",
            )
        return cls(VERSION, list(messages), list(pinned))

    @classmethod
    def decode(cls, data: bytes | str) -> ConversationSnapshot:
        """Read a snapshot from JSON.

        Raises:
            SnapshotError: `malformed` JSON or shape, `version` other than 1, or
                `length_mismatch`.
        """
        try:
            raw = _decoder.decode(data)
        except RecursionError as exc:
            raise SnapshotError("malformed", "not a snapshot: nested too deeply") from exc
        except msgspec.DecodeError as exc:
            # Say "version" when that is what is wrong, even if the rest is a newer shape.
            version = _version_of(data)
            if version is not None and version != VERSION:
                raise _bad_version(version) from exc
            raise SnapshotError("malformed", f"not a snapshot: {exc}") from exc
        if raw.version != VERSION:
            raise _bad_version(raw.version)
        return cls.new(raw.messages, raw.pinned)

    def encode(self) -> bytes:
        """The snapshot as JSON."""
        return _encoder.encode(self)

    @classmethod
    def from_conversation(cls, conversation: Conversation) -> ConversationSnapshot:
        """The messages of `conversation`, pinned as its `rig.pin` asides and its latest old
        `"pins"` aside say, each reply without its token `usage`."""
        pins: set[Any] = pinned(conversation)
        entries = conversation.entries()
        messages = [_without_usage(message) for message in conversation.messages()]
        return cls.new(messages, [ref.id in pins for ref in entries])

    def to_conversation(self, *, ids: IdMinter | None = None) -> Conversation:
        """A new conversation of these messages (one push record), with a `"pins"` aside naming
        the pinned entries when any is pinned."""
        conversation = Conversation.from_messages(self.messages, ids=ids)
        pinned = [conversation.id(at) for at, pin in enumerate(self.pinned) if pin]
        if pinned:
            conversation.add_aside(Aside(PINS_KIND, None, Author.rig(), pinned))
        return conversation


def _without_usage(message: AnyMessage) -> AnyMessage:
    if isinstance(message, Assistant) and message.usage is not None:
        return msgspec.structs.replace(message, usage=None)
    return message


def _version_of(data: bytes | str) -> int | None:
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    version = value.get("version") if isinstance(value, dict) else None
    return version if isinstance(version, int) else None


def _bad_version(version: int) -> SnapshotError:
    return SnapshotError("version", f"snapshot version {version} is not supported (only {VERSION})")
