"""Every error convsync raises, split by whose fault it is.

- `ProtocolError`: something broke the protocol. `RemoteProtocolError`: the peer (or a file) sent
  something the protocol does not allow (`DecodeError` is the one the codec raises); the
  connection is dropped and, on a replica, made again with backoff. `LocalProtocolError`: this
  side was about to break it (a bug or a misuse); nothing was sent.
- `Unavailable`: the hub could not serve this socket now; a replica retries.
- `Refused`: the hub refused this replica for good (a bad id, a bad or missing token, a message
  it will never accept). A replica never retries it; `connect()` raises it at once.
- `UsageError`: the calling code misused the API (a bad range, a record too large to send).
- `ApplyError`: a change record does not fit the conversation it is applied to.
- `PairingError`, `AnswerError`: tool calls and results do not pair (see `sync.pairing`).
- `SnapshotError`: a snapshot is malformed (see `sync.snapshot`).

Every error carries a machine-readable `reason` and a short lower-case message.
"""

from __future__ import annotations

from typing import Final, Literal, NamedTuple

__all__ = [
    "CODES",
    "REJECTS",
    "AnswerError",
    "ApplyError",
    "CodeInfo",
    "ConvsyncError",
    "DecodeError",
    "ErrorCode",
    "LocalProtocolError",
    "PairingError",
    "ProtocolError",
    "Refused",
    "RejectRule",
    "RemoteProtocolError",
    "Retry",
    "SnapshotError",
    "Unavailable",
    "UsageError",
    "close_code_of",
    "code_of_close",
    "reject_rule",
    "retry_of",
    "sole_exception",
]

ErrorCode = Literal[
    "malformed_json",
    "unknown_type",
    "bad_message",
    "no_hello",
    "unexpected",
    "too_big",
    "bad_client",
    "bad_conversation_id",
    "unauthorized",
    "forbidden",
    "rate_limited",
    "lagging",
    "unavailable",
    "shutting_down",
    "internal",
    "replaced",
    "deleted",
]
"""Every code the hub sends in an `error` message (and as the reason of the close after it)."""

Retry = Literal["never", "new_token", "backoff", "at_once"]
"""What a replica does after a close with that code: give up (`Refused`), retry only with a
new token, retry with capped exponential backoff, or reconnect at once."""


class CodeInfo(NamedTuple):
    close: int
    retry: Retry


CODES: Final[dict[ErrorCode, CodeInfo]] = {
    # The peer sent something the protocol does not allow: resending it cannot help.
    "malformed_json": CodeInfo(1008, "never"),
    "unknown_type": CodeInfo(1008, "never"),
    "bad_message": CodeInfo(1008, "never"),
    "no_hello": CodeInfo(1008, "never"),
    "unexpected": CodeInfo(1008, "never"),
    "too_big": CodeInfo(1009, "never"),
    "bad_client": CodeInfo(1008, "never"),
    "bad_conversation_id": CodeInfo(1008, "never"),
    # Access control (SPEC 6).
    "unauthorized": CodeInfo(4001, "new_token"),
    "forbidden": CodeInfo(4003, "never"),
    "replaced": CodeInfo(4009, "never"),
    # The conversation was deleted (SPEC 15): its tombstone answers every hello, for good.
    "deleted": CodeInfo(4410, "never"),
    # Transient: the hub could not serve this socket now.
    "rate_limited": CodeInfo(4008, "backoff"),
    "lagging": CodeInfo(4000, "at_once"),
    "unavailable": CodeInfo(1011, "backoff"),
    "shutting_down": CodeInfo(1001, "backoff"),
    "internal": CodeInfo(1011, "backoff"),
}
"""The one table of error codes: the websocket close code that follows each, and the retry
rule replicas (Python and JavaScript) follow."""

RejectRule = Literal["replay", "final", "queue"]
"""What a replica does with a rejected push: replay it on the log once the records it missed
arrive, report each record as a `Conflict` (resending cannot help), or replay it as queued
input (`sync.steer.queue_records`)."""

REJECTS: Final[dict[str, RejectRule]] = {
    "behind": "replay",
    "lineage": "replay",
    "invalid": "final",
    "forbidden": "final",  # a token without `write`
    # Steering (SPEC 10): user text mid-step waits as a queued aside; an assistant push made
    # on a base older than a user request that landed since, and a push or stop for a turn
    # that ended, can never land as sent.
    "queued": "queue",
    "superseded": "final",
    "turn_ended": "final",
    # Pins hold (SPEC 11): a compaction that would take a pinned entry out never lands.
    "pinned": "final",
    # Approvals (SPEC 12): a second decision (or a change reopening, flipping or removing a
    # decided approval), a second ask for the same (turn, key), an asked_by / decided_by that
    # is not the socket's, an answer its schema refuses: none can land as sent.
    "decided": "final",
    "asked": "final",
    "forged": "final",
    "bad_answer": "final",
}
"""The one table of reject reasons and what replicas (Python and JavaScript) do with each; a
reason not in it (a newer hub) is final."""


def reject_rule(reason: str) -> RejectRule:
    """What a replica does with a push rejected for `reason` (`REJECTS`; final when unknown)."""
    return REJECTS.get(reason, "final")


_BY_NAME: Final[dict[str, CodeInfo]] = {code: info for code, info in CODES.items()}

_BY_CLOSE: Final[dict[int, ErrorCode]] = {
    # websockets closes a socket whose frame passes its size limit with a bare 1009 (before
    # the hub could send `error too_big`): resending the same push can only fail again.
    1009: "too_big",
    4000: "lagging",
    4001: "unauthorized",
    4003: "forbidden",
    4008: "rate_limited",
    4009: "replaced",
    4410: "deleted",
}


def retry_of(code: str) -> Retry:
    """The retry rule for an error `code`; an unknown code (a newer hub) is retried with
    backoff, so an old replica never gives up on something it does not understand."""
    info = _BY_NAME.get(code)
    return "backoff" if info is None else info.retry


def close_code_of(code: str) -> int:
    """The websocket close code the hub uses after `error {code}` (1011 for a code not in the
    table, which would be a bug of the hub's)."""
    info = _BY_NAME.get(code)
    return 1011 if info is None else info.close


def code_of_close(close: int, reason: str) -> str | None:
    """The error code a close stands for: its reason when that is a known code (the hub
    closes with the code as the reason), else the one code our close codes name alone."""
    if reason in _BY_NAME:
        return reason
    return _BY_CLOSE.get(close)


class ConvsyncError(Exception):
    """Base of every convsync error.

    Attributes:
        reason: a machine-readable reason, one word in snake case.
        message: a short human-readable explanation.
        quotes_peer: True when `message` may quote what the peer sent (a decoder's words about
            a frame): it goes back to that peer, never into a log line.
    """

    quotes_peer = False

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class ProtocolError(ConvsyncError):
    """Something broke the protocol (see `RemoteProtocolError`, `LocalProtocolError`)."""


class RemoteProtocolError(ProtocolError):
    """The peer (or a file) sent something the protocol does not allow. `reason` is an
    `ErrorCode` when the hub reports it to a replica."""


class LocalProtocolError(ProtocolError):
    """This side was about to break the protocol; nothing was sent."""


class Refused(ConvsyncError):
    """The hub refused this replica for good; retrying cannot help.

    Attributes:
        code: the hub's error code (`bad_conversation_id`, `forbidden`, ...; see `CODES`), or
            `http_<status>` when the hub refused the websocket handshake itself.
        detail: the hub's explanation.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


class Unavailable(ConvsyncError):
    """The hub could not serve this socket now (`unavailable`, `shutting_down`, `lagging`,
    `rate_limited`, `internal`, ...): a replica reconnects as `retry_of(code)` says.

    Attributes:
        code: the hub's error code.
        detail: the hub's explanation.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


class DecodeError(RemoteProtocolError):
    """Bytes that do not decode to the expected wire type; the message says where (and may
    quote the bytes: msgspec names an unknown enum value)."""

    quotes_peer = True

    def __init__(self, message: str) -> None:
        super().__init__("malformed", message)


class UsageError(ConvsyncError, ValueError):
    """The calling code misused the API; nothing was changed."""


class ApplyError(ConvsyncError):
    """A change record does not fit the conversation; the conversation is unchanged."""


class PairingError(ConvsyncError):
    """Why a message list is not a canonical conversation, or what a repair mended.

    `reason` is one of `consecutive_assistant`, `unanswered_tool_call`, `orphan_tool_result`,
    `interrupted_tool_call` (a system message between a call and its result), or
    `reused_tool_call` (strict pairing: a call id an earlier call already used); `index` is the
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

    @classmethod
    def reused_tool_call(cls, index: int, call_id: str) -> PairingError:
        """Message `index` makes a call with id `call_id`, which an earlier call already used."""
        return cls(
            "reused_tool_call",
            index,
            call_id,
            f"tool call {call_id!r} of message {index} reuses the id of an earlier call; "
            "each call needs an id of its own",
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


def sole_exception(error: BaseException) -> BaseException:
    """The one exception a task group wrapped (groups of one unwrapped, however deep), else
    `error` itself: what callers report or tell apart by type."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
