"""Strict pairing (`sync.strict`) and the reused-call-id rule (`pairing.reused_call`)."""

from __future__ import annotations

import pytest

from sync import Conversation, pairing
from sync.errors import PairingError
from sync.messages import AnyMessage, Assistant, Message, Stop, Text, ToolCall, User
from sync.strict import strict_violation

TOOL_USE = Stop("tool_use")


def call(id_: str, q: str = "q") -> ToolCall:
    return ToolCall(id_, "search", {"q": q})


def turn(*calls: ToolCall) -> list[AnyMessage]:
    """An assistant message making `calls`, then the user message answering each."""
    return [
        Assistant([Text("let me look"), *calls], stop=TOOL_USE),
        User([Message.tool_result(c.id, c.name, "ok").content[0] for c in calls]),
    ]


def conversation(*messages: AnyMessage) -> Conversation:
    return Conversation.from_messages(messages)


@pytest.mark.parametrize(
    ("messages", "since", "expected"),
    [
        ([Message.user("q"), *turn(call("c1")), *turn(call("c2"))], 0, None),
        (
            [Message.user("q"), *turn(call("c1")), Message.user("again"), *turn(call("c1"))],
            0,
            PairingError.reused_tool_call(4, "c1"),
        ),
        # Two calls of one message sharing an id are a reuse too.
        (
            [Message.user("q"), *turn(call("c1"), call("c1", "other"))],
            0,
            PairingError.reused_tool_call(1, "c1"),
        ),
        # Only calls from `since` on are judged; earlier ones only lend their ids.
        (
            [Message.user("q"), *turn(call("c1")), *turn(call("c1")), *turn(call("c1"))],
            4,
            PairingError.reused_tool_call(5, "c1"),
        ),
        ([Message.user("q"), *turn(call("c1")), *turn(call("c1"))], 4, None),
    ],
)
def test_reused_call(messages: list[AnyMessage], since: int, expected: PairingError | None) -> None:
    """A call whose id an earlier call used is found at its message, from `since` on."""
    assert pairing.reused_call(messages, since) == expected


def test_reused_call_message_names_the_id_and_the_message() -> None:
    """The reason is short and says which call of which message, and what to do."""
    error = PairingError.reused_tool_call(4, "c1")
    assert error.reason == "reused_tool_call" and error.call_id == "c1" and error.index == 4
    assert error.message == (
        "tool call 'c1' of message 4 reuses the id of an earlier call; "
        "each call needs an id of its own"
    )


def test_strict_pairing_refuses_a_reused_call_id_and_nothing_else_of_the_history() -> None:
    """Strict pairing refuses a new call reusing an id of the conversation (also one far
    back, before the window it otherwise reads), and accepts new ids, a regenerated turn
    whose old call is gone, and a later push on a history that already reused one."""
    first = [Message.user("weather?"), *turn(call("c1")), Message.assistant("18°C")]
    filler = [m for n in range(20) for m in (Message.user(f"u{n}"), Message.assistant(f"a{n}"))]
    value = conversation(*first, *filler)
    since = len(value)
    value.extend([Message.user("again?"), *turn(call("c1"))])
    assert strict_violation(value, since) == PairingError.reused_tool_call(since + 1, "c1")
    fresh = conversation(*first, *filler)
    fresh.extend([Message.user("again?"), *turn(call("c2"))])
    assert strict_violation(fresh, since) is None
    # The turn that made c1 is taken out and made again: the id is free once more.
    redo = conversation(*first)
    redo.splice(slice(1, 4), [], None)
    redo.extend([*turn(call("c1")), Message.assistant("19°C")])
    assert strict_violation(redo, 1) is None
    # A history loaded with strict pairing off is not held against a later push.
    loaded = conversation(*first, *turn(call("c1")))
    loaded.push(Message.user("thanks"))
    assert strict_violation(loaded, len(loaded) - 1) is None


def test_strict_pairing_reports_the_earliest_violation() -> None:
    """With an orphan result and a reused id in one change, the first in the history wins."""
    value = conversation(Message.user("q"), *turn(call("c1")))
    since = len(value)
    value.extend([Message.tool_result("nope", "search", "x"), *turn(call("c1"))])
    violation = strict_violation(value, since)
    assert violation is not None and violation.reason == "orphan_tool_result"
    assert violation.index == since
