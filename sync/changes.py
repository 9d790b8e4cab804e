"""Changes, change records and the serde form of a conversation (its state)."""

from __future__ import annotations

import msgspec

from .entries import Aside, Author, Entry, Halt, SavedAside
from .ids import AsideId, MessageId

__all__ = [
    "AnyChange",
    "AsideChange",
    "Change",
    "ChangeRecord",
    "ConversationState",
    "HaltChange",
    "Push",
    "Reset",
    "Splice",
]


class Change(msgspec.Struct, frozen=True, gc=False, tag_field="type"):
    """Base of every change: one edit of a conversation."""


class Push(Change, frozen=True, tag="push"):
    """Entries appended at the end."""

    entries: list[Entry]


class Splice(Change, frozen=True, tag="splice"):
    """Entries `start:stop` (whose ids are `removed`) replaced with `entries`."""

    start: int
    stop: int
    removed: list[MessageId]
    entries: list[Entry]


class HaltChange(Change, frozen=True, tag="halt"):
    """The halt set (or cleared, with `None`)."""

    halt: Halt | None


class AsideChange(Change, frozen=True, tag="aside"):
    """Aside `id` put (or replaced in place), or removed with `None`."""

    id: AsideId
    aside: Aside | None


class ConversationState(msgspec.Struct, frozen=True, gc=False):
    """A conversation's serde form: everything a log holds, without outbox, revision or
    lineage."""

    entries: list[Entry] = msgspec.field(default_factory=list)
    asides: list[SavedAside] = msgspec.field(default_factory=list)
    halt: Halt | None = None
    retired: list[MessageId] = msgspec.field(default_factory=list)


class Reset(Change, frozen=True, tag="reset"):
    """The whole value replaced: entries, saved asides, halt and retired ids."""

    state: ConversationState


AnyChange = Push | Splice | HaltChange | AsideChange | Reset


class ChangeRecord(msgspec.Struct, frozen=True, gc=False):
    """A change with who made it and when (ms since the epoch; the hub stamps a null `at`)."""

    change: AnyChange
    by: Author | None = None
    at: int | None = None
