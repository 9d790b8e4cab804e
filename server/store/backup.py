"""Backing up a SQLite store while its hub runs, and restoring it under fresh lineages.

How this works: `backup` opens the store's file read-only beside the running hub (WAL lets a
reader copy while the hub writes) and copies it with SQLite's online backup API in one step,
so the copy is one consistent state: every record a hub had acknowledged when the backup
began is in it (a hub acknowledges an append only once it is committed and synced). The copy
is written to a temporary file beside the target, checked (`PRAGMA integrity_check`), synced
and only then renamed into place: an interrupted backup leaves no half file under the
target's name.

`restore` makes a new store file from a backup and gives every conversation a fresh lineage.
A replica that saw revisions past the backup then finds that its lineage continues nothing
on the restored hub and rereads the log instead of diverging from it; its own edits that did
not make it into the backup are replayed as pending records, as after any rewrite. Neither
function ever overwrites an existing file.

For PostgreSQL, `docs/deploy.md` gives the `pg_dump` recipe and the statement that does what
`restore` does to the lineages.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sync.errors import UsageError
from sync.lineage import Lineage

from .base import TOMBSTONE
from .sqlite import SCHEMA_VERSION

__all__ = ["Copied", "backup", "restore"]

_TABLES = {"conversations", "records", "snapshots", "clients"}


@dataclass(frozen=True)
class Copied:
    """What a backup or a restore copied."""

    conversations: int
    records: int
    bytes: int


def backup(path: str, target: str, *, say: Callable[[str], None] | None = None) -> Copied:
    """Copy the store at `path` to a new file `target`, while a hub may be using it.

    Args:
        path: the store's SQLite file.
        target: the backup file to make; it must not exist.
        say: called with a line before the copy and once it is done (progress).

    Raises:
        UsageError: `exists` when `target` exists; `not_a_store` when `path` is missing or
            is not a convsync store; `backup_failed` when SQLite fails (nothing is left at
            `target`).
    """
    _refuse_existing(target)
    source = _open_store_read_only(path)
    try:
        size = os.path.getsize(path)
        if say is not None:
            say(f"backing up {path} ({size / 2**20:,.1f} MiB) to {target}")
        copied = _copy_into(source, target, fresh_lineages=False)
    finally:
        source.close()
    if say is not None:
        say(
            f"backed up {copied.conversations:,} conversations, {copied.records:,} records "
            f"({copied.bytes / 2**20:,.1f} MiB) to {target}"
        )
    return copied


def restore(source: str, path: str, *, say: Callable[[str], None] | None = None) -> Copied:
    """Make a new store file `path` from the backup `source`, every conversation under a
    fresh lineage; serve it with `convsync serve --db PATH`.

    Raises:
        UsageError: `exists` when `path` (or its `-wal`) exists; `not_a_store` when `source`
            is missing or is not a convsync store; `backup_failed` when SQLite fails
            (nothing is left at `path`).
    """
    _refuse_existing(path)
    _refuse_existing(path + "-wal")
    backup_db = _open_store_read_only(source)
    try:
        if say is not None:
            say(f"restoring {source} into {path}, every conversation under a fresh lineage")
        copied = _copy_into(backup_db, path, fresh_lineages=True)
    finally:
        backup_db.close()
    if say is not None:
        say(f"restored {copied.conversations:,} conversations, {copied.records:,} records")
    return copied


def _refuse_existing(target: str) -> None:
    if os.path.lexists(target):
        raise UsageError("exists", f"{target} exists: give a new file (nothing was changed)")


def _open_store_read_only(path: str) -> sqlite3.Connection:
    """A read-only connection to the convsync store at `path`.

    Raises:
        UsageError: `not_a_store`, naming what is wrong.
    """
    if not os.path.isfile(path):
        raise UsageError("not_a_store", f"{path} is not a file")
    uri = Path(path).absolute().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error as exc:
        raise UsageError("not_a_store", f"{path} is not a SQLite file ({exc})") from exc
    if version != SCHEMA_VERSION or not _TABLES <= tables:
        conn.close()
        raise UsageError(
            "not_a_store",
            f"{path} is not a convsync store of schema version {SCHEMA_VERSION} "
            f"(user_version {version}; open it with `convsync serve` once to migrate it)",
        )
    return conn


def _copy_into(source: sqlite3.Connection, target: str, *, fresh_lineages: bool) -> Copied:
    """Copy `source` into a new file at `target` (through a temporary file renamed into place
    once checked and synced); with `fresh_lineages`, every conversation gets a new one."""
    directory = os.path.dirname(os.path.abspath(target))
    partial = os.path.join(directory, f".{os.path.basename(target)}.{uuid.uuid4().hex}.partial")
    try:
        copy = sqlite3.connect(partial)
        try:
            source.backup(copy)  # one step: one consistent state, however busy the hub is
            copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            if fresh_lineages:
                _refresh_lineages(copy)
            check = copy.execute("PRAGMA integrity_check").fetchone()[0]
            if check != "ok":
                raise UsageError("backup_failed", f"the copy failed its integrity check: {check}")
            conversations = copy.execute(
                "SELECT count(*) FROM conversations WHERE lineage != ?", (TOMBSTONE,)
            ).fetchone()[0]
            records = copy.execute("SELECT count(*) FROM records").fetchone()[0]
        finally:
            copy.close()
        _fsync_file(partial)
        os.replace(partial, target)
        _fsync_dir(directory)
    except sqlite3.Error as exc:
        raise UsageError("backup_failed", f"SQLite failed: {exc}") from exc
    finally:
        for leftover in (partial, partial + "-journal"):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return Copied(conversations, records, os.path.getsize(target))


def _refresh_lineages(conn: sqlite3.Connection) -> None:
    """Give every conversation a fresh lineage; a snapshot of its old lineage follows it. A
    deleted conversation's tombstone stays one (SPEC 15): a restore never brings it back."""
    with conn:
        rows = conn.execute(
            "SELECT id, lineage FROM conversations WHERE lineage != ?", (TOMBSTONE,)
        ).fetchall()
        for conversation_id, old in rows:
            new = Lineage.fresh()
            conn.execute(
                "UPDATE conversations SET lineage = ? WHERE id = ?", (new, conversation_id)
            )
            conn.execute(
                "UPDATE snapshots SET lineage = ? WHERE conversation_id = ? AND lineage = ?",
                (new, conversation_id, old),
            )


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
