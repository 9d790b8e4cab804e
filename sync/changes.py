"""Changes, change records and the serde form of a conversation (its state)."""

from __future__ import annotations

import msgspec

from .entries import Aside, Author, Entry, Halt, SavedAside
from .ids import AsideId, Count, MessageId

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
    "Via",
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


class Via(msgspec.Struct, frozen=True, gc=False):
    """Who really sent a record, as the hub saw it: the token's principal and the client id."""

    sub: str
    client: str


class ChangeRecord(msgspec.Struct, frozen=True, gc=False):
    """A change with who made it and when (ms since the epoch; the hub stamps a null `at`).

    `via` is stamped by a hub running with auth (SPEC 6), whatever `by` claims. It is `UNSET`
    otherwise and then left out of the JSON, so records of a hub without auth keep their bytes.
    """

    change: AnyChange
    by: Author | None = None
    at: Count | None = None
    via: Via | msgspec.UnsetType = msgspec.UNSET
