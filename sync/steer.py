"""Steering a running agent (SPEC 10): mid-step, queued input and stop requests, pure.

How this works: a worker marks each model call with a `rig.step` aside; the record that ends
the step (the assistant message, or the results of its calls) removes it. A conversation is
*mid-step* while such a marker stands or the last assistant message a model reads has calls
nothing answers yet (`mid_step`). A push made only of the user's own text arriving mid-step is
refused `queued` by the hub; the replica turns it into `rig.queued` asides (`queue_records`,
the one rule both replicas follow, with vectors) and the hub lands them as entries once the
step ends (`landing_records`). A `rig.stop` aside asks the worker to stop.

A queued aside's id is its entry's id with the aside prefix (`queued_id`): queuing the same
entry twice names the same aside, and whether a queued entry landed is read from the log alone
(it holds the entry's id).

The hub asks "mid-step?" on every push, so it keeps a `Steering` index of the markers (updated
from the records that land, O(records)) and reads the pending calls from the tail only
(`step_pending`, O(the last step)): no scan of the conversation or of its asides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from .changes import AsideChange, ChangeRecord, HaltChange, Push, Reset, Splice
from .entries import (
    TURN_KIND,
    AnyTurnEnd,
    Aside,
    Author,
    Entry,
    Halt,
    Stopped,
    TurnEnd,
    TurnOwner,
    TurnRecord,
    is_stopped_note,
    stopped_note,
)
from .fold import Fold
from .ids import ASIDE_PREFIX, MESSAGE_PREFIX, AsideId, MessageId, is_message_id
from .kinds import TOUCHES, USER_TEXT, is_user_text, kinds_of
from .messages import AnyMessage, Assistant, Message, Stop, Text, ToolCall, ToolResult, User

if TYPE_CHECKING:
    from .conversation import Conversation

__all__ = [
    "QUEUED_KIND",
    "STEP_KIND",
    "STOPPED_RESULT",
    "STOP_KIND",
    "SUPERSEDED",
    "WENT_AWAY",
    "Steering",
    "finish_records",
    "finish_stopped",
    "is_stop_request",
    "is_user_text",
    "keep_superseded",
    "landing_records",
    "mid_step",
    "open_turn",
    "queue_records",
    "queued_entry",
    "queued_entry_id",
    "queued_id",
    "step_pending",
    "step_value",
    "turn_owner",
    "user_text_push",
]

STEP_KIND = "rig.step"
"""A model call is under way: value `{"turn": int | None, "at": ms}`."""
QUEUED_KIND = "rig.queued"
"""User input waiting for the step to end: value the entry (`Entry` as plain data)."""
STOP_KIND = "rig.stop"
"""The user asked the turn to stop: value `{"turn": int | None, "at": ms}`."""

_RIG = Author.rig()
_replace = msgspec.structs.replace
ABORTED = Stop("aborted", "stopped")


def is_stop_request(record: ChangeRecord) -> bool:
    """Whether `record` puts a stop request (a `rig.stop` aside)."""
    change = record.change
    return (
        type(change) is AsideChange
        and change.aside is not None
        and (change.aside.kind == STOP_KIND)
    )


def user_text_push(records: Sequence[ChangeRecord]) -> bool:
    """Whether `records` push a message of the user's own (what waits, mid-step)."""
    return bool(kinds_of(records) & USER_TEXT)


def step_pending(conversation: Fold) -> bool:
    """Whether the last assistant message a model reads has a call nothing answers yet, read
    from the end back to that message only (as `pairing.pending_calls` reads it: a failed
    last reply owes nothing, and neither does a turn the user wrote after with more than
    results)."""
    answered: dict[str, int] | None = None  # made only once a result is read
    for entry in reversed(conversation._entries):
        message = entry.message
        if type(message) is User:
            # More than results (the common last entry: the user's text): nothing is owed.
            # A loop, not `tool_results()`, and `type`, not `isinstance` (which costs more
            # when it fails): the hub asks this for every user push.
            content = message.content
            for part in content:
                if type(part) is not ToolResult:
                    return False
            results: list[ToolResult] = content  # type: ignore[assignment]  # checked above
            if answered is None:
                answered = {}
            for result in results:
                answered[result.call_id] = answered.get(result.call_id, 0) + 1
        elif type(message) is Assistant:
            if message.failed():
                return False
            for call in message.tool_calls():
                if answered is not None and answered.get(call.id, 0) > 0:
                    answered[call.id] -= 1
                else:
                    return True
            return False
    return False


def mid_step(conversation: Fold) -> bool:
    """Whether `conversation` is mid-step: a `rig.step` marker stands, or the last assistant
    message a model reads has pending calls (SPEC 10). O(asides + the last step); the hub
    keeps a `Steering` index instead."""
    if any(aside.kind == STEP_KIND for aside in conversation._asides.values()):
        return True
    return step_pending(conversation)


def queued_id(entry_id: MessageId) -> AsideId:
    """The id of the queued aside holding entry `entry_id`."""
    return ASIDE_PREFIX + entry_id[len(MESSAGE_PREFIX) :]


def queued_entry_id(aside_id: AsideId) -> MessageId:
    """The id of the entry a queued aside `aside_id` holds (`queued_id`'s inverse)."""
    return MESSAGE_PREFIX + aside_id[len(ASIDE_PREFIX) :]


def queued_entry(aside: Aside) -> Entry | None:
    """The entry a `rig.queued` aside holds; None when it is not one, or malformed, or not the
    user's own text with a well-formed id."""
    if aside.kind != QUEUED_KIND:
        return None
    try:
        entry = msgspec.convert(aside.value, Entry)
    except (msgspec.ValidationError, TypeError):
        return None
    return entry if is_message_id(entry.id) and is_user_text(entry) else None


def queue_records(
    records: Sequence[ChangeRecord], after: MessageId | None
) -> list[ChangeRecord] | None:
    """The rebase rule for a push refused `queued`: in `records`, each entry of the user's
    own text a push brings is replayed as a `rig.queued` aside put, in order, drawn after
    entry `after` (the log's last); the aside's author is the entry's (the user's own when
    it names none), its id `queued_id(entry.id)`. The other entries of that push stay a push,
    before those asides; every other record stays as it is. None when no record pushes
    user text."""
    if not user_text_push(records):
        return None
    replayed: list[ChangeRecord] = []
    for record in records:
        change = record.change
        if type(change) is not Push:
            replayed.append(record)
            continue
        # A STOPPED note pushed before the user's text goes: the landing puts one itself
        # while the halt stands (a note alone must never land mid-step).
        typed = any(is_user_text(entry) for entry in change.entries)
        rest = [
            entry
            for entry in change.entries
            if not is_user_text(entry)
            and not (typed and is_stopped_note(entry.message, entry.author))
        ]
        if rest:
            replayed.append(
                record if len(rest) == len(change.entries) else _replace(record, change=Push(rest))
            )
        for entry in change.entries:
            if not is_user_text(entry):
                continue
            assert entry.id is not None
            author = entry.author if entry.author is not None else Author.user()
            aside = Aside(QUEUED_KIND, after, author, msgspec.to_builtins(entry))
            put = AsideChange(queued_id(entry.id), aside)
            replayed.append(ChangeRecord(put, author, record.at))
    return replayed


def landing_records(
    conversation: Fold, queue: Iterable[AsideId], at: int | None, note_id: MessageId
) -> list[ChangeRecord]:
    """What lands the queue: for each queued aside of `queue` still in `conversation`, in
    order, a push of its entry (its id and author kept, made by that author) then the aside's
    removal (made by `rig`), all dated `at`. Entries the conversation holds or retired already
    are not pushed again (their asides still go). When the user stopped the last request
    (halt `stopped`), a STOPPED note (id `note_id`) goes first, as `Conversation.push` puts
    it: queued input lands after the STOPPED note."""
    records: list[ChangeRecord] = []
    if conversation._halt is Halt.STOPPED:
        note = msgspec.structs.replace(stopped_note(), id=note_id)
        records.append(ChangeRecord(Push([note]), _RIG, at))
    asides = conversation._asides
    seen: set[MessageId] = set()
    for id_ in queue:
        aside = asides.get(id_)
        if aside is None:
            continue
        entry = queued_entry(aside)
        if (
            entry is not None
            and entry.id not in seen
            and entry.id not in conversation._index
            and entry.id not in conversation._retired
        ):
            seen.add(entry.id)  # type: ignore[arg-type]
            records.append(ChangeRecord(Push([entry]), entry.author, at))
        records.append(ChangeRecord(AsideChange(id_, None), _RIG, at))
    if len(records) == 1 and type(records[0].change) is Push:
        return []  # nothing of the queue is left to land: no note either
    return records


STOPPED_RESULT = "stopped by the user"
"""The error text of a result a stopped turn gives each call it left unanswered."""


def finish_stopped(conversation: Conversation, partial: AnyMessage | str | None = None) -> bool:
    """Finish a turn the user stopped, as the seed's model reads a stopped turn, as edits of
    `conversation` that one push carries (SPEC 10): the partial answer kept as an assistant
    message with `Stop("aborted", "stopped")` (shown, never read by a model), an error result
    ("stopped by the user") for each pending call, halt `stopped` (the STOPPED note goes
    before the next input), the open turn ended `stopped`, and the step markers and stop
    requests removed. Whether a stop request or a step marker stood, or a call was pending
    (nothing to finish otherwise: then nothing changes)."""
    steering = [id_ for id_, aside in conversation.asides() if aside.kind in (STOP_KIND, STEP_KIND)]
    pending = conversation.pending_calls()
    if not steering and not pending and partial is None:
        return False
    if isinstance(partial, str):
        partial = Assistant([Text(partial)]) if partial else None
    if partial is not None and not pending:
        content = [part for part in partial.content if type(part) is not ToolCall]
        if content:
            conversation.push(Assistant(content, ABORTED))  # type: ignore[arg-type]
    for call in pending:
        conversation.push(Message.tool_result(call.id, call.name, STOPPED_RESULT, is_error=True))
    conversation.halt(Halt.STOPPED)
    conversation.end_turn(TurnEnd.stopped())
    for id_ in steering:
        conversation.remove_aside(id_)
    return True


class Steering:
    """The hub's index of a conversation's steering asides, kept from the records that land.

    `steps` and `stops` hold the ids of the `rig.step` and `rig.stop` asides standing,
    `queue` the `rig.queued` ones in the order put (a dict as an ordered set). `track` is
    O(records); `rebuild` (after a load or a reset) scans the asides once.
    """

    __slots__ = ("queue", "steps", "stops")

    def __init__(self) -> None:
        self.steps: set[AsideId] = set()
        self.stops: set[AsideId] = set()
        self.queue: dict[AsideId, None] = {}

    def copy(self) -> Steering:
        other = Steering()
        other.steps, other.stops, other.queue = set(self.steps), set(self.stops), dict(self.queue)
        return other

    def rebuild(self, conversation: Fold) -> None:
        """Index the asides `conversation` holds now."""
        self.steps.clear()
        self.stops.clear()
        self.queue.clear()
        for id_, aside in conversation._asides.items():
            self._put(id_, aside.kind)

    def touches(self, records: Sequence[ChangeRecord]) -> bool:
        """Whether `records` may change the index (they hold an aside change or a reset; the
        hub reads it from the push's `kinds_of` once)."""
        return bool(kinds_of(records) & TOUCHES)

    def track(self, conversation: Fold, records: Sequence[ChangeRecord]) -> None:
        """Follow `records`, folded into `conversation` already."""
        for record in records:
            change = record.change
            if type(change) is AsideChange:
                self.steps.discard(change.id)
                self.stops.discard(change.id)
                self.queue.pop(change.id, None)
                if change.aside is not None:
                    self._put(change.id, change.aside.kind)
            elif type(change) is Reset:
                self.rebuild(conversation)

    def _put(self, id_: AsideId, kind: str) -> None:
        if kind == STEP_KIND:
            self.steps.add(id_)
        elif kind == STOP_KIND:
            self.stops.add(id_)
        elif kind == QUEUED_KIND:
            self.queue[id_] = None

    def mid_step(self, conversation: Fold) -> bool:
        """`mid_step(conversation)` from the index: O(the last step)."""
        return bool(self.steps) or step_pending(conversation)

    def lands(self, conversation: Fold) -> bool:
        """Whether the queue lands now: something is queued, no stop stands, not mid-step."""
        return bool(self.queue) and not self.stops and not self.mid_step(conversation)


SUPERSEDED = Stop("aborted", "superseded")


def keep_superseded(conversation: Conversation, records: Sequence[ChangeRecord]) -> list[MessageId]:
    """Keep what a push refused `superseded` wrote (SPEC 10): each assistant message `records`
    pushed or spliced in is pushed again, its text and reasoning only, as an aborted message
    (`Stop("aborted", "superseded")`: shown, never read by a model) with a new id, so the
    model is called again with the input that landed meanwhile. Returns the new ids."""
    kept: list[MessageId] = []
    for record in records:
        change = record.change
        if not isinstance(change, Push | Splice):
            continue
        for entry in change.entries:
            message = entry.message
            if type(message) is not Assistant:
                continue
            content = [part for part in message.content if type(part) is not ToolCall]
            if content:
                kept.append(
                    conversation.push(Entry(Assistant(content, SUPERSEDED), None, entry.author))
                )
    return kept


def step_value(turn: int | None, at: int) -> dict[str, Any]:
    """The value of a `rig.step` or `rig.stop` aside."""
    return {"turn": turn, "at": at}


# ---------------------------------------------------------------------- turns (SPEC 10)


def open_turn(conversation: Fold) -> tuple[AsideId, TurnRecord] | None:
    """The open turn: the last turn record (by index), when it has not ended; None when no
    turn record stands or the last one ended. O(asides)."""
    last: tuple[AsideId, TurnRecord] | None = None
    for id_, aside in conversation._asides.items():
        if aside.kind != TURN_KIND:
            continue
        try:
            record = msgspec.convert(aside.value, TurnRecord)
        except msgspec.ValidationError:
            continue
        if last is None or record.index >= last[1].index:
            last = (id_, record)
    return last if last is not None and last[1].end is None else None


def turn_owner(conversation: Fold) -> TurnOwner | None:
    """Who runs the open turn, as its record names it (`(sub, client)`); None when no turn
    is open or its record names no owner. The one place that says who owns a turn: only the
    owner creates an approval (SPEC 12), and the hub keeps the owner's lease (SPEC 10)."""
    turn = open_turn(conversation)
    return None if turn is None else turn[1].owner


WENT_AWAY = "the worker went away"
"""Why a turn whose owner stayed away past its lease ended `failed`, and the error text of
the results it gives the calls left unanswered."""


def finish_records(
    conversation: Conversation,
    turn_id: AsideId,
    end: AnyTurnEnd,
    ids: Callable[[], MessageId],
    at: int | None,
    partial: Entry | None = None,
) -> list[ChangeRecord]:
    """The records a hub makes to finish the open turn `turn_id` whose worker is gone (SPEC
    10), as `finish_stopped` would, all made by `Author.rig()` and dated `at`, without
    changing `conversation`: `partial` (a draft's text, an entry with the draft's id) kept
    as an assistant message with `Stop("aborted", ...)` (only while no call is pending), an
    error result for each pending call, halt `stopped` when `end` is a stop (a `failed` end
    sets none: the request stays owed), the turn record ended `end`, and the step markers
    and stop requests removed. `ids` mints the ids of new entries."""
    stopped = type(end) is Stopped
    records: list[ChangeRecord] = []
    pending = conversation.pending_calls()
    if partial is not None and not pending and type(partial.message) is Assistant:
        content = [part for part in partial.message.content if type(part) is not ToolCall]
        if content:
            stop = ABORTED if stopped else Stop("aborted", "failed")
            message = Assistant(content, stop)
            records.append(ChangeRecord(Push([_replace(partial, message=message)]), _RIG, at))
    if pending:
        text = STOPPED_RESULT if stopped else WENT_AWAY
        results = [ToolResult(call.id, call.name, [Text(text)], is_error=True) for call in pending]
        entry = Entry(User(results), ids(), _RIG)  # type: ignore[arg-type]
        records.append(ChangeRecord(Push([entry]), _RIG, at))
    if stopped:
        records.append(ChangeRecord(HaltChange(Halt.STOPPED), _RIG, at))
    aside = conversation.aside(turn_id)
    if aside is not None:
        record = msgspec.convert(aside.value, TurnRecord)
        ended = _replace(aside, value=_replace(record, end=end).value())
        records.append(ChangeRecord(AsideChange(turn_id, ended), _RIG, at))
    for id_, standing in conversation.asides():
        if standing.kind in (STEP_KIND, STOP_KIND):
            records.append(ChangeRecord(AsideChange(id_, None), _RIG, at))
    return records
