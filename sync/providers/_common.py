"""What the three converters share: reading the source, the lossy policy, the request value.

A converter reads the messages a model reads: a failed reply (`Stop.is_failure`) is never
sent (seed 000: it answers nothing and is never replayed), the STOPPED note goes as the user
text it is. Ids, authors, source ids and asides are not in a `Message` at all, so they cannot
reach a payload; `Assistant.stop`, `origin` and `usage` describe a reply and are not sent
either (no request format carries them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from ..errors import DecodeError, UsageError
from ..messages import AnyMessage, Assistant, Json, Reasoning, ResultPart, Text, ToolCall, User

Lossy = Literal["error", "drop"]
ReasoningPolicy = Literal["drop", "text"]


class Request(dict[str, Any]):
    """The request's keyword arguments (`client.messages.create(model=..., **request)`), and
    in `dropped` what the format could not say and `lossy="drop"` left out, one line each
    (empty with `lossy="error"`, which raises instead)."""

    def __init__(self, fields: Mapping[str, Any], dropped: list[str]) -> None:
        super().__init__(fields)
        self.dropped: tuple[str, ...] = tuple(dropped)


class Losses:
    """Collects what a format cannot say, or raises at the first under `lossy="error"`."""

    def __init__(self, lossy: Lossy, format: str) -> None:
        if lossy not in ("error", "drop"):
            raise UsageError("bad_argument", f"lossy must be 'error' or 'drop', not {lossy!r}")
        self.lossy = lossy
        self.format = format
        self.dropped: list[str] = []

    def lose(self, where: str, what: str) -> None:
        line = f"{where}: {what}"
        if self.lossy == "error":
            raise UsageError("lossy", f"{self.format} cannot say {line} (lossy='drop' drops it)")
        self.dropped.append(line)


def read_source(source: object) -> list[tuple[int, AnyMessage]]:
    """The messages of a `Conversation` or a sequence of messages, each with its index, failed
    replies left out."""
    messages_of = getattr(source, "messages", None)
    messages: Iterable[AnyMessage] = messages_of() if callable(messages_of) else source  # type: ignore[assignment]
    return [
        (at, message)
        for at, message in enumerate(messages)
        if not (isinstance(message, Assistant) and message.failed())
    ]


def replays_to(message: Assistant, provider: str) -> bool:
    """Whether reasoning and provider data of `message` may go to `provider`: only to the
    provider its `Origin` names (another provider refuses a foreign signature)."""
    return message.origin is not None and message.origin.provider == provider


def reasoning_as_text(part: Reasoning, policy: ReasoningPolicy) -> Text | None:
    """Reasoning sent to a provider that did not write it: dropped, or its text (redacted
    reasoning has none, so it is dropped either way)."""
    if policy == "text" and part.text and not part.redacted:
        return Text(part.text)
    return None


def result_text(content: list[ResultPart]) -> str:
    """A result's parts as one text (JSON values as JSON text): the rendering for formats
    whose tool results take a string."""
    return "".join(_text_of(part) for part in content if not _is_image(part))


def _is_image(part: ResultPart) -> bool:
    return not isinstance(part, Text | Json)


def _text_of(part: ResultPart) -> str:
    if isinstance(part, Text):
        return part.text
    assert isinstance(part, Json)
    return json.dumps(part.value, ensure_ascii=False, separators=(",", ":"))


def arguments_json(call: ToolCall) -> str:
    """A call's arguments as the JSON text OpenAI's formats carry (key order kept)."""
    return json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))


def parse_arguments(raw: object, where: str) -> dict[str, Any]:
    """Arguments given as JSON text (OpenAI) or an object (Anthropic); empty text is `{}`.

    Raises:
        DecodeError: not a JSON object.
    """
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    if not isinstance(raw, str):
        raise DecodeError(f"{where}: tool call arguments are neither text nor an object")
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise DecodeError(f"{where}: tool call arguments are not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise DecodeError(f"{where}: tool call arguments are not a JSON object")
    return value


def plain(value: object) -> Any:
    """An SDK object as its JSON-shaped dict (`model_dump`), anything else as it is."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_unset=False)
    return value


def data_url(media_type: str, data: str) -> str:
    return f"data:{media_type};base64,{data}"


def split_data_url(url: str) -> tuple[str, str] | None:
    """`(media_type, base64 data)` of a `data:...;base64,...` URL, else None."""
    if not url.startswith("data:"):
        return None
    head, sep, data = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        return None
    return head[: -len(";base64")], data


def merge_users(messages: list[AnyMessage], joined: set[int]) -> list[AnyMessage]:
    """Merge each user message whose index is in `joined` into the user message before it
    (formats that split one user message in several, results first, read it back whole)."""
    out: list[AnyMessage] = []
    for at, message in enumerate(messages):
        last = out[-1] if out else None
        if at in joined and isinstance(last, User) and isinstance(message, User):
            out[-1] = User([*last.content, *message.content])
        else:
            out.append(message)
    return out


def names_of_calls(messages: Iterable[AnyMessage]) -> dict[str, str]:
    """Call id -> tool name, for formats whose results do not repeat the name."""
    return {call.id: call.name for message in messages for call in message.tool_calls()}


def get(obj: object, key: str, default: Any = None) -> Any:
    """`obj[key]` for a dict, `obj.key` for an SDK object: the stream folds take both."""
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)
