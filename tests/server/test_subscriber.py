"""The hub's per-subscriber sending: direct writes, the bounded queue, lagging."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.streams import StreamReader

from server.metrics import Metrics
from server.subscriber import FRAMED_ONCE, LAGGING, Subscriber
from sync.protocol import DraftUpdate, decode_hub_message, encode_message


class FakeSocket:
    """Stands in for a server connection whose peer reads only when told to."""

    def __init__(self, buffered: int) -> None:
        self.protocol = type("P", (), {"state": State.OPEN, "extensions": []})()
        self.transport = self
        self.buffered = buffered
        self.sent: list[bytes] = []
        self.closed: tuple[int, str] | None = None
        self.reading = asyncio.Event()

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def abort(self) -> None:
        self.closed = self.closed or (1006, "")

    async def send(self, frame: bytes, text: bool = True) -> None:
        await self.reading.wait()
        self.sent.append(frame)

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def write(self, data: Any) -> None:  # websockets' broadcast writes here
        raise AssertionError("a stuck socket must not be written to directly")


async def test_a_queued_catch_up_does_not_count_as_lagging() -> None:
    """A catch-up larger than the queue limit waits in the queue; live frames behind it are
    not taken for lagging (found in review: they were, and the replica looped resyncing)."""
    ws = FakeSocket(buffered=10 << 20)  # the peer is slow: nothing goes straight through
    metrics = Metrics()
    sub = Subscriber(ws, 1000, metrics)  # type: ignore[arg-type]
    writer = asyncio.create_task(sub.run())
    for _ in range(5):
        sub.send(b"c" * 800, catch_up=True)
    sub.send(b"live" * 10)
    assert not sub.closing and metrics.send_queue_drops == 0
    ws.reading.set()
    await asyncio.sleep(0.01)
    assert ws.sent[-1] == b"live" * 10 and len(ws.sent) == 6
    sub.close(1000, "")
    await asyncio.wait_for(writer, 1)


async def test_live_frames_over_the_limit_send_the_subscriber_to_resync() -> None:
    """Live frames past `send_queue` bytes drop the queue and close with `lagging`."""
    ws = FakeSocket(buffered=10 << 20)
    metrics = Metrics()
    sub = Subscriber(ws, 1000, metrics)  # type: ignore[arg-type]
    writer = asyncio.create_task(sub.run())
    await asyncio.sleep(0)
    sub.send(b"a" * 600)
    sub.send(b"b" * 600)
    assert sub.closing and metrics.send_queue_drops == 1
    ws.reading.set()
    await asyncio.wait_for(writer, 1)
    await asyncio.sleep(0.01)
    assert ws.closed is not None and ws.closed[0] == LAGGING


async def test_draft_deltas_for_a_slow_peer_merge_and_never_count_as_lagging() -> None:
    """Deltas of one draft part queued for a peer that does not read merge into one delta
    (in order, after the frames queued before them) and never send it to resync."""
    ws = FakeSocket(buffered=10 << 20)
    metrics = Metrics()
    sub = Subscriber(ws, 1000, metrics)  # type: ignore[arg-type]
    writer = asyncio.create_task(sub.run())
    await asyncio.sleep(0)
    sub.send(b"first")
    offset = 0
    for _ in range(400):  # 400 deltas of 10 characters: far over the 1000-byte limit
        message = DraftUpdate("msg_d", "append", "text", offset, "x" * 10)
        sub.send_draft(("msg_d", "text"), message, encode_message(message))
        offset += 10
    other = DraftUpdate("msg_d", "append", "reasoning", 0, "hm")
    sub.send_draft(("msg_d", "reasoning"), other, encode_message(other))
    assert not sub.closing and metrics.send_queue_drops == 0
    ws.reading.set()
    await asyncio.sleep(0.01)
    first, *deltas = ws.sent
    assert first == b"first"
    assert [decode_hub_message(frame) for frame in deltas] == [
        DraftUpdate("msg_d", "append", "text", 0, "x" * 4000),
        other,
    ]
    sub.close(1000, "")
    await asyncio.wait_for(writer, 1)


class OpenSocket(FakeSocket):
    """A connection that keeps up: every frame is written straight to its transport."""

    def __init__(self, extensions: list[Any] | None = None) -> None:
        super().__init__(buffered=0)
        self.protocol.extensions = extensions or []
        self.written: list[bytes] = []

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))


def parsed(wire: bytes) -> Frame:
    """The one frame `wire` holds, read as a client reads what a server sent."""
    reader = StreamReader()
    reader.feed_data(wire)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parser)
    except StopIteration as done:
        assert reader.at_eof(), "bytes left after the frame"
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("an incomplete frame")


def test_direct_writes_are_whole_text_frames_of_every_length_class() -> None:
    """A frame written straight to the transport is one unmasked text frame holding exactly
    the payload, for each header form (7-bit, 16-bit and 64-bit lengths) and for a frame
    that goes to several connections (framed once) or over `FRAMED_ONCE` (framed each time)."""
    sockets = [OpenSocket() for _ in range(3)]
    subs = [Subscriber(ws, 1 << 30, Metrics()) for ws in sockets]  # type: ignore[arg-type]
    sizes = [0, 125, 126, 65_535, 65_536, FRAMED_ONCE + 1, 200_000]
    payloads = [bytes([97 + k]) * size for k, size in enumerate(sizes)]
    for payload in payloads:
        for sub in subs:
            sub.send(payload)
        # Another payload of the same length is framed afresh, not taken for the last one.
        subs[0].send(payload.upper())
    for ws in sockets:
        expected = (
            payloads if ws is not sockets[0] else [x for p in payloads for x in (p, p.upper())]
        )
        frames = [parsed(wire) for wire in ws.written]
        assert [(f.opcode, f.fin, f.data) for f in frames] == [
            (Opcode.TEXT, True, p) for p in expected
        ]


def test_with_an_extension_frames_go_through_websockets() -> None:
    """With an extension (permessage-deflate) the bytes depend on the connection: websockets
    frames them, not the hub."""

    class Deflating(OpenSocket):
        def __init__(self) -> None:
            super().__init__(extensions=[object()])
            self.framed: list[bytes] = []
            self.protocol.send_text = self.framed.append
            self.send_in_progress = None

        def send_data(self) -> None:
            pass

    ws = Deflating()
    sub = Subscriber(ws, 1 << 30, Metrics())  # type: ignore[arg-type]
    sub.send(b'{"type":"ack"}')
    assert ws.framed == [b'{"type":"ack"}'] and ws.written == []


def test_a_socket_that_fails_a_write_is_dropped_and_the_others_still_get_the_frame(
    caplog: Any,
) -> None:
    """A transport whose write raises is aborted (its replica reconnects and catches up); the
    frame still goes to every other subscriber, as websockets' broadcast would have it."""

    class Broken(OpenSocket):
        def write(self, data: Any) -> None:
            raise OSError("the socket is gone")

    broken, healthy = Broken(), OpenSocket()
    subs = [Subscriber(ws, 1 << 30, Metrics()) for ws in (broken, healthy)]  # type: ignore[arg-type]
    for sub in subs:
        sub.send(b'{"type":"records"}')
    assert broken.closed == (1006, "")  # aborted
    assert [parsed(wire).data for wire in healthy.written] == [b'{"type":"records"}']
    assert "could not be written" in caplog.text


class OneAtATime(FakeSocket):
    """A peer that takes one frame each time it is told to (`take`)."""

    def __init__(self) -> None:
        super().__init__(buffered=0)
        self.permits = asyncio.Semaphore(0)
        self.blocked = asyncio.Event()  # a send waits for the peer

    async def send(self, frame: bytes, text: bool = True) -> None:
        self.blocked.set()
        await self.permits.acquire()
        self.blocked.clear()
        self.sent.append(frame)

    async def take(self) -> None:
        """Let one frame through, then wait until the writer waits again."""
        self.blocked.clear()
        self.permits.release()
        await asyncio.wait_for(self.blocked.wait(), 5)


async def test_a_snapshot_is_built_one_frame_at_a_time_as_the_peer_reads() -> None:
    """Frames given to `send_frames` are built only as the peer takes them (one held at a
    time, however many there are, so a joining UI's `drafts` snapshot costs the hub one
    frame: issue 27), in order; frames sent after them go after them."""
    ws = OneAtATime()
    built: list[int] = []

    def frames() -> Iterator[bytes]:
        for n in range(10):
            built.append(n)
            yield b"f%d" % n

    sub = Subscriber(ws, 1000, Metrics())  # type: ignore[arg-type]
    writer = asyncio.create_task(sub.run())
    sub.send_frames(frames())
    sub.send(b"after")  # queued behind the snapshot, not written past it
    await asyncio.wait_for(ws.blocked.wait(), 5)
    assert built == [0]
    await ws.take()
    await ws.take()
    assert built == [0, 1, 2] and ws.sent == [b"f0", b"f1"]
    for _ in range(8):
        await ws.take()
    assert ws.sent == [b"f%d" % n for n in range(10)]
    ws.permits.release()
    sub.close(1000, "")
    await asyncio.wait_for(writer, 5)
    assert ws.sent[-1] == b"after" and ws.closed == (1000, "")
