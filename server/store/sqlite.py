"""`SqliteStore`: the embedded, durable `LogStore` (stdlib `sqlite3`, WAL mode).

How this works
--------------
- **Writes run on the event loop; the disk waits on the store's thread.** One connection
  writes. A caller on the loop checks its arguments and queues a job; at most one batch is
  under way, and the jobs queued meanwhile go together in the next (group commit). A batch of
  appends runs on the loop: `BEGIN IMMEDIATE`, a few statements per append, `COMMIT`, which
  at `synchronous=NORMAL` writes the WAL to the page cache and returns (tens of
  microseconds). The store's thread then `fdatasync`s the WAL and only then do the batch's
  appends resolve. The thread runs what waits on the disk: the fsync, the checkpoints
  (SQLite's automatic ones are off; the thread runs one every `CHECKPOINT_EVERY` commits),
  whole batches that hold a snapshot or a rewrite (large writes), and a batch that finds the
  write lock taken by a process outside the store (the loop never waits for a lock: its
  `busy_timeout` is 0, the thread's is the store's). Two syncs SQLite makes on its own stay on
  the loop: the WAL header's, in the first commit after a checkpoint (once every
  `CHECKPOINT_EVERY` commits), and the directory's when the WAL file is first made. Whoever
  runs statements holds the batch under way, so the loop and the thread never use the
  connection at once. Measured against a writer thread that ran every statement: less CPU
  handed between threads and no writer contending for the GIL (`docs/benchmarks.md`).
- **Each job under its own `SAVEPOINT`**, doing its own compare-and-append check against
  what the jobs before it left: one that fails (`LogMoved`, `SeqTaken`, a database error) is
  rolled back to its savepoint and fails alone.
- **Durable before resolved.** A write resolves only after its commit is in the WAL and the
  WAL is synced (`synchronous=FULL` or `EXTRA`: the connection runs at NORMAL plus that sync,
  which is what FULL does in WAL mode; NORMAL and OFF resolve after the commit, with what
  those levels promise). Once `await append(...)` returns, the records and the client mark
  survive `kill -9` of the process and a power cut. If the commit fails, every job of the
  batch fails with `StoreError` and nothing of it is kept. If the sync fails, the batch fails
  and so does every later write (the kernel may have dropped what it could not write): reopen
  the store. A read can see a commit before the thread has synced it, so it returns only
  once every commit it could have seen is synced: it never returns what a crash could still
  take back (after a failed sync it fails instead).
- **One event loop at a time.** The writes run on the loop that queued them; a write from
  another loop while some are under way is refused (`UsageError`, reason `wrong_loop`). Once
  they are done (or their loop has closed), another loop may write.
- **Reads** (`load`, `read`, `list_conversations`, `client_mark`) run in worker threads
  (`asyncio.to_thread`) on a small pool of read-only connections, each inside one read
  transaction, so a load sees one consistent state; WAL lets them run beside the writer.
- **Schema** (version 2 in `PRAGMA user_version`; a version 1 file is migrated when opened):
  `conversations(id, lineage, revision)`; `records(conversation_id, revision, data)`, a rowid
  table (rows land in append order, so a commit dirties few pages) with its key as index, so
  a conversation's tail is one index range scan; `snapshots(conversation_id, lineage,
  revision, data)`, one row per conversation, the latest; `clients(conversation_id, client,
  seq, ack_from, ack_revision)`. `load` reads the snapshot and only the records after it.
- **`:memory:` is refused**: every sqlite3 connection to it is a separate database, and the
  writer/reader split needs one shared file. `MemoryStore` is the in-memory store
  (`open_store(":memory:")` picks it).
- **One hub per file.** Nothing here can tell another process that a log moved, so two hubs on
  one file would each serve rooms the other made stale. The store's thread therefore first takes
  an exclusive `flock` on a sidecar file `<db>.lock` (before it opens the database) and holds it
  until it has closed its connection; it writes `pid@host` into it so that a second store can
  name the holder when it refuses with `StoreLocked`. The kernel drops the lock when the holder
  dies, `kill -9` included, so a restarted hub is never blocked by its crashed predecessor.
  (`flock` works across processes on one machine; it is not a guarantee on network file
  systems.)
- **Nothing touches the disk until the store is entered or first used**, and an open that
  fails leaves nothing it created: the database file (and its `-wal`/`-shm`) and the lock file
  are removed again when this store made them, before the lock is let go. A store that took
  the lock checks the lock file is still the one at the path (not one removed meanwhile).
  The errors name the path and the cause (a directory that does not exist, a file that is not
  a database, ...).
- **In parts.** This file holds the store (its `LogStore` methods) and the readers' pool. The
  file's opening, its holder lock and its schema are `sqlite_files`; the statements every
  write and read runs in its transaction are `sqlite_sql`; the group commit (`_Committer`, on
  the loop) and the store's thread (`_Writer`: commits, fsync, checkpoints, scrubs) are
  `sqlite_writer`.
- The store is bound to asyncio (futures and `call_soon_threadsafe`). Cancelling a caller that
  awaits an append does not withdraw the append: it may still commit; reload to find out. So
  may a write that failed because its sync failed.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self, TypeVar

from sync.errors import UsageError

from .base import (
    ClientMark,
    Closable,
    Lease,
    LeaseChange,
    Loaded,
    check_append_args,
    check_delete_args,
    check_list_args,
    check_read_args,
    check_records,
    check_rewrite_args,
    closed_error,
)
from .sqlite_files import SCHEMA_VERSION, connect, fresh, store_error
from .sqlite_sql import (
    _append_in,
    _delete_in,
    _drop_lease_in,
    _forget_in,
    _last_in,
    _leases_due_in,
    _list_in,
    _load_in,
    _mark_in,
    _put_lease_in,
    _read_in,
    _rewrite_in,
    _snapshot_in,
)
from .sqlite_writer import _Committer, _Job, _Writer

__all__ = ["SCHEMA_VERSION", "SqliteStore"]

T = TypeVar("T")

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")

_IDLE_READERS = 4


class _Readers:
    """A small pool of read-only connections, used from worker threads."""

    def __init__(self, writer: _Writer) -> None:
        self._writer = writer
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._closed = False

    def run(self, read: Callable[[sqlite3.Connection], T]) -> T:
        """Run `read` in one read transaction (called in a worker thread)."""
        self._writer.start()
        self._writer.ready.wait()
        if self._writer.error is not None:
            raise fresh(self._writer.error)
        conn = self._take()
        try:
            conn.execute("BEGIN")
            try:
                return read(conn)
            finally:
                conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise store_error("read failed", exc) from exc
        finally:
            self._give_back(conn)

    def _take(self) -> sqlite3.Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        w = self._writer
        try:
            return connect(w.path, w.synchronous, w.busy_timeout, reader=True)
        except sqlite3.Error as exc:
            raise store_error("cannot open a reader", exc) from exc

    def _give_back(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < _IDLE_READERS:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class SqliteStore(Closable):
    """The durable `LogStore` in one SQLite file (see the module docstring for how it works).

    Args:
        path: the database file, created when missing. `:memory:` is refused (use
            `MemoryStore`).
        synchronous: SQLite's `synchronous` setting. `FULL` (the default) makes every acked
            append survive a power cut; `NORMAL` keeps it across a process crash only.
        busy_timeout: seconds to wait for another process's write lock before failing.
        max_batch: most jobs one transaction carries.

    Raises:
        UsageError: a `:memory:` or empty path, an unknown `synchronous` value or a batch
            size below 1. Failures to open the file surface on `__aenter__` or the first use,
            as `StoreError`; `StoreLocked` (reason `locked`) when another open store holds
            the file (one hub per file: see "One hub per file" above).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = "./convsync.db",
        *,
        synchronous: str = "FULL",
        busy_timeout: float = 5.0,
        max_batch: int = 1000,
    ) -> None:
        path = os.fspath(path)
        if path in ("", ":memory:"):
            raise UsageError("bad_path", "SqliteStore needs a file; use MemoryStore for memory")
        synchronous = synchronous.upper()
        if synchronous not in _SYNCHRONOUS:
            raise UsageError("bad_synchronous", f"synchronous must be one of {_SYNCHRONOUS}")
        if max_batch < 1:
            raise UsageError("bad_batch", f"max_batch {max_batch} is below 1")
        self.path = path
        self._closed = False
        self._writer = _Writer(path, synchronous, busy_timeout, max_batch)
        self._readers = _Readers(self._writer)
        self._committer = _Committer(self._writer)
        # A store dropped without close still stops its thread and frees its connections.
        self._finalizer = weakref.finalize(
            self, _stop, self._writer, self._readers, self._committer
        )

    @property
    def commits(self) -> int:
        """How many write transactions the store has committed."""
        return self._writer.commits

    @property
    def appends(self) -> int:
        """How many `append` calls were carried by committed transactions (rejected or not)."""
        return self._writer.appends

    async def _write(
        self, run: Callable[[sqlite3.Cursor], T], *, is_append: bool, scrubs: bool = False
    ) -> T:
        writer = self._writer
        if not writer.ready.is_set():
            writer.start()
            await asyncio.to_thread(writer.ready.wait)
            self._check_open()  # closed while the file opened
        if writer.error is not None:
            raise fresh(writer.error)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._committer.add(_Job(run, future, is_append=is_append, scrubs=scrubs), loop)
        return await future

    async def _read(self, read: Callable[[sqlite3.Connection], T]) -> T:
        self._check_open()
        result = await asyncio.to_thread(self._readers.run, read)
        # A commit is in the file before the thread has synced it, so this read may have seen
        # one: it returns only once every commit it could have seen is on the disk, so that it
        # never returns what a crash could still take back.
        target = self._writer.begun
        await self._committer.synced_to(target)
        if self._writer.broken is not None:
            raise fresh(self._writer.broken)  # what it saw may never reach the disk
        if self._committer.synced < target:
            raise closed_error()  # the store stopped before what it saw was synced
        return result

    async def load(self, conversation_id: str) -> Loaded | None:
        """See `LogStore.load`."""
        return await self._read(functools.partial(_load_in, conversation_id=conversation_id))

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
        """See `LogStore.append`. Resolves once the transaction carrying it has committed."""
        self._check_open()
        frozen = check_append_args(lineage, revision, records, client, mark)
        run = functools.partial(
            _append_in,
            conversation_id=conversation_id,
            lineage=lineage,
            revision=revision,
            records=frozen,
            client=client,
            mark=mark,
            lease=lease,
        )
        return await self._write(run, is_append=True)

    async def read(
        self, conversation_id: str, lineage: int, from_revision: int, limit: int | None = None
    ) -> list[bytes] | None:
        """See `LogStore.read`."""
        check_read_args(from_revision, limit)
        return await self._read(
            functools.partial(
                _read_in,
                conversation_id=conversation_id,
                lineage=lineage,
                from_revision=from_revision,
                limit=limit,
            )
        )

    async def write_snapshot(
        self, conversation_id: str, lineage: int, revision: int, state: bytes
    ) -> None:
        """See `LogStore.write_snapshot`."""
        self._check_open()
        check_records([state])
        run = functools.partial(
            _snapshot_in,
            conversation_id=conversation_id,
            lineage=lineage,
            revision=revision,
            state=state,
        )
        await self._write(run, is_append=False)

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
        run = functools.partial(
            _rewrite_in,
            conversation_id=conversation_id,
            lineage=lineage,
            records=frozen,
            base=base,
        )
        await self._write(run, is_append=False)

    async def list_conversations(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> list[str]:
        """See `LogStore.list_conversations`."""
        self._check_open()
        check_list_args(limit)
        return await self._read(
            functools.partial(_list_in, prefix=prefix, after=after, limit=limit)
        )

    async def client_mark(self, conversation_id: str, client: str) -> ClientMark | None:
        """See `LogStore.client_mark`."""
        return await self._read(
            functools.partial(_mark_in, conversation_id=conversation_id, client=client)
        )

    async def delete(self, conversation_id: str, now: float) -> bool:
        """See `LogStore.delete`. Returns once the delete is durable and the file scrubbed
        (`_Writer._scrub`): the database rebuilt without the conversation and the WAL emptied
        (unless a reader held an old snapshot for `busy_timeout`: then at the next write)."""
        self._check_open()
        check_delete_args(now)
        run = functools.partial(_delete_in, conversation_id=conversation_id, now=int(now))
        return await self._write(run, is_append=False, scrubs=True)

    async def last_records(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> list[tuple[str, bytes | None]]:
        """See `LogStore.last_records`."""
        self._check_open()
        check_list_args(limit)
        return await self._read(
            functools.partial(_last_in, prefix=prefix, after=after, limit=limit)
        )

    async def forget_deleted(self, before: float) -> int:
        """See `LogStore.forget_deleted`."""
        self._check_open()
        return await self._write(functools.partial(_forget_in, before=before), is_append=False)

    async def put_lease(self, lease: Lease, *, replace: bool = True) -> None:
        """See `LogStore.put_lease`."""
        self._check_open()
        run = functools.partial(_put_lease_in, lease=lease, replace=replace)
        await self._write(run, is_append=False)

    async def drop_lease(self, conversation_id: str, turn: int) -> None:
        """See `LogStore.drop_lease`."""
        self._check_open()
        run = functools.partial(_drop_lease_in, conversation_id=conversation_id, turn=turn)
        await self._write(run, is_append=False)

    async def leases_due(self, now: int, limit: int = 100) -> list[Lease]:
        """See `LogStore.leases_due`."""
        self._check_open()
        check_list_args(limit)
        return await self._read(functools.partial(_leases_due_in, now=now, limit=limit))

    async def close(self) -> None:
        """Commit every write already queued on this event loop, then stop the store's thread
        and close all connections.

        Idempotent: a second call returns once the first one's work is done (the thread has
        ended and the file is let go). Writes queued before `close` still resolve normally.
        Cancelled, it still stops the thread and lets the file go.
        """
        if self._closed:
            if self._writer.started:  # another close is under way, or done
                await asyncio.to_thread(self._writer.thread.join)
            return
        self._closed = True
        self._finalizer.detach()
        try:
            await self._committer.drained()
        finally:
            _stop(self._writer, self._readers, self._committer)
            if self._writer.started:
                await asyncio.to_thread(self._writer.thread.join)

    async def __aenter__(self) -> Self:
        """Wait until the file is open and its schema ready.

        Raises:
            StoreLocked: another open store, here or in another process, holds the file.
            StoreError: the file cannot be opened or has an unknown schema.
        """
        self._check_open()
        self._writer.start()
        try:
            await asyncio.to_thread(self._writer.ready.wait)
        except BaseException:  # cancelled while the file opens: do not leave it open
            await asyncio.shield(self.close())
            raise
        if self._writer.error is not None:
            error = self._writer.error
            await self.close()
            raise error
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _stop(writer: _Writer, readers: _Readers, committer: _Committer) -> None:
    committer.stop()  # first: no turn is queued behind the stop request
    writer.shut()
    writer.turns.put(None)
    readers.close()
