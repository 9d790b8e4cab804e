"""OpenAI Responses: `input` items out, messages (and a `Response`) in.

Rules of the format, kept here so the caller never handles them:

- System messages are `system` input messages where they stand.
- A tool result is a `function_call_output` item (before the rest of its user message), its
  output a string for one text part, else `input_text` / `input_image` parts. No `is_error`:
  an error result's text starts with `"Error: "` (a documented rendering). The name is read
  back from the call.
- User text `input_text`, images `input_image` (a data URL for inline data), documents
  `input_file` (`file_data` as a data URL, or `file_url`).
- An assistant message is one item per part, in order: text an `assistant` message with
  `output_text`, a call a `function_call` (arguments as JSON text), reasoning a `reasoning`
  item. Reasoning and the call's item `id` (`provider_data`) go back only to OpenAI (the
  reply's `Origin.provider == "openai"`), reasoning only when it carries its item `id`
  (`provider_data`, with `encrypted_content` when the request asked for it); elsewhere
  `reasoning="text"` sends it as text, `"drop"` (the default) leaves it out. Several summary
  parts are kept in `provider_data["summary"]`, the text being them joined by blank lines.

Stop (from the response's `status` and output):

    completed                     Stop("tool_use") with a function call, else Stop("stop")
    completed with a refusal      Stop("stop", "refusal")
    incomplete: max_output_tokens Stop("length", "max_output_tokens")
    incomplete: content_filter    Stop("stop", "content_filter")
    incomplete: other             Stop("length", <the reason>)
    failed                        Stop("error", <error code: message>)
    cancelled                     Stop("aborted", "cancelled")
    in_progress / queued          None

Usage: `input_tokens`, `output_tokens`, `input_tokens_details.cached_tokens` (cache reads),
`output_tokens_details.reasoning_tokens`; cache writes are not given.
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
    arguments_json,
    data_url,
    get,
    merge_users,
    parse_arguments,
    plain,
    read_source,
    reasoning_as_text,
    replays_to,
    result_text,
    split_data_url,
)
from .openai_chat import ERROR_PREFIX

__all__ = ["PROVIDER", "from_openai_responses", "stop_of", "to_openai_responses", "usage_of"]

PROVIDER = "openai"


def stop_of(response: Any) -> Stop | None:
    """The `Stop` of a Responses `Response` (object or dict; table in the module docstring)."""
    status = get(response, "status")
    if status == "completed":
        output = get(response, "output") or []
        if any(get(item, "type") == "function_call" for item in output):
            return Stop("tool_use")
        if any(
            get(part, "type") == "refusal"
            for item in output
            if get(item, "type") == "message"
            for part in get(item, "content") or []
        ):
            return Stop("stop", "refusal")
        return Stop("stop")
    if status == "incomplete":
        details = get(response, "incomplete_details")
        reason = get(details, "reason") if details is not None else None
        if reason == "content_filter":
            return Stop("stop", "content_filter")
        return Stop("length", reason)
    if status == "failed":
        error = get(response, "error")
        detail = None if error is None else f"{get(error, 'code')}: {get(error, 'message')}"
        return Stop("error", detail)
    if status == "cancelled":
        return Stop("aborted", "cancelled")
    return None


def usage_of(usage: Any) -> Usage | None:
    """A `Usage` of a Responses `usage` object or dict."""
    if usage is None:
        return None
    given = get(usage, "input_tokens_details")
    made = get(usage, "output_tokens_details")
    return Usage(
        get(usage, "input_tokens"),
        get(usage, "output_tokens"),
        None if given is None else get(given, "cached_tokens"),
        None,
        None if made is None else get(made, "reasoning_tokens"),
    )


# ---------------------------------------------------------------------- out


def to_openai_responses(
    source: object, *, lossy: Lossy = "error", reasoning: ReasoningPolicy = "drop"
) -> Request:
    """`{"input": [...]}` of a Responses request for a `Conversation` or messages.

    Raises:
        UsageError: `lossy` when a part has no Responses form and `lossy="error"`.
    """
    losses = Losses(lossy, "openai responses")
    items: list[dict[str, Any]] = []
    for at, message in read_source(source):
        match message:
            case System(content=text):
                items.append({"role": "system", "content": text})
            case User():
                items.extend(_user(message))
            case Assistant():
                items.extend(_assistant(at, message, losses, reasoning))
    return Request({"input": items}, losses.dropped)


def _input_part(part: Text | Image | Document) -> dict[str, Any]:
    match part:
        case Text(text=text):
            return {"type": "input_text", "text": text}
        case Image(media_type=media_type, data=data, url=url):
            link = data_url(media_type, data) if data is not None else url
            return {"type": "input_image", "image_url": link, "detail": "auto"}
        case Document(media_type=media_type, data=data, url=url, name=name):
            file: dict[str, Any] = {"type": "input_file"}
            if data is not None:
                file["file_data"] = data_url(media_type, data)
            else:
                file["file_url"] = url
            if name is not None:
                file["filename"] = name
            return file


def _user(message: User) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, ToolResult):
            out.append(
                {"type": "function_call_output", "call_id": part.call_id, "output": _output(part)}
            )
        else:
            rest.append(_input_part(part))
    if rest:
        out.append({"role": "user", "content": rest})
    return out


def _output(result: ToolResult) -> Any:
    if all(not isinstance(part, Image) for part in result.content):
        text = result_text(result.content)
        return ERROR_PREFIX + text if result.is_error else text
    parts = [
        _input_part(part) if isinstance(part, Image) else _input_part(Text(result_text([part])))
        for part in result.content
    ]
    if result.is_error:
        parts.insert(0, {"type": "input_text", "text": ERROR_PREFIX})
    return parts


def _assistant(
    at: int, message: Assistant, losses: Losses, policy: ReasoningPolicy
) -> list[dict[str, Any]]:
    own = replays_to(message, PROVIDER)
    items: list[dict[str, Any]] = []
    for part in message.content:
        match part:
            case Text(text=text):
                items.append(_said(text))
            case ToolCall(id=call_id, name=name, provider_data=data):
                item: dict[str, Any] = {"type": "function_call", "call_id": call_id, "name": name}
                item["arguments"] = arguments_json(part)
                if own and data is not None and "id" in data:
                    item["id"] = data["id"]
                items.append(item)
            case Reasoning(provider_data=data) if own and data is not None and "id" in data:
                summary = data.get("summary", [part.text] if part.text else [])
                item = {
                    "type": "reasoning",
                    "id": data["id"],
                    "summary": [{"type": "summary_text", "text": text} for text in summary],
                }
                if data.get("encrypted_content") is not None:
                    item["encrypted_content"] = data["encrypted_content"]
                items.append(item)
            case Reasoning():
                shown = reasoning_as_text(part, policy)
                if shown is not None:
                    items.append(_said(shown.text))
            case Image():
                losses.lose(f"message {at}", "an image in an assistant message")
    return items


def _said(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "output_text", "text": text}]}


# ---------------------------------------------------------------------- in


def from_openai_responses(payload: object) -> list[AnyMessage]:
    """Messages of a Responses payload: a request (`{"input", "instructions"}`), a list of
    input items, or a `Response` (an SDK object or its dict; its output gives one
    `Assistant` with stop, origin and usage).

    Raises:
        DecodeError: an item or part this reader does not know, or bad arguments.
    """
    payload = plain(payload)
    if isinstance(payload, dict) and payload.get("object") == "response":
        return [_response(payload)]
    out: list[AnyMessage] = []
    if isinstance(payload, dict):
        if isinstance(payload.get("instructions"), str):
            out.append(System(payload["instructions"]))
        payload = payload.get("input", [])
        if isinstance(payload, str):
            payload = [{"role": "user", "content": payload}]
    if not isinstance(payload, list):
        raise DecodeError("openai responses: expected a request, input items or a response")
    return out + _items(payload)


def _items(items: list[dict[str, Any]]) -> list[AnyMessage]:
    out: list[AnyMessage] = []
    joined: set[int] = set()
    names: dict[str, str] = {}
    replying: list[Any] | None = None  # the parts of the assistant message being read
    after_output = False
    for at, item in enumerate(items):
        where = f"openai responses: item {at}"
        kind = item.get("type", "message")
        role = item.get("role")
        side = (
            "assistant" if kind in ("function_call", "reasoning") or role == "assistant" else kind
        )
        if side != "assistant":
            replying = None
        if side == "assistant":
            if replying is None:
                replying = []
                out.append(Assistant(replying))
            part = _assistant_part(item, where)
            if part is not None:
                replying.extend(part)
                if isinstance(part[0], ToolCall):
                    names[part[0].id] = part[0].name
        elif kind == "function_call_output":
            call_id = item["call_id"]
            result = ToolResult(call_id, names.get(call_id, ""), _result(item.get("output")))
            if after_output:
                joined.add(len(out))
            out.append(User([result]))
        elif kind == "message" and role in ("system", "developer"):
            content = item.get("content")
            out.append(System(content if isinstance(content, str) else _text(content)))
        elif kind == "message" and role == "user":
            if after_output:
                joined.add(len(out))
            out.append(User(_user_parts(item.get("content"), where)))
        else:
            raise DecodeError(f"{where}: a {kind!r} item has no convsync form")
        after_output = kind == "function_call_output"
    # The assistant parts were gathered in place; rebuild so each message settles its list.
    out = [Assistant(list(m.content)) if isinstance(m, Assistant) else m for m in out]
    return merge_users(out, joined)


def _text(content: Any) -> str:
    return "".join(part.get("text", "") for part in content or [])


def _inline(part: dict[str, Any], where: str) -> Text | Image | Document:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return Text(part["text"])
    if kind == "input_image":
        url = part.get("image_url") or ""
        inline = split_data_url(url)
        return Image(*inline) if inline else Image("image/*", None, url)
    if kind == "input_file":
        inline = split_data_url(part.get("file_data") or "")
        if inline is not None:
            return Document(inline[0], inline[1], None, part.get("filename"))
        return Document(
            "application/octet-stream", None, part.get("file_url"), part.get("filename")
        )
    raise DecodeError(f"{where}: a {kind!r} part has no convsync form")


def _user_parts(content: Any, where: str) -> list[Any]:
    if isinstance(content, str):
        return [Text(content)]
    return [_inline(part, where) for part in content or []]


def _result(output: Any) -> list[ResultPart]:
    if isinstance(output, str):
        return [Text(output)]
    parts: list[ResultPart] = []
    for part in output or []:
        read = _inline(part, "openai responses: output")
        if isinstance(read, Document):
            raise DecodeError("openai responses: a file in a tool output has no convsync form")
        parts.append(read)
    return parts


def _assistant_part(item: dict[str, Any], where: str) -> list[Any] | None:
    kind = item.get("type", "message")
    if kind == "function_call":
        held = {"id": item["id"]} if item.get("id") else None
        arguments = parse_arguments(item.get("arguments"), where)
        return [ToolCall(item["call_id"], item["name"], arguments, provider_data=held)]
    if kind == "reasoning":
        summary = [part.get("text", "") for part in item.get("summary") or []]
        data: dict[str, Any] = {"id": item["id"]}
        if item.get("encrypted_content") is not None:
            data["encrypted_content"] = item["encrypted_content"]
        if len(summary) > 1:
            data["summary"] = summary
        return [Reasoning("\n\n".join(summary), provider_data=data)]
    content = item.get("content")
    if isinstance(content, str):
        return [Text(content)]
    parts: list[Any] = []
    for part in content or []:
        if part.get("type") == "refusal":
            parts.append(Text(part["refusal"]))
        else:
            parts.append(Text(part["text"]))
    return parts


def _response(response: dict[str, Any]) -> Assistant:
    messages = _items(response.get("output") or [])
    content = [part for m in messages if isinstance(m, Assistant) for part in m.content]
    return Assistant(
        content,
        stop=stop_of(response),
        origin=Origin(PROVIDER, response.get("model") or "", response.get("id")),
        usage=usage_of(response.get("usage")),
    )
