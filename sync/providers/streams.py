"""Stream folds: a provider's stream events in, draft appends and the final `Assistant` out.

How this works: a fold is fed the events of one model call in order (the SDK's event objects
or their dicts; both are read by attribute or key, never dumped per event). `feed` returns
the appends for the draft (`text`, `reasoning`, `call:<call_id>` with the tool's name on the
first append of a call). The fold keeps the response in the provider's own shape as it grows
(as the SDK's own accumulation does) and, at the end, `final()` reads it with the format's
`from_*`, so the committed message equals `from_*(the SDK's final accumulation)`.
`partial(stop)` is what a cut stream had said so far (its text and reasoning), for a reply
kept under a failure stop.

Formats: `"anthropic"` (Messages events), `"openai_chat"` (chat completion chunks),
`"openai_responses"` (`response.*` events).
"""

from __future__ import annotations

import json
from typing import Any, Literal, NamedTuple

from ..errors import ConvsyncError, UsageError
from ..messages import Assistant, Reasoning, Stop, Text
from ._common import get, plain
from .anthropic import from_anthropic
from .openai_chat import from_openai_chat
from .openai_responses import from_openai_responses

__all__ = ["Append", "Format", "StreamError", "StreamFold", "stream_fold"]

Format = Literal["anthropic", "openai_chat", "openai_responses"]


class Append(NamedTuple):
    """One draft append: `text` added to `part`, `name` the tool's on a call's first."""

    part: str
    text: str
    name: str | None = None


class StreamError(ConvsyncError):
    """The provider reported an error in the stream (`reason` `provider_error`), or the
    stream ended before its final event (`reason` `incomplete_stream`)."""


class StreamFold:
    """Base of the three folds; `stream_fold(format)` makes one."""

    def __init__(self) -> None:
        self.done = False
        self._text: list[str] = []
        self._reasoning: list[str] = []

    def feed(self, event: object) -> list[Append]:  # pragma: no cover - overridden
        raise NotImplementedError

    def final(self) -> Assistant:  # pragma: no cover - overridden
        raise NotImplementedError

    def partial(self, stop: Stop) -> Assistant:
        """What the stream said so far, as a reply under `stop` (a failure: never read)."""
        parts: list[Any] = []
        if self._reasoning:
            parts.append(Reasoning("".join(self._reasoning)))
        if self._text:
            parts.append(Text("".join(self._text)))
        return Assistant(parts, stop=stop)

    def _said(self, text: str) -> Append:
        self._text.append(text)
        return Append("text", text)

    def _thought(self, text: str) -> Append:
        self._reasoning.append(text)
        return Append("reasoning", text)

    def _not_done(self) -> StreamError:
        return StreamError("incomplete_stream", "the stream ended before its final event")


def stream_fold(format: Format) -> StreamFold:
    """A new fold for one stream of `format`.

    Raises:
        UsageError: `bad_argument` for an unknown format.
    """
    folds: dict[str, type[StreamFold]] = {
        "anthropic": AnthropicFold,
        "openai_chat": OpenAIChatFold,
        "openai_responses": OpenAIResponsesFold,
    }
    fold = folds.get(format)
    if fold is None:
        raise UsageError("bad_argument", f"no stream format {format!r} ({', '.join(folds)})")
    return fold()


def _provider_error(event: object) -> StreamError:
    error = get(event, "error")
    kind = get(error, "type") if error is not None else None
    return StreamError("provider_error", f"the provider reported {kind or 'an error'}")


class AnthropicFold(StreamFold):
    """Messages events: `message_start`, `content_block_start` / `_delta` / `_stop`,
    `message_delta`, `message_stop` (`ping` ignored; `error` raises `StreamError`)."""

    def __init__(self) -> None:
        super().__init__()
        self._message: dict[str, Any] = {}
        self._blocks: list[dict[str, Any]] = []
        self._json: dict[int, list[str]] = {}

    def feed(self, event: object) -> list[Append]:
        kind = get(event, "type")
        if kind == "content_block_delta":
            delta = get(event, "delta")
            index = get(event, "index")
            block = self._blocks[index]
            match get(delta, "type"):
                case "text_delta":
                    text = get(delta, "text")
                    block["text"] += text
                    return [self._said(text)]
                case "thinking_delta":
                    text = get(delta, "thinking")
                    block["thinking"] += text
                    return [self._thought(text)]
                case "signature_delta":
                    block["signature"] = (block.get("signature") or "") + get(delta, "signature")
                case "input_json_delta":
                    text = get(delta, "partial_json")
                    parts = self._json.setdefault(index, [])
                    parts.append(text)
                    if text:
                        first = len(parts) == 1 or not "".join(parts[:-1])
                        name = block["name"] if first else None
                        return [Append(f"call:{block['id']}", text, name)]
            return []
        if kind == "content_block_start":
            block = dict(plain(get(event, "content_block")))
            if block.get("type") == "text":
                block["text"] = block.get("text") or ""
                block.pop("citations", None)
            elif block.get("type") == "thinking":
                block["thinking"] = block.get("thinking") or ""
            self._blocks.append(block)
            return []
        if kind == "message_start":
            self._message = dict(plain(get(event, "message")))
            self._blocks = []
            return []
        if kind == "message_delta":
            delta = get(event, "delta")
            self._message["stop_reason"] = get(delta, "stop_reason")
            self._message["stop_sequence"] = get(delta, "stop_sequence")
            usage = dict(self._message.get("usage") or {})
            for key, value in plain(get(event, "usage") or {}).items():
                if value is not None:
                    usage[key] = value
            self._message["usage"] = usage
            return []
        if kind == "message_stop":
            self.done = True
            return []
        if kind == "error":
            raise _provider_error(event)
        return []

    def final(self) -> Assistant:
        if not self.done:
            raise self._not_done()
        for index, parts in self._json.items():
            self._blocks[index]["input"] = json.loads("".join(parts) or "{}")
        (reply,) = from_anthropic(self._message | {"content": self._blocks, "type": "message"})
        assert isinstance(reply, Assistant)
        return reply


class OpenAIChatFold(StreamFold):
    """Chat completion chunks, bare or as the `chunk` events of `openai`'s
    `chat.completions.stream()` (the first choice; usage from the last chunk when the request
    set `stream_options={"include_usage": True}`). The stream ends with its last chunk:
    call `final()` once the SDK's iterator is exhausted."""

    def __init__(self) -> None:
        super().__init__()
        self._completion: dict[str, Any] = {}
        self._content: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None

    def feed(self, event: object) -> list[Append]:
        kind = get(event, "type")
        if kind is not None:  # `openai`'s `chat.completions.stream()` wraps each chunk
            if kind != "chunk":
                return []  # its derived events (`content.delta`, ...) restate the chunks
            event = get(event, "chunk")
        if not self._completion:
            self._completion = {"id": get(event, "id"), "model": get(event, "model")}
        usage = get(event, "usage")
        if usage is not None:
            self._completion["usage"] = plain(usage)
        out: list[Append] = []
        for choice in get(event, "choices") or ():
            if get(choice, "index") != 0:
                continue
            delta = get(choice, "delta")
            text = get(delta, "content")
            if text:
                self._content.append(text)
                out.append(self._said(text))
            refusal = get(delta, "refusal")
            if refusal:
                self._refusal.append(refusal)
                out.append(self._said(refusal))
            for call in get(delta, "tool_calls") or ():
                out.extend(self._call(call))
            finish = get(choice, "finish_reason")
            if finish is not None:
                self._finish = finish
                self.done = True
        return out

    def _call(self, call: object) -> list[Append]:
        index = get(call, "index")
        held = self._calls.get(index)
        function = get(call, "function")
        if held is None:
            held = self._calls[index] = {"id": get(call, "id"), "name": "", "arguments": []}
        name = get(function, "name") if function is not None else None
        if name:
            held["name"] += name
        text = get(function, "arguments") if function is not None else None
        if not text:
            return []
        first = not held["arguments"]
        held["arguments"].append(text)
        return [Append(f"call:{held['id']}", text, held["name"] if first else None)]

    def final(self) -> Assistant:
        if not self.done:
            raise self._not_done()
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._content) or None,
            "refusal": "".join(self._refusal) or None,
        }
        if self._calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": "".join(call["arguments"])},
                }
                for _, call in sorted(self._calls.items())
            ]
        choice = {"index": 0, "message": message, "finish_reason": self._finish}
        completion = self._completion | {"object": "chat.completion", "choices": [choice]}
        (reply,) = from_openai_chat(completion)
        assert isinstance(reply, Assistant)
        return reply


_RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")


class OpenAIResponsesFold(StreamFold):
    """Responses `response.*` events: text, refusal, reasoning summary and text deltas, and
    function call arguments become appends; `response.completed` / `.incomplete` / `.failed`
    carry the final response. An `error` event raises `StreamError`."""

    def __init__(self) -> None:
        super().__init__()
        self._response: Any = None
        self._calls: dict[str, tuple[str, str]] = {}  # item id -> (call id, name)
        self._named: set[str] = set()

    def feed(self, event: object) -> list[Append]:
        kind = get(event, "type")
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            return [self._said(get(event, "delta"))]
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return [self._thought(get(event, "delta"))]
        if kind == "response.function_call_arguments.delta":
            found = self._calls.get(get(event, "item_id"))
            text = get(event, "delta")
            if found is None or not text:
                return []
            call_id, name = found
            first = call_id not in self._named
            self._named.add(call_id)
            return [Append(f"call:{call_id}", text, name if first else None)]
        if kind == "response.output_item.added":
            item = get(event, "item")
            if get(item, "type") == "function_call":
                self._calls[get(item, "id")] = (get(item, "call_id"), get(item, "name"))
            return []
        if kind in _RESPONSE_ENDS:
            self._response = get(event, "response")
            self.done = True
            return []
        if kind == "error":
            raise StreamError("provider_error", f"the provider reported {get(event, 'code')}")
        return []

    def final(self) -> Assistant:
        if not self.done:
            raise self._not_done()
        (reply,) = from_openai_responses(self._response)
        assert isinstance(reply, Assistant)
        return reply
