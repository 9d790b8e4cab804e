"""The wire protocol `convsync.v1`: one JSON message per websocket text frame.

Replica -> hub: `Hello`, `PushBatch`, `Auth`. Hub -> replica: `Welcome`, `Records`, `State`,
`Entries`, `Ack`, `Reject`, `Error`, `AuthOk`. Each direction is one tagged union (tag field
`"type"`) with its decoder built once. The hub sends records it already holds as JSON bytes,
joined into frames without decoding them (`sync.frames`), so a record is encoded once however
many replicas receive it.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .changes import ChangeRecord, ConversationState
from .entries import Entry
from .errors import DecodeError

__all__ = [
    "SUBPROTOCOL",
    "Ack",
    "Auth",
    "AuthOk",
    "ClientMessage",
    "Entries",
    "Error",
    "Hello",
    "HubMessage",
    "PushBatch",
    "PushOrigin",
    "Records",
    "Reject",
    "RejectReason",
    "State",
    "Welcome",
    "decode_client_message",
    "decode_hub_message",
    "encode_message",
]

SUBPROTOCOL = "convsync.v1"

RejectReason = Literal["behind", "lineage", "invalid", "forbidden"]


# ---------------------------------------------------------------- replica -> hub


class Hello(msgspec.Struct, frozen=True, tag_field="type", tag="hello", omit_defaults=True):
    """Opens a session: who the replica is and which log state it holds."""

    client: str
    lineage: int
    revision: int
    token: str | None = None
    features: list[str] = []
    """Optional capabilities this replica uses (`drafts`, `presence`, `auth`, ...); each side
    uses only what both list."""


class PushBatch(msgspec.Struct, frozen=True, tag_field="type", tag="push"):
    """A batch of records made on log `lineage` at `revision`; `seq` rises per client."""

    seq: int
    lineage: int
    revision: int
    records: list[ChangeRecord]


# ---------------------------------------------------------------- access control (SPEC 6)


class Auth(msgspec.Struct, frozen=True, tag_field="type", tag="auth"):
    """A fresh token for this connection (same principal); its scopes apply at once."""

    token: str


class AuthOk(msgspec.Struct, frozen=True, tag_field="type", tag="auth_ok"):
    """The token of an `Auth` was taken; it expires in `expires_in` seconds."""

    expires_in: float


ClientMessage = Hello | PushBatch | Auth


# ---------------------------------------------------------------- hub -> replica


class Welcome(msgspec.Struct, frozen=True, tag_field="type", tag="welcome", omit_defaults=True):
    """The log's lineage and revision, and the last push seq the hub holds from this client."""

    lineage: int
    revision: int
    acked: int
    features: list[str] = []
    """Optional capabilities this hub offers (SPEC 5)."""
    scopes: list[str] | None = None
    """What this connection may do (`read`, `write`, `presence`); None: everything (no auth)."""
    expires_in: float | None = None
    """Seconds until the connection's token expires; None without auth."""


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


HubMessage = Welcome | Records | State | Entries | Ack | Reject | Error | AuthOk


# Frames built from bytes encoded already (records, state runs) are built in `sync.frames`.

_encoder = msgspec.json.Encoder()
_client_decoder = msgspec.json.Decoder(ClientMessage)
_hub_decoder = msgspec.json.Decoder(HubMessage)


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
    """A hub's message; raises `DecodeError` saying what is wrong."""
    try:
        return _hub_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from exc
    except RecursionError as exc:  # found by fuzzing: deep nesting in a free-form value
        raise DecodeError("nested too deeply") from exc
