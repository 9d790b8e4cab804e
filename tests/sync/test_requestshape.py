"""The fake provider's request checks (`tests/support/requestshape.py`) refuse what each provider's
API refuses, and take what the converters build, so the SDK tests' round trips mean
something (SPEC §11)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from requestshape import request_errors
from test_providers import _conversations

from sync import (
    Assistant,
    Conversation,
    Message,
    Origin,
    Reasoning,
    Stop,
    Text,
    ToolCall,
    ToolResult,
    User,
)
from sync.providers import to_anthropic, to_openai_chat, to_openai_responses

ANTHROPIC = "/v1/messages"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


def _tool_loop() -> Conversation:
    """A question, a reply with signed thinking and two calls, both results, more text."""
    anthropic = Origin("anthropic", "claude-fake")
    calls = [ToolCall("call_1", "weather", {"city": "Paris"}), ToolCall("call_2", "time", {})]
    reply = Assistant(
        [Reasoning("hm", signature="c2ln"), Text("Looking."), *calls],
        Stop("tool_use"),
        origin=anthropic,
    )
    conversation = Conversation.from_messages([Message.user("weather and time?"), reply])
    results = [
        ToolResult("call_1", "weather", [Text("sunny")]),
        ToolResult("call_2", "time", [Text("noon")]),
    ]
    conversation.push(User([*results, Text("thanks")]))
    return conversation


@pytest.mark.parametrize(
    ("path", "to", "extra"),
    [
        (ANTHROPIC, to_anthropic, {"max_tokens": 10}),
        (CHAT, to_openai_chat, {}),
        (RESPONSES, to_openai_responses, {}),
    ],
)
def test_what_the_converters_build_is_taken(path: str, to: Any, extra: dict[str, Any]) -> None:
    """A tool loop with signed thinking and two results, as each `to_*` builds it, is a
    request its provider takes."""
    assert request_errors(path, {"model": "m", **extra, **to(_tool_loop())}) == []


FORMATS = {
    "anthropic": (ANTHROPIC, to_anthropic, {"max_tokens": 10}),
    "chat": (CHAT, to_openai_chat, {}),
    "responses": (RESPONSES, to_openai_responses, {}),
}


def _answered(messages: list[Any]) -> list[Any]:
    """`messages` with the last reply's calls answered and the user speaking last."""
    last = messages[-1] if messages else None
    pending = last.tool_calls() if isinstance(last, Assistant) else []
    results = [ToolResult(call.id, call.name, [Text("ok")]) for call in pending]
    return [*messages, User([*results, Text("go on")])]


@pytest.mark.parametrize("format", list(FORMATS))
@given(data=st.data())
def test_every_conversation_the_converters_send_is_taken(format: str, data: st.DataObject) -> None:
    """Whatever paired conversation a converter is given (the round-trip tests' strategy),
    what it sends is a request its provider takes."""
    messages = _answered(data.draw(_conversations(format)))
    path, to, extra = FORMATS[format]
    body = {"model": "m", **extra, **to(messages)}
    assert request_errors(path, body) == [], body


def test_what_a_provider_refuses_is_named() -> None:
    """An id leaking into a block, thinking without its signature, a result after text or
    answering no call, a tool message with no call before it: each is named."""
    good = {"model": "m", "max_tokens": 10, **to_anthropic(_tool_loop())}
    messages = good["messages"]
    leaked = [{"role": "user", "content": [{"type": "text", "text": "hi", "id": "msg_1"}]}]
    assert request_errors(ANTHROPIC, {**good, "messages": leaked}) == [
        "messages.0.content.0: unknown key id"
    ]
    unsigned = [
        messages[0],
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]},
    ]
    assert "messages.1.content.0: missing signature" in request_errors(
        ANTHROPIC, {**good, "messages": unsigned}
    )
    results = messages[2]["content"]
    late = [messages[0], messages[1], {"role": "user", "content": [*results[2:], *results[:2]]}]
    assert "messages.2.content.1: tool results go first in a user message" in request_errors(
        ANTHROPIC, {**good, "messages": late}
    )
    orphan = [messages[0], {"role": "user", "content": results[:1]}]
    assert any(
        "answers no tool_use" in e for e in request_errors(ANTHROPIC, {**good, "messages": orphan})
    )
    chat = to_openai_chat(_tool_loop())
    stray = [chat["messages"][0], chat["messages"][2]]
    assert any(
        "answers no call" in e for e in request_errors(CHAT, {"model": "m", "messages": stray})
    )
    responses = to_openai_responses(_tool_loop())
    outputs = [item for item in responses["input"] if item.get("type") == "function_call_output"]
    assert any(
        "answers no function_call" in e
        for e in request_errors(RESPONSES, {"model": "m", "input": outputs})
    )
