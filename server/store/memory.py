"""`MemoryStore`: the `LogStore` for tests and `--db :memory:`; nothing outlives the process.

It enforces compare-and-append exactly like the durable store (same checks, from `base`).
Each method runs to completion without awaiting, so on one event loop every call is atomic,
which is what a transaction gives the durable store.

A snapshot is kept compressed (zlib, level 1): it repeats what the records hold, and is read
only when a room loads, while the records stay as they are (a room shares them for catch-up).
In a hub holding 100 conversations of 1,000 messages, the snapshots were 45 MiB of 240
(issue 32). It is compressed in a worker thread (zlib lets go of the GIL), so the room that
wrote it goes on at once: on the event loop, compressing a growing conversation's snapshots
cost a writer 2.8 µs a record at 100,000 records (`bench/hub.py fanout`, one reader). And only
once it has stood for `SNAPSHOT_QUIET`: a busy conversation's snapshot is soon replaced. Until
then, and until the thread is done, the snapshot is held as written.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from .base import (
    ClientMark,
    Counted,
    Deleted,
    Lease,
    LeaseChange,
    Loaded,
    check_append_args,
    check_base,
    check_delete_args,
    check_list_args,
    check_mark,
    check_read_args,
    check_records,
    check_rewrite,
    check_rewrite_args,
    check_snapshot_revision,
    merge_lease,
    prefix_range,
    readable,
)

__all__ = ["MemoryStore"]

SNAPSHOT_LEVEL = 1
"""zlib's level for snapshots: the fastest."""
SNAPSHOT_QUIET = 0.05
"""Seconds a snapshot stands before it is compressed. A conversation being written replaces
its snapshot every `snapshot_every` records; compressing each one as it came cost the hub's
process a second core (the threads' zlib) for snapshots soon dropped: `bench/hub.py fanout`,
one reader, 5,000 records per run, was 0.87 of 19a832e's records/s (whose memory store kept
snapshots as written), and its hub ran 1.26x the instructions per record, a fifth of them in
zlib. Only a snapshot that stands is worth its compression. Short, as the snapshots waiting
add up: at 0.5 s the Hocuspocus memory row (100 conversations built 10 at a time) rose from
214 to 227 MiB; at 0.05 s, 216 (214-217)."""


class _Log:
    """One conversation: `records[i]` is revision `i + 1`."""

    __slots__ = ("clients", "lineage", "records", "snapshot")

    def __init__(self, lineage: int) -> None:
        self.lineage = lineage
        self.records: list[bytes] = []
        # lineage, revision, the state, and whether it is compressed yet (`zlib`)
        self.snapshot: tuple[int, int, bytes, bool] | None = None
        self.clients: dict[str, ClientMark] = {}

    @property
    def revision(self) -> int:
        return len(self.records)


class MemoryStore(Counted):
    """A `LogStore` held in dicts. Every append is its own commit."""

    def __init__(self) -> None:
        self._logs: dict[str, _Log] = {}
        self._deleted: dict[str, int] = {}  # tombstones (SPEC 15): id -> when (epoch seconds)
        self._leases: dict[tuple[str, int], Lease] = {}
        self._closed = False
        self._commits = 0
        self._appends = 0

    async def load(self, conversation_id: str) -> Loaded | None:
        """See `LogStore.load`."""
        self._check_open()
        self._check_deleted(conversation_id)
        log = self._logs.get(conversation_id)
        if log is None:
            return None
        snapshot: bytes | None = None
        snapshot_revision = 0
        if log.snapshot is not None and log.snapshot[0] == log.lineage:
            _, snapshot_revision, kept, packed = log.snapshot
            snapshot = zlib.decompress(kept) if packed else kept
        return Loaded(
            lineage=log.lineage,
            revision=log.revision,
            snapshot=snapshot,
            snapshot_revision=snapshot_revision,
            records=log.records[snapshot_revision:],
            clients=dict(log.clients),
        )

    async def append(
        self,
        conversation_id: str,
        lineage: int,
        revision: int,
        records: Sequence[bytes],
        client: str | None = None,
        mark: ClientMark | None = None,
        *,
        lease: LeaseChange | None = None,
    ) -> int:
        """See `LogStore.append`."""
        self._check_open()
        frozen = check_append_args(lineage, revision, records, client, mark)
        log = self._logs.get(conversation_id)
        self._appends += 1
        self._check_deleted(conversation_id)
        if client is not None and mark is not None:
            stored = log.clients.get(client) if log is not None else None
            check_mark(conversation_id, client, stored, mark)
        current = None if log is None else (log.lineage, log.revision)
        check_base(conversation_id, current, lineage, revision)
        if log is None:
            log = self._logs[conversation_id] = _Log(lineage)
        log.records.extend(frozen)
        if client is not None and mark is not None:
            log.clients[client] = mark
        if lease is not None:  # nothing awaits between the checks above and here: atomic
            self._change_lease(conversation_id, lease)
        self._commits += 1
        return log.revision

    async def read(
        self, conversation_id: str, lineage: int, from_revision: int, limit: int | None = None
    ) -> list[bytes] | None:
        """See `LogStore.read`."""
        self._check_open()
        check_read_args(from_revision, limit)
        log = self._logs.get(conversation_id)
        if log is None or not readable((log.lineage, log.revision), lineage, from_revision):
            return None
        stop = log.revision if limit is None else min(log.revision, from_revision + limit)
        return log.records[from_revision:stop]

    async def write_snapshot(
        self, conversation_id: str, lineage: int, revision: int, state: bytes
    ) -> None:
        """See `LogStore.write_snapshot`."""
        self._check_open()
        check_records([state])
        log = self._logs.get(conversation_id)
        if log is None or log.lineage != lineage:
            return
        check_snapshot_revision(revision, log.revision)
        if log.snapshot is not None and log.snapshot[0] == lineage and log.snapshot[1] >= revision:
            return
        written = log.snapshot = (lineage, revision, state, False)
        self._commits += 1
        _compress_later(log, written)

    async def rewrite(
        self,
        conversation_id: str,
        lineage: int,
        records: Sequence[bytes],
        *,
        base: tuple[int, int] | None = None,
    ) -> None:
        """See `LogStore.rewrite`."""
        self._check_open()
        frozen = check_rewrite_args(lineage, records)
        self._check_deleted(conversation_id)
        log = self._logs.get(conversation_id)
        current = None if log is None else (log.lineage, log.revision)
        check_rewrite(conversation_id, current, lineage, base)
        fresh = _Log(lineage)
        fresh.records.extend(frozen)
        if log is not None:
            fresh.clients = log.clients
        self._logs[conversation_id] = fresh
        self._commits += 1

    async def list_conversations(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> list[str]:
        """See `LogStore.list_conversations`."""
        self._check_open()
        check_list_args(limit)
        low, high = prefix_range(prefix)
        ids = sorted(
            cid
            for cid in self._logs
            if cid >= low and (high is None or cid < high) and (after is None or cid > after)
        )
        return ids if limit is None else ids[:limit]

    async def client_mark(self, conversation_id: str, client: str) -> ClientMark | None:
        """See `LogStore.client_mark`."""
        self._check_open()
        log = self._logs.get(conversation_id)
        return None if log is None else log.clients.get(client)

    # Deleting (SPEC 15): a tombstone per deleted id, checked before every write and load.

    def _check_deleted(self, conversation_id: str) -> None:
        deleted_at = self._deleted.get(conversation_id)
        if deleted_at is not None:
            raise Deleted(conversation_id, deleted_at)

    async def delete(self, conversation_id: str, now: float) -> bool:
        """See `LogStore.delete`."""
        self._check_open()
        check_delete_args(now)
        log = self._logs.pop(conversation_id, None)
        if log is not None:
            log.snapshot = None  # (its compression, if due, then finds nothing to do)
        if log is None:
            return False
        for key in [key for key in self._leases if key[0] == conversation_id]:
            del self._leases[key]  # its turns' leases go with it
        self._deleted[conversation_id] = int(now)
        self._commits += 1
        return True

    async def last_records(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> list[tuple[str, bytes | None]]:
        """See `LogStore.last_records`."""
        ids = await self.list_conversations(prefix, after=after, limit=limit)
        last = [self._logs[cid].records[-1:] for cid in ids]
        return [(cid, tail[0] if tail else None) for cid, tail in zip(ids, last, strict=True)]

    async def forget_deleted(self, before: float) -> int:
        """See `LogStore.forget_deleted`."""
        self._check_open()
        old = [cid for cid, at in self._deleted.items() if at < before]
        for cid in old:
            del self._deleted[cid]
        return len(old)

    async def put_lease(self, lease: Lease, *, replace: bool = True) -> None:
        """See `LogStore.put_lease`."""
        self._check_open()
        key = (lease.conversation_id, lease.turn)
        self._leases[key] = merge_lease(self._leases.get(key), lease, replace)

    def _change_lease(self, conversation_id: str, change: LeaseChange) -> None:
        if change.drop is not None:
            self._leases.pop((conversation_id, change.drop), None)
        if change.put is not None:
            key = (change.put.conversation_id, change.put.turn)
            self._leases[key] = merge_lease(self._leases.get(key), change.put, True)

    async def drop_lease(self, conversation_id: str, turn: int) -> None:
        """See `LogStore.drop_lease`."""
        self._check_open()
        self._leases.pop((conversation_id, turn), None)

    async def leases_due(self, now: int, limit: int = 100) -> list[Lease]:
        """See `LogStore.leases_due`."""
        self._check_open()
        check_list_args(limit)
        due = [lease for lease in self._leases.values() if lease.due(now)]
        due.sort(key=_soonest)
        return due[:limit]

    async def close(self) -> None:
        """Drop every log. Idempotent."""
        self._closed = True
        self._logs.clear()
        self._deleted.clear()
        self._leases.clear()

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _soonest(lease: Lease) -> int:
    return min(t for t in (lease.expires, lease.stop_expires) if t is not None)


def _compress_later(log: _Log, written: tuple[int, int, bytes, bool]) -> None:
    """Compress snapshot `written` in a worker thread once it has stood `SNAPSHOT_QUIET`
    seconds; put it in its place on the event loop once done, unless another snapshot (or
    none, after a rewrite) took that place meanwhile."""
    lineage, revision, state, _ = written
    loop = asyncio.get_running_loop()

    def begin() -> None:
        if log.snapshot is not written:
            return  # replaced already: compressing it would be work for nothing
        done = loop.run_in_executor(None, zlib.compress, state, SNAPSHOT_LEVEL)
        done.add_done_callback(keep)

    def keep(future: asyncio.Future[bytes]) -> None:  # on the event loop
        if future.cancelled() or future.exception() is not None:
            return  # (retrieved: the uncompressed snapshot stays, as good)
        if log.snapshot is written:
            log.snapshot = (lineage, revision, future.result(), True)

    loop.call_later(SNAPSHOT_QUIET, begin)
