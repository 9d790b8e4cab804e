"""Anthropic Messages: `system` + `messages` out, messages (and a response `Message`) in.

Rules of the format, kept here so the caller never handles them:

- A leading run of system messages is the top-level `system` (a string for one, text blocks
  for several). A system message after the first non-system one has no place: lossy.
- Tool results go first in their user message, as `tool_result` blocks (`is_error` kept;
  a JSON part as JSON text, a documented rendering). The tool's name is not sent; reading a
  payload back takes it from the call the result answers.
- Images and documents as `base64` or `url` sources; a document's `name` is its `title`. An
  image in an assistant message is lossy.
- Reasoning goes back only to Anthropic (the reply's `Origin.provider == "anthropic"`) as
  `thinking` with its `signature`, or `redacted_thinking` with its `data`; reasoning without
  a signature cannot be replayed and is dropped (not an error: Anthropic needs none back).
  Elsewhere `reasoning="text"` sends it as text, `"drop"` (the default) leaves it out.

Stop reasons (`stop_reason` -> `Stop`):

    end_turn        Stop("stop")
    stop_sequence   Stop("stop", "stop_sequence")
    max_tokens      Stop("length")
    model_context_window_exceeded  Stop("length", "model_context_window_exceeded")
    tool_use        Stop("tool_use")
    pause_turn      Stop("stop", "pause_turn")  NOT final: send the conversation back to let
                                                 the model continue (`is_paused`)
    refusal         Stop("stop", "refusal")     the model declined; the reply is read
    other / absent  Stop("stop", <the raw reason>) / None

Usage: `input_tokens` is Anthropic's input plus its cache reads and writes (every prompt
token, as OpenAI counts); `cache_read_tokens` / `cache_write_tokens` are
`cache_read_input_tokens` / `cache_creation_input_tokens`; `reasoning_tokens` is not given.
"""

from __future__ import annotations

from typing import Any

from ..errors import DecodeError
from ..messages import (
    AnyMessage,
    Assistant,
    Document,
    Image,
    Json,
    Origin,
    Reasoning,
    ResultPart,
    Stop,
    System,
    Text,
    ToolCall,
    ToolResult,
    Usage,
    User,
)
from ._common import (
    Losses,
    Lossy,
    ReasoningPolicy,
    Request,
    get,
    names_of_calls,
    parse_arguments,
    plain,
    read_source,
    reasoning_as_text,
    replays_to,
    result_text,
)

__all__ = ["PROVIDER", "from_anthropic", "is_paused", "stop_of", "to_anthropic", "usage_of"]

PROVIDER = "anthropic"
"""The `Origin.provider` of a reply Anthropic wrote."""

_STOPS: dict[str, Stop] = {
    "end_turn": Stop("stop"),
    "stop_sequence": Stop("stop", "stop_sequence"),
    "max_tokens": Stop("length"),
    "model_context_window_exceeded": Stop("length", "model_context_window_exceeded"),
    "tool_use": Stop("tool_use"),
    "pause_turn": Stop("stop", "pause_turn"),
    "refusal": Stop("stop", "refusal"),
}


def stop_of(stop_reason: str | None) -> Stop | None:
    """The `Stop` of an Anthropic `stop_reason` (table in the module docstring)."""
    if stop_reason is None:
        return None
    return _STOPS.get(stop_reason) or Stop("stop", stop_reason)


def is_paused(message: AnyMessage) -> bool:
    """Whether `message` stopped at `pause_turn`: the turn is not over, call the model again
    with the conversation as it is."""
    return isinstance(message, Assistant) and message.stop == _STOPS["pause_turn"]


def usage_of(usage: Any) -> Usage | None:
    """A `Usage` of an Anthropic `usage` object or dict (see the module docstring)."""
    if usage is None:
        return None
    read = get(usage, "cache_read_input_tokens")
    write = get(usage, "cache_creation_input_tokens")
    given = get(usage, "input_tokens")
    total = None if given is None else given + (read or 0) + (write or 0)
    return Usage(total, get(usage, "output_tokens"), read, write, None)


# ---------------------------------------------------------------------- out


def to_anthropic(
    source: object, *, lossy: Lossy = "error", reasoning: ReasoningPolicy = "drop"
) -> Request:
    """The `system` and `messages` of a Messages request for a `Conversation` or messages.

    Raises:
        UsageError: `lossy` when a part has no Anthropic form and `lossy="error"` (the
            message says which); with `lossy="drop"` it is left out and named in `dropped`.
    """
    losses = Losses(lossy, "anthropic")
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for at, message in read_source(source):
        match message:
            case System(content=text):
                if messages:
                    losses.lose(f"message {at}", "a system message after the first turn")
                else:
                    system.append(text)
            case User():
                messages.append({"role": "user", "content": _user_blocks(at, message, losses)})
            case Assistant():
                blocks = _assistant_blocks(at, message, losses, reasoning)
                messages.append({"role": "assistant", "content": blocks})
    fields: dict[str, Any] = {}
    if len(system) == 1:
        fields["system"] = system[0]
    elif system:
        fields["system"] = [{"type": "text", "text": text} for text in system]
    fields["messages"] = messages
    return Request(fields, losses.dropped)


def _source(media_type: str, data: str | None, url: str | None) -> dict[str, Any]:
    if data is not None:
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _user_blocks(at: int, message: User, losses: Losses) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for part in message.content:
        match part:
            case ToolResult():
                results.append(_result_block(at, part, losses))
            case Text(text=text):
                rest.append({"type": "text", "text": text})
            case Image(media_type=media_type, data=data, url=url):
                rest.append({"type": "image", "source": _source(media_type, data, url)})
            case Document(media_type=media_type, data=data, url=url, name=name):
                block: dict[str, Any] = {
                    "type": "document",
                    "source": _source(media_type, data, url),
                }
                if name is not None:
                    block["title"] = name
                rest.append(block)
    return results + rest  # results first: the format requires it


def _result_block(at: int, result: ToolResult, losses: Losses) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for part in result.content:
        if isinstance(part, Image):
            content.append(
                {"type": "image", "source": _source(part.media_type, part.data, part.url)}
            )
        else:
            content.append({"type": "text", "text": result_text([part])})
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": result.call_id,
        "content": content,
    }
    if result.is_error:
        block["is_error"] = True
    return block


def _assistant_blocks(
    at: int, message: Assistant, losses: Losses, policy: ReasoningPolicy
) -> list[dict[str, Any]]:
    own = replays_to(message, PROVIDER)
    blocks: list[dict[str, Any]] = []
    for part in message.content:
        match part:
            case Text(text=text):
                blocks.append({"type": "text", "text": text})
            case ToolCall(id=call_id, name=name, arguments=arguments):
                blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
            case Reasoning() if own:
                if part.redacted and part.data is not None:
                    blocks.append({"type": "redacted_thinking", "data": part.data})
                elif not part.redacted and part.signature is not None:
                    blocks.append(
                        {"type": "thinking", "thinking": part.text, "signature": part.signature}
                    )
            case Reasoning():
                shown = reasoning_as_text(part, policy)
                if shown is not None:
                    blocks.append({"type": "text", "text": shown.text})
            case Image():
                losses.lose(f"message {at}", "an image in an assistant message")
    return blocks


# ---------------------------------------------------------------------- in


def from_anthropic(payload: object) -> list[AnyMessage]:
    """Messages of an Anthropic payload: a request (`{"system", "messages"}`), a list of
    message params, or a response `Message` (an SDK object or its dict; it gives one
    `Assistant` with stop, origin and usage).

    Raises:
        DecodeError: a block or message this reader does not know, or bad arguments.
    """
    payload = plain(payload)
    if isinstance(payload, dict) and payload.get("type") == "message":
        return [_response(payload)]
    out: list[AnyMessage] = []
    if isinstance(payload, dict):
        system = payload.get("system")
        if isinstance(system, str):
            out.append(System(system))
        elif isinstance(system, list):
            out.extend(System(block["text"]) for block in system)
        payload = payload.get("messages", [])
    if not isinstance(payload, list):
        raise DecodeError("anthropic: expected a request, a list of messages or a message")
    names: dict[str, str] = {}
    for at, item in enumerate(payload):
        role = item.get("role")
        content = item.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if role == "assistant":
            reply = Assistant(_assistant_parts(at, blocks))
            names.update(names_of_calls([reply]))
            out.append(reply)
        elif role == "user":
            out.append(User(_user_parts(at, blocks, names)))
        else:
            raise DecodeError(f"anthropic: message {at} has role {role!r}")
    return out


def _response(message: dict[str, Any]) -> Assistant:
    return Assistant(
        _assistant_parts(0, message.get("content") or []),
        stop=stop_of(message.get("stop_reason")),
        origin=Origin(PROVIDER, message.get("model") or "", message.get("id")),
        usage=usage_of(message.get("usage")),
    )


def _media(source: dict[str, Any], where: str) -> tuple[str, str | None, str | None]:
    kind = source.get("type")
    if kind == "base64":
        return source["media_type"], source["data"], None
    if kind == "url":
        url = source["url"]
        return _guess_type(url), None, url
    raise DecodeError(f"{where}: a {kind!r} source has no convsync form")


def _guess_type(url: str) -> str:
    lower = url.lower().split("?")[0]
    for end, media_type in (
        (".png", "image/png"),
        (".gif", "image/gif"),
        (".webp", "image/webp"),
        (".pdf", "application/pdf"),
    ):
        if lower.endswith(end):
            return media_type
    return "image/jpeg" if lower.endswith((".jpg", ".jpeg")) else "application/octet-stream"


def _user_parts(at: int, blocks: list[dict[str, Any]], names: dict[str, str]) -> list[Any]:
    where = f"anthropic: message {at}"
    parts: list[Any] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(Text(block["text"]))
        elif kind == "image":
            parts.append(Image(*_media(block["source"], where)))
        elif kind == "document":
            media_type, data, url = _media(block["source"], where)
            parts.append(Document(media_type, data, url, block.get("title")))
        elif kind == "tool_result":
            call_id = block["tool_use_id"]
            parts.append(
                ToolResult(
                    call_id,
                    names.get(call_id, ""),
                    _result_parts(block.get("content"), where),
                    bool(block.get("is_error")),
                )
            )
        else:
            raise DecodeError(f"{where}: a {kind!r} block has no convsync form")
    return parts


def _result_parts(content: object, where: str) -> list[ResultPart]:
    if content is None:
        return []
    if isinstance(content, str):
        return [Text(content)]
    parts: list[ResultPart] = []
    for block in content:  # type: ignore[attr-defined]
        if block.get("type") == "text":
            parts.append(Text(block["text"]))
        elif block.get("type") == "image":
            parts.append(Image(*_media(block["source"], where)))
        else:
            raise DecodeError(f"{where}: a {block.get('type')!r} result block has no form")
    return parts


def _assistant_parts(at: int, blocks: list[dict[str, Any]]) -> list[Any]:
    where = f"anthropic: message {at}"
    parts: list[Any] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(Text(block["text"]))
        elif kind == "thinking":
            parts.append(Reasoning(block.get("thinking", ""), signature=block.get("signature")))
        elif kind == "redacted_thinking":
            parts.append(Reasoning("", redacted=True, data=block.get("data")))
        elif kind == "tool_use":
            parts.append(
                ToolCall(block["id"], block["name"], parse_arguments(block.get("input"), where))
            )
        else:
            raise DecodeError(f"{where}: a {kind!r} block has no convsync form")
    return parts


# `Json` renders as text in a tool result (see the module docstring): imported for the type.
_ = Json
