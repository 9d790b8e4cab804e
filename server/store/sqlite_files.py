"""The SQLite store's file: opening it, the holder lock beside it, and its schema.

`SqliteStore` (`server/store/sqlite.py`) opens the file on its thread through these: it takes
the holder lock (`<db>.lock`, an exclusive `flock`) before it touches the database, connects,
creates or migrates the schema, and on a failed open removes what it created. The errors
name the path and the cause. See `server/store/sqlite.py` "One hub per file" for why.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sqlite3
from collections.abc import Sequence
from typing import TypeVar

from .base import StoreError, StoreLocked, closed_error

__all__ = [
    "SCHEMA_VERSION",
    "closed_error",
    "connect",
    "create_schema",
    "fresh",
    "hold",
    "lock_path",
    "open_error",
    "path_problem",
    "release",
    "remove_created",
    "store_error",
]

E = TypeVar("E", bound=BaseException)

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


def connect(
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


def hold(path: str) -> int:
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
            raise store_error(f"cannot lock {sidecar!r}", exc) from exc
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


def path_problem(path: str) -> str | None:
    """Why the database at `path` cannot be opened, seen before touching anything, or None."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"cannot open the database {path!r}: it is a directory"
    if not os.path.exists(directory):
        return f"cannot create the database {path!r}: the directory {directory!r} does not exist"
    if not os.path.isdir(directory):
        return f"cannot create the database {path!r}: {directory!r} is not a directory"
    return None


def open_error(path: str, exc: Exception) -> StoreError:
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


def remove_created(paths: Sequence[str]) -> None:
    """Remove the files of `paths` (made by an open that failed); missing ones are fine."""
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            pass  # nothing more to do about it: the open already failed with its own error


def release(fd: int) -> None:
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


def create_schema(conn: sqlite3.Connection, path: str) -> None:
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


def store_error(message: str, exc: BaseException) -> StoreError:
    error = StoreError(f"{message}: {exc}")
    error.__cause__ = exc
    return error


def fresh(error: E) -> E:
    """A new exception like `error` (same type, text, fields and cause), to raise in its
    place: the store keeps a failure (a failed open, a failed sync) and fails every later
    call with it, and raising one object again and again would lengthen its traceback each
    time, keeping every frame it passed through alive."""
    copy = type(error).__new__(type(error))
    copy.args = error.args
    copy.__dict__.update(error.__dict__)
    copy.__cause__ = error.__cause__
    return copy
