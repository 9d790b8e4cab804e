"""Messages: the immutable content a model reads.

A message carries no id, author or provenance (those live on the `Entry` holding it), so
`Conversation.messages()` is exactly what a provider request sends.

Every struct here is `gc=False`, and the lists and dicts they hold (content, tool call
arguments, JSON values) are taken out of the garbage collector's lists when the struct is made
or decoded (`_settle`, `sync/untrack.py`), so a full collection does not walk every message a
process holds. Content given as a tuple is stored as a list, so how it was built never makes
two messages unequal.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .untrack import is_tracked, untrack_at, untrack_tree

__all__ = [
    "Assistant",
    "AssistantPart",
    "Document",
    "Image",
    "Json",
    "Message",
    "Origin",
    "Reasoning",
    "ResultPart",
    "Stop",
    "StopReason",
    "System",
    "Text",
    "ToolCall",
    "ToolResult",
    "Usage",
    "User",
    "UserPart",
]

StopReason = Literal["stop", "length", "tool_use", "error", "aborted"]


class Text(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="text"):
    text: str


class Json(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="json"):
    value: Any

    def __post_init__(self) -> None:
        untrack_tree(self.value)


class Image(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="image"):
    media_type: str
    data: str | None = None
    url: str | None = None


class Document(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="document"):
    media_type: str
    data: str | None = None
    url: str | None = None
    name: str | None = None


class ToolCall(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="tool_call"):
    """A call the model makes. `provider_data` is opaque data the provider that made the call
    needs back when the call is replayed to it (the OpenAI Responses `function_call` item's
    id); it is sent to no other provider."""

    id: str
    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)
    provider_data: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if is_tracked(self.arguments):  # flat arguments are untracked by CPython already
            untrack_tree(self.arguments)
        if self.provider_data is not None:
            untrack_tree(self.provider_data)


def _settle(message: Any) -> None:
    """Store tuple content as a list, then untrack the list when every part in it is an
    untracked struct (the parts are `gc=False`; anything else keeps the list tracked).

    It is the `__post_init__` of `User`, `Assistant` and `ToolResult` itself, not called from
    one: msgspec runs it for every message it decodes, and the extra call cost a tenth of
    decoding a state of short messages (issue 32)."""
    content = message.content
    if type(content) is not list:  # a tuple when the caller built it with one
        if type(content) is not tuple:
            return
        content = list(content)
        msgspec.structs.force_setattr(message, "content", content)
    for part in content:
        if is_tracked(part):
            return
    untrack_at(id(content))


ResultPart = Text | Json | Image


class ToolResult(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="tool_result"):
    call_id: str
    name: str
    content: list[ResultPart]
    is_error: bool = False

    __post_init__ = _settle  # type: ignore[misc]  # the function itself: see `_settle`


class Reasoning(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="reasoning"):
    """A model's reasoning. Every field but `text` is opaque, kept verbatim for the provider
    named in the reply's `Origin` and sent back to that provider only:

    - `signature`: what vouches for the text (Anthropic `thinking.signature`);
    - `data`: the encrypted body of redacted reasoning (Anthropic `redacted_thinking.data`;
      `redacted` is then true and `text` is empty);
    - `provider_data`: anything else the provider needs replayed (OpenAI Responses: the
      reasoning item's `id` and `encrypted_content`).
    """

    text: str
    redacted: bool = False
    signature: str | None = None
    data: str | None = None
    provider_data: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.provider_data is not None:
            untrack_tree(self.provider_data)


UserPart = Text | ToolResult | Image | Document
AssistantPart = Text | ToolCall | Reasoning | Image


class Stop(msgspec.Struct, frozen=True, gc=False):
    """Why a model reply ended."""

    reason: StopReason
    detail: str | None = None

    def is_failure(self) -> bool:
        """True for `error` and `aborted`: the reply was cut short and answers nothing."""
        return self.reason == "error" or self.reason == "aborted"


class Usage(msgspec.Struct, frozen=True, gc=False):
    """Tokens a reply cost, as its provider counted them; `None` where the provider did not
    say. `input_tokens` counts every prompt token, cached ones included (so the counts of
    two providers add up the same way); `reasoning_tokens` are part of `output_tokens`."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None


class Origin(msgspec.Struct, frozen=True, gc=False):
    """Which provider and model wrote a reply."""

    provider: str
    model: str
    response_id: str | None = None


class Message(msgspec.Struct, frozen=True, gc=False, tag_field="role"):
    """Base of `System`, `User` and `Assistant`; also the home of the constructors."""

    @staticmethod
    def system(text: str) -> System:
        return System(text)

    @staticmethod
    def user(text: str) -> User:
        return User([Text(text)])

    @staticmethod
    def assistant(text: str, stop: Stop | None = None) -> Assistant:
        return Assistant([Text(text)], stop=stop)

    @staticmethod
    def tool_result(call_id: str, name: str, text: str, is_error: bool = False) -> User:
        """A user message holding one tool result with a text body."""
        return User([ToolResult(call_id, name, [Text(text)], is_error)])

    def tool_calls(self) -> list[ToolCall]:
        """The tool calls this message makes (only an assistant message makes any)."""
        return []

    def tool_results(self) -> list[ToolResult]:
        """The tool results this message carries (only a user message carries any)."""
        return []


class System(Message, frozen=True, tag="system"):
    content: str


class User(Message, frozen=True, tag="user"):
    content: list[UserPart]

    __post_init__ = _settle  # type: ignore[misc]  # the function itself: see `_settle`

    def tool_results(self) -> list[ToolResult]:
        return [part for part in self.content if isinstance(part, ToolResult)]

    def only_results(self) -> bool:
        """Whether every part is a tool result (and there is at least one)."""
        return bool(self.content) and all(isinstance(part, ToolResult) for part in self.content)


class Assistant(Message, frozen=True, tag="assistant"):
    content: list[AssistantPart]
    stop: Stop | None = None
    origin: Origin | None = None
    usage: Usage | None = None

    __post_init__ = _settle  # type: ignore[misc]  # the function itself: see `_settle`

    def tool_calls(self) -> list[ToolCall]:
        return [part for part in self.content if isinstance(part, ToolCall)]

    def failed(self) -> bool:
        """Whether this reply was cut short (its stop is a failure)."""
        return self.stop is not None and self.stop.is_failure()


AnyMessage = System | User | Assistant
"""The union decoders use for a message."""
