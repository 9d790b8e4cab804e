"""What a hub connection may receive and when: pure, no sockets.

`HubSession.receive` takes one frame's bytes and returns the decoded `Hello`, `PushBatch`,
`Auth`, `DraftOp` or `StatusUpdate`, or raises `ProtocolError` with the code the hub sends in
its `error` message before closing that socket. A session expects exactly one `hello` first,
then pushes, token refreshes, draft ops and statuses.

The session also holds the connection's access state (SPEC 6): `authorize` verifies the token
of the hello (or of the handshake's `Authorization` header) and `refresh` the token of an
`auth` message; the first frame's size limit is checked in `receive`, and `throttle` meters
each message against its kind's budget (`sync.budget`: the shell waits as long as it says
before it reads on, and a socket held at a budget for `flood_after` seconds is cut);
`next_deadline` says when the shell must wake it (the hello deadline, then the
token's expiry plus its grace) and `expired` whether that moment has come. Time always comes
in as `now`, in seconds since the epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from sync.budget import BudgetKind
from sync.errors import DecodeError, ProtocolError, RemoteProtocolError
from sync.lineage import Lineage
from sync.protocol import (
    STATE_FORMATS,
    Auth,
    ClientMessage,
    DraftOp,
    Hello,
    Ping,
    PushBatch,
    StatusUpdate,
    decode_client_message,
    is_conversation_id,
    is_kind,
)
from sync.text import has_control

from .auth import (
    ANONYMOUS,
    AUDIENCE,
    EXPIRY_GRACE_S,
    Grant,
    KeyRing,
    verify,
    verify_refresh,
)
from .drafts import MAX_NAME, valid_part
from .limits import BUDGETS, Budget, TokenBucket
from .presence import status_problem

__all__ = [
    "CONVERSATION_PATH",
    "Access",
    "HubSession",
    "conversation_id_of",
    "is_conversation_id",
]

CONVERSATION_PATH = "/v1/conversations/"
_BUDGET_OF: dict[type, BudgetKind] = {PushBatch: "push", DraftOp: "draft", StatusUpdate: "status"}
_KNOWN_TYPES = frozenset({"hello", "push", "auth", "draft", "status"})


def conversation_id_of(path: str) -> str | None:
    """The conversation id in a `/v1/conversations/{id}` path (query ignored), else None."""
    path = path.split("?", 1)[0]
    if not path.startswith(CONVERSATION_PATH):
        return None
    return path[len(CONVERSATION_PATH) :]


@dataclass(frozen=True)
class Access:
    """How a hub with auth checks tokens: the keys it trusts now and its audience."""

    keys: KeyRing
    audience: str = AUDIENCE


@dataclass(frozen=True)
class Limits:
    """The per-connection limits a session enforces (SPEC 6); `HubConfig` holds the settings.

    Attributes:
        hello_timeout: seconds a socket has to send its hello.
        first_frame: the largest first frame (the hello), in bytes.
        rate: inbound pushes per second, on average (None: no budgets at all)...
        burst: ...with bursts of up to this many. The other kinds of message have budgets
            of their own (`BUDGETS`), so that drafts, presence and pings never spend what
            pushes need.
        flood_after: seconds a socket may be held at a budget without a break (the hub
            reading it no faster than the budget allows) before it is closed `rate_limited`.
        expiry_grace: seconds after a token's `exp` before the socket is closed (4001),
            unless an `auth` refreshed it meanwhile.
    """

    hello_timeout: float = math.inf
    first_frame: int | None = None
    rate: float | None = None
    burst: float = 1.0
    flood_after: float = 10.0
    expiry_grace: float = EXPIRY_GRACE_S

    def budgets(self) -> dict[BudgetKind, Budget]:
        """Each kind's budget: pushes from `rate` and `burst`, the others the defaults."""
        if self.rate is None:
            return {}
        return {**BUDGETS, "push": Budget(self.rate, self.burst)}


class HubSession:
    """The protocol and access state of one replica connection.

    Args:
        max_frame: the largest frame accepted, in bytes.
        access: how to check tokens; None for a hub without auth (every socket is
            `ANONYMOUS`).
        conversation_id: the conversation the socket opened (a refreshed token must allow it).
        bearer: the token of the handshake's `Authorization: Bearer` header, if any.
        limits: the hello deadline, first-frame size and rate limit.
        now: when the socket opened (the hello deadline counts from here).
    """

    def __init__(
        self,
        max_frame: int,
        *,
        access: Access | None = None,
        conversation_id: str = "",
        bearer: str | None = None,
        limits: Limits | None = None,
        now: float = 0.0,
    ) -> None:
        self.max_frame = max_frame
        self.hello: Hello | None = None
        self.access = access
        self.conversation_id = conversation_id
        self.grant: Grant = ANONYMOUS
        self._bearer = bearer
        self.limits = limits or Limits()
        self.hello_deadline = now + self.limits.hello_timeout
        self._buckets = {
            kind: TokenBucket(budget.rate, budget.burst, now)
            for kind, budget in self.limits.budgets().items()
        }
        self._held: dict[BudgetKind, tuple[float, int]] = {}  # since when, messages since

    def receive(self, data: bytes | str, now: float = 0.0) -> ClientMessage:
        """Decode and check one frame that arrived at `now`.

        Raises:
            ProtocolError: with code `too_big`, `malformed_json`,
                `unknown_type`, `bad_message`, `no_hello`, `unexpected` (a second hello) or
                `bad_client`.
        """
        limit = self.max_frame
        if self.hello is None and self.limits.first_frame is not None:
            limit = min(limit, self.limits.first_frame)
        if len(data) > limit:
            raise RemoteProtocolError("too_big", f"frame of {len(data)} bytes over {limit}")
        try:
            message = decode_client_message(data)
        except DecodeError as exc:
            raise _explain(data, exc) from exc
        if type(message) is PushBatch:  # first, without the `match`: nearly every message
            if self.hello is None:
                raise RemoteProtocolError("no_hello", "push before hello")
            if message.seq < 1:
                raise RemoteProtocolError("bad_message", "push seq starts at 1")
            if not message.records:
                raise RemoteProtocolError("bad_message", "a push carries at least one record")
            _check_position(message.lineage, message.revision)
            return message
        match message:
            case Hello(client, lineage, revision, kind=kind):
                if self.hello is not None:
                    raise RemoteProtocolError("unexpected", "hello was already received")
                if not 0 < len(client) <= 128 or has_control(client):
                    raise RemoteProtocolError(
                        "bad_client", "client id must be 1 to 128 printable chars"
                    )
                if kind is not None and not is_kind(kind):
                    # Shown to every presence subscriber: unchecked, a hello near the first
                    # frame's 64 KiB cap made presence snapshots past the frame limit.
                    raise RemoteProtocolError("bad_message", "kind must be 1 to 64 printable chars")
                _check_position(lineage, revision)
                _check_state_format(message.state_format)
                self.hello = message
            case Auth():
                if self.hello is None:
                    raise RemoteProtocolError("no_hello", "auth before hello")
                if self.access is None:
                    raise RemoteProtocolError("unexpected", "this hub does not check tokens")
            case DraftOp(op=op, part=part, offset=offset, epoch=epoch, role=role):
                if self.hello is None:
                    raise RemoteProtocolError("no_hello", "draft before hello")
                if offset < 0 or epoch < 0:
                    raise RemoteProtocolError(
                        "bad_message", "draft offset and epoch are not negative"
                    )
                if op == "append" and not valid_part(part):
                    raise RemoteProtocolError(
                        "bad_message", "a draft part is text, reasoning or call:<id>"
                    )
                if op == "open" and role != "assistant":
                    raise RemoteProtocolError("bad_message", "a draft's role is assistant")
                if message.name is not None and not 0 < len(message.name) <= MAX_NAME:
                    raise RemoteProtocolError(
                        "bad_message", f"a tool name is 1 to {MAX_NAME} characters"
                    )
            case Ping():
                if self.hello is None:
                    raise RemoteProtocolError("no_hello", "ping before hello")
            case StatusUpdate(status, detail):
                if self.hello is None:
                    raise RemoteProtocolError("no_hello", "status before hello")
                problem = status_problem(status, detail)
                if problem is not None:
                    raise RemoteProtocolError("bad_message", problem)
        return message

    # ------------------------------------------------------------------ access

    def authorize(self, hello: Hello, now: float) -> Grant:
        """The grant of this socket: `ANONYMOUS` without auth, else what the token of `hello`
        (or of the handshake's bearer header) allows. The core then checks the conversation
        and the `read` scope.

        Raises:
            AuthError: `unauthorized`, the token is missing or not valid.
        """
        if self.access is not None:
            token = hello.token if hello.token is not None else self._bearer
            self.grant = verify(token, self.access.keys, now=now, audience=self.access.audience)
        return self.grant

    def refresh(self, auth: Auth, now: float) -> Grant:
        """Take the token of an `auth` message: valid, same principal, this conversation.

        Raises:
            AuthError: `unauthorized`; the socket is closed (the old grant stays meanwhile).
        """
        assert self.access is not None, "receive refuses auth without access"
        self.grant = verify_refresh(
            self.grant,
            auth.token,
            self.access.keys,
            self.conversation_id,
            now=now,
            audience=self.access.audience,
        )
        return self.grant

    def throttle(self, message: ClientMessage, now: float) -> float:
        """Meter `message`, received at `now`, against its kind's budget: the seconds the
        shell must wait before it handles it and reads on (0.0: within budget). Waiting is the
        backpressure: a socket over its budget is read no faster than the budget allows.

        Raises:
            ProtocolError: `rate_limited` once the socket has been held at a budget for
                `flood_after` seconds without a break (a flood, not a writer that bursts).
        """
        kind = _BUDGET_OF.get(type(message), "control")
        bucket = self._buckets.get(kind)
        if bucket is None:
            return 0.0
        wait = bucket.spend(now)
        if wait == 0.0:
            self._held.pop(kind, None)
            return 0.0
        since, count = self._held.get(kind, (now, 0))
        if now - since >= self.limits.flood_after:
            seen = (count + 1) / (now - since) if now > since else math.inf
            raise RemoteProtocolError(
                "rate_limited",
                f"over the limit of {bucket.rate:g} {kind} messages/s for "
                f"{now - since:.0f} s ({seen:.0f}/s read while held); slow down",
            )
        self._held[kind] = (since, count + 1)
        return wait

    def next_deadline(self) -> float:
        """When the shell must call `expired` next (seconds since the epoch; `inf`: never):
        the hello deadline until the hello, then the token's expiry plus its grace."""
        if self.hello is None:
            return self.hello_deadline
        return self.grant.exp + self.limits.expiry_grace

    def expired(self, now: float) -> ProtocolError | None:
        """The error to close the socket with if its deadline has passed at `now`, else None."""
        if now < self.next_deadline():
            return None
        if self.hello is None:
            return RemoteProtocolError("no_hello", "no hello in time")
        return RemoteProtocolError("unauthorized", "token expired")


def _check_state_format(state_format: str | None) -> None:
    if state_format is not None and state_format not in STATE_FORMATS:
        shown = state_format[:32]
        raise RemoteProtocolError(
            "bad_message",
            f"unknown state_format {shown!r}: this hub sends {' or '.join(STATE_FORMATS)}",
        )


def _check_position(lineage: int, revision: int) -> None:
    if not Lineage.EMPTY <= lineage <= Lineage.DETACHED or revision < 0:
        raise RemoteProtocolError("bad_message", "lineage or revision out of range")


def _explain(data: bytes | str, exc: DecodeError) -> ProtocolError:
    """Tell malformed JSON, an unknown type and wrong fields apart."""
    try:
        raw = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):  # deep nesting: found by fuzzing
        return _quoting("malformed_json", exc.message)
    kind = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(kind, str) or kind not in _KNOWN_TYPES:
        shown = kind if isinstance(kind, str) else type(kind).__name__
        return _quoting("unknown_type", f"unknown message type {shown!r}")
    return _quoting("bad_message", exc.message)


def _quoting(reason: str, message: str) -> RemoteProtocolError:
    """A refusal whose message quotes the frame: the peer reads it, no log line does."""
    error = RemoteProtocolError(reason, message)
    error.quotes_peer = True
    return error
