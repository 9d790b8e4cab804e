"""`HubConnection`: the hub's websocket connection class, which bounds what a peer can make it
buffer.

How this works: two hooks on the websockets protocol and its asyncio transport. The first data
frame (the hello) is read with a small size limit of its own, raised to the socket's once that
frame is in; and while the transport's write buffer is above its high-water mark (a peer that
does not read what it is sent), reading pauses, so TCP pushes back on the peer.

Async API: none of its own: these are asyncio's synchronous transport callbacks
(`connection_made`, `pause_writing`, `resume_writing`), which websockets' asyncio server calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConcurrencyError, ConnectionClosed
from websockets.frames import Opcode
from websockets.protocol import State

from sync.protocol import Error, encode_message

__all__ = ["LET_GO", "LET_GO_AFTER", "HubConnection", "let_go"]

LET_GO = 16 * 1024
"""Data frames larger than this are let go of by a ping (`let_go`) when no other frame follows
within `LET_GO_AFTER` seconds."""
LET_GO_AFTER = 0.05
"""How long a socket may sit on a large frame before the hub pings to let go of it: a writer
sending batch after batch (one per ack) gets no ping per batch (a ping and its pong cost both
ends a wake-up each). Short, because the frames held meanwhile add up: at 1 s, a hub that had
100 writers load 1,000 messages each kept 35 MiB more RSS (213 -> 248 MiB, the Hocuspocus
memory row), at 0.2 s 6 MiB, at 0.05 s none."""

_DATA_OPCODES = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)


class HubConnection(ServerConnection):
    """A hub socket that stops reading a peer which does not read what it is sent.

    websockets answers every ping with a pong whatever the socket's backlog, and pings never
    reach `recv` (so no rate limit sees them): a peer that floods pings and reads nothing
    would grow the hub's write buffer without bound. While the transport's write buffer is
    above its high-water mark, reading pauses (TCP then pushes back on the peer); it resumes
    below the low-water mark, unless websockets' own flow control (too many frames not yet
    read by the hub) holds it paused.
    """

    first_frame: int | None = None
    """The first data frame's size limit (the hello's), set by `with_first_frame`."""

    @classmethod
    def with_first_frame(cls, limit: int) -> type[HubConnection]:
        """This class, whose sockets read a first data frame of at most `limit` bytes."""
        return type("_HubConnection", (cls,), {"first_frame": limit})

    def __init__(self, protocol: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(protocol, *args, **kwargs)
        if self.first_frame is not None:
            self._hold_first_frame(protocol, self.first_frame)

    @staticmethod
    def _hold_first_frame(protocol: Any, limit: int) -> None:
        """Read the first data frame with the hello's limit and raise it to the socket's own
        (`max_size`) once that frame is in: websockets refuses a frame by the length in its
        header, so a 64 MiB "hello" is never buffered to be refused after (issue 27: 8
        sockets x 60 MiB peaked at 486 MiB). The limit rises in the protocol, before the next
        frame is parsed, so a push sent right behind the hello is read with the full limit.
        Over it, the peer gets `error too_big`, then close 1009, as the session would say."""
        full = protocol.max_message_size
        protocol.max_message_size = limit
        receive = protocol.recv_frame
        fail = protocol.fail

        def recv_frame(frame: Any) -> None:
            receive(frame)
            if frame.opcode in _DATA_OPCODES and frame.fin:
                protocol.max_message_size = full
                protocol.recv_frame = receive  # once is enough
                protocol.fail = fail

        def fail_too_big(code: int, reason: str = "") -> None:
            if code == 1009 and protocol.state is State.OPEN:
                detail = f"first frame over {limit} bytes"
                protocol.send_text(encode_message(Error("too_big", detail)))
            fail(code, reason)

        protocol.recv_frame = recv_frame
        protocol.fail = fail_too_big

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._writes_paused = False
        resume = self.recv_messages.resume

        def resume_unless_writes_paused() -> None:
            if not self._writes_paused:
                resume()

        self.recv_messages.resume = resume_unless_writes_paused

    def pause_writing(self) -> None:
        super().pause_writing()
        self._writes_paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._writes_paused = False
        if not self.recv_messages.paused:
            self.transport.resume_reading()


async def let_go(ws: ServerConnection) -> None:
    """Ping `ws` so that websockets lets go of the data frame it read last.

    websockets' frame parser keeps the last frame it parsed (its bytes too) until the next
    one comes: an idle writer's last push, up to `max_size`, stayed alive per connection
    (issue 32: 100 idle writers held 47 MiB of push frames). The peer's pong is that next
    frame. A closed socket needs nothing; a ping already waiting does the same."""
    with contextlib.suppress(ConnectionClosed, ConcurrencyError):
        await ws.ping()
