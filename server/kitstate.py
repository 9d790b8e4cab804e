"""What a chat kit's endpoint reads from a conversation, pure (SPEC 13).

How this works: a kit (the AI SDK's `useChat`, an AG-UI client) sees a conversation as a
list of messages with ids it may have minted itself, and one answer in progress. This module
gives both sides of that view from a replica's state, with no I/O:

- `answer_in_progress` reads the answer to the user's last message: the entries committed
  since it, the drafts still open, the approvals of its turn, and whether it is still
  running or waits only for a person;
- `read_sent` reads the messages a kit sends back (its whole history, as kits do): which
  user messages are new, and whether the history would edit or reorder the log (a kit's
  edit: answered 409 until branching exists);
- `kit_id` is the id a kit knows an entry by: the id it minted (kept in `source_id`), else
  the entry's own.

Async API: none (pure).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sync import Conversation, EntryRef, Text, TurnRecord, User
from sync.approvals import Approval, approvals, parked
from sync.entries import Entry
from sync.ids import AsideId
from sync.steer import is_user_text, mid_step, open_turn, queued_entry

__all__ = [
    "MAX_KIT_ID",
    "Answer",
    "DraftView",
    "SentMessage",
    "SentReading",
    "answer_in_progress",
    "kit_id",
    "read_sent",
    "user_text",
]

MAX_KIT_ID = 256
"""The longest message id a kit may give (kept in `source_id`)."""


@dataclass(frozen=True)
class DraftView:
    """An open draft as the kit endpoints read it (`client.live.Draft` has the same fields;
    kept apart so this module needs no client import)."""

    id: str
    since: int
    parts: Mapping[str, str]
    names: Mapping[str, str]


@dataclass(frozen=True)
class Answer:
    """The answer to the user's last message, as far as the log and the drafts tell.

    Attributes:
        request: the entry of the user's last message (None: the log holds none).
        entries: the entries committed after it, in log order (assistant messages, tool
            results, notes).
        drafts: the drafts open now whose entries are not in the log yet, oldest first.
        approvals: the approvals and questions of the answer's turn (every state), in the
            order asked; empty without a turn record.
        turn: the turn record answering it (the open one, or the last one when it started
            at the request or later), if any.
        running: the answer is not over: its turn is open, a step is under way, a draft is
            open, or the request still waits for the model.
        parked: it waits only for a person (an open approval, a frontend tool's call).
    """

    request: EntryRef | None
    entries: tuple[EntryRef, ...]
    drafts: tuple[DraftView, ...]
    approvals: tuple[tuple[AsideId, Approval], ...]
    turn: TurnRecord | None
    running: bool
    parked: bool

    @property
    def open_approvals(self) -> list[tuple[AsideId, Approval]]:
        return [(id_, a) for id_, a in self.approvals if a.is_open]

    @property
    def first_id(self) -> str | None:
        """The id of the answer's first entry or draft (its stable name: a draft takes the
        id its entry will have); None while nothing of it exists."""
        if self.entries:
            return self.entries[0].id
        if self.drafts:
            return self.drafts[0].id
        return None


def kit_id(ref: EntryRef | Entry) -> str:
    """The id a kit knows an entry by: the one it minted (`source_id`), else the entry's."""
    known = ref.source_id or ref.id
    assert known is not None  # entries in a conversation have ids
    return known


def user_text(ref: EntryRef | Entry) -> str:
    """The text of a user message (its text parts joined)."""
    message = ref.message
    if not isinstance(message, User):
        return ""
    return "".join(part.text for part in message.content if isinstance(part, Text))


def _is_request(ref: EntryRef) -> bool:
    return is_user_text(Entry(ref.message, ref.id, ref.author, ref.source_id))


def answer_in_progress(conversation: Conversation, drafts: Iterable[DraftView]) -> Answer:
    """The answer to the user's last message in `conversation`, with the `drafts` a replica
    sees open (a draft whose entry already landed is left out)."""
    entries = conversation.entries()
    at = len(entries) - 1
    while at >= 0 and not _is_request(entries[at]):
        at -= 1
    request = entries[at] if at >= 0 else None
    committed = tuple(entries[at + 1 :])
    held = {ref.id for ref in committed}
    open_drafts = tuple(
        sorted(
            (d for d in drafts if d.id not in held and not conversation.holds(d.id)),
            key=lambda d: (d.since, d.id),
        )
    )
    turn = _turn_of(conversation, request)
    asked = tuple((id_, a) for id_, a in approvals(conversation) if turn and a.turn == turn.index)
    still_open = open_turn(conversation) is not None
    running = (
        still_open or mid_step(conversation) or bool(open_drafts) or conversation.awaits_model()
    )
    return Answer(
        request=request,
        entries=committed,
        drafts=open_drafts,
        approvals=asked,
        turn=turn,
        running=running,
        parked=still_open and not open_drafts and parked(conversation),
    )


def _turn_of(conversation: Conversation, request: EntryRef | None) -> TurnRecord | None:
    """The turn answering `request`: the open turn, else the last turn record when it began
    at the request's run of user messages or later."""
    found = open_turn(conversation)
    if found is not None:
        return found[1]
    turns = conversation.turns()
    if not turns:
        return None
    last = turns[-1][1]
    start = conversation.index_of(last.start)
    if request is None or start is None:
        return last if request is None else None
    first = request.index
    while first > 0 and _is_request(conversation.entries()[first - 1]):
        first -= 1
    return last if start >= first else None


@dataclass(frozen=True)
class SentMessage:
    """A message as a kit sends it back: its id, role and (for a user message) its text."""

    id: str
    role: str
    text: str = ""


@dataclass(frozen=True)
class SentReading:
    """What a kit's sent history means for the log.

    Attributes:
        new: the user messages the log does not hold yet (by kit id, nor queued), in order.
        problem: why the history would edit or reorder the log (answer 409), or None.
    """

    new: tuple[SentMessage, ...]
    problem: str | None


def read_sent(conversation: Conversation, sent: Sequence[SentMessage]) -> SentReading:
    """Read the history a kit sent against the log.

    A user message the log holds (by kit id) must have the same text (else: an edit); the
    ones the log holds must come in log order, and none after a new one (else: a rewrite).
    Ids the log does not know are new user messages; other roles with unknown ids are the
    kit's own (a reply in progress, a client-side message) and read as nothing. Messages
    queued behind a running step (SPEC 10) count as held.
    """
    known: dict[str, EntryRef] = {}
    for entry_ref in conversation.entries():
        known.setdefault(kit_id(entry_ref), entry_ref)
    queued: dict[str, Entry] = {}
    for _, aside in conversation.asides():
        entry = queued_entry(aside)
        if entry is not None:
            queued.setdefault(kit_id(entry), entry)
    new: list[SentMessage] = []
    last_index = -1
    for message in sent:
        ref = known.get(message.id)
        held: EntryRef | Entry | None = ref if ref is not None else queued.get(message.id)
        if held is None:
            if message.role == "user":
                new.append(message)
            continue
        if new:
            return SentReading((), f"message {message.id!r} comes after a message not sent yet")
        if message.role == "user" and isinstance(held.message, User):
            if user_text(held) != message.text:
                return SentReading((), f"message {message.id!r} differs from the log's")
        if ref is not None:
            if ref.index < last_index:
                return SentReading((), f"message {message.id!r} is out of the log's order")
            last_index = ref.index
    return SentReading(tuple(new), None)
