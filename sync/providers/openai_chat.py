"""OpenAI Chat Completions: `messages` out, messages (and a `ChatCompletion`) in.

Rules of the format, kept here so the caller never handles them:

- System messages stay where they are (`role: "system"`; `developer` reads as system).
- One `tool` message per tool result, before the rest of its user message. Chat has no
  `is_error` and no tool name on a result: an error result is sent as its text prefixed
  with `"Error: "` (a documented rendering, not a loss; reading it back gives a plain
  result), the name is read back from the call. JSON parts go as JSON text; an image in a
  result is lossy (a `tool` message takes text only).
- User text, images (`image_url`, a data URL for inline data) and documents (`file` with
  `file_data`; a document by URL is lossy). One text part goes as a plain string.
- An assistant message is its text (a string for one part, text parts for several) then its
  `tool_calls` (arguments as JSON text): text after a call comes back before it. Chat takes
  no reasoning back: `reasoning="text"` sends it as text, `"drop"` (the default) leaves it
  out. An image in an assistant message is lossy.

Stop reasons (`finish_reason` -> `Stop`): `stop` Stop("stop"), `length` Stop("length"),
`tool_calls` / `function_call` Stop("tool_use"), `content_filter` Stop("stop",
"content_filter"); a reply with a `refusal` is Stop("stop", "refusal") and its refusal text is
its text; another reason is Stop("stop", <it>).

Usage: `prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens` (cache
reads), `completion_tokens_details.reasoning_tokens`; cache writes are not given.
"""

from __future__ import annotations

from typing import Any

from ..errors import DecodeError
from ..messages import (
    AnyMessage,
    Assistant,
    Document,
    Image,
    Origin,
    Reasoning,
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
    arguments_json,
    data_url,
    get,
    merge_users,
    parse_arguments,
    plain,
    read_source,
    reasoning_as_text,
    result_text,
    split_data_url,
)

__all__ = ["ERROR_PREFIX", "PROVIDER", "from_openai_chat", "stop_of", "to_openai_chat", "usage_of"]

PROVIDER = "openai"
ERROR_PREFIX = "Error: "
"""How an error result's text begins (Chat has no `is_error`)."""

_STOPS: dict[str, Stop] = {
    "stop": Stop("stop"),
    "length": Stop("length"),
    "tool_calls": Stop("tool_use"),
    "function_call": Stop("tool_use"),
    "content_filter": Stop("stop", "content_filter"),
}


def stop_of(finish_reason: str | None, refused: bool = False) -> Stop | None:
    """The `Stop` of a `finish_reason` (table in the module docstring)."""
    if refused:
        return Stop("stop", "refusal")
    if finish_reason is None:
        return None
    return _STOPS.get(finish_reason) or Stop("stop", finish_reason)


def usage_of(usage: Any) -> Usage | None:
    """A `Usage` of a Chat `usage` object or dict."""
    if usage is None:
        return None
    prompt = get(usage, "prompt_tokens_details")
    completion = get(usage, "completion_tokens_details")
    return Usage(
        get(usage, "prompt_tokens"),
        get(usage, "completion_tokens"),
        None if prompt is None else get(prompt, "cached_tokens"),
        None,
        None if completion is None else get(completion, "reasoning_tokens"),
    )


# ---------------------------------------------------------------------- out


def to_openai_chat(
    source: object, *, lossy: Lossy = "error", reasoning: ReasoningPolicy = "drop"
) -> Request:
    """`{"messages": [...]}` of a Chat Completions request for a `Conversation` or messages.

    Raises:
        UsageError: `lossy` when a part has no Chat form and `lossy="error"`.
    """
    losses = Losses(lossy, "openai chat")
    messages: list[dict[str, Any]] = []
    for at, message in read_source(source):
        match message:
            case System(content=text):
                messages.append({"role": "system", "content": text})
            case User():
                messages.extend(_user(at, message, losses))
            case Assistant():
                messages.append(_assistant(at, message, losses, reasoning))
    return Request({"messages": messages}, losses.dropped)


def _user(at: int, message: User, losses: Losses) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for part in message.content:
        match part:
            case ToolResult():
                if any(isinstance(p, Image) for p in part.content):
                    losses.lose(f"message {at}", f"an image in the result of {part.call_id}")
                text = result_text(part.content)
                if part.is_error:
                    text = ERROR_PREFIX + text
                out.append({"role": "tool", "tool_call_id": part.call_id, "content": text})
            case Text(text=text):
                rest.append({"type": "text", "text": text})
            case Image(media_type=media_type, data=data, url=url):
                link = data_url(media_type, data) if data is not None else url
                rest.append({"type": "image_url", "image_url": {"url": link}})
            case Document(media_type=media_type, data=data, name=name):
                if data is None:
                    losses.lose(f"message {at}", "a document by URL")
                    continue
                file: dict[str, Any] = {"file_data": data_url(media_type, data)}
                if name is not None:
                    file["filename"] = name
                rest.append({"type": "file", "file": file})
    if rest:
        content: Any = rest[0]["text"] if len(rest) == 1 and rest[0]["type"] == "text" else rest
        out.append({"role": "user", "content": content})
    return out


def _assistant(
    at: int, message: Assistant, losses: Losses, policy: ReasoningPolicy
) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in message.content:
        match part:
            case Text(text=text):
                texts.append(text)
            case ToolCall(id=call_id, name=name):
                function = {"name": name, "arguments": arguments_json(part)}
                calls.append({"id": call_id, "type": "function", "function": function})
            case Reasoning():
                shown = reasoning_as_text(part, policy)
                if shown is not None:
                    texts.append(shown.text)
            case Image():
                losses.lose(f"message {at}", "an image in an assistant message")
    content: Any
    if not texts:
        content = None
    elif len(texts) == 1:
        content = texts[0]
    else:
        content = [{"type": "text", "text": text} for text in texts]
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = calls
    return out


# ---------------------------------------------------------------------- in


def from_openai_chat(payload: object) -> list[AnyMessage]:
    """Messages of a Chat payload: a request (`{"messages"}`), a list of messages, or a
    `ChatCompletion` (an SDK object or its dict; its first choice gives one `Assistant`
    with stop, origin and usage).

    Raises:
        DecodeError: a message or part this reader does not know, or bad arguments.
    """
    payload = plain(payload)
    if isinstance(payload, dict) and payload.get("object") == "chat.completion":
        return [_completion(payload)]
    if isinstance(payload, dict):
        payload = payload.get("messages", [])
    if not isinstance(payload, list):
        raise DecodeError("openai chat: expected a request, a list of messages or a completion")
    out: list[AnyMessage] = []
    joined: set[int] = set()
    names: dict[str, str] = {}
    after_tool = False
    for at, item in enumerate(payload):
        role = item.get("role")
        where = f"openai chat: message {at}"
        if role in ("system", "developer"):
            content = item.get("content")
            out.append(System(content if isinstance(content, str) else _joined(content)))
        elif role == "assistant":
            reply = _assistant_message(item, where)
            names.update((call.id, call.name) for call in reply.tool_calls())
            out.append(reply)
        elif role == "tool":
            call_id = item["tool_call_id"]
            text = item.get("content")
            text = text if isinstance(text, str) else _joined(text)
            result = ToolResult(call_id, names.get(call_id, ""), [Text(text)])
            if after_tool:
                joined.add(len(out))
            out.append(User([result]))
        elif role == "user":
            if after_tool:
                joined.add(len(out))
            out.append(User(_user_parts(item.get("content"), where)))
        else:
            raise DecodeError(f"{where}: role {role!r}")
        after_tool = role == "tool"
    return merge_users(out, joined)


def _joined(content: Any) -> str:
    return "".join(part.get("text", "") for part in content or [])


def _user_parts(content: Any, where: str) -> list[Any]:
    if isinstance(content, str):
        return [Text(content)]
    parts: list[Any] = []
    for part in content or []:
        kind = part.get("type")
        if kind == "text":
            parts.append(Text(part["text"]))
        elif kind == "image_url":
            url = part["image_url"]["url"]
            inline = split_data_url(url)
            parts.append(Image(*inline) if inline else Image("image/*", None, url))
        elif kind == "file":
            file = part["file"]
            inline = split_data_url(file.get("file_data") or "")
            if inline is None:
                raise DecodeError(f"{where}: a file part without inline data")
            parts.append(Document(inline[0], inline[1], None, file.get("filename")))
        else:
            raise DecodeError(f"{where}: a {kind!r} part has no convsync form")
    return parts


def _assistant_message(item: dict[str, Any], where: str) -> Assistant:
    parts: list[Any] = []
    content = item.get("content")
    if isinstance(content, str):
        if content:
            parts.append(Text(content))
    else:
        for part in content or []:
            if part.get("type") == "text":
                parts.append(Text(part["text"]))
            elif part.get("type") == "refusal":
                parts.append(Text(part["refusal"]))
    if item.get("refusal"):
        parts.append(Text(item["refusal"]))
    for call in item.get("tool_calls") or []:
        function = call["function"]
        parts.append(
            ToolCall(
                call["id"], function["name"], parse_arguments(function.get("arguments"), where)
            )
        )
    return Assistant(parts)


def _completion(completion: dict[str, Any]) -> Assistant:
    choice = completion["choices"][0]
    message = choice["message"]
    reply = _assistant_message(message, "openai chat: completion")
    return Assistant(
        reply.content,
        stop=stop_of(choice.get("finish_reason"), refused=bool(message.get("refusal"))),
        origin=Origin(PROVIDER, completion.get("model") or "", completion.get("id")),
        usage=usage_of(completion.get("usage")),
    )
