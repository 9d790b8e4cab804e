"""Pairing: when a tool call counts as answered, and how a history is mended so each one is.

How this works: one pass (`_Pass`) reads a history in order with a small state:

- `waiting`: the calls of the latest live assistant turn that no result has answered yet, in
  call order, each with the index of the message that made it;
- `held`: system messages that arrived while calls waited; they go back in right after the
  message that ends the wait, so that nothing comes between a call and its results;
- `stored`: under `Pairing(stored=True)` and until the first turn, the ids of the calls a
  provider holds server-side that a result has answered already.

A user message is read part by part. A result answers the first waiting call with its id, or
is an orphan and is dropped. The first part that is not a result ends the wait: the calls still
waiting get made-up error results right there, after the results that did arrive and before
the user's own content. An assistant turn, a `None` or the end of the history ends the wait the
same way, the made-up results then forming a user message of their own.

Every change the pass makes comes with a finding (a `PairingError`), and every finding with a
change. So `check` is the pass's first finding, a history without findings comes back as it
was, and a repaired history has none left. The changes that are no finding are tidying, not
faults: `pair` and `repair` merge user messages side by side (`normalize` does not) and leave
out `None`s.

Each public function is a view of that pass: `pair` and `repair` keep its messages, `normalize`
its entries, `check` and `validate` its first finding, `pending_calls` what still waits at the
end.

`reused_call` is a rule beside the pass: providers refuse a history in which two calls share an
id, but the pass matches results to calls per occurrence and has no repair that would not
change what the model did, so it is no finding of the pass (`validate` accepts such a history).
Strict pairing (`sync.strict`) refuses an edit that makes such a call.

    from sync import pairing
    from sync.messages import Message

    pairing.validate([Message.user("Hello"), Message.assistant("Hi")])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from .entries import Author, Entry
from .errors import AnswerError, PairingError, UsageError
from .messages import (
    AnyMessage,
    Assistant,
    Message,
    System,
    Text,
    ToolCall,
    ToolResult,
    User,
    UserPart,
)

__all__ = [
    "CANONICAL",
    "NO_RESULT_PROVIDED",
    "AnswerError",
    "Normalized",
    "Paired",
    "Pairing",
    "PairingError",
    "answers",
    "check",
    "check_answers",
    "close_pending",
    "close_pending_with",
    "findings",
    "normalize",
    "pair",
    "pending_calls",
    "repair",
    "reused_call",
    "safe_start",
    "validate",
]

NO_RESULT_PROVIDED = "No result provided"
"""The text of the error result made up for a tool call nothing answered."""


@dataclass(frozen=True)
class Pairing:
    """How a history is read. The defaults (`CANONICAL`) are the reading a provider expects.

    Attributes:
        stored: results before the first assistant turn answer calls the provider holds
            server-side (a request continuing a stored response), so they are kept, one per
            call id, instead of being dropped as orphans. They stop counting as such at the
            first turn, `None` or user message with more than results, as any call's wait does.
        answers: make up an error result for each call nothing answered. `False` for requests
            that send calls and results as text, where a call may stay unanswered (no finding
            then) and a system message may come between a call and its result (it is not held).
    """

    stored: bool = False
    answers: bool = True


CANONICAL = Pairing()
"""The canonical reading: `Pairing(stored=False, answers=True)`."""


@dataclass(frozen=True)
class Paired:
    """A history with its calls and results paired.

    Attributes:
        messages: the repaired history.
        repairs: what the pass found and mended, in the order it found it.
    """

    messages: list[AnyMessage]
    repairs: list[PairingError]


@dataclass(frozen=True)
class Normalized:
    """Entries repaired as `repair` repairs messages, keeping ids (see `normalize`).

    Attributes:
        entries: the repaired entries; unchanged ones are the very objects given.
        repairs: what the pass found and mended, in the order it found it.
    """

    entries: list[Entry]
    repairs: list[PairingError]


_RIG = Author.rig()


def _made_up(call: ToolCall, why: str) -> ToolResult:
    return ToolResult(call.id, call.name, [Text(why)], is_error=True)


@dataclass
class _Call:
    call: ToolCall
    index: int
    """The input message that made the call."""


@dataclass
class _Slot:
    """One message of the output, with the entry it came from."""

    message: AnyMessage
    source: Entry | None
    """`None` for a message the pass made up."""
    changed: bool = False
    calls: list[_Call] = field(default_factory=list)
    """An assistant's calls, with the input message each came from (merges keep them apart)."""


@dataclass
class _Held:
    slot: _Slot
    index: int
    call_id: str
    """The first call waiting when the system message arrived: what it interrupts."""
    reported: bool = False


class _Pass:
    """The one reading of a history; see the module docstring."""

    def __init__(self, pairing: Pairing, *, merge_users: bool, merge_assistants: bool) -> None:
        self.pairing = pairing
        self.merge_users = merge_users
        self.merge_assistants = merge_assistants
        self.out: list[_Slot] = []
        self.repairs: list[PairingError] = []
        self.waiting: list[_Call] = []
        self.held: list[_Held] = []
        self.stored: set[str] | None = set() if pairing.stored else None

    def read_all(self, messages: Sequence[Message | None]) -> _Pass:
        for index, message in enumerate(messages):
            self.read(index, message, None)
        return self

    def read(self, index: int, message: Message | None, source: Entry | None) -> None:
        match message:
            case None:
                # A turn the caller emptied still ends the wait of the turn before it.
                self.end_wait()
            case System():
                self._system(index, message, source)
            case User():
                self._user(index, message, source)
            case Assistant():
                self._assistant(index, message, source)
            case _:
                raise UsageError("not_a_message", f"item {index} is not a message")

    def finish(self) -> _Pass:
        self.end_wait()
        return self

    def end_wait(self) -> None:
        """End the wait at a turn, a `None` or the end: made-up results form their own message."""
        found: list[PairingError] = []
        made = self._end_calls(found)
        self.repairs.extend(found)
        if made:
            self._place(_Slot(User(made), None, changed=True))
        self._release()

    def _end_calls(self, found: list[PairingError]) -> list[UserPart]:
        # Whatever a provider held server-side is answered by now, too.
        self.stored = None
        calls, self.waiting = self.waiting, []
        if not self.pairing.answers:
            return []
        found.extend(PairingError.unanswered_tool_call(c.index, c.call.id) for c in calls)
        return [_made_up(c.call, NO_RESULT_PROVIDED) for c in calls]

    def _answers(self, result: ToolResult) -> bool:
        """Whether `result` answers a call; the call it answers stops waiting."""
        if self.stored is not None:
            if result.call_id in self.stored:
                return False
            self.stored.add(result.call_id)
            return True
        for at, waiting in enumerate(self.waiting):
            if waiting.call.id == result.call_id:
                del self.waiting[at]
                return True
        return False

    def _system(self, index: int, message: System, source: Entry | None) -> None:
        slot = _Slot(message, source)
        # Holding keeps results next to their calls, as a provider's tool protocol needs; calls
        # sent as text need no such thing. (There a wait a `None` ended would also leave no
        # mark, so a held system message would read differently once the `None` is gone.)
        if self.waiting and self.pairing.answers:
            self.held.append(_Held(slot, index, self.waiting[0].call.id))
        else:
            self.out.append(slot)

    def _user(self, index: int, message: User, source: Entry | None) -> None:
        kept: list[UserPart] = []
        found: list[PairingError] = []
        ended = False
        for part in message.content:
            if isinstance(part, ToolResult):
                if not self._answers(part):
                    found.append(PairingError.orphan_tool_result(index, part.call_id))
                    continue
            elif not ended:
                ended = True
                kept.extend(self._end_calls(found))
            kept.append(part)
        if message.content and not kept:
            # Only orphans: the message goes, and so overtakes no held system message.
            self.repairs.extend(found)
            return
        for held in self.held:
            if not held.reported:
                held.reported = True
                self.repairs.append(PairingError.interrupted_tool_call(held.index, held.call_id))
        self.repairs.extend(found)
        # Each finding here dropped or added a part; without one the message is as it came.
        self._place(_Slot(User(kept) if found else message, source, changed=bool(found)))
        if not self.waiting:
            self._release()

    def _assistant(self, index: int, message: Assistant, source: Entry | None) -> None:
        self.end_wait()
        calls = [_Call(call, index) for call in message.tool_calls()]
        last = self.out[-1] if self.out else None
        if self.merge_assistants and last is not None and isinstance(last.message, Assistant):
            self.repairs.append(PairingError.consecutive_assistant(index))
            first = last.message
            reply = Assistant(
                [*first.content, *message.content], stop=message.stop, origin=first.origin
            )
            last.message = reply
            last.changed = True
            # The merged reply is one turn under the later stop, so all its calls wait now;
            # reading it again then waits for the very same calls.
            last.calls.extend(calls)
            calls = last.calls
        else:
            reply = message
            self.out.append(_Slot(message, source, calls=calls))
        self.waiting = [] if reply.failed() else list(calls)

    def _place(self, slot: _Slot) -> None:
        last = self.out[-1] if self.out else None
        new = slot.message
        if (
            self.merge_users
            and last is not None
            and isinstance(last.message, User)
            and last.message.content
            and isinstance(new, User)
            and new.content
        ):
            last.message = User([*last.message.content, *new.content])
            last.changed = True
        else:
            self.out.append(slot)

    def _release(self) -> None:
        self.out.extend(held.slot for held in self.held)
        self.held.clear()


def pair(messages: Sequence[Message | None], pairing: Pairing = CANONICAL) -> Paired:
    """The one rule for when a tool call is answered, applied to a history.

    A result answers the first still-waiting call with its id from the assistant turn before
    it; ids match one result per occurrence, in any order, and results may be split over
    several user messages. A result answering nothing is dropped. A call still waiting when a
    user message with more than results arrives, or the next turn, a `None` or the end, gets a
    `NO_RESULT_PROVIDED` error result after the results that did arrive and before the user's
    own content. A failed turn is kept but its calls wait for nothing. A system message that
    arrives while calls wait is put after the message that ends the wait. User messages side by
    side, neither empty, become one.

    Args:
        messages: the history; `None` is a turn the caller emptied: it ends the wait of the
            calls before it as a turn does, and is then left out.
        pairing: how to read the history.

    Returns:
        The paired history (assistant messages side by side stay apart: see `repair`) and
        what was mended, in the order found.
    """
    run = _Pass(pairing, merge_users=True, merge_assistants=False).read_all(messages).finish()
    return Paired([slot.message for slot in run.out], run.repairs)


def repair(messages: Sequence[Message | None], pairing: Pairing = CANONICAL) -> Paired:
    """`pair`, and an assistant message directly after another merged into it.

    The merge appends the content, keeps the first's origin and lets the later stop stand; the
    merged reply is one turn, so its calls wait as one turn's do. This is the lenient load of a
    history from outside (a stored transcript) and the close of a run's history when it is
    cut short. No turn is lost.

    Returns:
        A history `validate(..., pairing)` accepts, which `repair` gives back as it is with no
        repairs; and what was mended, including each `consecutive_assistant`, in the order
        found.
    """
    run = _Pass(pairing, merge_users=True, merge_assistants=True).read_all(messages).finish()
    return Paired([slot.message for slot in run.out], run.repairs)


def check(messages: Sequence[Message], pairing: Pairing = CANONICAL) -> PairingError | None:
    """The first thing `repair` would mend in `messages`, or `None` when it needs nothing.

    User messages side by side are no fault (`repair` merges them only to tidy up).
    """
    run = _Pass(pairing, merge_users=False, merge_assistants=True).read_all(messages).finish()
    return run.repairs[0] if run.repairs else None


def validate(messages: Sequence[Message], pairing: Pairing = CANONICAL) -> None:
    """Accept a canonical history, or raise what makes it not one.

    Raises:
        PairingError: the first finding, as `check` returns it: `consecutive_assistant`,
            `unanswered_tool_call`, `orphan_tool_result` or `interrupted_tool_call` (a system
            message between a call and its result). Its message says where and which call.
    """
    error = check(messages, pairing)
    if error is not None:
        raise error


def normalize(entries: Sequence[Entry], pairing: Pairing = CANONICAL) -> Normalized:
    """Entries repaired as `repair` repairs their messages, keeping ids; user entries stay apart.

    An assistant entry directly after another merges into it and keeps the first's id, author
    and source id. An orphan result is dropped, and so is an entry left empty by that. A
    made-up result goes into the user entry that ends the wait (at the front, after its
    results), else into a new id-less `Author.rig()` entry for the conversation to mint an id
    for. A system entry arriving while calls wait moves after the entry that ends the wait.

    Returns:
        Entries whose messages `validate` accepts. A changed entry is a copy with the same id,
        author and source id; an unchanged one is the object given, so a list that needs no
        repair comes back with the very same entries and no repairs.
    """
    run = _Pass(pairing, merge_users=False, merge_assistants=True)
    for index, entry in enumerate(entries):
        run.read(index, entry.message, entry)
    run.finish()
    return Normalized([_entry_of(slot) for slot in run.out], run.repairs)


def _entry_of(slot: _Slot) -> Entry:
    if slot.source is None:
        return Entry(slot.message, author=_RIG)
    if not slot.changed:
        return slot.source
    return msgspec.structs.replace(slot.source, message=slot.message)


def pending_calls(messages: Sequence[Message]) -> list[ToolCall]:
    """The calls of the last assistant message that no later result answers, in call order.

    This is what a history cut short still owes the model, read as `pair` reads it: a failed
    last turn owes nothing, and neither does a turn the user has since written after (with
    more than results), since `pair` closes its calls there.
    """
    # No `finish`: the end of the history is exactly where the calls are still owed.
    run = _Pass(CANONICAL, merge_users=False, merge_assistants=False).read_all(messages)
    return [waiting.call for waiting in run.waiting]


def check_answers(
    pending: Sequence[ToolCall], results: Message | Sequence[ToolResult]
) -> AnswerError | None:
    """Why `results` do not answer `pending` exactly, or `None` when they do.

    Results match calls as `pair` matches them: each takes the first unmatched call with its id,
    one result per occurrence, in any order.
    """
    if isinstance(results, Message):
        if not isinstance(results, User):
            return AnswerError.not_a_result()
        given: Sequence[object] = results.content
    else:
        given = results
    answered: list[ToolResult] = []
    for result in given:
        if not isinstance(result, ToolResult):
            return AnswerError.not_a_result()
        answered.append(result)
    left = list(pending)
    for result in answered:
        at = next((n for n, call in enumerate(left) if call.id == result.call_id), None)
        if at is None:
            return AnswerError.unknown(result.call_id)
        del left[at]
    if left:
        return AnswerError.unanswered([call.id for call in left])
    return None


def answers(pending: Sequence[ToolCall], results: Message | Sequence[ToolResult]) -> None:
    """Accept `results` answering `pending` exactly, or raise why not.

    Raises:
        AnswerError: `not_a_result` when the message holds anything but tool results (or is
            not a user message), `unknown` for the first result that matches no pending call
            left, `unanswered` with the calls no result matched, in call order.
    """
    error = check_answers(pending, results)
    if error is not None:
        raise error


def close_pending(pending: Sequence[ToolCall]) -> User:
    """The user message closing calls nothing answered, exactly as `pair` closes them.

    One `NO_RESULT_PROVIDED` error result per occurrence, in call order (no parts for none).
    """
    return close_pending_with(pending, NO_RESULT_PROVIDED)


def close_pending_with(pending: Sequence[ToolCall], why: str) -> User:
    """`close_pending` with `why` as each error result's text (such as why the calls never ran)."""
    return User([_made_up(call, why) for call in pending])


def safe_start(messages: Sequence[Message], at: int) -> int:
    """The first index at or after `at` that a request may start `messages` from.

    A tool result before the first assistant turn from `at` would lose its call, so the start
    moves past the last such result, taking any text or system message among them along.
    Results after that turn are paired there and stay. A negative `at` counts as 0; `at` past
    the end gives `len(messages)`.
    """
    start = max(at, 0)
    for index in range(start, len(messages)):
        message = messages[index]
        if isinstance(message, Assistant):
            break
        if message.tool_results():
            start = index + 1
    return min(start, len(messages))


def findings(messages: Sequence[Message], pairing: Pairing = CANONICAL) -> list[PairingError]:
    """Everything `repair` would mend in `messages`, in the order found (`check` is the
    first). User messages side by side are no fault."""
    run = _Pass(pairing, merge_users=False, merge_assistants=True).read_all(messages).finish()
    return list(run.repairs)


def reused_call(messages: Sequence[Message], since: int = 0) -> PairingError | None:
    """The first tool call of a message at or after `since` whose id an earlier call already
    used (in an earlier message, or earlier in the same one), as `reused_tool_call`; `None`
    when every such call has an id of its own.

    Calls before `since` are read only for their ids: a history that already reuses one is
    not held against the messages after it.
    """
    seen: set[str] = set()
    for index, message in enumerate(messages):
        if not isinstance(message, Assistant):
            continue
        for call in message.tool_calls():
            if call.id in seen and index >= since:
                return PairingError.reused_tool_call(index, call.id)
            seen.add(call.id)
    return None
