"""Strict pairing: what the hub refuses beyond what a running turn allows.

A turn in progress leaves calls waiting for results, so an unanswered call is no fault here.
What strict pairing refuses is a change that leaves a tool result answering no waiting call
(an orphan), an assistant message directly after another one (except a retry after a reply
that failed, which a model never reads), or a tool call whose id an earlier call in the
conversation already used (providers refuse such a history; a worker replaying a script with
fixed ids makes one). Only the messages from the change on are judged, so a history loaded
with strict pairing off is not held against a later push.
"""

from __future__ import annotations

from . import pairing
from .conversation import Conversation
from .entries import is_failed_reply
from .errors import PairingError
from .messages import AnyMessage, Assistant

__all__ = ["strict_violation"]


def strict_violation(conversation: Conversation, since: int) -> PairingError | None:
    """The first orphan result, unwarranted consecutive assistant message or reused tool call
    id at or after message `since`, or None.

    The check reads from the last assistant message before `since` (where the pairing state
    is known) to the end, so its cost is that window, not the conversation; only when the
    window makes a tool call are the ids of every earlier call read as well.
    """
    start = min(since, len(conversation))
    while start > 0:
        start -= 1
        entry = conversation.entry(start)
        if entry is not None and isinstance(entry.message, Assistant):
            break
    window: list[AnyMessage] = []
    for at in range(start, len(conversation)):
        entry = conversation.entry(at)
        assert entry is not None
        window.append(entry.message)
    found = _window_violation(window, start, since)
    calls = any(m.tool_calls() for m in window[max(0, since - start) :])
    reused = pairing.reused_call(conversation.messages(), since) if calls else None
    if found is None or (reused is not None and reused.index < found.index):
        return reused
    return found


def _window_violation(window: list[AnyMessage], start: int, since: int) -> PairingError | None:
    """The first orphan result or unwarranted consecutive assistant message at or after
    `since` in `window` (the messages from `start` on)."""
    for finding in pairing.findings(window):
        at = finding.index + start
        if at < since:
            continue
        if finding.reason == "orphan_tool_result":
            return PairingError.orphan_tool_result(at, finding.call_id or "")
        if finding.reason == "consecutive_assistant":
            before = window[finding.index - 1] if finding.index > 0 else None
            if before is None or not is_failed_reply(before):
                return PairingError.consecutive_assistant(at)
    return None
