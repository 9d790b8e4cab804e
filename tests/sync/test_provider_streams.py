"""The pure stream folds on plain event dicts (no SDK): the appends a draft gets, the final
message, and the errors (SPEC §11)."""

from __future__ import annotations

import pytest
from fakeprovider import anthropic_stream, chat_stream, responses_stream

from sync import Reasoning, Stop, Text, ToolCall, UsageError
from sync.providers.streams import Append, StreamError, stream_fold


def _feed(format: str, events: list[dict]) -> tuple[list[Append], object]:
    fold = stream_fold(format)  # type: ignore[arg-type]
    appends = [a for event in events if "sleep" not in event for a in fold.feed(event)]
    return appends, fold


def test_anthropic_events_become_appends_and_the_final_message() -> None:
    """Thinking deltas go to `reasoning`, text to `text`, input JSON to `call:<id>` (named on
    its first append); the final message has the signature, the call and the stop."""
    blocks = [
        {"type": "thinking", "thinking": "think hard", "signature": "sig"},
        {"type": "text", "text": "hello world"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
    ]
    appends, fold = _feed("anthropic", anthropic_stream(blocks, stop_reason="tool_use"))
    assert "".join(a.text for a in appends if a.part == "reasoning") == "think hard"
    assert "".join(a.text for a in appends if a.part == "text") == "hello world"
    calls = [a for a in appends if a.part == "call:t1"]
    assert calls[0].name == "f" and all(a.name is None for a in calls[1:])
    assert "".join(a.text for a in calls) == '{"a": 1}'
    final = fold.final()  # type: ignore[attr-defined]
    assert final.content == [
        Reasoning("think hard", signature="sig"),
        Text("hello world"),
        ToolCall("t1", "f", {"a": 1}),
    ]
    assert final.stop == Stop("tool_use")


def test_chat_chunks_and_responses_events_fold() -> None:
    """Chat chunks and Responses events give the text and call appends and the final reply."""
    appends, fold = _feed("openai_chat", chat_stream("hi there", calls=[("c1", "f", {})]))
    assert "".join(a.text for a in appends if a.part == "text") == "hi there"
    assert next(a.name for a in appends if a.part == "call:c1") == "f"
    assert fold.final().tool_calls() == [ToolCall("c1", "f", {})]  # type: ignore[attr-defined]
    item = {"type": "message", "id": "m", "role": "assistant", "status": "completed"}
    item["content"] = [{"type": "output_text", "text": "yes indeed", "annotations": []}]
    appends, fold = _feed("openai_responses", responses_stream([item]))
    assert "".join(a.text for a in appends) == "yes indeed"
    assert fold.final().content == [Text("yes indeed")]  # type: ignore[attr-defined]


def test_a_stream_cut_short_or_in_error_raises() -> None:
    """`final()` before the last event raises `incomplete_stream`; an `error` event raises
    `provider_error`; the partial keeps what was said; an unknown format is a UsageError."""
    events = anthropic_stream([{"type": "text", "text": "abcdefgh"}])
    _, fold = _feed("anthropic", events[:4])
    with pytest.raises(StreamError) as caught:
        fold.final()  # type: ignore[attr-defined]
    assert caught.value.reason == "incomplete_stream"
    partial = fold.partial(Stop("aborted", "stopped"))  # type: ignore[attr-defined]
    assert partial.content == [Text("abcd")] and partial.failed()
    with pytest.raises(StreamError) as caught:
        _feed("anthropic", anthropic_stream([{"type": "text", "text": "x"}], error_after=1))
    assert caught.value.reason == "provider_error"
    with pytest.raises(UsageError):
        stream_fold("gemini")  # type: ignore[arg-type]
