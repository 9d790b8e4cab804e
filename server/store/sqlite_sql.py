"""The SQLite store's statements: each runs inside a transaction the caller holds, on the
connection (a reader's) or cursor (the writer's) it is given.

Writes (`*_in` taking `_Db`) run under the writer's per-job savepoint (`sqlite_writer`),
which undoes a half-done one; reads run in one read transaction of a reader connection.
The rules they enforce are `base`'s `check_*`, shared with the other stores.
"""

from __future__ import annotations

import sqlite3

from .base import (
    TOMBSTONE,
    ClientMark,
    Lease,
    LeaseChange,
    Loaded,
    check_base,
    check_live,
    check_mark,
    check_rewrite,
    check_snapshot_revision,
    held_tail,
    loaded,
    merge_lease,
    prefix_range,
    readable,
)

_Db = sqlite3.Connection | sqlite3.Cursor
"""Where a statement runs: a reader's connection, or the writer's one reused cursor."""

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
    check_snapshot_revision(revision, current[1])
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
    check_live(conversation_id, current)
    lineage, revision = current
    snapshot = conn.execute(
        "SELECT revision, data FROM snapshots WHERE conversation_id = ? AND lineage = ?",
        (conversation_id, lineage),
    ).fetchone()
    records = [
        data
        for (data,) in conn.execute(
            "SELECT data FROM records WHERE conversation_id = ? AND revision > ? ORDER BY revision",
            (conversation_id, 0 if snapshot is None else snapshot[0]),
        )
    ]
    clients = {
        client: ClientMark(seq, ack_from, ack_revision)
        for client, seq, ack_from, ack_revision in conn.execute(
            "SELECT client, seq, ack_from, ack_revision FROM clients WHERE conversation_id = ?",
            (conversation_id,),
        )
    }
    return loaded(conversation_id, lineage, revision, snapshot, records, clients)


def _read_in(
    conn: sqlite3.Connection,
    conversation_id: str,
    lineage: int,
    from_revision: int,
    limit: int | None,
) -> list[bytes] | None:
    current = _position_in(conn, conversation_id)
    if current is None or not readable(current, lineage, from_revision):
        return None
    rows = conn.execute(
        "SELECT revision, data FROM records WHERE conversation_id = ? AND revision > ?"
        " ORDER BY revision LIMIT ?",
        (conversation_id, from_revision, -1 if limit is None else limit),
    ).fetchall()
    return held_tail(current[1], from_revision, limit, rows)


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
