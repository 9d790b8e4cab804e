"""Messages: the immutable content a model reads.

A message carries no id, author or provenance (those live on the `Entry` holding it), so
`Conversation.messages()` is exactly what a provider request sends.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

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
    "User",
    "UserPart",
]

StopReason = Literal["stop", "length", "tool_use", "error", "aborted"]


class Text(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="text"):
    text: str


class Json(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="json"):
    value: Any


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
    id: str
    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


ResultPart = Text | Json | Image


class ToolResult(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="tool_result"):
    call_id: str
    name: str
    content: list[ResultPart]
    is_error: bool = False


class Reasoning(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="reasoning"):
    text: str
    redacted: bool = False


UserPart = Text | ToolResult | Image | Document
AssistantPart = Text | ToolCall | Reasoning | Image


class Stop(msgspec.Struct, frozen=True, gc=False):
    """Why a model reply ended."""

    reason: StopReason
    detail: str | None = None

    def is_failure(self) -> bool:
        """True for `error` and `aborted`: the reply was cut short and answers nothing."""
        return self.reason == "error" or self.reason == "aborted"


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

    def tool_results(self) -> list[ToolResult]:
        return [part for part in self.content if isinstance(part, ToolResult)]

    def only_results(self) -> bool:
        """Whether every part is a tool result (and there is at least one)."""
        return bool(self.content) and all(isinstance(part, ToolResult) for part in self.content)


class Assistant(Message, frozen=True, tag="assistant"):
    content: list[AssistantPart]
    stop: Stop | None = None
    origin: Origin | None = None

    def tool_calls(self) -> list[ToolCall]:
        return [part for part in self.content if isinstance(part, ToolCall)]

    def failed(self) -> bool:
        """Whether this reply was cut short (its stop is a failure)."""
        return self.stop is not None and self.stop.is_failure()


AnyMessage = System | User | Assistant
"""The union decoders use for a message."""
