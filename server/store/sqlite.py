"""`SqliteStore`: the embedded, durable `LogStore` (stdlib `sqlite3`, WAL mode).

How this works
--------------
- **One writer thread** owns the only connection that writes. A caller on the event loop checks
  its arguments, puts a job on a queue and awaits an asyncio future; nothing that touches the
  disk runs on the loop. The writer hands each outcome back with `loop.call_soon_threadsafe`.
- **Group commit.** The writer waits for a job, opens a transaction with `BEGIN IMMEDIATE` (it
  takes the file's write lock, so several processes sharing the file still serialize), then
  pulls every job queued by then (up to `max_batch`) into that one transaction. Jobs queued
  while it waits for the lock or for the previous fsync ride along, so under load one commit
  carries many appends. Each job runs under its own `SAVEPOINT` and does its own
  compare-and-append check against what the jobs before it left: one that fails (`LogMoved`,
  `SeqTaken`, a database error) is rolled back to its savepoint and fails alone.
- **Durable before resolved.** A job's future is resolved only after `COMMIT` returned. With
  `synchronous=FULL` in WAL mode the commit syncs the WAL, so once `await append(...)` returns,
  the records and the client mark survive `kill -9` of the process (and a power cut). If the
  commit itself fails, every job of the batch fails with `StoreError` and nothing of it is kept.
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
  one file would each serve rooms the other made stale. The writer thread therefore first takes
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
- The store is bound to asyncio (futures and `call_soon_threadsafe`). Cancelling a caller that
  awaits an append does not withdraw the append: it may still commit; reload to find out.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
import queue
import socket
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from sync.errors import UsageError

from .base import (
    ClientMark,
    Closable,
    Loaded,
    StoreError,
    StoreLocked,
    check_append_args,
    check_base,
    check_list_args,
    check_mark,
    check_new_lineage,
    check_read_args,
    check_records,
    check_rewrite,
    prefix_range,
)

__all__ = ["SqliteStore"]

T = TypeVar("T")

_Db = sqlite3.Connection | sqlite3.Cursor
"""Where a statement runs: a reader's connection, or the writer's one reused cursor."""

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY,
    lineage INTEGER NOT NULL,
    revision INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE records (
    conversation_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (conversation_id, revision)
);
CREATE TABLE snapshots (
    conversation_id TEXT PRIMARY KEY,
    lineage INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE clients (
    conversation_id TEXT NOT NULL,
    client TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ack_from INTEGER NOT NULL,
    ack_revision INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, client)
) WITHOUT ROWID;
"""

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")

_IDLE_READERS = 4


def _connect(
    path: str, synchronous: str, busy_timeout: float, *, reader: bool
) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; every one is begun explicitly.
    conn = sqlite3.connect(
        path, timeout=busy_timeout, isolation_level=None, check_same_thread=not reader
    )
    try:
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        if reader:
            conn.execute("PRAGMA query_only = ON")
        else:
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if str(mode).lower() != "wal":
                raise StoreError(f"cannot put {path!r} in WAL mode (got {mode})")
    except BaseException:
        conn.close()
        raise
    return conn


def lock_path(path: str) -> str:
    """The sidecar file whose `flock` says which process holds the database at `path`."""
    return path + ".lock"


def _hold(path: str) -> int:
    """Take the holder lock of the database at `path`; the open descriptor holds it.

    Raises:
        StoreLocked: another open store (in this process or another) holds it.
        StoreError: the lock file cannot be opened or locked.
    """
    sidecar = lock_path(path)
    for _ in range(10):
        try:
            fd = os.open(sidecar, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(
                f"cannot create the lock file {sidecar!r} next to the database: "
                f"{exc.strerror or exc}"
            ) from exc
        try:
            # flock, not fcntl's record locks: those are per process, so a second store in the
            # same process would get the lock too; flock is per open file description.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
            os.close(fd)
            raise StoreLocked(path, holder) from None
        except OSError as exc:
            os.close(fd)
            raise _store_error(f"cannot lock {sidecar!r}", exc) from exc
        if _same_file(fd, sidecar):
            break
        # A store whose open failed removed this lock file after we opened it: the lock we
        # hold is on a file nobody else will find. Take the one at the path now.
        os.close(fd)
    else:
        raise StoreError(f"cannot lock {sidecar!r}: it keeps being replaced")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}@{socket.gethostname()}\n".encode(), 0)
    except OSError:
        pass  # the lock holds without the name; a refused store then says "another process"
    return fd


def _same_file(fd: int, path: str) -> bool:
    try:
        named = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _path_problem(path: str) -> str | None:
    """Why the database at `path` cannot be opened, seen before touching anything, or None."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"cannot open the database {path!r}: it is a directory"
    if not os.path.exists(directory):
        return f"cannot create the database {path!r}: the directory {directory!r} does not exist"
    if not os.path.isdir(directory):
        return f"cannot create the database {path!r}: {directory!r} is not a directory"
    return None


def _open_error(path: str, exc: Exception) -> StoreError:
    """`exc`, raised opening the database at `path`, as an error naming the path and cause."""
    if isinstance(exc, StoreError):
        return exc
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in text:
        message = f"{path!r} is not a SQLite database ({text})"
    elif isinstance(exc, sqlite3.DatabaseError) and "malformed" in text:
        message = f"{path!r} is damaged ({text})"
    elif not os.path.exists(path):
        directory = os.path.dirname(os.path.abspath(path))
        hint = "" if os.access(directory, os.W_OK) else f": no permission to write in {directory!r}"
        message = f"cannot create the database {path!r} ({text}){hint}"
    else:
        hint = "" if os.access(path, os.R_OK | os.W_OK) else ": no permission to read and write it"
        message = f"cannot open the database {path!r} ({text}){hint}"
    error = StoreError(message)
    error.__cause__ = exc
    return error


def _remove_created(paths: Sequence[str]) -> None:
    """Remove the files of `paths` (made by an open that failed); missing ones are fine."""
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            pass  # nothing more to do about it: the open already failed with its own error


def _release(fd: int) -> None:
    """Give the holder lock back (after the database connection is closed)."""
    try:
        os.ftruncate(fd, 0)  # no stale holder name for the next reader of the file
    except OSError:
        pass
    os.close(fd)  # closing the only descriptor of the file description releases the flock


# Version 1 kept `records` clustered on its key (WITHOUT ROWID). With ~300-byte rows a leaf
# holds a dozen of them, so every append dirtied (and split) the tail leaf of its own
# conversation's run: about twice the WAL pages per commit of a rowid table, whose rows go to
# the table's last page and whose key index holds only small entries. Version 2 moves the
# rows over in the opening transaction.
_MIGRATE_FROM_1 = (
    """CREATE TABLE records_2 (
        conversation_id TEXT NOT NULL,
        revision INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (conversation_id, revision)
    )""",
    "INSERT INTO records_2 (conversation_id, revision, data)"
    " SELECT conversation_id, revision, data FROM records ORDER BY conversation_id, revision",
    "DROP TABLE records",
    "ALTER TABLE records_2 RENAME TO records",
)


def _create_schema(conn: sqlite3.Connection, path: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version == 0:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version == 1:
            for statement in _MIGRATE_FROM_1:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version != SCHEMA_VERSION:
            raise StoreError(f"{path!r} has schema version {version}, not {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


# Statements run inside a transaction, on whichever connection is given.


def _position_in(conn: _Db, conversation_id: str) -> tuple[int, int] | None:
    row = conn.execute(
        "SELECT lineage, revision FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def _mark_in(conn: _Db, conversation_id: str, client: str) -> ClientMark | None:
    row = conn.execute(
        "SELECT seq, ack_from, ack_revision FROM clients WHERE conversation_id = ? AND client = ?",
        (conversation_id, client),
    ).fetchone()
    return None if row is None else ClientMark(row[0], row[1], row[2])


def _insert_records(
    conn: _Db, conversation_id: str, after: int, records: tuple[bytes, ...]
) -> None:
    if len(records) == 1:
        conn.execute(
            "INSERT INTO records (conversation_id, revision, data) VALUES (?, ?, ?)",
            (conversation_id, after + 1, records[0]),
        )
        return
    conn.executemany(
        "INSERT INTO records (conversation_id, revision, data) VALUES (?, ?, ?)",
        ((conversation_id, after + i, data) for i, data in enumerate(records, 1)),
    )


def _append_in(
    conn: _Db,
    conversation_id: str,
    lineage: int,
    revision: int,
    records: tuple[bytes, ...],
    client: str | None,
    mark: ClientMark | None,
) -> int:
    """Compare-and-append in as few statements as the common case needs: the client's mark
    is written only if its seq is new, the position moves only if it is where the caller
    expects; the SELECTs that explain a refusal run only on that path. The caller's
    savepoint (or transaction) undoes a half-done append."""
    new_revision = revision + len(records)
    if client is not None and mark is not None:
        # Checked first: a resend is answered with its ack even when the log moved since.
        written = conn.execute(
            "INSERT INTO clients (conversation_id, client, seq, ack_from, ack_revision)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (conversation_id, client) DO UPDATE SET"
            " seq = excluded.seq, ack_from = excluded.ack_from,"
            " ack_revision = excluded.ack_revision WHERE excluded.seq > clients.seq",
            (conversation_id, client, mark.seq, mark.ack_from, mark.ack_revision),
        ).rowcount
        if not written:
            check_mark(conversation_id, client, _mark_in(conn, conversation_id, client), mark)
    moved = conn.execute(
        "UPDATE conversations SET revision = ? WHERE id = ? AND lineage = ? AND revision = ?",
        (new_revision, conversation_id, lineage, revision),
    ).rowcount
    if not moved:
        current = _position_in(conn, conversation_id)
        check_base(conversation_id, current, lineage, revision)  # raises unless a new log
        conn.execute(
            "INSERT INTO conversations (id, lineage, revision) VALUES (?, ?, ?)",
            (conversation_id, lineage, new_revision),
        )
    _insert_records(conn, conversation_id, revision, records)
    return new_revision


def _snapshot_in(
    conn: _Db, conversation_id: str, lineage: int, revision: int, state: bytes
) -> None:
    current = _position_in(conn, conversation_id)
    if current is None or current[0] != lineage:
        return
    if not 0 <= revision <= current[1]:
        raise UsageError("bad_revision", f"no revision {revision} in a log of {current[1]} records")
    row = conn.execute(
        "SELECT lineage, revision FROM snapshots WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    if row is not None and row[0] == lineage and row[1] >= revision:
        return
    conn.execute(
        "INSERT OR REPLACE INTO snapshots (conversation_id, lineage, revision, data)"
        " VALUES (?, ?, ?, ?)",
        (conversation_id, lineage, revision, state),
    )


def _rewrite_in(
    conn: _Db,
    conversation_id: str,
    lineage: int,
    records: tuple[bytes, ...],
    base: tuple[int, int] | None,
) -> None:
    check_rewrite(conversation_id, _position_in(conn, conversation_id), lineage, base)
    conn.execute("DELETE FROM records WHERE conversation_id = ?", (conversation_id,))
    conn.execute("DELETE FROM snapshots WHERE conversation_id = ?", (conversation_id,))
    conn.execute(
        "INSERT OR REPLACE INTO conversations (id, lineage, revision) VALUES (?, ?, ?)",
        (conversation_id, lineage, len(records)),
    )
    _insert_records(conn, conversation_id, 0, records)


def _load_in(conn: sqlite3.Connection, conversation_id: str) -> Loaded | None:
    current = _position_in(conn, conversation_id)
    if current is None:
        return None
    lineage, revision = current
    snapshot: bytes | None = None
    snapshot_revision = 0
    row = conn.execute(
        "SELECT revision, data FROM snapshots WHERE conversation_id = ? AND lineage = ?",
        (conversation_id, lineage),
    ).fetchone()
    if row is not None:
        snapshot_revision, snapshot = row
    records = [
        data
        for (data,) in conn.execute(
            "SELECT data FROM records WHERE conversation_id = ? AND revision > ? ORDER BY revision",
            (conversation_id, snapshot_revision),
        )
    ]
    if len(records) != revision - snapshot_revision:
        raise StoreError(
            f"{conversation_id!r} holds {len(records)} records after revision"
            f" {snapshot_revision}, expected {revision - snapshot_revision}"
        )
    clients = {
        client: ClientMark(seq, ack_from, ack_revision)
        for client, seq, ack_from, ack_revision in conn.execute(
            "SELECT client, seq, ack_from, ack_revision FROM clients WHERE conversation_id = ?",
            (conversation_id,),
        )
    }
    return Loaded(
        lineage=lineage,
        revision=revision,
        snapshot=snapshot,
        snapshot_revision=snapshot_revision,
        records=records,
        clients=clients,
    )


def _read_in(
    conn: sqlite3.Connection,
    conversation_id: str,
    lineage: int,
    from_revision: int,
    limit: int | None,
) -> list[bytes] | None:
    current = _position_in(conn, conversation_id)
    if current is None or current[0] != lineage or from_revision > current[1]:
        return None
    rows = conn.execute(
        "SELECT revision, data FROM records WHERE conversation_id = ? AND revision > ?"
        " ORDER BY revision LIMIT ?",
        (conversation_id, from_revision, -1 if limit is None else limit),
    ).fetchall()
    if from_revision < current[1] and limit != 0 and (not rows or rows[0][0] != from_revision + 1):
        return None  # the first record asked for is no longer held
    return [data for _, data in rows]


def _list_in(
    conn: sqlite3.Connection, prefix: str, after: str | None, limit: int | None
) -> list[str]:
    # A range over the primary key (BINARY collation: code point order), never LIKE.
    low, high = prefix_range(prefix)
    sql = "SELECT id FROM conversations WHERE id >= ?"
    args: list[object] = [low]
    if high is not None:
        sql += " AND id < ?"
        args.append(high)
    if after is not None:
        sql += " AND id > ?"
        args.append(after)
    sql += " ORDER BY id LIMIT ?"
    args.append(-1 if limit is None else limit)
    return [cid for (cid,) in conn.execute(sql, args)]


# The writer thread.

COMMIT_WINDOW = 0.0003
"""Seconds the writer waits for more appends before a commit, only when the last commit
carried several: concurrent writers then share one fsync instead of alternating in two
groups. A single writer never waits."""


class _Job:
    """One write: a function run in the writer's transaction, and where its outcome goes."""

    __slots__ = ("future", "is_append", "loop", "run")

    def __init__(
        self,
        run: Callable[[sqlite3.Cursor], Any],
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
        *,
        is_append: bool,
    ) -> None:
        self.run = run
        self.loop = loop
        self.future = future
        self.is_append = is_append

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        """Resolve the future on its loop; a loop that is gone has nobody waiting."""
        try:
            self.loop.call_soon_threadsafe(_resolve, self.future, result, error)
        except RuntimeError:
            pass


def _settle_all(batch: list[_Job], outcomes: list[tuple[Any, BaseException | None]]) -> None:
    """Resolve a batch's futures with one wake-up per event loop, not one per job."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, Any]]] = {}
    for job, (result, error) in zip(batch, outcomes, strict=True):
        by_loop.setdefault(job.loop, []).append((job.future, result, error))
    for loop, settled in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve_all, settled)
        except RuntimeError:  # a loop that is gone has nobody waiting
            pass


def _resolve_all(settled: list[tuple[asyncio.Future[Any], Any, Any]]) -> None:
    for future, result, error in settled:
        _resolve(future, result, error)


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _store_error(message: str, exc: BaseException) -> StoreError:
    error = StoreError(f"{message}: {exc}")
    error.__cause__ = exc
    return error


class _Writer:
    """The writer thread and its connection.

    It holds no reference to the store, so a store dropped without `close` can still be
    collected; the store's finalizer then stops this thread.
    """

    def __init__(self, path: str, synchronous: str, busy_timeout: float, max_batch: int) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.max_batch = max_batch
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.ready = threading.Event()
        self.error: StoreError | None = None
        self.commits = 0
        self.appends = 0
        self._last_batch = 1
        self.thread = threading.Thread(
            target=self._main, name="convsync-sqlite-writer", daemon=True
        )
        self._start_lock = threading.Lock()

    def start(self) -> None:
        """Start the thread (it opens the file) unless it was started already."""
        with self._start_lock:
            if self.thread.ident is None:
                self.thread.start()

    @property
    def started(self) -> bool:
        return self.thread.ident is not None

    def stop(self) -> None:
        """Ask the thread to finish the jobs queued so far and exit."""
        self.jobs.put(None)

    def _main(self) -> None:
        path = self.path
        problem = _path_problem(path)
        if problem is not None:
            self._fail_until_stopped(StoreError(problem))
            return
        # What this open creates, it removes again if it fails: the lock file if it was not
        # there, the database files if the database was not there once the lock is held (no
        # other store makes them meanwhile).
        made = [] if os.path.exists(lock_path(path)) else [lock_path(path)]
        try:
            held = _hold(path)  # before the database is touched at all
        except Exception as exc:
            self._fail_until_stopped(_open_error(path, exc))
            return
        if not os.path.exists(path):
            made += [path + suffix for suffix in ("", "-wal", "-shm", "-journal")]
        try:
            conn = _connect(path, self.synchronous, self.busy_timeout, reader=False)
        except Exception as exc:
            _remove_created(made)  # while the lock is still held: nobody else made them
            _release(held)
            self._fail_until_stopped(_open_error(path, exc))
            return
        try:
            _create_schema(conn, path)
        except Exception as exc:
            conn.close()
            _remove_created(made)
            _release(held)
            self._fail_until_stopped(_open_error(path, exc))
            return
        # Every statement of the writer runs on this one cursor: `Connection.execute` would
        # make (and free) a cursor per statement, about a fifth of a statement's Python cost.
        cursor = conn.cursor()
        self.ready.set()
        try:
            while True:
                first = self.jobs.get()
                if first is None or self._run_batch(conn, cursor, first):
                    break
        finally:
            conn.close()
            _release(held)
            self._fail_until_empty(UsageError("closed", "the store is closed"))

    def fail_unstarted(self, error: BaseException) -> None:
        """Fail the jobs queued on a writer that was never started (a store closed unused)."""
        self._fail_until_empty(error)

    def _fail_until_stopped(self, exc: Exception) -> None:
        self.error = exc if isinstance(exc, StoreError) else _store_error("cannot open", exc)
        self.ready.set()
        while (job := self.jobs.get()) is not None:
            job.settle(error=self.error)
        self._fail_until_empty(self.error)

    def _fail_until_empty(self, error: BaseException) -> None:
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.settle(error=error)

    def _gather(self, batch: list[_Job]) -> bool:
        """Add the jobs queued now to `batch`; True when a stop request was among them."""
        while len(batch) < self.max_batch:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return False
            if job is None:
                return True
            batch.append(job)
        return False

    def _run_batch(self, conn: sqlite3.Connection, cursor: sqlite3.Cursor, first: _Job) -> bool:
        """Run `first` and every job queued meanwhile in one transaction; True: stop after."""
        try:
            cursor.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            first.settle(error=_store_error("cannot begin a write", exc))
            return False
        # Taken after the lock: jobs that queued while we waited for it join this commit.
        batch = [first]
        stop = self._gather(batch)
        if not stop and self._last_batch > 1 and len(batch) < self._last_batch:
            # Writers were many last time: the rest of them are likely a moment away, and one
            # fsync for all beats two.
            time.sleep(COMMIT_WINDOW)
            stop = self._gather(batch)
        self._last_batch = len(batch)
        outcomes: list[tuple[Any, BaseException | None]] = []
        alone = len(batch) == 1  # a job alone needs no savepoint: its transaction is its own
        try:
            for job in batch:
                if not alone:
                    cursor.execute("SAVEPOINT job")
                try:
                    result = job.run(cursor)
                except Exception as exc:
                    # Some errors (disk full, I/O) end the whole transaction; then ROLLBACK TO
                    # fails and the whole batch fails below.
                    cursor.execute("ROLLBACK" if alone else "ROLLBACK TO job")
                    if isinstance(exc, sqlite3.Error):
                        outcomes.append((None, _store_error("write failed", exc)))
                    else:  # LogMoved, SeqTaken, UsageError: the caller's to handle
                        outcomes.append((None, exc))
                else:
                    outcomes.append((result, None))
                if not alone:
                    cursor.execute("RELEASE job")
            if conn.in_transaction:
                cursor.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                try:
                    cursor.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            failure = _store_error("commit failed", exc)
            for job in batch:
                job.settle(error=failure)
            return stop
        self.commits += 1
        self.appends += sum(job.is_append for job in batch)
        _settle_all(batch, outcomes)
        return stop


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
            raise self._writer.error
        conn = self._take()
        try:
            conn.execute("BEGIN")
            try:
                return read(conn)
            finally:
                conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise _store_error("read failed", exc) from exc
        finally:
            self._give_back(conn)

    def _take(self) -> sqlite3.Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        w = self._writer
        try:
            return _connect(w.path, w.synchronous, w.busy_timeout, reader=True)
        except sqlite3.Error as exc:
            raise _store_error("cannot open a reader", exc) from exc

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
        # A store dropped without close still stops its thread and frees its connections.
        self._finalizer = weakref.finalize(self, _stop, self._writer, self._readers)

    @property
    def commits(self) -> int:
        """How many write transactions the store has committed."""
        return self._writer.commits

    @property
    def appends(self) -> int:
        """How many `append` calls were carried by committed transactions (rejected or not)."""
        return self._writer.appends

    async def _write(self, run: Callable[[sqlite3.Cursor], T], *, is_append: bool) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._writer.jobs.put(_Job(run, loop, future, is_append=is_append))
        self._writer.start()
        return await future

    async def _read(self, read: Callable[[sqlite3.Connection], T]) -> T:
        self._check_open()
        return await asyncio.to_thread(self._readers.run, read)

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
        frozen = check_records(records)
        check_new_lineage(lineage)
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

    async def close(self) -> None:
        """Commit every write already queued, then stop the writer and close all connections.

        Idempotent. Writes queued before `close` still resolve normally.
        """
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _stop(self._writer, self._readers)
        if self._writer.started:
            await asyncio.to_thread(self._writer.thread.join)
        else:
            self._writer.fail_unstarted(UsageError("closed", "the store is closed"))

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


def _stop(writer: _Writer, readers: _Readers) -> None:
    writer.stop()
    readers.close()
