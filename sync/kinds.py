"""What a batch of records holds, read once: the kinds the hub's rules look at, pure.

How this works: `kinds_of(records)` reads a batch once and says, as bit flags, which kinds of
change and message it holds: an aside change, a reset, a splice, a halt change, the user's own
text (`is_user_text`), a message that takes part in pairing (`pairs`), an assistant message.
Each rule the hub runs on a push is about some of those kinds only (the steering index about
asides and resets, strict pairing about pairing messages, splices and resets, the approval
rules about asides, ...), so the hub asks once per push and skips every rule whose kinds the
batch lacks: most pushes are the user's text or an answer, and then most rules have nothing to
look at. The batch predicates (`user_text_push`, `Steering.touches`, ...) are these flags, so
each is written once.

    kinds = kinds_of(batch.records)
    if kinds & USER_TEXT: ...   # the mid-step rule applies
    if kinds & TOUCHES: ...     # the steering index may change
"""

from __future__ import annotations

from collections.abc import Sequence

from .changes import AsideChange, ChangeRecord, Push, Reset, Splice
from .entries import Entry, is_stopped_note
from .messages import Assistant, ToolResult, User

__all__ = [
    "ASIDES",
    "ASSISTANT",
    "HALT",
    "MOVES_CALLS",
    "PAIRS",
    "RESET",
    "SPLICE",
    "TOUCHES",
    "USER_TEXT",
    "is_user_text",
    "kinds_of",
    "pairs",
]

ASIDES = 1
"""An aside change (put or removal)."""
RESET = 2
"""A reset (the whole state replaced)."""
SPLICE = 4
"""A splice (entries replaced)."""
HALT = 8
"""A halt change."""
USER_TEXT = 16
"""A push of the user's own text (`is_user_text`): what waits, mid-step (SPEC 10)."""
PAIRS = 32
"""A push or splice of a message that takes part in pairing (`pairs`)."""
ASSISTANT = 64
"""A push or splice of an assistant message."""

TOUCHES = ASIDES | RESET
"""What may change the asides standing (the steering index, turns, approvals)."""
MOVES_CALLS = PAIRS | RESET
"""What may change the calls pending (it brings a call or a result, or replaces them all)."""


def is_user_text(entry: Entry) -> bool:
    """Whether `entry` is the user's own message (a `User` message holding no tool result),
    and not the STOPPED note: a worker committing its answer after a halt `stopped` pushes
    that note with it (`Conversation.push`), and the note must land with the answer, never
    wait in the queue (it would land after the answer and clear the halt)."""
    message = entry.message
    if type(message) is not User:
        return False
    for part in message.content:  # a loop, not `any(...)`: the hub asks this every push
        if type(part) is ToolResult:
            return False
    author = entry.author  # most entries have none (and so are no note): no call then
    return author is None or not is_stopped_note(message, author)


def pairs(message: object) -> bool:
    """Whether a pushed message takes part in pairing (an assistant turn or a result)."""
    if type(message) is Assistant:
        return True
    if type(message) is User:
        for part in message.content:  # a loop, not `any(...)`
            if type(part) is ToolResult:
                return True
    return False


def kinds_of(records: Sequence[ChangeRecord]) -> int:
    """The kinds `records` hold, as the flags above or'ed (0 for no records)."""
    kinds = 0
    for record in records:  # one loop, no generator: the hub asks this on every push
        change = record.change
        kind = type(change)
        if kind is Push or kind is Splice:
            if kind is Splice:
                kinds |= SPLICE
            for entry in change.entries:  # type: ignore[union-attr]  # a push or a splice
                message = entry.message
                if type(message) is Assistant:
                    kinds |= ASSISTANT | PAIRS
                elif kind is Push and is_user_text(entry):
                    kinds |= USER_TEXT
                elif pairs(message):
                    kinds |= PAIRS
        elif kind is AsideChange:
            kinds |= ASIDES
        elif kind is Reset:
            kinds |= RESET
        else:
            kinds |= HALT
    return kinds
