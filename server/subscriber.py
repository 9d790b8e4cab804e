"""The sending side of one hub connection: a bounded queue of frames and one writer task.

A frame goes straight to the socket while the socket keeps up (as websockets' `broadcast`
does, without a task switch per frame; framed once for all the connections it goes to, when
no extension makes the bytes differ per connection); otherwise it queues behind one writer
task that waits for the peer to read. A subscriber whose queue of live frames passes
`send_queue` bytes is closed with code 4000 (`lagging`) and catches up when it reconnects;
catch-up frames never count toward that limit (they are bounded by the log). Draft deltas
(SPEC 7) never count either: while one waits in the queue, later deltas of the same draft part
merge into it, so a slow peer holds at most one pending delta per draft part, bounded by the
draft's text.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterator

from websockets.asyncio.server import ServerConnection, broadcast
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from sync.errors import CODES, close_code_of
from sync.frames import Binary
from sync.protocol import DraftUpdate, Error, encode_message

from .metrics import Metrics

__all__ = ["CLOSE_DEADLINE", "DIRECT_WRITE", "LAGGING", "Subscriber", "cut_if_open"]

log = logging.getLogger("convsync.hub")

LAGGING = CODES["lagging"].close
"""Close code for a subscriber sent to resync: reconnect and catch up from your revision."""

DIRECT_WRITE = 256 * 1024
"""Unsent bytes on a socket below which a frame is written at once; above, frames queue (and
count towards `send_queue` bytes) behind a writer that waits for the peer to read."""

CLOSE_DEADLINE = 10.0
"""Seconds a socket being closed gets to send what is queued and finish the closing handshake;
then it is cut. A peer that stopped reading would otherwise hold it open for good: its writer
waits on a full socket, and so does the close (the hub's, websockets' own)."""

FRAMED_ONCE = 64 * 1024
"""Frames up to this size are framed once for all the connections they go to (the last one
framed is kept); a larger one is framed per connection, so no large copy outlives its send."""


def wire_bytes(frame: bytes) -> bytes:
    """`frame` as one unfragmented frame from a server (unmasked, no extension), text unless
    it is `Binary` (a MessagePack state): the bytes are the same for every connection, so a
    broadcast needs them built once."""
    opcode = Opcode.BINARY if type(frame) is Binary else Opcode.TEXT
    return Frame(opcode, frame).serialize(mask=False, extensions=[])


_framed: tuple[bytes, bytes] = (b"", wire_bytes(b""))  # the last frame framed, and its bytes


def _wire(frame: bytes) -> bytes:
    global _framed
    last, wire = _framed
    if frame is last:
        return wire
    wire = wire_bytes(frame)
    if len(frame) <= FRAMED_ONCE:
        _framed = (frame, wire)
    return wire


class _HeldDelta:
    """A draft delta waiting in the queue; later deltas of its draft part merge into it."""

    __slots__ = ("chunks", "end", "key", "message")

    def __init__(self, key: tuple[str, str], message: DraftUpdate) -> None:
        self.key = key
        self.message = message
        self.chunks = [message.text]
        self.end = message.offset + len(message.text)  # where the next delta must start

    def frame(self) -> bytes:
        if len(self.chunks) == 1:
            return encode_message(self.message)
        text = "".join(self.chunks)
        message = self.message
        return encode_message(
            DraftUpdate(message.id, "append", message.part, message.offset, text, message.name)
        )


class _Frames:
    """Frames built as the writer reads them (a `drafts` snapshot): it stays at the head of
    the queue until its last frame went, so what was sent after it waits behind it."""

    __slots__ = ("frames",)

    def __init__(self, frames: Iterator[bytes]) -> None:
        self.frames = frames


class Subscriber:
    """The sending side of one connection: a bounded queue of frames and one writer task."""

    def __init__(self, ws: ServerConnection, limit: int, metrics: Metrics) -> None:
        self._ws = ws
        # Frames waiting for the writer, each with the bytes it counts against the limit: a
        # catch-up counts none (it is bounded by the log, and a large one must not look like
        # lagging), live frames count their size.
        self._queue: collections.deque[tuple[bytes | _HeldDelta | _Frames, int]] = (
            collections.deque()
        )
        self._held: dict[tuple[str, str], _HeldDelta] = {}  # draft deltas in `_queue`
        self._queued = 0  # live bytes in `_queue`
        self._limit = limit
        self._metrics = metrics
        self._wake = asyncio.Event()
        self._closing: tuple[int, str] | None = None
        self._sending = False
        self._closer: asyncio.Task[None] | None = None
        # Without an extension (permessage-deflate) a frame's bytes do not depend on the
        # connection: they are written to the transport as built once (`_wire`).
        self._plain = not ws.protocol.extensions
        self._relay = getattr(ws, "relay", None)
        self.client: str | None = None
        self.shared_socket: int | None = getattr(ws, "shared_socket", None)  # `server.mux`

    @property
    def closing(self) -> bool:
        return self._closing is not None

    def send(self, frame: bytes, catch_up: bool = False) -> None:
        """Send `frame` now if the socket keeps up, else queue it for the writer task. A full
        queue sends this subscriber to resync (live frames only: a catch-up is bounded by the
        log and always queued)."""
        if self._closing is not None:
            return
        if not self._queue and not self._sending and self._keeps_up():
            # Nothing waits before it: write straight to the transport, as websockets'
            # broadcast does, without a task switch per frame and subscriber.
            self._write(frame)
            return
        counted = 0 if catch_up else len(frame)
        if counted and self._queued + counted > self._limit and self._queue:
            self._queue.clear()
            self._held.clear()
            self._queued = 0
            self._metrics.send_queue_drops += 1
            self.close(LAGGING, "lagging")
            return
        self._queue.append((frame, counted))
        self._queued += counted
        self._wake.set()

    def send_draft(self, key: tuple[str, str], message: DraftUpdate, frame: bytes) -> None:
        """Send draft delta `frame` (the encoded `message`) now if the socket keeps up, else
        queue it, merged into a delta for the same draft part (`key`) still waiting. Draft
        deltas never count toward the `lagging` limit."""
        if self._closing is not None:
            return
        if not self._queue and not self._sending and self._keeps_up():
            self._write(frame)
            return
        held = self._held.get(key)
        if held is not None and held.end == message.offset:
            held.chunks.append(message.text)
            held.end += len(message.text)
            return
        held = self._held[key] = _HeldDelta(key, message)
        self._queue.append((held, 0))
        self._wake.set()

    def send_frames(self, frames: Iterator[bytes]) -> None:
        """Send the frames of `frames` in order, as catch-up (never `lagging`), each built
        only once the one before it was written and drained: however many there are, the
        queue holds one at a time."""
        if self._closing is not None:
            return
        self._queue.append((_Frames(frames), 0))
        self._wake.set()

    def _write(self, frame: bytes) -> None:
        if self._plain:
            try:
                self._ws.transport.write(_wire(frame))
            except Exception:  # as in websockets' broadcast: one bad socket stops no other
                log.warning("a frame could not be written; dropping the connection", exc_info=True)
                self._ws.transport.abort()  # its replica reconnects and catches up
        elif self._relay is not None:
            self._relay(frame)  # a channel of a shared socket (`server.mux`)
        else:
            broadcast((self._ws,), frame, text=type(frame) is not Binary)

    def _keeps_up(self) -> bool:
        """Whether the socket is open and its unsent bytes are few (below `DIRECT_WRITE`)."""
        ws = self._ws
        return (
            ws.protocol.state is State.OPEN and ws.transport.get_write_buffer_size() < DIRECT_WRITE
        )

    def fail(self, code: str, detail: str) -> None:
        """Send `error {code, detail}` and close with the code's close code (`sync.errors.CODES`):
        bad input, a refusal, or the hub cannot serve this socket now."""
        if self._closing is None:
            self._queue.append((encode_message(Error(code, detail)), 0))
            self.close(close_code_of(code), code)

    def close(self, code: int, reason: str) -> None:
        if self._closing is None:
            self._closing = (code, reason)
            self._wake.set()
            asyncio.get_running_loop().call_later(CLOSE_DEADLINE, cut_if_open, self._ws)
            if self._sending:
                # The writer is stuck on a peer that stopped reading: close around it.
                self._closer = asyncio.get_running_loop().create_task(self._close_stuck())

    async def _close_stuck(self) -> None:
        assert self._closing is not None
        try:
            await asyncio.wait_for(self._ws.close(*self._closing), timeout=2)
        except (TimeoutError, ConnectionClosed):
            pass
        finally:
            self._ws.transport.abort()

    async def run(self) -> None:
        """Write queued frames until closed; then close the socket with the reason given."""
        ws, queue = self._ws, self._queue
        try:
            while True:
                while queue:
                    self._sending = True
                    frame, counted = queue.popleft()
                    self._queued -= counted
                    if isinstance(frame, _HeldDelta):
                        if self._held.get(frame.key) is frame:
                            del self._held[frame.key]
                        frame = frame.frame()
                    elif isinstance(frame, _Frames):
                        built = next(frame.frames, None)
                        if built is None:
                            self._sending = False
                            continue
                        queue.appendleft((frame, 0))  # its next frame, once this one went
                        frame = built
                    await ws.send(frame, text=type(frame) is not Binary)
                    self._sending = False
                if self._closing is not None:
                    break
                self._wake.clear()
                await self._wake.wait()
            await ws.close(*self._closing)
        except ConnectionClosed:
            pass


def cut_if_open(ws: ServerConnection) -> None:
    """Abort `ws`'s TCP connection unless it is gone already. (Not `is_closing()`: a transport
    closed with unsent bytes stays open until a peer that stopped reading reads them.)"""
    if not ws.connection_lost_waiter.done():
        log.info("cutting a socket that did not close in time")
        ws.transport.abort()
