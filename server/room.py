"""One conversation on the hub: its folded log, its subscribers, and the push pipeline.

How this works: a `Room` holds the conversation folded from the store's log and the encoded
tail of that log. Pushes and joins take the room's lock, so per conversation they run one at a
time, in log order. A push is checked against the log's position, folded into the conversation
with `apply_batch` (a record that fails undoes those before it; a strict-pairing breach runs the
batch's undo, no reload), stamped, appended durably with the client's new seq in one transaction
(a failed append undoes the batch and then reloads, since the write may have landed), and only
then acked to its pusher and broadcast, encoded once, to every other subscriber. Each subscriber
has a bounded queue and one writer task; one that falls behind is closed with code 4000
(`lagging`) and catches up when it reconnects.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence

import msgspec
from websockets.asyncio.server import ServerConnection, broadcast
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from sync import (
    Assistant,
    Author,
    ChangeRecord,
    Conversation,
    Lineage,
    Push,
    Reset,
    Splice,
    ToolResult,
    User,
    decode_record,
    decode_state,
    encode,
)
from sync.errors import ApplyError
from sync.ids import now_ms
from sync.protocol import (
    Ack,
    Error,
    Hello,
    PushBatch,
    PushOrigin,
    Reject,
    RejectReason,
    Welcome,
    encode_message,
    records_frame,
)
from sync.strict import strict_violation

from .config import HubConfig
from .metrics import Metrics
from .store import ClientMark, LogMoved, LogStore, SeqTaken

__all__ = ["LAGGING", "Room", "Subscriber"]

log = logging.getLogger("convsync.hub")

LAGGING = 4000
"""Close code for a subscriber sent to resync: reconnect and catch up from your revision."""

_FRAME_OVERHEAD = 256

DIRECT_WRITE = 256 * 1024
"""Unsent bytes on a socket below which a frame is written at once; above, frames queue (and
count towards `send_queue` bytes) behind a writer that waits for the peer to read."""


class Subscriber:
    """The sending side of one connection: a bounded queue of frames and one writer task."""

    def __init__(self, ws: ServerConnection, limit: int, metrics: Metrics) -> None:
        self._ws = ws
        # Frames waiting for the writer, each with the bytes it counts against the limit: a
        # catch-up counts none (it is bounded by the log, and a large one must not look like
        # lagging), live frames count their size.
        self._queue: collections.deque[tuple[bytes, int]] = collections.deque()
        self._queued = 0  # live bytes in `_queue`
        self._limit = limit
        self._metrics = metrics
        self._wake = asyncio.Event()
        self._closing: tuple[int, str] | None = None
        self._sending = False
        self._closer: asyncio.Task[None] | None = None
        self.client: str | None = None

    @property
    def closing(self) -> bool:
        return self._closing is not None

    def send(self, frame: bytes, *, catch_up: bool = False) -> None:
        """Send `frame` now if the socket keeps up, else queue it for the writer task. A full
        queue sends this subscriber to resync (live frames only: a catch-up is bounded by the
        log and always queued)."""
        if self._closing is not None:
            return
        if not self._queue and not self._sending and self._keeps_up():
            # Nothing waits before it: write straight to the transport, as websockets'
            # broadcast does, without a task switch per frame and subscriber.
            broadcast((self._ws,), frame, text=True)
            return
        counted = 0 if catch_up else len(frame)
        if counted and self._queued + counted > self._limit and self._queue:
            self._queue.clear()
            self._queued = 0
            self._metrics.send_queue_drops += 1
            self.close(LAGGING, "lagging")
            return
        self._queue.append((frame, counted))
        self._queued += counted
        self._wake.set()

    def _keeps_up(self) -> bool:
        """Whether the socket is open and its unsent bytes are few (below `DIRECT_WRITE`)."""
        ws = self._ws
        return (
            ws.protocol.state is State.OPEN and ws.transport.get_write_buffer_size() < DIRECT_WRITE
        )

    def fail(self, code: str, detail: str, close_code: int = 1008) -> None:
        """Send `error` and close: bad input, or the hub cannot serve this socket now."""
        if self._closing is None:
            self._queue.append((encode_message(Error(code, detail)), 0))
            self.close(close_code, code)

    def close(self, code: int, reason: str) -> None:
        if self._closing is None:
            self._closing = (code, reason)
            self._wake.set()
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
                    await ws.send(frame, text=True)
                    self._sending = False
                if self._closing is not None:
                    break
                self._wake.clear()
                await self._wake.wait()
            await ws.close(*self._closing)
        except ConnectionClosed:
            pass


class Room:
    """One conversation: the folded log, the subscribers, and the push pipeline."""

    def __init__(
        self, conversation_id: str, store: LogStore, config: HubConfig, metrics: Metrics
    ) -> None:
        self.id = conversation_id
        self._store = store
        self._config = config
        self._metrics = metrics
        self.lock = asyncio.Lock()
        self.subscribers: set[Subscriber] = set()
        self.users = 0  # connections holding this room (joined or about to)
        self.idle_since = time.monotonic()
        self.conversation = Conversation()
        self.lineage: int = Lineage.fresh()
        self.revision = 0
        self.exists = False
        self.clients: dict[str, ClientMark] = {}
        self._recent: list[bytes] = []
        self._recent_from = 0
        self._snapshot_revision = 0

    # ------------------------------------------------------------------ loading

    async def load(self) -> None:
        """Fold the store's log (its latest snapshot, then the records after it)."""
        loaded = await self._store.load(self.id)
        if loaded is None:
            self.conversation = Conversation()
            self.lineage, self.revision, self.exists = Lineage.fresh(), 0, False
            self.clients, self._recent, self._recent_from = {}, [], 0
            self._snapshot_revision = 0
            return
        conversation = decode_state(loaded.snapshot) if loaded.snapshot else Conversation()
        for data in loaded.records:
            conversation.apply(decode_record(data))
        conversation.continue_log(loaded.lineage, loaded.revision)
        self.conversation = conversation
        self.lineage, self.revision, self.exists = loaded.lineage, loaded.revision, True
        self.clients = dict(loaded.clients)
        keep = self._config.recent_records
        self._recent = list(loaded.records[-keep:]) if keep else []
        self._recent_from = loaded.revision - len(self._recent)
        self._snapshot_revision = loaded.snapshot_revision

    # ------------------------------------------------------------------ joining

    async def join(self, sub: Subscriber, hello: Hello) -> None:
        """Welcome `sub`, bring it up to date, then deliver every record appended after."""
        async with self.lock:
            mark = self.clients.get(hello.client)
            sub.client = hello.client
            sub.send(
                encode_message(Welcome(self.lineage, self.revision, mark.seq if mark else 0)),
                catch_up=True,
            )
            await self._catch_up(sub, hello.lineage, hello.revision)
            self.subscribers.add(sub)

    async def _catch_up(self, sub: Subscriber, lineage: int, revision: int) -> None:
        fresh = lineage == Lineage.EMPTY and revision == 0
        if (lineage == self.lineage or fresh) and revision <= self.revision:
            missing = self.revision - revision
            if missing == 0:
                return
            state_items = len(self.conversation) + len(self.conversation.asides())
            if not (fresh and missing >= state_items):
                records = await self._records_since(revision)
                budget = self._config.max_frame - _FRAME_OVERHEAD
                # A record too large for a frame (a rewrite's reset) goes as a chunked state.
                if records is not None and all(len(record) <= budget for record in records):
                    self._send_records(sub, revision, records, None, catch_up=True)
                    return
        self._send_state(sub)

    async def _records_since(self, revision: int) -> Sequence[bytes] | None:
        if revision >= self._recent_from:
            return self._recent[revision - self._recent_from :]
        return await self._store.read(self.id, self.lineage, revision)

    def _send_records(
        self,
        sub: Subscriber,
        from_: int,
        records: Sequence[bytes],
        origin: PushOrigin | None,
        *,
        catch_up: bool,
    ) -> None:
        for start, chunk in _chunks(records, self._config.max_frame - _FRAME_OVERHEAD):
            sub.send(records_frame(from_ + start, chunk, origin), catch_up=catch_up)

    def _send_state(self, sub: Subscriber) -> None:
        """The whole state: a `state` frame, then as many `entries` frames as the limit needs."""
        for frame in self._state_frames():
            sub.send(frame, catch_up=True)

    def _state_frames(self) -> list[bytes]:
        state = self.conversation.state()
        head = b'{"type":"state","lineage":%d,"revision":%d,"state":{"entries":' % (
            self.lineage,
            self.revision,
        )
        tail = b',"asides":%s,"halt":%s,"retired":%s}' % (
            encode(state.asides),
            encode(state.halt),
            encode(state.retired),
        )
        budget = self._config.max_frame - _FRAME_OVERHEAD
        runs = _encoded_runs(state.entries, budget - len(head) - len(tail), budget)
        frames = [
            head + runs[0] + tail + (b',"more":true}' if len(runs) > 1 else b',"more":false}')
        ]
        for k, run in enumerate(runs[1:], start=2):
            more = b"true" if k < len(runs) else b"false"
            frames.append(b'{"type":"entries","entries":%s,"more":%s}' % (run, more))
        return frames

    def leave(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    # ------------------------------------------------------------------ pushing

    async def push(self, sub: Subscriber, batch: PushBatch, closing: bool = False) -> None:
        """Append `batch` if it continues the log and fits; answer `sub`; broadcast."""
        started = time.monotonic()
        client = sub.client
        assert client is not None
        async with self.lock:
            if closing:
                sub.fail("shutting_down", "the hub is shutting down; reconnect later", 1001)
                return
            mark = self.clients.get(client)
            if mark is not None and batch.seq <= mark.seq:
                # A resend of a push that landed: answer with its ack, append nothing.
                sub.send(encode_message(Ack(batch.seq, mark.ack_from, mark.ack_revision)))
                return
            fresh_log = batch.lineage == Lineage.EMPTY and self.revision == 0
            if batch.lineage != self.lineage and not fresh_log:
                self._reject(sub, batch, "lineage", "the log was rewritten; a state follows")
                self._send_state(sub)
                return
            if batch.revision != self.revision:
                self._reject(sub, batch, "behind", f"the log is at revision {self.revision}")
                return
            conversation = self.conversation
            since = len(conversation)
            try:
                undo = conversation.apply_batch(batch.records)
            except ApplyError as error:
                self._reject(sub, batch, "invalid", str(error))
                return
            if self._config.strict_pairing:
                violation = _strict_check(conversation, batch.records, since)
                if violation is not None:
                    undo()
                    self._reject(sub, batch, "invalid", f"strict pairing: {violation}")
                    return
            await self._append(sub, batch, client, started, undo)

    async def _append(
        self,
        sub: Subscriber,
        batch: PushBatch,
        client: str,
        started: float,
        undo: Callable[[], None],
    ) -> None:
        now = now_ms()
        records = [
            record if record.at is not None else msgspec.structs.replace(record, at=now)
            for record in batch.records
        ]
        encoded = [encode(record) for record in records]
        from_ = self.revision
        mark = ClientMark(batch.seq, from_, from_ + len(encoded))
        try:
            await self._store.append(self.id, self.lineage, from_, encoded, client, mark)
        except SeqTaken as taken:  # another hub (or we, before a restart) appended it
            await self.load()
            sub.send(encode_message(Ack(batch.seq, taken.mark.ack_from, taken.mark.ack_revision)))
            return
        except LogMoved:  # another hub sharing the store appended first
            await self._reload_and_forward(from_)
            self._reject(sub, batch, "behind", "the log moved on another hub")
            return
        except Exception as exc:
            log.exception("append to %s failed", self.id)
            # The write may or may not have landed: trust only what the store says.
            undo()
            await self.load()
            sub.fail("unavailable", f"storage failed: {exc}; reconnect and resend", 1011)
            return
        self.exists = True
        self.revision = mark.ack_revision
        self.clients[client] = mark
        self._remember(encoded)
        sub.send(encode_message(Ack(batch.seq, from_, self.revision)))
        frame = records_frame(from_, encoded, PushOrigin(client, batch.seq))
        for other in self.subscribers:
            if other is not sub:
                other.send(frame)
        metrics = self._metrics
        metrics.records_appended += len(encoded)
        metrics.pushes_accepted += 1
        metrics.observe_append(time.monotonic() - started)
        if self.revision - self._snapshot_revision >= self._config.snapshot_every:
            await self._snapshot()

    def _reject(self, sub: Subscriber, batch: PushBatch, reason: RejectReason, detail: str) -> None:
        self._metrics.pushes_rejected[reason] += 1
        sub.send(encode_message(Reject(batch.seq, reason, detail, self.lineage, self.revision)))

    def _remember(self, encoded: list[bytes]) -> None:
        keep = self._config.recent_records
        if not keep:
            self._recent_from = self.revision
            return
        self._recent.extend(encoded)
        if len(self._recent) > 2 * keep:
            drop = len(self._recent) - keep
            del self._recent[:drop]
            self._recent_from += drop

    async def _snapshot(self) -> None:
        try:
            await self._store.write_snapshot(
                self.id, self.lineage, self.revision, encode(self.conversation)
            )
            self._snapshot_revision = self.revision
        except Exception:  # a snapshot only speeds up loading; the log is intact
            log.exception("snapshot of %s failed", self.id)

    async def _reload_and_forward(self, known: int) -> None:
        """Reload after another hub moved the log; bring every subscriber up to date."""
        lineage = self.lineage
        await self.load()
        records = (
            await self._store.read(self.id, lineage, known) if lineage == self.lineage else None
        )
        for sub in list(self.subscribers):
            if records is not None:
                self._send_records(sub, known, records, None, catch_up=True)
            else:
                self._send_state(sub)

    async def rewrite(self, conversation: Conversation) -> None:
        """Replace the log with one `reset` record holding `conversation`'s state, under a
        fresh lineage; every subscriber is sent the new state and rereads."""
        async with self.lock:
            record = ChangeRecord(Reset(conversation.state()), Author.rig(), now_ms())
            lineage = Lineage.fresh()
            await self._store.rewrite(self.id, lineage, [encode(record)])
            await self.load()
            for sub in list(self.subscribers):
                self._send_state(sub)

    # ------------------------------------------------------------------ reads

    def snapshot_json(self) -> bytes:
        """`{"lineage", "revision", "state"}` for `GET /v1/conversations/{id}`."""
        state = encode(self.conversation)
        return b'{"lineage":%d,"revision":%d,"state":%s}' % (self.lineage, self.revision, state)


def _strict_check(
    conversation: Conversation, records: Sequence[ChangeRecord], since: int
) -> str | None:
    """Strict pairing over what `records` changed (`since` is the length before them)."""
    touches = False
    for record in records:
        change = record.change
        if isinstance(change, Push):
            touches = touches or any(_pairs(entry.message) for entry in change.entries)
        elif isinstance(change, Splice | Reset):
            since = min(since, change.start if isinstance(change, Splice) else 0)
            touches = True
    if not touches:
        return None
    violation = strict_violation(conversation, since)
    return None if violation is None else violation.message


def _pairs(message: object) -> bool:
    """Whether a pushed message takes part in pairing (an assistant turn or a result)."""
    if isinstance(message, Assistant):
        return True
    return isinstance(message, User) and any(isinstance(p, ToolResult) for p in message.content)


def _chunks(items: Sequence[bytes], budget: int) -> list[tuple[int, list[bytes]]]:
    """Split `items` into runs whose sizes (plus a comma each) fit `budget`; each run keeps
    at least one item. Returns (offset, run) pairs."""
    runs: list[tuple[int, list[bytes]]] = []
    start = 0
    current: list[bytes] = []
    size = 0
    for k, item in enumerate(items):
        if current and size + len(item) + 1 > budget:
            runs.append((start, current))
            start, current, size = k, [], 0
        current.append(item)
        size += len(item) + 1
    if current:
        runs.append((start, current))
    return runs


def _encoded_runs(items: Sequence[object], first_budget: int, budget: int) -> list[bytes]:
    """`items` encoded as consecutive JSON arrays, the first at most `first_budget` bytes and
    the others at most `budget` (an item larger than that goes alone). Each array is encoded
    in one call, sized from a sample, so the cost is about one encoding of everything."""
    count_all = len(items)
    if not count_all:
        return [b"[]"]
    sample = min(64, count_all)
    per_item = max(1, len(encode(list(items[:sample]))) // sample)
    runs: list[bytes] = []
    start = 0
    limit = first_budget
    while start < count_all:
        count = max(1, min(count_all - start, int(limit * 0.9) // per_item))
        while True:
            data = encode(list(items[start : start + count]))
            if len(data) <= limit or count == 1:
                break
            count = max(1, count // 2)
        runs.append(data)
        start += count
        limit = budget
    return runs
