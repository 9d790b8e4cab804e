"""Entries (a message with its id and author), asides, notes, turn records and halts."""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec

from .ids import AsideId, MessageId, made_ms
from .messages import AnyMessage, Assistant, Message, Text, User
from .untrack import untrack_tree

__all__ = [
    "STOPPED",
    "Aside",
    "Author",
    "AuthorKind",
    "Entry",
    "EntryRef",
    "Halt",
    "Note",
    "TurnEnd",
    "TurnRecord",
    "is_stopped_note",
    "stopped_note",
]

AuthorKind = Literal["user", "agent", "plugin", "rig"]

STOPPED = "STOPPED"
"""The text of the note that separates a stopped request from what was sent next."""


class Author(msgspec.Struct, frozen=True, gc=False):
    """Who put an entry (or an aside) there, when it is not the user's own or the model's."""

    kind: AuthorKind
    name: str | None = None
    request: str | None = None
    title: str | None = None

    @staticmethod
    def user(title: str | None = None) -> Author:
        return Author("user", title=title)

    @staticmethod
    def agent(name: str, request: str | None = None) -> Author:
        """A subagent or delegating caller; `request` names the request it acted on."""
        return Author("agent", name=name, request=request)

    @staticmethod
    def plugin(name: str) -> Author:
        return Author("plugin", name=name)

    @staticmethod
    def rig() -> Author:
        """The engine itself: its STOPPED notes and its own repairs."""
        return Author("rig")

    def titled(self, title: str) -> Author:
        """This author with a title shown in headers."""
        return msgspec.structs.replace(self, title=title)


_RIG = Author.rig()


class Entry(msgspec.Struct, frozen=True, gc=False):
    """A message held by a conversation, with its id, author and source.

    `Entry(message)` has no id yet: the conversation mints one when the entry goes in.
    """

    message: AnyMessage
    id: MessageId | None = None
    author: Author | None = None
    source_id: str | None = None

    @property
    def made(self) -> int | None:
        """The millisecond the entry was made, read from its id (`None` before it has one)."""
        return None if self.id is None else made_ms(self.id)


class EntryRef(msgspec.Struct, frozen=True, gc=False):
    """An entry as `Conversation.entries()` yields it: with its index."""

    index: int
    id: MessageId
    message: AnyMessage
    author: Author | None
    source_id: str | None

    @property
    def made(self) -> int:
        return made_ms(self.id)

    @property
    def entry(self) -> Entry:
        return Entry(self.message, self.id, self.author, self.source_id)

    def is_users_own(self) -> bool:
        """A user message with text or attachments, written by the user (no author, or an
        untitled user author)."""
        author = self.author
        return (
            _asks(self.message)
            and (author is None or (author.kind == "user" and author.title is None))
            and not self.is_stop_marker()
        )

    def is_request(self) -> bool:
        """A user message with text or attachments (not only results) that is not a STOPPED
        note."""
        return _asks(self.message) and not self.is_stop_marker()

    def is_stop_marker(self) -> bool:
        """Whether this is the STOPPED note."""
        return is_stopped_note(self.message, self.author)


def _asks(message: Message) -> bool:
    return isinstance(message, User) and bool(message.content) and not message.only_results()


def stopped_note() -> Entry:
    """A fresh (id-less) STOPPED note, authored by the engine."""
    return Entry(User([Text(STOPPED)]), author=_RIG)


def is_stopped_note(message: Message, author: Author | None) -> bool:
    return (
        author is not None  # first: most entries have none, and `None == _RIG` is slow
        and author == _RIG
        and isinstance(message, User)
        and len(message.content) == 1
        and message.content[0] == Text(STOPPED)
    )


def is_failed_reply(message: Message) -> bool:
    """An assistant reply cut short: kept in the history, never read by a model."""
    return isinstance(message, Assistant) and message.failed()


class Halt(enum.StrEnum):
    """Why the user's last message is left unanswered."""

    STOPPED = "stopped"
    """The user stopped the turn answering it; the next entry pushed follows a STOPPED note."""
    KEPT = "kept"
    """Left for a later turn."""


class Aside(msgspec.Struct, frozen=True, gc=False):
    """Data that travels with a conversation but is never sent to a model.

    `after` is the id of the entry it is drawn after (`None`: before the first). An unsaved
    aside (`saved=False`) lives only in the value that holds it.
    """

    kind: str
    after: MessageId | None
    author: Author
    value: Any
    saved: bool = True

    def __post_init__(self) -> None:
        untrack_tree(self.value)  # a turn record's nested dicts: see `sync/untrack.py`

    @staticmethod
    def note(title: str, text: str, after: MessageId | None, author: Author | None = None) -> Aside:
        return Aside("note", after, author or Author.user(), {"title": title, "text": text})


class Note(msgspec.Struct, frozen=True, gc=False):
    """The value of an aside of kind `"note"`."""

    title: str
    text: str


class TurnEnd(msgspec.Struct, frozen=True, gc=False, tag_field="how"):
    """How a turn ended: `TurnEnd.answered(id)`, `.failed(why)` or `.stopped(why=None)`."""

    @staticmethod
    def answered(answer: MessageId | None) -> Answered:
        return Answered(answer)

    @staticmethod
    def failed(why: str) -> Failed:
        return Failed(why)

    @staticmethod
    def stopped(why: str | None = None) -> Stopped:
        """`why` is `None` when the user stopped it."""
        return Stopped(why)


class Answered(TurnEnd, frozen=True, tag="answered"):
    answer: MessageId | None


class Failed(TurnEnd, frozen=True, tag="failed"):
    why: str


class Stopped(TurnEnd, frozen=True, tag="stopped"):
    why: str | None = None


AnyTurnEnd = Answered | Failed | Stopped


class TurnOwner(msgspec.Struct, frozen=True, gc=False):
    """Who runs a turn (SPEC 10): the token's `sub` (`anonymous` without auth) and the
    replica's client id. The hub checks it against the socket that opens the turn."""

    sub: str
    client: str


class TurnRecord(msgspec.Struct, frozen=True, gc=False):
    """The value of a `"rig.turn"` aside: the turn's number, where it began, how it ended,
    and who runs it (`owner`, absent from records made before turns had owners: the hub then
    takes the identity of the socket that opened it)."""

    index: int
    start: MessageId
    end: AnyTurnEnd | None = None
    owner: TurnOwner | None = None

    def value(self) -> dict[str, Any]:
        """The record as an aside's value; `owner` only when there is one, so records without
        one encode as they always did."""
        value: dict[str, Any] = msgspec.to_builtins(self)
        if self.owner is None:
            del value["owner"]
        return value


TURN_KIND = "rig.turn"
PINS_KIND = "pins"


class SavedAside(msgspec.Struct, frozen=True, gc=False):
    """An aside as a conversation's state lists it: with its id."""

    id: AsideId
    kind: str
    after: MessageId | None
    author: Author
    value: Any
    saved: bool = True

    @property
    def aside(self) -> Aside:
        return Aside(self.kind, self.after, self.author, self.value, self.saved)

    @staticmethod
    def of(id_: AsideId, aside: Aside) -> SavedAside:
        return SavedAside(id_, aside.kind, aside.after, aside.author, aside.value, aside.saved)
