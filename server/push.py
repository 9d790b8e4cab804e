"""The rules of one push that read nothing but their arguments (used by `server.core`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sync import (
    Aside,
    Assistant,
    ChangeRecord,
    Conversation,
    Push,
    Reset,
    Splice,
    approvals,
)
from sync.protocol import Ack, encode_message
from sync.strict import strict_violation

from .auth import Grant
from .store.base import ClientMark
from .turns import pairs

__all__ = [
    "ack",
    "both",
    "pushes_assistant",
    "scope_refusal",
    "stopper",
    "strict_check",
    "turn_ended",
    "unchanged",
]


def scope_refusal(grant: Grant, records: Sequence[ChangeRecord], now: int) -> str | None:
    """Why `grant` may not push `records`, or None: deciding approvals needs `approve` and
    nothing else does; every other record needs `write` (SPEC 12: `write` does not decide)."""
    if now >= grant.exp * 1000:
        return "token expired"
    decisions = sum(1 for record in records if approvals.is_decision(record))
    if decisions and not grant.can_approve:
        return "token lacks the approve scope"
    if (decisions < len(records) or not records) and not grant.can_write:
        return "token lacks the write scope"
    return None


def unchanged(landed: Sequence[ChangeRecord], sent: Sequence[ChangeRecord]) -> bool:
    """Whether `place` replayed every sent record as it was (none dropped or re-targeted)."""
    return len(landed) == len(sent) and all(a is b for a, b in zip(landed, sent, strict=True))


def ack(seq: int, mark: ClientMark) -> bytes:
    """The `ack` frame of push `seq`, from the mark the store holds for it."""
    return encode_message(Ack(seq, mark.ack_from, mark.ack_revision))


def strict_check(
    conversation: Conversation, records: Sequence[ChangeRecord], since: int
) -> str | None:
    """Strict pairing over what `records` changed (`since` is the length before them)."""
    touches = False
    for record in records:
        change = record.change
        if isinstance(change, Push):
            touches = touches or any(pairs(entry.message) for entry in change.entries)
        elif isinstance(change, Splice | Reset):
            since = min(since, change.start if isinstance(change, Splice) else 0)
            touches = True
    if not touches:
        return None
    violation = strict_violation(conversation, since)
    return None if violation is None else violation.message


def both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    """Undo `then`, then `first` (two folds, the later one on top)."""

    def undo() -> None:
        then()
        first()

    return undo


def pushes_assistant(records: Sequence[ChangeRecord]) -> bool:
    """Whether `records` push (or splice in) an assistant message."""
    for record in records:
        change = record.change
        if isinstance(change, Push | Splice):
            if any(type(entry.message) is Assistant for entry in change.entries):
                return True
    return False


def stopper(aside: Aside) -> str | None:
    """Who a stop request says stopped: its `user` author's name (SPEC 10)."""
    author = aside.author
    return author.name if author.kind == "user" else None


def turn_ended(conversation: Conversation, aside: Aside) -> bool:
    """Whether stop request `aside` names a turn whose record has ended."""
    value = aside.value
    turn = value.get("turn") if isinstance(value, dict) else None
    if type(turn) is not int:
        return False
    return any(
        record.index == turn and record.end is not None for _, record in conversation.turns()
    )
