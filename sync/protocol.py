"""The wire protocol `convsync.v1`: one JSON message per websocket text frame.

Replica -> hub: `Hello`, `PushBatch`, `Auth` (SPEC 6), and for live drafts and presence (SPEC 7)
`DraftOp`, `StatusUpdate`, and `Ping`. Hub -> replica: `Welcome`, `Records`, `State`, `Entries`,
`Ack`, `Reject`, `Error`, `AuthOk` (SPEC 6), and `Drafts`, `DraftUpdate`, `DraftState`,
`DraftEnd`, `PresenceSnapshot`, `PresenceDiff`, and `Pong`. Each direction is one tagged union
(tag field `"type"`) with its decoder built once. The hub sends records it already holds as
JSON bytes, joined into frames without decoding them (`sync.frames`), so a record is encoded
once however many replicas receive it.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from .budget import Budget
from .changes import ChangeRecord, ConversationState
from .entries import Author, Entry
from .errors import DecodeError
from .ids import Count
from .text import has_control

__all__ = [
    "MAX_DETAIL",
    "MAX_STATUS",
    "STATE_FORMATS",
    "SUBPROTOCOL",
    "Ack",
    "Auth",
    "AuthOk",
    "ClientMessage",
    "DraftEnd",
    "DraftEndStatus",
    "DraftHead",
    "DraftInfo",
    "DraftOp",
    "DraftState",
    "DraftUpdate",
    "Drafts",
    "Entries",
    "Error",
    "Hello",
    "HubMessage",
    "Ping",
    "Pong",
    "PresenceDiff",
    "PresenceEntry",
    "PresenceSnapshot",
    "PushBatch",
    "PushOrigin",
    "Records",
    "Reject",
    "RejectReason",
    "State",
    "StatusUpdate",
    "Welcome",
    "decode_client_message",
    "decode_hub_message",
    "encode_message",
    "is_conversation_id",
    "is_kind",
    "status_problem",
]

SUBPROTOCOL = "convsync.v1"

STATE_FORMATS = ("json", "msgpack")
"""The values of `Hello.state_format` a hub takes (issue 32)."""

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


MAX_STATUS = 64
"""The longest presence status, in characters."""
MAX_DETAIL = 1024
"""The largest presence status detail, in bytes of JSON."""


def status_problem(status: object, detail: object) -> str | None:
    """What is wrong with a presence `status` and its `detail`, or None when the hub takes
    them (the hub checks each `status` message with it, a replica each `set_status`)."""
    if status is not None and (not isinstance(status, str) or len(status) > MAX_STATUS):
        return f"status is a string of at most {MAX_STATUS} characters, or None"
    if status is not None and has_control(status):
        return "status holds a control character"
    if detail is not None:
        try:
            size = len(msgspec.json.encode(detail))
        except (TypeError, ValueError, OverflowError):
            return "status detail is not JSON"
        if size > MAX_DETAIL:
            return f"status detail over {MAX_DETAIL} bytes of JSON"
    return None


def is_kind(value: object) -> bool:
    """Whether `value` may be a hello's `kind` (shown in presence): 1 to 64 characters, no
    control characters (`sync.text.has_control`)."""
    return isinstance(value, str) and 0 < len(value) <= 64 and not has_control(value)


def is_conversation_id(value: object) -> bool:
    """Whether `value` is a conversation id: 1 to 128 characters of `[A-Za-z0-9._:-]` (it goes
    into a URL path as it is)."""
    return isinstance(value, str) and _CONVERSATION_ID.fullmatch(value) is not None


RejectReason = Literal[
    "behind",
    "lineage",
    "invalid",
    "forbidden",
    "queued",
    "superseded",
    "turn_ended",
    "decided",
    "asked",
    "forged",
    "bad_answer",
    "pinned",
]
"""Why a push was rejected; `sync.errors.REJECTS` says what a replica does with each."""


# ---------------------------------------------------------------- replica -> hub


class Hello(msgspec.Struct, frozen=True, tag_field="type", tag="hello", omit_defaults=True):
    """Opens a session: who the replica is and which log state it holds."""

    client: str
    lineage: Count
    revision: Count
    token: str | None = None
    features: list[str] = []
    """Optional capabilities this replica uses (`drafts`, `presence`, `auth`, ...); each side
    uses only what both list."""
    kind: str | None = None
    """What this replica is (`user`, `agent`, ...), shown in presence when there is no token."""
    watch: bool = False
    """Watching, not joining (SPEC 17): the hub counts it in metrics but shows it in no one's
    presence and in no summary row's `online`; it still reads everything."""
    state_format: str | None = None
    """How the hub sends the log's state (`state` and its `entries`, issue 32): one of
    `STATE_FORMATS`; None or `json`: JSON text frames, `msgpack`: MessagePack of the same
    messages in binary frames. A hub that knows no such format closes with `bad_message`."""


class PushBatch(msgspec.Struct, frozen=True, tag_field="type", tag="push"):
    """A batch of records made on log `lineage` at `revision`; `seq` rises per client."""

    seq: Count
    lineage: Count
    revision: Count
    records: list[ChangeRecord]


# ---------------------------------------------------------------- access control (SPEC 6)


class Auth(msgspec.Struct, frozen=True, tag_field="type", tag="auth"):
    """A fresh token for this connection (same principal); its scopes apply at once."""

    token: str


class AuthOk(msgspec.Struct, frozen=True, tag_field="type", tag="auth_ok"):
    """The token of an `Auth` was taken; it expires in `expires_in` seconds."""

    expires_in: float


# ---------------------------------------------------------------- hub -> replica


class Welcome(msgspec.Struct, frozen=True, tag_field="type", tag="welcome", omit_defaults=True):
    """The log's lineage and revision, and the last push seq the hub holds from this client."""

    lineage: int
    revision: int
    acked: int
    features: list[str] = []
    """Optional capabilities this hub offers (SPEC 5)."""
    scopes: list[str] | None = None
    """What this connection may do (`read`, `write`, `presence`, `approve`); None: everything
    (no auth)."""
    expires_in: float | None = None
    """Seconds until the connection's token expires; None without auth."""
    limits: dict[str, Budget] | None = None
    """The hub's budget for each kind of message this connection sends (`sync.budget`):
    a replica paces its pushes within `push`. None: the hub meters nothing."""
    state_format: str | None = None
    """`msgpack` when the hub sends this connection's states as MessagePack (its hello asked
    for it); None: JSON. Every other message is JSON either way."""
    sub: str | None = None
    """Who the hub knows this connection as (the token's `sub`, SPEC 10): the identity a
    replica names as a turn's owner or a stop's author. None without auth (`anonymous`)."""


class PushOrigin(msgspec.Struct, frozen=True):
    client: str
    seq: int


class Records(
    msgspec.Struct, frozen=True, tag_field="type", tag="records", rename={"from_": "from"}
):
    """Records `from_ + 1 ..` of the log, in order."""

    from_: int
    records: list[ChangeRecord]
    origin: PushOrigin | None = None


class State(msgspec.Struct, frozen=True, tag_field="type", tag="state"):
    """The log's whole state; when `more`, `Entries` messages with the rest follow."""

    lineage: int
    revision: int
    state: ConversationState
    more: bool = False


class Entries(msgspec.Struct, frozen=True, tag_field="type", tag="entries"):
    """More entries of the state just sent."""

    entries: list[Entry]
    more: bool


class Ack(msgspec.Struct, frozen=True, tag_field="type", tag="ack", rename={"from_": "from"}):
    """Push `seq` landed as records `from_ + 1 .. revision`."""

    seq: int
    from_: int
    revision: int


class Reject(msgspec.Struct, frozen=True, tag_field="type", tag="reject"):
    """Push `seq` was not appended, and why; the log is at `lineage`/`revision`."""

    seq: int
    reason: RejectReason
    detail: str
    lineage: int
    revision: int


class Error(msgspec.Struct, frozen=True, tag_field="type", tag="error"):
    """Sent before the hub closes the socket for bad input."""

    code: str
    detail: str


# ---------------------------------------------------------------- drafts and presence (SPEC 7)
# Live state the hub keeps in memory only: never part of the log. Used only by peers that both
# list the `drafts` / `presence` feature.

DraftOpKind = Literal["open", "append", "keep", "abort"]
DraftEndStatus = Literal[
    "committed", "aborted", "timeout", "stopped", "gap", "unknown", "refused", "stopping"
]
"""`stopping` (SPEC 10) goes to a draft's producer only: the turn was asked to stop, so its
appends are refused from now on, while every UI keeps showing the draft's text until the turn
ends (then `committed` when the text lands under the draft's id, or `stopped`)."""
"""How a draft ended, for everyone: `committed`, `aborted`, `timeout`, `stopped`. To the sender
of a refused op only (the draft, if any, goes on): `gap` (an append past the hub's length) and
`unknown` (no such open draft): it may `open` again and resend from the lengths the hub has;
`refused` (another client's draft, too many drafts, no right to write): it may not."""


class DraftOp(msgspec.Struct, frozen=True, tag_field="type", tag="draft", omit_defaults=True):
    """Replica -> hub: open, append to, keep alive or abort draft `id` (a `msg_` id the
    producer minted; its final entry takes it). `offset` counts code points already in
    `part`; `name` is a tool's name, given with a `call:<id>` part's first append."""

    id: str
    op: DraftOpKind
    role: str = "assistant"
    after: str | None = None
    author: Author | None = None
    epoch: Count = 0
    part: str = "text"
    offset: Count = 0
    text: str = ""
    name: str | None = None


class StatusUpdate(msgspec.Struct, frozen=True, tag_field="type", tag="status"):
    """Replica -> hub: this connection's presence status (<= 64 chars) and detail (<= 1 KiB
    of JSON)."""

    status: str | None
    detail: Any = None


class DraftHead(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a draft is, declared once: whose (`principal`, `client`), which `role`, open since
    (ms), written as `author`, to land `after` a message. `DraftInfo` adds its text, the hubs'
    bus (`server.mirror.BusDraft`) sends it as it is."""

    id: str
    role: str
    principal: str
    client: str
    since: int
    author: Author | None = None
    after: str | None = None


class DraftInfo(DraftHead, frozen=True, omit_defaults=True):
    """An open draft with its text so far, as `drafts` lists it."""

    parts: dict[str, str] = {}
    names: dict[str, str] = {}


class Drafts(msgspec.Struct, frozen=True, tag_field="type", tag="drafts", omit_defaults=True):
    """Hub -> replica after each catch-up: every open draft (chunked when large: `more`)."""

    drafts: list[DraftInfo]
    more: bool = False


class DraftUpdate(msgspec.Struct, frozen=True, tag_field="type", tag="draft", omit_defaults=True):
    """Hub -> replica: a draft opened (`op: "open"`, with `info`) or grew (`op: "append"`:
    `text` goes at code point `offset` of `part`)."""

    id: str
    op: Literal["open", "append"]
    part: str = "text"
    offset: int = 0
    text: str = ""
    name: str | None = None
    info: DraftInfo | None = None


class DraftState(msgspec.Struct, frozen=True, tag_field="type", tag="draft_state"):
    """Hub -> producer, the answer to `open`: the lengths (code points) the hub holds."""

    id: str
    lengths: dict[str, int]


class DraftEnd(msgspec.Struct, frozen=True, tag_field="type", tag="draft_end", omit_defaults=True):
    """Hub -> replica: draft `id` ended (or, for `gap`/`unknown`, an op on it was refused)."""

    id: str
    status: DraftEndStatus
    detail: str = ""


class PresenceEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One live session: its connection id (the hub's), who, and its status. `socket`: the
    shared socket (`/v1/mux`, SPEC 14) it is a channel of, if any; the tabs of one browser
    share one, so a view shows them as one person."""

    connection: int
    principal: str
    client: str
    since: int
    kind: str | None = None
    name: str | None = None
    status: str | None = None
    detail: Any = None
    socket: int | None = None


class PresenceSnapshot(msgspec.Struct, frozen=True, tag_field="type", tag="presence"):
    """Hub -> replica after each catch-up: every live connection."""

    connections: list[PresenceEntry]


class PresenceDiff(
    msgspec.Struct, frozen=True, tag_field="type", tag="presence_diff", omit_defaults=True
):
    """Hub -> replica: connections that joined, left (by id) or changed since the last one."""

    joined: list[PresenceEntry] = []
    left: list[int] = []
    changed: list[PresenceEntry] = []


# ---------------------------------------------------------------- keepalive


class Ping(msgspec.Struct, frozen=True, tag_field="type", tag="ping"):
    """Replica -> hub, after a welcome listing the `ping` feature: answered with `Pong`. For
    replicas that cannot send websocket pings (browsers), to notice a hub gone silent."""


class Pong(msgspec.Struct, frozen=True, tag_field="type", tag="pong"):
    """Hub -> replica: the answer to a `Ping`."""


ClientMessage = Hello | PushBatch | Auth | DraftOp | StatusUpdate | Ping

HubMessage = (
    Welcome
    | Records
    | State
    | Entries
    | Ack
    | Reject
    | Error
    | AuthOk
    | Drafts
    | DraftUpdate
    | DraftState
    | DraftEnd
    | PresenceSnapshot
    | PresenceDiff
    | Pong
)


# Frames built from bytes encoded already (records, state runs) are built in `sync.frames`.

_encoder = msgspec.json.Encoder()
_client_decoder = msgspec.json.Decoder(ClientMessage)
_hub_decoder = msgspec.json.Decoder(HubMessage)
_hub_msgpack_decoder = msgspec.msgpack.Decoder(HubMessage)


def encode_message(message: msgspec.Struct) -> bytes:
    """JSON bytes of any protocol message."""
    return _encoder.encode(message)


def decode_client_message(data: bytes | str) -> ClientMessage:
    """A replica's message; raises `DecodeError` saying what is wrong."""
    try:
        return _client_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from exc
    except RecursionError as exc:  # found by fuzzing: deep nesting in a free-form value
        raise DecodeError("nested too deeply") from exc


def decode_hub_message(data: bytes | str) -> HubMessage:
    """A hub's message, JSON or MessagePack (a binary frame: the state of a hello that asked
    for `msgpack`); raises `DecodeError` saying what is wrong.

    The two are told apart by the first byte: JSON from a hub starts with `{`, MessagePack of
    a message (a map) with a byte of 0x80 or above, which never starts JSON text."""
    try:
        if type(data) is bytes and data[:1] >= b"\x80":
            return _hub_msgpack_decoder.decode(data)
        return _hub_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from exc
    except RecursionError as exc:  # found by fuzzing: deep nesting in a free-form value
        raise DecodeError("nested too deeply") from exc
