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
- The store is bound to asyncio (futures and `call_soon_threadsafe`). Cancelling a caller that
  awaits an append does not withdraw the append: it may still commit; reload to find out. So
  may a write that failed because its sync failed.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import logging
import os
import queue
import socket
import sqlite3
import threading
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from sync.errors import UsageError

from .base import (
    TOMBSTONE,
    ClientMark,
    Closable,
    Deleted,
    Lease,
    LeaseChange,
    Loaded,
    StoreError,
    StoreLocked,
    check_append_args,
    check_base,
    check_delete_args,
    check_list_args,
    check_mark,
    check_new_lineage,
    check_read_args,
    check_records,
    check_rewrite,
    merge_lease,
    prefix_range,
)

__all__ = ["SqliteStore"]

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

log = logging.getLogger("convsync.store")

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

# Turn leases (SPEC 10): hints beside the log, not part of it, so the table is made whatever
# the schema version (a file of any version gains it when opened; an older hub ignores it).
_LEASES = """CREATE TABLE IF NOT EXISTS turn_leases (
    conversation_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    owner TEXT NOT NULL,
    expires INTEGER,
    stop_expires INTEGER,
    PRIMARY KEY (conversation_id, turn)
) WITHOUT ROWID"""

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")

_IDLE_READERS = 4


def _connect(
    path: str, synchronous: str, busy_timeout: float, *, reader: bool
) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; every one is begun explicitly. Every
    # connection is used from more than one thread (readers from a pool of worker threads, the
    # writer from the store's thread and the event loop's), never from two at once.
    conn = sqlite3.connect(
        path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
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
        conn.execute(_LEASES)
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
    lease: LeaseChange | None = None,
) -> int:
    """Compare-and-append in as few statements as the common case needs: the client's mark
    is written only if its seq is new, the position moves only if it is where the caller
    expects; the SELECTs that explain a refusal run only on that path. `lease`'s writes go
    last, in the same savepoint. The caller's savepoint (or transaction) undoes a half-done
    append."""
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
    if lease is not None:
        if lease.drop is not None:
            _drop_lease_in(conn, conversation_id, lease.drop)
        if lease.put is not None:
            _put_lease_in(conn, lease.put, True)
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
    if lineage == TOMBSTONE:
        raise Deleted(conversation_id, revision)
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
    sql = "SELECT id FROM conversations WHERE id >= ? AND lineage != ?"
    args: list[object] = [low, TOMBSTONE]
    if high is not None:
        sql += " AND id < ?"
        args.append(high)
    if after is not None:
        sql += " AND id > ?"
        args.append(after)
    sql += " ORDER BY id LIMIT ?"
    args.append(-1 if limit is None else limit)
    return [cid for (cid,) in conn.execute(sql, args)]


# Deleting (SPEC 15): the head row becomes the tombstone, everything else of the id goes, and
# the store's thread then scrubs the file (`_Writer._scrub`).


def _delete_in(conn: _Db, conversation_id: str, now: int) -> bool:
    current = _position_in(conn, conversation_id)
    if current is None or current[0] == TOMBSTONE:
        return False
    for table in ("records", "snapshots", "clients", "turn_leases"):
        conn.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (conversation_id,))
    conn.execute(
        "UPDATE conversations SET lineage = ?, revision = ? WHERE id = ?",
        (TOMBSTONE, now, conversation_id),
    )
    return True


def _last_in(
    conn: sqlite3.Connection, prefix: str, after: str | None, limit: int | None
) -> list[tuple[str, bytes | None]]:
    ids = _list_in(conn, prefix, after, limit)
    last = "SELECT r.data FROM conversations c JOIN records r"
    last += " ON r.conversation_id = c.id AND r.revision = c.revision WHERE c.id = ?"
    out: list[tuple[str, bytes | None]] = []
    for cid in ids:
        row = conn.execute(last, (cid,)).fetchone()
        out.append((cid, None if row is None else row[0]))
    return out


def _forget_in(conn: _Db, before: float) -> int:
    return conn.execute(
        "DELETE FROM conversations WHERE lineage = ? AND revision < ?", (TOMBSTONE, before)
    ).rowcount


def _lease_in(conn: _Db, conversation_id: str, turn: int) -> Lease | None:
    row = conn.execute(
        "SELECT owner, expires, stop_expires FROM turn_leases"
        " WHERE conversation_id = ? AND turn = ?",
        (conversation_id, turn),
    ).fetchone()
    return None if row is None else Lease(conversation_id, turn, row[0], row[1], row[2])


def _put_lease_in(conn: _Db, lease: Lease, replace: bool) -> None:
    stored = _lease_in(conn, lease.conversation_id, lease.turn)
    kept = merge_lease(stored, lease, replace)
    if kept != stored:
        conn.execute(
            "INSERT OR REPLACE INTO turn_leases"
            " (conversation_id, turn, owner, expires, stop_expires) VALUES (?, ?, ?, ?, ?)",
            (kept.conversation_id, kept.turn, kept.owner, kept.expires, kept.stop_expires),
        )


def _drop_lease_in(conn: _Db, conversation_id: str, turn: int) -> None:
    conn.execute(
        "DELETE FROM turn_leases WHERE conversation_id = ? AND turn = ?", (conversation_id, turn)
    )


def _leases_due_in(conn: sqlite3.Connection, now: int, limit: int) -> list[Lease]:
    rows = conn.execute(
        "SELECT conversation_id, turn, owner, expires, stop_expires FROM turn_leases"
        " WHERE expires <= ? OR stop_expires <= ?"
        " ORDER BY MIN(COALESCE(expires, stop_expires), COALESCE(stop_expires, expires))"
        " LIMIT ?",
        (now, now, limit),
    ).fetchall()
    return [Lease(*row) for row in rows]


# The writes: statements on the event loop, fsync and heavy work on the store's thread.

CHECKPOINT_EVERY = 64
"""Commits between two checkpoints of the WAL into the database, run on the store's thread
(SQLite's automatic checkpoint would run inside a commit, on the event loop)."""


class _Job:
    """One write: a function run in a transaction, and the future its caller awaits."""

    __slots__ = ("future", "is_append", "run", "scrubs")

    def __init__(
        self,
        run: Callable[[sqlite3.Cursor], Any],
        future: asyncio.Future[Any],
        *,
        is_append: bool,
        scrubs: bool = False,
    ) -> None:
        self.run = run
        self.future = future
        self.is_append = is_append
        self.scrubs = scrubs  # a delete: once it returns True, the file is scrubbed


Outcomes = list[tuple[Any, BaseException | None]]


class _Turn:
    """A batch handed to the store's thread: to run and commit there when `outcomes` is None,
    then to sync; its outcome goes back to `committer` on `loop`."""

    __slots__ = ("batch", "committer", "loop", "outcomes")

    def __init__(
        self,
        batch: list[_Job],
        outcomes: Outcomes | None,
        loop: asyncio.AbstractEventLoop,
        committer: _Committer,
    ) -> None:
        self.batch = batch
        self.outcomes = outcomes
        self.loop = loop
        self.committer = committer


def _call_back(turn: _Turn, outcomes: Outcomes | None, failure: BaseException | None) -> None:
    """Hand `turn`'s outcome back to its event loop (from the store's thread)."""
    turn.committer.returned()
    try:
        turn.loop.call_soon_threadsafe(turn.committer.done, turn, outcomes, failure)
    except RuntimeError:  # the loop is closed: nobody waits, but the store must go on
        turn.committer.abandon()


def _transact(conn: sqlite3.Connection, cursor: sqlite3.Cursor, batch: list[_Job]) -> Outcomes:
    """Run `batch` in the transaction just begun, each job under its own savepoint, and commit.

    Returns each job's outcome: a refused job (`LogMoved`, `SeqTaken`, a database error) is
    rolled back to its savepoint and fails alone. Raises what made the whole transaction fail
    (disk full, I/O error), after rolling it back.
    """
    outcomes: Outcomes = []
    alone = len(batch) == 1  # a job alone needs no savepoint: its transaction is its own
    try:
        for job in batch:
            if not alone:
                cursor.execute("SAVEPOINT job")
            try:
                result = job.run(cursor)
            except Exception as exc:
                # Some errors (disk full, I/O) end the whole transaction: then the whole batch
                # fails with that error (a ROLLBACK TO would only say there is no transaction).
                if not conn.in_transaction:
                    raise
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
    except BaseException:
        if conn.in_transaction:
            try:
                cursor.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        raise
    return outcomes


def _is_busy(exc: sqlite3.Error) -> bool:
    """Whether `exc` says another connection holds the lock asked for."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:  # an extended code (SQLITE_BUSY_RECOVERY, ...) in its low byte
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc)


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


def _closed() -> UsageError:
    return UsageError("closed", "the store is closed")


def _fresh(error: E) -> E:
    """A new exception like `error` (same type, text, fields and cause), to raise in its
    place: the store keeps a failure (a failed open, a failed sync) and fails every later
    call with it, and raising one object again and again would lengthen its traceback each
    time, keeping every frame it passed through alive."""
    copy = type(error).__new__(type(error))
    copy.args = error.args
    copy.__dict__.update(error.__dict__)
    copy.__cause__ = error.__cause__
    return copy


def _fsync(fd: int) -> None:
    """`fdatasync` where the system has it (Linux), else `fsync` (macOS)."""
    sync = getattr(os, "fdatasync", None) or os.fsync
    sync(fd)


class _Writer:
    """The store's thread and the one connection that writes.

    The thread opens the file (and holds its lock), then carries out the `_Turn`s the event
    loop hands it: it commits the batches the loop does not run itself, `fdatasync`s the WAL
    after every commit when the store is durable, and checkpoints the WAL. At most one batch
    is under way (`_Committer.busy`), so the loop and the thread take turns on the connection;
    `lock` makes that hold when the store shuts down under a batch too.

    It holds no reference to the store, so a store dropped without `close` can still be
    collected; the store's finalizer then stops this thread.
    """

    def __init__(self, path: str, synchronous: str, busy_timeout: float, max_batch: int) -> None:
        self.path = path
        self.synchronous = synchronous
        # FULL and EXTRA: the connection runs at NORMAL (a commit writes the WAL and returns)
        # and this thread syncs the WAL before any write of the commit resolves.
        self.syncs = synchronous in ("FULL", "EXTRA")
        self.busy_timeout = busy_timeout
        self.max_batch = max_batch
        self.turns: queue.SimpleQueue[_Turn | None] = queue.SimpleQueue()
        self.ready = threading.Event()
        self.lock = threading.Lock()  # held while statements run on `conn`, and to close it
        self.stopping = False  # set (under the committer's lock) before the stop request
        self.error: StoreError | None = None
        self.broken: StoreError | None = None  # a failed fsync: no write may resolve again
        self.conn: sqlite3.Connection | None = None
        self.cursor: sqlite3.Cursor | None = None
        # Batches that began a transaction: counted before `BEGIN`, so a commit a reader can
        # see is always counted (`_Committer.synced` says how many of them are synced).
        self.begun = 0
        self.commits = 0
        self.appends = 0
        self.since_checkpoint = 0
        # A delete committed: VACUUM, then empty the WAL (`_scrub`); the WAL only, when the
        # VACUUM was done but a reader kept the checkpoint from truncating it.
        self.vacuum_due = False
        self.truncate_due = False
        self._wal = -1
        self.thread = threading.Thread(target=self._main, name="convsync-sqlite-disk", daemon=True)
        self._start_lock = threading.Lock()
        self._shut = False  # the store stopped: the thread may no longer start

    def start(self) -> None:
        """Start the thread (it opens the file) unless it was started already; once the store
        has stopped, a thread that never started never will (`shut`)."""
        with self._start_lock:
            if self.thread.ident is None:
                if self._shut:
                    raise _closed()
                self.thread.start()

    def shut(self) -> None:
        """No thread starts from now on: one that started is joined by `close`, and none can
        start behind its back (a read's worker thread starts it too)."""
        with self._start_lock:
            self._shut = True

    @property
    def started(self) -> bool:
        return self.thread.ident is not None

    def committed(self, batch: list[_Job], outcomes: Outcomes) -> None:
        """Count a batch committed (by the loop or by this thread); a refused write alone was
        rolled back, not committed (`_transact`)."""
        if len(batch) == 1 and outcomes[0][1] is not None:
            return
        self.commits += 1
        self.appends += sum(job.is_append for job in batch)
        self.since_checkpoint += 1

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
        synchronous = "NORMAL" if self.syncs else self.synchronous
        try:
            conn = _connect(path, synchronous, self.busy_timeout, reader=False)
        except Exception as exc:
            _remove_created(made)  # while the lock is still held: nobody else made them
            _release(held)
            self._fail_until_stopped(_open_error(path, exc))
            return
        try:
            _create_schema(conn, path)
            # The loop never waits for a lock: a batch that finds the write lock taken (by a
            # process outside the store) comes here, which waits `busy_timeout` for it.
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # this thread checkpoints
            wal = os.open(path + "-wal", os.O_RDWR | os.O_CLOEXEC) if self.syncs else -1
        except Exception as exc:
            conn.close()
            _remove_created(made)
            _release(held)
            self._fail_until_stopped(_open_error(path, exc))
            return
        # Every statement of the writer runs on this one cursor: `Connection.execute` would
        # make (and free) a cursor per statement, about a fifth of a statement's Python cost.
        self.conn, self.cursor, self._wal = conn, conn.cursor(), wal
        self.ready.set()
        try:
            while (turn := self.turns.get()) is not None:
                try:
                    self._carry_out(turn)
                except Exception as exc:  # a bug: fail the turn, keep serving the others
                    log.exception("the SQLite store's thread failed a batch")
                    self.broken = _store_error("the store's thread failed; reopen the store", exc)
                    _call_back(turn, None, _fresh(self.broken))
        finally:
            with self.lock:  # not under a batch the loop is running
                if wal >= 0:
                    os.close(wal)
                conn.close()
                self.conn = self.cursor = None
            _release(held)
            self._fail_until_empty(_closed())

    def _carry_out(self, turn: _Turn) -> None:
        outcomes = turn.outcomes
        failure: BaseException | None = None if self.broken is None else _fresh(self.broken)
        if failure is None and outcomes is None:
            outcomes, failure = self._commit(turn.batch)
        if failure is None and self.syncs:
            try:
                _fsync(self._wal)
            except OSError as exc:
                # The commit is in the WAL but may not be on the disk, and after a failed
                # fsync the kernel may have dropped the pages: nothing written from now on can
                # be promised either. The store refuses every write until it is reopened.
                self.broken = _store_error("the disk failed to sync the WAL; reopen the store", exc)
                failure = _fresh(self.broken)
        if failure is None and (self.vacuum_due or self.truncate_due):
            self._scrub()
        if failure is None and self.since_checkpoint >= CHECKPOINT_EVERY:
            self._checkpoint()
        _call_back(turn, outcomes, failure)

    def _commit(self, batch: list[_Job]) -> tuple[Outcomes | None, BaseException | None]:
        with self.lock:
            conn, cursor = self.conn, self.cursor
            assert conn is not None and cursor is not None
            self.begun += 1
            try:
                cursor.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                try:
                    cursor.execute("BEGIN IMMEDIATE")
                finally:
                    cursor.execute("PRAGMA busy_timeout = 0")
            except sqlite3.Error as exc:
                return None, _store_error("cannot begin a write", exc)
            try:
                outcomes = _transact(conn, cursor, batch)
            except Exception as exc:
                return None, _store_error("commit failed", exc)
        self.committed(batch, outcomes)
        if any(not job.is_append for job in batch):
            self.since_checkpoint = CHECKPOINT_EVERY  # a snapshot or a rewrite: a large WAL
        pairs = zip(batch, outcomes, strict=True)
        if any(job.scrubs and outcome == (True, None) for job, outcome in pairs):
            self.vacuum_due = True
        return outcomes, None

    def _scrub(self) -> None:
        """After a delete (SPEC 15): leave nothing of the deleted conversation in the files.

        A deleted row's bytes stay in its page, and pages freed earlier (old snapshots, a
        rewrite's records) keep theirs until reused; `VACUUM` rebuilds the database without
        them, and a `TRUNCATE` checkpoint copies that into the file and empties the WAL,
        whose old frames held them too. It waits up to `busy_timeout` for readers; when one
        still holds an old snapshot, the checkpoint (not the VACUUM) is tried again at the
        thread's next turn. The cost is a rewrite of the whole file (deletes committed in one
        batch share one)."""
        with self.lock:
            assert self.cursor is not None
            cursor = self.cursor
            try:
                if self.vacuum_due:
                    self.vacuum_due = False  # failed or not: not once per turn
                    cursor.execute("VACUUM")
                    if self.syncs:
                        _fsync(self._wal)
                cursor.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                try:
                    (busy, _, _) = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                finally:
                    cursor.execute("PRAGMA busy_timeout = 0")
            except (sqlite3.Error, OSError) as exc:
                self.truncate_due = False  # the next delete tries again
                log.error("scrubbing %s after a delete failed: %s", self.path, exc)
                return
        self.since_checkpoint = 0
        self.truncate_due = bool(busy)  # then the next batch goes to the thread (`flush`)

    def _checkpoint(self) -> None:
        """Copy the WAL into the database (PASSIVE: readers are not waited for), so that the
        next commit starts the WAL over; what it cannot copy now, a later one does."""
        self.since_checkpoint = 0
        with self.lock:
            assert self.cursor is not None
            try:
                self.cursor.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error:
                log.warning(
                    "a checkpoint of %s failed; the WAL grows until one succeeds", self.path
                )

    def _fail_until_stopped(self, exc: Exception) -> None:
        self.error = exc if isinstance(exc, StoreError) else _store_error("cannot open", exc)
        self.ready.set()
        while (turn := self.turns.get()) is not None:
            _call_back(turn, None, _fresh(self.error))  # none is made: the open failed

    def _fail_until_empty(self, error: BaseException) -> None:
        while True:
            try:
                turn = self.turns.get_nowait()
            except queue.Empty:
                return
            if turn is not None:
                _call_back(turn, None, error)


class _Committer:
    """The event loop's side of the writes.

    Writes queue here. At most one batch is under way: while it is, the writes that come
    queue behind it and go together in the next (group commit). A batch of appends runs on
    the loop (a few statements each and a commit that writes the WAL, tens of microseconds)
    and goes to the store's thread to be synced; a batch holding a snapshot or a rewrite (large
    writes), or one that finds the write lock taken, runs on the thread. Its writes resolve
    once the thread has synced the commit.

    Its state is guarded by `_lock`, since a store may serve another event loop (in another
    thread) once the writes of the first are done. Holds no reference to the store.
    """

    def __init__(self, writer: _Writer) -> None:
        self.writer = writer
        self.pending: list[_Job] = []
        self.busy = False
        # The thread is done with the batch under way, which waits for its loop to take it
        # back (`done`): a loop that stops and closes in between never does.
        self.back = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.synced = 0  # every batch begun up to this count is synced, or failed
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiters: list[asyncio.Future[None]] = []  # on `loop`, for the batch under way

    def add(self, job: _Job, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self.writer.stopping:
                raise _closed()
            if loop is not self.loop:
                gone = self.loop is None or self.loop.is_closed()
                if gone and self.busy and self.back:
                    self._settle()  # nobody is left to take it back: it is over
                if self.busy or (self.pending and not gone):
                    raise UsageError(
                        "wrong_loop", "this SqliteStore has writes under way on another event loop"
                    )
                self.pending.clear()  # queued on a loop that closed: nobody awaits them
                self.loop = loop
            self.pending.append(job)
            start = len(self.pending) == 1 and not self.busy
        if start:
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Start the next batch (on the loop), unless one is under way."""
        w = self.writer
        with self._lock:
            if self.busy or not self.pending:
                return
            batch = self.pending[: w.max_batch]
            del self.pending[: w.max_batch]
            self.busy = True
            loop = self.loop
        assert loop is not None
        if w.broken is not None or w.stopping:
            self._finish(batch, None, _closed() if w.broken is None else _fresh(w.broken))
            return
        outcomes: Outcomes | None = None
        if all(job.is_append for job in batch):
            ran = self._commit_here(batch)
            if isinstance(ran, BaseException):
                self._finish(batch, None, ran)
                return
            outcomes = ran
            settled = w.since_checkpoint < CHECKPOINT_EVERY and not w.truncate_due
            if outcomes is not None and not w.syncs and settled:
                self._finish(batch, outcomes, None)  # durable as the level makes it
                return
        with self._lock:  # a turn is never queued behind the thread's stop request
            handed = not w.stopping
            if handed:
                w.turns.put(_Turn(batch, outcomes, loop, self))
        if not handed:
            self._finish(batch, None, _closed())

    def _commit_here(self, batch: list[_Job]) -> Outcomes | BaseException | None:
        """Run and commit `batch` on the loop: its outcomes, the error that failed it whole,
        or None when another connection holds the write lock (the thread waits for it)."""
        w = self.writer
        with w.lock:  # never contended: the batch under way is ours (see `_Writer`)
            conn, cursor = w.conn, w.cursor
            if conn is None or cursor is None:
                return _closed()
            w.begun += 1
            try:
                cursor.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                return None if _is_busy(exc) else _store_error("cannot begin a write", exc)
            try:
                outcomes = _transact(conn, cursor, batch)
            except Exception as exc:
                return _store_error("commit failed", exc)
        w.committed(batch, outcomes)
        return outcomes

    def done(self, turn: _Turn, outcomes: Outcomes | None, failure: BaseException | None) -> None:
        """The store's thread is done with `turn` (called on the loop)."""
        self._finish(turn.batch, outcomes, failure)

    def _finish(
        self, batch: list[_Job], outcomes: Outcomes | None, failure: BaseException | None
    ) -> None:
        if failure is not None or outcomes is None:
            # A commit that failed, or one whose sync failed: none of its writes resolves.
            for job in batch:  # one exception each: each caller raises its own
                _resolve(job.future, None, _closed() if failure is None else _fresh(failure))
        else:
            for job, (result, error) in zip(batch, outcomes, strict=True):
                _resolve(job.future, result, error)
        with self._lock:
            waiters, start, loop = self._settle()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        if start and loop is not None:
            loop.call_soon(self.flush)

    def returned(self) -> None:
        """The thread is done with the batch under way: synced, or failed (on the thread).
        Reads stop waiting for it now, whether or not its loop ever takes it back."""
        with self._lock:
            self.back = True
            self.synced = self.writer.begun
            self._changed.notify_all()

    def abandon(self) -> None:
        """The batch under way belongs to a loop that closed (called on the store's thread):
        nobody awaits it; let the store serve another loop."""
        with self._lock:
            self._settle()

    def _settle(self) -> tuple[list[asyncio.Future[None]], bool, asyncio.AbstractEventLoop | None]:
        """The batch under way is over (under `_lock`)."""
        self.busy = False
        self.back = False
        self.synced = self.writer.begun  # no other batch began meanwhile: it was the one
        self._changed.notify_all()
        waiters, self._waiters = self._waiters, []
        loop = self.loop
        start = bool(self.pending) and loop is not None and not loop.is_closed()
        return waiters, start, loop

    def stop(self) -> None:
        """No write is started or handed to the thread from now on."""
        with self._lock:
            self.writer.stopping = True
            self._changed.notify_all()

    async def synced_to(self, target: int) -> None:
        """Wait until every batch begun up to `target` (a `_Writer.begun`) is synced."""
        loop = asyncio.get_running_loop()
        while self.synced < target and not self.writer.stopping:
            if loop is self.loop:
                with self._lock:
                    if self.synced >= target:
                        return
                    waiter = loop.create_future()
                    self._waiters.append(waiter)
                await waiter
            else:
                await asyncio.to_thread(self._wait_synced, target)

    def _wait_synced(self, target: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self.synced >= target or self.writer.stopping)

    async def drained(self) -> None:
        """Wait until every write queued on this loop has resolved."""
        loop = asyncio.get_running_loop()
        while loop is self.loop and (self.busy or self.pending) and not self.writer.stopping:
            if not self.busy:
                self.flush()
            with self._lock:
                if not self.busy:
                    continue
                # Until the batch under way is over: a batch at the thread is only counted in
                # `begun` once the thread begins it, so waiting on that count would spin.
                waiter = loop.create_future()
                self._waiters.append(waiter)
            await waiter


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
            raise _fresh(self._writer.error)
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
            raise _fresh(writer.error)
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
            raise _fresh(self._writer.broken)  # what it saw may never reach the disk
        if self._committer.synced < target:
            raise _closed()  # the store stopped before what it saw was synced
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
