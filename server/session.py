"""What a hub connection may receive and when: pure, no sockets.

`HubSession.receive` takes one frame's bytes and returns the decoded `Hello`, `PushBatch`,
`DraftOp` or `StatusUpdate`, or raises `ProtocolError` with the code the hub sends in its
`error` message before closing that socket. A session expects exactly one `hello` first, then
pushes, draft ops and statuses.
"""

from __future__ import annotations

import re

import msgspec

from sync.errors import DecodeError, ProtocolError
from sync.lineage import Lineage
from sync.protocol import (
    ClientMessage,
    DraftOp,
    Hello,
    PushBatch,
    StatusUpdate,
    decode_client_message,
)

from .drafts import valid_part
from .presence import status_problem

__all__ = ["CONVERSATION_PATH", "HubSession", "conversation_id_of", "is_conversation_id"]

CONVERSATION_PATH = "/v1/conversations/"
_CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_CLIENT_ID = re.compile(r"[^\x00-\x1f]{1,128}")
_KNOWN_TYPES = frozenset({"hello", "push", "draft", "status"})


def is_conversation_id(value: str) -> bool:
    """1 to 128 characters of `[A-Za-z0-9._:-]`."""
    return _CONVERSATION_ID.fullmatch(value) is not None


def conversation_id_of(path: str) -> str | None:
    """The conversation id in a `/v1/conversations/{id}` path (query ignored), else None."""
    path = path.split("?", 1)[0]
    if not path.startswith(CONVERSATION_PATH):
        return None
    return path[len(CONVERSATION_PATH) :]


class HubSession:
    """The protocol state of one replica connection.

    Args:
        max_frame: the largest frame accepted, in bytes.
    """

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.hello: Hello | None = None

    def receive(self, data: bytes | str) -> ClientMessage:
        """Decode and check one frame.

        Raises:
            ProtocolError: with code `too_big`, `malformed_json`, `unknown_type`,
                `bad_message`, `no_hello`, `unexpected` (a second hello) or `bad_client`.
        """
        if len(data) > self.max_frame:
            raise ProtocolError("too_big", f"frame of {len(data)} bytes over {self.max_frame}")
        try:
            message = decode_client_message(data)
        except DecodeError as exc:
            raise _explain(data, exc) from exc
        match message:
            case Hello(client, lineage, revision):
                if self.hello is not None:
                    raise ProtocolError("unexpected", "hello was already received")
                if _CLIENT_ID.fullmatch(client) is None:
                    raise ProtocolError("bad_client", "client id must be 1 to 128 printable chars")
                _check_position(lineage, revision)
                self.hello = message
            case PushBatch(seq, lineage, revision, records):
                if self.hello is None:
                    raise ProtocolError("no_hello", "push before hello")
                if seq < 1:
                    raise ProtocolError("bad_message", "push seq starts at 1")
                if not records:
                    raise ProtocolError("bad_message", "a push carries at least one record")
                _check_position(lineage, revision)
            case DraftOp(op=op, part=part, offset=offset, epoch=epoch, role=role):
                if self.hello is None:
                    raise ProtocolError("no_hello", "draft before hello")
                if offset < 0 or epoch < 0:
                    raise ProtocolError("bad_message", "draft offset and epoch are not negative")
                if op == "append" and not valid_part(part):
                    raise ProtocolError(
                        "bad_message", "a draft part is text, reasoning or call:<id>"
                    )
                if op == "open" and role != "assistant":
                    raise ProtocolError("bad_message", "a draft's role is assistant")
            case StatusUpdate(status, detail):
                if self.hello is None:
                    raise ProtocolError("no_hello", "status before hello")
                problem = status_problem(status, detail)
                if problem is not None:
                    raise ProtocolError("bad_message", problem)
        return message


def _check_position(lineage: int, revision: int) -> None:
    if not Lineage.EMPTY <= lineage <= Lineage.DETACHED or revision < 0:
        raise ProtocolError("bad_message", "lineage or revision out of range")


def _explain(data: bytes | str, exc: DecodeError) -> ProtocolError:
    """Tell malformed JSON, an unknown type and wrong fields apart."""
    try:
        raw = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):  # deep nesting: found by fuzzing
        return ProtocolError("malformed_json", exc.message)
    kind = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(kind, str) or kind not in _KNOWN_TYPES:
        shown = kind if isinstance(kind, str) else type(kind).__name__
        return ProtocolError("unknown_type", f"unknown message type {shown!r}")
    return ProtocolError("bad_message", exc.message)
