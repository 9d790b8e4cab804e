"""What a `RoomCore` asks its shell to do: frames to write, and store calls to carry out.

The core's entry points return a list of these actions, in order; the shell (`server.room`)
carries out the frame actions with `deliver` and awaits a `StoreCall` that ends the list,
handing its outcome back to `RoomCore.resume`. Nothing here decides anything.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

import msgspec

from sync import Conversation, encode
from sync.errors import ErrorCode
from sync.protocol import DraftUpdate, Error, encode_message

from .drafts import Delta, Frame, Out
from .store.base import ClientMark, Lease, LeaseChange

__all__ = [
    "SNAPSHOT_SPAN",
    "Action",
    "AppendRecords",
    "Broadcast",
    "Close",
    "DropLease",
    "LoadLog",
    "PutLease",
    "Raise",
    "ReadMark",
    "ReadRecords",
    "RewriteLog",
    "Send",
    "SendDraft",
    "SendFrames",
    "StoreCall",
    "WriteSnapshot",
    "deliver",
    "error_frame",
    "live_actions",
]

C = TypeVar("C", bound=Hashable)
"""A connection, as the shell names it (the core only compares and hashes it)."""


class Send(msgspec.Struct, Generic[C], frozen=True):
    """Write `frame` to `to`. A catch-up frame never counts toward the subscriber's
    `lagging` limit (it is bounded by the log)."""

    to: C
    frame: bytes
    catch_up: bool = False


class Broadcast(msgspec.Struct, Generic[C], frozen=True):
    """Write the same `frame` to every connection of `to`."""

    to: list[C]
    frame: bytes


class SendFrames(msgspec.Struct, Generic[C], frozen=True):
    """Write the frames of `frames` to `to`, in order, as catch-up (never `lagging`): built
    one at a time as they are read, so a shell that reads the next only once the last was
    sent holds one at a time (the `drafts` snapshot, issue 27)."""

    to: C
    frames: Iterator[bytes]


class Close(msgspec.Struct, Generic[C], frozen=True):
    """Send `error {code, detail}` to `to`, then close it with the code's close code."""

    to: C
    code: ErrorCode
    detail: str


class SendDraft(msgspec.Struct, Generic[C], frozen=True):
    """Write `frame` (the encoded `message`: one draft part grown) to every connection of
    `to`. A shell may merge it into a delta for the same `key` still queued for a slow peer;
    draft deltas never count toward `lagging` (SPEC 7)."""

    to: list[C]
    key: tuple[str, str]
    message: DraftUpdate
    frame: bytes


class ReadRecords(msgspec.Struct, frozen=True):
    """Read the log's records after revision `from_`, at `lineage` (None: gone)."""

    lineage: int
    from_: int


class ReadMark(msgspec.Struct, frozen=True):
    """Read `client`'s last accepted push from the store (`LogStore.client_mark`)."""

    client: str


class AppendRecords(msgspec.Struct, frozen=True):
    """Compare-and-append `records` at `lineage`/`from_`, with `client`'s new `mark` (None for
    records the hub makes on its own: a turn it finishes) and, when they open, park, unpark,
    stop or end a turn, the `lease` writes that follow, all in one transaction (SPEC 10)."""

    lineage: int
    from_: int
    records: list[bytes]
    client: str | None
    mark: ClientMark | None
    lease: LeaseChange | None = None


class PutLease(msgspec.Struct, frozen=True):
    """Keep `lease` for its turn in the store (`LogStore.put_lease`); its outcome is ignored
    (a lease is a hint: a failed write is retried by the next renewal)."""

    lease: Lease
    replace: bool = True


class DropLease(msgspec.Struct, frozen=True):
    """Forget the lease of turn `turn` (it ended)."""

    turn: int


class LoadLog(msgspec.Struct, frozen=True):
    """Load the conversation from the store (its snapshot and the records after it)."""


SNAPSHOT_SPAN = 10
"""At most this many times `snapshot_every` records between two snapshots (`_snapshot_due`)."""


class WriteSnapshot(msgspec.Struct, frozen=True):
    """Store the state of `conversation` at `lineage`/`revision`, encoded by `data()` when
    the call is carried out: after the frames before it went, so that encoding the whole
    conversation never holds up the ack and the records of the push that asked for it. The
    room runs no other step between delivering those frames and calling `data()`, so it
    encodes the state as it was when the core asked. Its outcome is the size of that encoded
    state in bytes."""

    lineage: int
    revision: int
    conversation: Conversation

    def data(self) -> bytes:
        return encode(self.conversation)


class RewriteLog(msgspec.Struct, frozen=True):
    """Replace the log with `records` under the new `lineage`, only if it is still at `base`
    (lineage, revision): a lagging hub never erases what another hub acknowledged."""

    lineage: int
    records: list[bytes]
    base: tuple[int, int] | None


class Raise(msgspec.Struct, frozen=True):
    """Raise `error` to the caller of the operation, once the actions before it are done."""

    error: Exception


StoreCall = (
    ReadRecords
    | AppendRecords
    | LoadLog
    | WriteSnapshot
    | RewriteLog
    | ReadMark
    | PutLease
    | DropLease
)
Action = Send[C] | Broadcast[C] | Close[C] | SendDraft[C] | SendFrames[C] | Raise | StoreCall


def deliver(
    actions: list[Action[C]],
    send: Callable[[C, bytes, bool], None],
    close: Callable[[C, ErrorCode, str], None],
    send_draft: Callable[[C, SendDraft[C]], None] | None = None,
    broadcast: Callable[[list[C], bytes], None] | None = None,
    send_frames: Callable[[C, Iterator[bytes]], None] | None = None,
) -> StoreCall | None:
    """Carry out the frame actions of `actions` in order with `send(to, frame, catch_up)` and
    `close(to, code, detail)` (and `send_draft(to, action)` for draft deltas, if given; else
    they go through `send`; and `broadcast(to, frame)` for a frame to several, if given; else
    `send` to each; and `send_frames(to, frames)` for frames built as they are read, if
    given; else `send` each at once, as catch-up); return the store call that ends the
    list, if any (the caller awaits it and hands the outcome to `RoomCore.resume`). A
    `Raise` raises its error."""
    call: StoreCall | None = None
    # By exact type, most frequent first: not `isinstance` (each one that fails looks up
    # `__instancecheck__`: a store call at the end failed six) nor `match`, which costs more.
    action: Any  # mypy does not narrow through `kind`
    for action in actions:
        kind = type(action)
        if kind is Broadcast:
            if broadcast is not None:
                broadcast(action.to, action.frame)
                continue
            frame = action.frame
            for conn in action.to:
                send(conn, frame, False)
        elif kind is Send:
            send(action.to, action.frame, action.catch_up)
        elif kind is SendDraft:
            for conn in action.to:
                if send_draft is not None:
                    send_draft(conn, action)
                else:
                    send(conn, action.frame, False)
        elif kind is Close:
            close(action.to, action.code, action.detail)
        elif kind is SendFrames:
            if send_frames is not None:
                send_frames(action.to, action.frames)
            else:
                for frame in action.frames:
                    send(action.to, frame, True)
        elif kind is Raise:
            raise action.error
        else:
            call = action
    return call


def live_actions(out: list[Out[C]]) -> list[Action[C]]:
    """The actions that carry out what the drafts board sent (`Frame`s and `Delta`s)."""
    actions: list[Action[C]] = []
    for item in out:
        match item:
            case Frame(to, frame):
                actions.append(Send(to[0], frame) if len(to) == 1 else Broadcast(to, frame))
            case Delta(to, key, message, frame):
                actions.append(SendDraft(to, key, message, frame))
    return actions


def error_frame(code: ErrorCode, detail: str) -> bytes:
    """The `error` message sent before a close."""
    return encode_message(Error(code, detail))
