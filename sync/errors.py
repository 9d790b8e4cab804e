"""Every error convsync raises, split by whose fault it is.

- `ProtocolError`: a peer or a file sent something that is not what the protocol says
  (`DecodeError` is the one the codec raises).
- `UsageError`: the calling code misused the API (a bad range, a record too large to send).
- `ApplyError`: a change record does not fit the conversation it is applied to.
- `PairingError`, `AnswerError`: tool calls and results do not pair (see `sync.pairing`).
- `SnapshotError`: a snapshot is malformed (see `sync.snapshot`).

Every error carries a machine-readable `reason` and a short lower-case message.
"""

from __future__ import annotations

__all__ = [
    "AnswerError",
    "ApplyError",
    "ConvsyncError",
    "DecodeError",
    "PairingError",
    "ProtocolError",
    "SnapshotError",
    "UsageError",
]


class ConvsyncError(Exception):
    """Base of every convsync error.

    Attributes:
        reason: a machine-readable reason, one word in snake case.
        message: a short human-readable explanation.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class ProtocolError(ConvsyncError):
    """A peer (or a file) sent something the protocol does not allow."""


class DecodeError(ProtocolError):
    """Bytes that do not decode to the expected wire type; the message says where."""

    def __init__(self, message: str) -> None:
        super().__init__("malformed", message)


class UsageError(ConvsyncError, ValueError):
    """The calling code misused the API; nothing was changed."""


class ApplyError(ConvsyncError):
    """A change record does not fit the conversation; the conversation is unchanged."""


class PairingError(ConvsyncError):
    """Why a message list is not a canonical conversation, or what a repair mended.

    `reason` is one of `consecutive_assistant`, `unanswered_tool_call`, `orphan_tool_result`,
    `interrupted_tool_call` (a system message between a call and its result); `index` is the
    message it was found at and `call_id` the tool call concerned, if any.
    """

    def __init__(self, reason: str, index: int, call_id: str | None, message: str) -> None:
        super().__init__(reason, message)
        self.index = index
        self.call_id = call_id

    @classmethod
    def consecutive_assistant(cls, index: int) -> PairingError:
        return cls(
            "consecutive_assistant",
            index,
            None,
            f"message {index} is an assistant message directly after another",
        )

    @classmethod
    def unanswered_tool_call(cls, index: int, call_id: str) -> PairingError:
        return cls(
            "unanswered_tool_call",
            index,
            call_id,
            f"tool call {call_id!r} of message {index} has no result",
        )

    @classmethod
    def orphan_tool_result(cls, index: int, call_id: str) -> PairingError:
        return cls(
            "orphan_tool_result",
            index,
            call_id,
            f"tool result {call_id!r} in message {index} answers no waiting call",
        )

    @classmethod
    def interrupted_tool_call(cls, index: int, call_id: str) -> PairingError:
        """System message `index` arrived while call `call_id` still waited for its result."""
        return cls(
            "interrupted_tool_call",
            index,
            call_id,
            f"system message {index} comes while tool call {call_id!r} waits for its result",
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PairingError):
            return NotImplemented
        return (self.reason, self.index, self.call_id) == (other.reason, other.index, other.call_id)

    def __hash__(self) -> int:
        return hash((self.reason, self.index, self.call_id))

    def __repr__(self) -> str:
        return f"PairingError.{self.reason}(index={self.index}, call_id={self.call_id!r})"


class AnswerError(ConvsyncError):
    """Why a batch of results does not answer a turn's calls exactly.

    `reason` is `not_a_result`, `unknown` (with `call_id`) or `unanswered` (with `call_ids`).
    """

    def __init__(
        self, reason: str, message: str, call_id: str | None = None, call_ids: tuple[str, ...] = ()
    ) -> None:
        super().__init__(reason, message)
        self.call_id = call_id
        self.call_ids = call_ids

    @classmethod
    def not_a_result(cls) -> AnswerError:
        return cls("not_a_result", "the answer holds something other than tool results")

    @classmethod
    def unknown(cls, call_id: str) -> AnswerError:
        return cls("unknown", f"result {call_id!r} answers no pending call", call_id=call_id)

    @classmethod
    def unanswered(cls, call_ids: list[str]) -> AnswerError:
        return cls(
            "unanswered",
            f"calls left without a result: {', '.join(call_ids)}",
            call_ids=tuple(call_ids),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AnswerError):
            return NotImplemented
        return (self.reason, self.call_id, self.call_ids) == (
            other.reason,
            other.call_id,
            other.call_ids,
        )

    def __hash__(self) -> int:
        return hash((self.reason, self.call_id, self.call_ids))


class SnapshotError(ConvsyncError):
    """A snapshot that cannot be read or built (`length_mismatch`, `version`, `malformed`)."""
