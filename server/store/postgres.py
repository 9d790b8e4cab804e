"""`PostgresStore`: the `LogStore` that several hubs share (asyncpg, one PostgreSQL database).

How this works
--------------
- **Schema** (version 1, recorded in `convsync_meta`), created on first use inside one
  transaction under an advisory lock, so hubs starting together do not race:
  `conversations(id, lineage, revision)` is each log's *head row*;
  `records(conversation_id, revision, data)` keyed by both, so a tail is one index range;
  `snapshots(conversation_id, lineage, revision, data)`, the latest one per conversation;
  `clients(conversation_id, client, seq, ack_from, ack_revision)`. Ids use `COLLATE "C"`
  (code point order, the same as Python and SQLite). A database whose `convsync_meta` names a
  newer version is refused with `StoreError` (reason `schema`); nothing is changed.
- **Compare-and-append is decided by the head row**, in one statement (one round trip): the
  schema's `convsync_append` function upserts the client's mark only when its seq is new (else
  it raises `CV001`, read back as `SeqTaken`), then runs
  `UPDATE conversations SET revision = new WHERE id = .. AND lineage = .. AND revision = ..`.
  Two hubs racing at the same position both reach that row; PostgreSQL makes the second wait
  for the first to commit and then re-checks its `WHERE` against the new row, which no longer
  matches: it updates nothing and gets `LogMoved`. A log's first append inserts the head row
  with `ON CONFLICT DO NOTHING`, which decides a race to create it the same way. A refusal
  raises `CV002` (`LogMoved`, with the head's position), so the statement, and with it
  everything it wrote, rolls back. Otherwise the records go in with the head row.
- **Every other write is compare-and-set too.** `rewrite` locks the head row
  (`SELECT .. FOR UPDATE`) and checks `base`; `write_snapshot` writes only while the head is
  still at its lineage and never replaces a newer snapshot.
- **Reads** run in a read-only `REPEATABLE READ` transaction (`load`) or as one statement
  (`read`), so each sees one committed state.
- **Connections** come from an asyncpg pool made on first use (`min_size`..`max_size`). A
  server that cannot be reached gives `StoreError` with reason `unavailable`, naming
  `host:port` (never the password). Any other database failure is `StoreError` (`storage`)
  with the cause chained. The URL is checked when the store is made: one asyncpg would
  misread (a password holding `/`, `#`, `?` or `@` not percent-encoded, a port that is not a
  number, a `key=value` string) is refused with `UsageError` (`bad_dsn`), never repeated.
- **Nothing waits for good.** Each statement, and each wait for a pooled connection, gets
  `command_timeout` seconds (a lock another session never lets go, a network path that died
  without a reset), then fails with `StoreError` (`unavailable`); so do the steps of `close`,
  which then cuts the connections.
- **In parts.** This file holds the store: the `LogStore` methods and the turn leases. The
  schema and `convsync_append` are `postgres_schema`, the pool and its errors
  `postgres_pool`, the URL checks `postgres_dsn`. The notices that tell other hubs a log
  moved (`NOTIFY` after each write, `watch` to hear them) are `postgres_notices` (`Notices`,
  the store's `notices`; `watch()` and `channel` here are its); the bus of drafts and
  presence between hubs is `postgres_bus` (`PostgresBus`, made from a store by
  `server.bus.open_bus`).

Cancelling a caller mid-write rolls the transaction back unless COMMIT was already sent; after
a `StoreError` the write may or may not have landed: reload to find out.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Self

import asyncpg

from sync.errors import UsageError

from .base import (
    NO_LINEAGE,
    TOMBSTONE,
    ClientMark,
    Counted,
    Deleted,
    Lease,
    LeaseChange,
    Loaded,
    LogMoved,
    SeqTaken,
    check_append_args,
    check_base,
    check_delete_args,
    check_list_args,
    check_live,
    check_mark,
    check_read_args,
    check_records,
    check_rewrite,
    check_rewrite_args,
    check_snapshot_revision,
    held_tail,
    loaded,
    merge_lease,
    prefix_range,
    readable,
)
from .postgres_dsn import check_dsn, describe_dsn
from .postgres_notices import Notice, Notices
from .postgres_pool import Conn, Connections
from .postgres_schema import LEASES_TABLE, MOVED, SCHEMA_VERSION, SEQ_TAKEN, create_once

__all__ = ["SCHEMA_VERSION", "Notice", "PostgresStore", "check_dsn", "describe_dsn"]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")


class PostgresStore(Counted):
    """A `LogStore` in one PostgreSQL database, safe to share between any number of hubs.

    Args:
        dsn: a `postgresql://user[:password]@host[:port]/database` URL.
        schema: keep the tables in this schema (made when missing; lower-case letters, digits
            and `_`, at most 40) instead of the connection's default (`public`). Hubs that
            share a schema share the logs and the notification channel.
        min_size: connections the pool keeps open.
        max_size: connections the pool opens at most (concurrent writes beyond it wait).
        connect_timeout: seconds to wait for the server before `StoreError` (`unavailable`).
        command_timeout: seconds any one statement, or the wait for a pooled connection, may
            take before `StoreError` (`unavailable`): a lock another session never lets go,
            or a network path that died without a reset, fails the call instead of hanging
            it; also the bound on each step of `close`.
        notify: send `NOTIFY` after each write (`postgres_notices`); off when no hub watches.

    Attributes:
        channel: the `NOTIFY` channel of these tables (`convsync` or `convsync:SCHEMA`).
        notices: the notices it sends after each write and hears (`Notices`).

    Raises:
        UsageError: a bad URL (`bad_dsn`, without repeating it), schema name or pool size,
            or a timeout that is not a positive number.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        command_timeout: float = 30.0,
        notify: bool = True,
    ) -> None:
        check_dsn(dsn)
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("command_timeout", command_timeout),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise UsageError("bad_timeout", f"{name} must be a number of seconds, more than 0")
        if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
            raise UsageError("bad_schema", f"schema name {schema!r} is not allowed")
        if not 0 <= min_size <= max_size or max_size < 1:
            raise UsageError("bad_pool", f"pool size {min_size}..{max_size} is not allowed")
        self._pg = Connections(dsn, schema, min_size, max_size, connect_timeout, command_timeout)
        self.notices = Notices(
            self._pg, "convsync" if schema is None else f"convsync:{schema}", notify
        )
        self._closed = False
        self._closing: asyncio.Task[None] | None = None
        self._commits = 0
        self._appends = 0

    @property
    def channel(self) -> str:
        """The `NOTIFY` channel of these tables (`convsync` or `convsync:SCHEMA`)."""
        return self.notices.channel

    def watch(self) -> contextlib.AbstractAsyncContextManager[AsyncIterator[Notice]]:
        """Listen for logs that move: `Notices.watch` (see `postgres_notices`)."""
        return self.notices.watch()

    # Turn leases (SPEC 10): rows beside the log, one per open turn, hints only. The table
    # is made on first use (`create_once`), so a schema of any version gains it.

    async def put_lease(self, lease: Lease, *, replace: bool = True) -> None:
        """See `LogStore.put_lease`: the row is locked while it is merged."""

        async def work(conn: Conn) -> None:
            await create_once(conn, self._pg.made, LEASES_TABLE)
            async with conn.transaction():
                await _put_lease_in(conn, lease, replace)

        await self._pg.run(work)

    async def drop_lease(self, conversation_id: str, turn: int) -> None:
        """See `LogStore.drop_lease`."""

        async def work(conn: Conn) -> None:
            await create_once(conn, self._pg.made, LEASES_TABLE)
            await conn.execute(
                "DELETE FROM convsync_leases WHERE conversation_id = $1 AND turn = $2",
                conversation_id,
                turn,
            )

        await self._pg.run(work)

    async def leases_due(self, now: int, limit: int = 100) -> list[Lease]:
        """See `LogStore.leases_due`."""
        check_list_args(limit)

        async def work(conn: Conn) -> list[Lease]:
            await create_once(conn, self._pg.made, LEASES_TABLE)
            rows = await conn.fetch(
                "SELECT conversation_id, turn, owner, expires, stop_expires FROM convsync_leases"
                " WHERE expires <= $1 OR stop_expires <= $1"
                " ORDER BY LEAST(expires, stop_expires) LIMIT $2",
                now,
                limit,
            )
            return [Lease(*row) for row in rows]

        return await self._pg.run(work)

    # The `LogStore` methods.

    async def load(self, conversation_id: str) -> Loaded | None:
        """See `LogStore.load`."""

        async def work(conn: Conn) -> Loaded | None:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                head = await conn.fetchrow(
                    "SELECT lineage, revision FROM conversations WHERE id = $1", conversation_id
                )
                if head is None:
                    return None
                lineage, revision = head["lineage"], head["revision"]
                check_live(conversation_id, (lineage, revision))
                snapshot = await conn.fetchrow(
                    "SELECT revision, data FROM snapshots"
                    " WHERE conversation_id = $1 AND lineage = $2",
                    conversation_id,
                    lineage,
                )
                records = [
                    r["data"]
                    for r in await conn.fetch(
                        "SELECT data FROM records WHERE conversation_id = $1 AND revision > $2"
                        " ORDER BY revision",
                        conversation_id,
                        0 if snapshot is None else snapshot["revision"],
                    )
                ]
                clients = {
                    r["client"]: ClientMark(r["seq"], r["ack_from"], r["ack_revision"])
                    for r in await conn.fetch(
                        "SELECT client, seq, ack_from, ack_revision FROM clients"
                        " WHERE conversation_id = $1",
                        conversation_id,
                    )
                }
            kept = None if snapshot is None else (snapshot["revision"], snapshot["data"])
            return loaded(conversation_id, lineage, revision, kept, records, clients)

        return await self._pg.run(work)

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
        """See `LogStore.append`. With `lease`, the append and its lease writes run in one
        transaction (the lease's row locked while it is merged)."""
        self._check_open()
        frozen = list(check_append_args(lineage, revision, records, client, mark))

        async def work(conn: Conn) -> int:
            if lease is None:
                return await compare_and_append(conn)
            await create_once(conn, self._pg.made, LEASES_TABLE)
            async with conn.transaction():
                result = await compare_and_append(conn)
                await _change_lease_in(conn, conversation_id, lease)
            return result

        async def compare_and_append(conn: Conn) -> int:
            # One statement, one round trip: the function runs the whole compare-and-append
            # and raises (rolling all of it back) when the seq is taken or the log moved.
            try:
                result: int = await conn.fetchval(
                    "SELECT convsync_append($1, $2, $3, $4, $5, $6, $7, $8)",
                    conversation_id,
                    lineage,
                    revision,
                    frozen,
                    client,
                    None if mark is None else mark.seq,
                    None if mark is None else mark.ack_from,
                    None if mark is None else mark.ack_revision,
                )
            except asyncpg.PostgresError as exc:
                # The function only says where things are; the same checks as every other
                # store turn that into the error.
                if exc.sqlstate == SEQ_TAKEN and client is not None and mark is not None:
                    seq, ack_from, ack_revision = map(int, str(exc.detail).split())
                    check_mark(
                        conversation_id, client, ClientMark(seq, ack_from, ack_revision), mark
                    )
                if exc.sqlstate == MOVED:
                    head = str(exc.detail)
                    current = None if head == "none" else _pair(head)
                    check_base(conversation_id, current, lineage, revision)
                    # Only a log created by a racing write at exactly our position gets here:
                    # it was not there when we looked, so the log moved all the same.
                    raise LogMoved(conversation_id, *(current or (NO_LINEAGE, 0))) from None
                raise
            return result

        try:
            result = await self._pg.run(work)
        except (LogMoved, SeqTaken, UsageError, Deleted):
            self._appends += 1
            raise
        except BaseException:
            # Cancelled, or failed after COMMIT may have gone out: the append may have landed,
            # so tell the other hubs to look (a notice is a hint; a wrong one costs a read).
            self.notices.moved(conversation_id, lineage, revision + len(frozen))
            raise
        self._appends += 1
        self._commits += 1
        self.notices.moved(conversation_id, lineage, result)
        return result

    async def read(
        self, conversation_id: str, lineage: int, from_revision: int, limit: int | None = None
    ) -> list[bytes] | None:
        """See `LogStore.read`."""
        self._check_open()
        check_read_args(from_revision, limit)

        async def work(conn: Conn) -> list[bytes] | None:
            # One statement: the head and the records come from one snapshot of the database.
            rows = await conn.fetch(
                "SELECT c.lineage, c.revision AS head, r.revision, r.data"
                " FROM conversations c LEFT JOIN LATERAL ("
                "  SELECT revision, data FROM records"
                "  WHERE conversation_id = c.id AND revision > $2 ORDER BY revision LIMIT $3"
                " ) r ON true WHERE c.id = $1",
                conversation_id,
                from_revision,
                limit,
            )
            current = (rows[0]["lineage"], rows[0]["head"]) if rows else None
            if current is None or not readable(current, lineage, from_revision):
                return None
            found = [(r["revision"], r["data"]) for r in rows if r["revision"] is not None]
            return held_tail(current[1], from_revision, limit, found)

        return await self._pg.run(work)

    async def write_snapshot(
        self, conversation_id: str, lineage: int, revision: int, state: bytes
    ) -> None:
        """See `LogStore.write_snapshot`."""
        self._check_open()
        check_records([state])

        async def work(conn: Conn) -> bool:
            async with conn.transaction():
                # FOR SHARE: a rewrite cannot slip in between the check and the write.
                head = await conn.fetchrow(
                    "SELECT lineage, revision FROM conversations WHERE id = $1 FOR SHARE",
                    conversation_id,
                )
                if head is None or head["lineage"] != lineage:
                    return False
                check_snapshot_revision(revision, head["revision"])
                written = await conn.fetchval(
                    "INSERT INTO snapshots (conversation_id, lineage, revision, data)"
                    " VALUES ($1, $2, $3, $4) ON CONFLICT (conversation_id) DO UPDATE SET"
                    " lineage = excluded.lineage, revision = excluded.revision,"
                    " data = excluded.data WHERE snapshots.lineage <> excluded.lineage"
                    " OR snapshots.revision < excluded.revision RETURNING 1",
                    conversation_id,
                    lineage,
                    revision,
                    state,
                )
            return written is not None

        if await self._pg.run(work):
            self._commits += 1

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
        frozen = list(check_rewrite_args(lineage, records))

        async def work(conn: Conn) -> None:
            async with conn.transaction():
                current = await _position_in(conn, conversation_id, lock=True)
                check_rewrite(conversation_id, current, lineage, base)
                if current is None:
                    created = await conn.fetchval(
                        "INSERT INTO conversations (id, lineage, revision) VALUES ($1, $2, $3)"
                        " ON CONFLICT (id) DO NOTHING RETURNING 1",
                        conversation_id,
                        lineage,
                        len(frozen),
                    )
                    if created is None:  # another hub created the log meanwhile: check again
                        current = await _position_in(conn, conversation_id, lock=True)
                        check_rewrite(conversation_id, current, lineage, base)
                if current is not None:
                    await conn.execute(
                        "UPDATE conversations SET lineage = $2, revision = $3 WHERE id = $1",
                        conversation_id,
                        lineage,
                        len(frozen),
                    )
                await conn.execute(
                    "DELETE FROM records WHERE conversation_id = $1", conversation_id
                )
                await conn.execute(
                    "DELETE FROM snapshots WHERE conversation_id = $1", conversation_id
                )
                await _insert_records(conn, conversation_id, 0, frozen)

        await self._pg.run(work)
        self._commits += 1
        self.notices.moved(conversation_id, lineage, len(frozen))

    async def list_conversations(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> list[str]:
        """See `LogStore.list_conversations`."""
        self._check_open()
        check_list_args(limit)
        low, high = prefix_range(prefix)

        async def work(conn: Conn) -> list[str]:
            # A range over the primary key (COLLATE "C"), never LIKE; NULL bounds drop out.
            rows = await conn.fetch(
                "SELECT id FROM conversations WHERE id >= $1"
                " AND ($2::text IS NULL OR id < $2) AND ($3::text IS NULL OR id > $3)"
                " AND lineage <> $5 ORDER BY id LIMIT $4",
                low,
                high,
                after,
                limit,
                TOMBSTONE,
            )
            return [row["id"] for row in rows]

        return await self._pg.run(work)

    async def client_mark(self, conversation_id: str, client: str) -> ClientMark | None:
        """See `LogStore.client_mark`."""

        async def work(conn: Conn) -> ClientMark | None:
            # With the head row, in one statement: a hello on a deleted conversation is
            # refused by any hub at once, not only once its room has heard (SPEC 15).
            row = await conn.fetchrow(
                "SELECT c.lineage, c.revision, k.seq, k.ack_from, k.ack_revision"
                " FROM conversations c LEFT JOIN clients k"
                " ON k.conversation_id = c.id AND k.client = $2 WHERE c.id = $1",
                conversation_id,
                client,
            )
            if row is not None:
                check_live(conversation_id, (row["lineage"], row["revision"]))
            if row is None or row["seq"] is None:
                return None
            return ClientMark(row["seq"], row["ack_from"], row["ack_revision"])

        return await self._pg.run(work)

    # Deleting (SPEC 15): the head row becomes the tombstone (lineage `TOMBSTONE`, the time of
    # the delete in its revision column), so every compare-and-set on the id fails for good.

    async def delete(self, conversation_id: str, now: float) -> bool:
        """See `LogStore.delete`. The rows go at once; the space they held is PostgreSQL's
        (auto)vacuum's to reclaim, as for any deleted row."""
        self._check_open()
        check_delete_args(now)

        async def work(conn: Conn) -> bool:
            # Its turn leases go with it (the table may be new).
            await create_once(conn, self._pg.made, LEASES_TABLE)
            async with conn.transaction():
                # Marks first, then the head row: the order an append takes its locks in
                # (`convsync_append` upserts the mark, then updates the head), so a delete
                # racing an append waits for it instead of deadlocking with it.
                await conn.execute(
                    "DELETE FROM clients WHERE conversation_id = $1", conversation_id
                )
                current = await _position_in(conn, conversation_id, lock=True)
                if current is None or current[0] == TOMBSTONE:
                    return False
                for table in ("records", "snapshots", "clients", "convsync_leases"):
                    await conn.execute(
                        f"DELETE FROM {table} WHERE conversation_id = $1", conversation_id
                    )
                await conn.execute(
                    "UPDATE conversations SET lineage = $2, revision = $3 WHERE id = $1",
                    conversation_id,
                    TOMBSTONE,
                    int(now),
                )
                return True

        deleted = await self._pg.run(work)
        if deleted:
            self._commits += 1
            self.notices.moved(conversation_id, TOMBSTONE, int(now))  # other hubs drop their rooms
        return deleted

    async def last_records(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> list[tuple[str, bytes | None]]:
        """See `LogStore.last_records`."""
        self._check_open()
        check_list_args(limit)
        low, high = prefix_range(prefix)

        async def work(conn: Conn) -> list[tuple[str, bytes | None]]:
            rows = await conn.fetch(
                "SELECT c.id, r.data FROM conversations c LEFT JOIN records r"
                " ON r.conversation_id = c.id AND r.revision = c.revision WHERE c.id >= $1"
                " AND ($2::text IS NULL OR c.id < $2) AND ($3::text IS NULL OR c.id > $3)"
                " AND c.lineage <> $5 ORDER BY c.id LIMIT $4",
                low,
                high,
                after,
                limit,
                TOMBSTONE,
            )
            return [(row["id"], row["data"]) for row in rows]

        return await self._pg.run(work)

    async def forget_deleted(self, before: float) -> int:
        """See `LogStore.forget_deleted`."""
        self._check_open()

        async def work(conn: Conn) -> int:
            status = await conn.execute(
                "DELETE FROM conversations WHERE lineage = $1 AND revision < $2",
                TOMBSTONE,
                int(before),
            )
            return int(status.split()[-1])

        return await self._pg.run(work)

    async def close(self) -> None:
        """Let writes already started finish, send their notices, end every watch and bus
        listener, close every connection. Idempotent: a second call returns when the first
        one's work is done. Cancelled, the work still goes on to the end; each step waits at
        most the command timeout (writes under way are bounded by it too), then connections
        are cut."""
        if self._closing is None:
            self._closed = self._pg.closed = True
            self._closing = asyncio.get_running_loop().create_task(self._shut_down())
        if not self._closing.done():  # (one finished on a loop since closed is not awaited)
            await asyncio.shield(self._closing)

    async def _shut_down(self) -> None:
        try:
            async with self._pg.opening:
                pass  # an open under way finishes first; its pool is closed below
            await self._pg.idle.wait()
            await self.notices.close()
        finally:
            await self._pg.close_pool()

    async def __aenter__(self) -> Self:
        """Connect and make sure the schema is there.

        Raises:
            StoreError: the server cannot be reached (`unavailable`) or holds a schema this
                code cannot use (`schema`); the store is closed again.
        """
        self._check_open()
        try:
            await self._pg.open()
            self._check_open()  # closed while it opened
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _pair(text: str) -> tuple[int, int]:
    first, second = text.split()
    return int(first), int(second)


async def _position_in(
    conn: Conn, conversation_id: str, *, lock: bool = False
) -> tuple[int, int] | None:
    row = await conn.fetchrow(
        "SELECT lineage, revision FROM conversations WHERE id = $1"
        + (" FOR UPDATE" if lock else ""),
        conversation_id,
    )
    return None if row is None else (row["lineage"], row["revision"])


async def _mark_in(conn: Conn, conversation_id: str, client: str) -> ClientMark | None:
    row = await conn.fetchrow(
        "SELECT seq, ack_from, ack_revision FROM clients WHERE conversation_id = $1"
        " AND client = $2",
        conversation_id,
        client,
    )
    return None if row is None else ClientMark(row["seq"], row["ack_from"], row["ack_revision"])


async def _insert_records(conn: Conn, conversation_id: str, after: int, records: list[Any]) -> None:
    if not records:
        return
    # One round trip for any number of records.
    await conn.execute(
        "INSERT INTO records (conversation_id, revision, data)"
        " SELECT $1, $2 + n, data FROM unnest($3::bytea[]) WITH ORDINALITY AS r(data, n)",
        conversation_id,
        after,
        records,
    )


async def _put_lease_in(conn: Conn, lease: Lease, replace: bool) -> None:
    """Merge `lease` into the stored one (`merge_lease`), its row locked; in the caller's
    transaction."""
    row = await conn.fetchrow(
        "SELECT owner, expires, stop_expires FROM convsync_leases"
        " WHERE conversation_id = $1 AND turn = $2 FOR UPDATE",
        lease.conversation_id,
        lease.turn,
    )
    stored = None if row is None else Lease(lease.conversation_id, lease.turn, *row)
    kept = merge_lease(stored, lease, replace)
    if kept != stored:
        await conn.execute(
            "INSERT INTO convsync_leases (conversation_id, turn, owner, expires, stop_expires)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (conversation_id, turn)"
            " DO UPDATE SET owner = EXCLUDED.owner, expires = EXCLUDED.expires,"
            " stop_expires = EXCLUDED.stop_expires",
            kept.conversation_id,
            kept.turn,
            kept.owner,
            kept.expires,
            kept.stop_expires,
        )


async def _change_lease_in(conn: Conn, conversation_id: str, change: LeaseChange) -> None:
    """Carry out `change` (an append's lease writes) in the caller's transaction."""
    if change.drop is not None:
        await conn.execute(
            "DELETE FROM convsync_leases WHERE conversation_id = $1 AND turn = $2",
            conversation_id,
            change.drop,
        )
    if change.put is not None:
        await _put_lease_in(conn, change.put, True)
