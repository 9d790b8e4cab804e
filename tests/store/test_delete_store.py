"""Deleting a conversation in every store (SPEC 15): everything of it goes, a tombstone stays
and refuses every read and write of its log; nothing of it is left in SQLite's file or in
PostgreSQL's tables."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncpg
import pytest

from server.store import ClientMark, LogStore, SqliteStore
from server.store.base import Deleted
from sync.errors import UsageError

L1 = 1111
L2 = 2222
NOW = 1_800_000_000.0


@pytest.fixture
async def store(backend: Callable[[], LogStore]) -> AsyncIterator[LogStore]:
    async with backend() as made:
        yield made


async def test_a_deleted_conversation_is_gone_and_its_tombstone_refuses_it_for_good(
    store: LogStore,
) -> None:
    """After `delete`, the id is absent from the list, its load, appends at any position and
    rewrites raise `Deleted`, its reads find nothing, and a second delete finds nothing; the
    other conversations are untouched."""
    await store.append("gone", L1, 0, [b"a", b"b"], "c1", ClientMark(1, 1, 2))
    await store.write_snapshot("gone", L1, 2, b"state")
    await store.append("kept", L1, 0, [b"x"])
    assert await store.delete("gone", NOW) is True
    assert await store.list_conversations() == ["kept"]
    with pytest.raises(Deleted) as caught:
        await store.load("gone")
    assert (caught.value.reason, caught.value.deleted_at) == ("deleted", int(NOW))
    for lineage, revision in ((L1, 0), (L1, 2), (L2, 0)):  # a fresh log, or the old position
        with pytest.raises(Deleted):
            await store.append("gone", lineage, revision, [b"again"], "c1", ClientMark(2, 1, 1))
    for base in (None, (L1, 2)):
        with pytest.raises(Deleted):
            await store.rewrite("gone", L2, [b"reset"], base=base)
    assert await store.read("gone", L1, 0) is None
    assert await store.delete("gone", NOW + 1) is False
    assert await store.delete("never", NOW) is False
    assert await store.list_conversations() == ["kept"]
    kept = await store.load("kept")
    assert kept is not None and kept.records == [b"x"]


async def test_a_client_mark_of_a_deleted_conversation_is_not_served(store: LogStore) -> None:
    """A hello's mark read finds nothing (or the tombstone) once the conversation is gone."""
    await store.append("gone", L1, 0, [b"a"], "c1", ClientMark(1, 1, 1))
    await store.delete("gone", NOW)
    try:
        mark = await store.client_mark("gone", "c1")
    except Deleted:
        return
    assert mark is None


async def test_delete_refuses_a_time_that_is_not_one(store: LogStore) -> None:
    """A bad time is a usage error and deletes nothing."""
    await store.append("kept", L1, 0, [b"x"])
    for bad in (-1.0, float("nan"), True):
        with pytest.raises(UsageError):
            await store.delete("kept", bad)
    assert await store.list_conversations() == ["kept"]


async def test_old_tombstones_can_be_forgotten_and_the_id_used_again(store: LogStore) -> None:
    """`forget_deleted(before)` drops tombstones older than `before` only; a forgotten id may
    hold a new log."""
    for name, when in (("old", NOW - 100), ("new", NOW)):
        await store.append(name, L1, 0, [b"a"])
        await store.delete(name, when)
    assert await store.forget_deleted(NOW - 50) == 1
    with pytest.raises(Deleted):
        await store.load("new")
    assert await store.load("old") is None
    await store.append("old", L2, 0, [b"fresh"])
    assert await store.list_conversations() == ["old"]


async def test_last_records_gives_each_live_conversations_last_record(store: LogStore) -> None:
    """What retention dates idleness by: the last record of every conversation, by id,
    paged, without deleted ones."""
    await store.append("a", L1, 0, [b"a1", b"a2"])
    await store.append("b", L1, 0, [b"b1"])
    await store.rewrite("c", L2, [])
    await store.append("d", L1, 0, [b"d1"])
    await store.delete("d", NOW)
    assert await store.last_records() == [("a", b"a2"), ("b", b"b1"), ("c", None)]
    assert await store.last_records("", after="a", limit=1) == [("b", b"b1")]


MARKER = b"the-secret-marker-7f3a"


def file_bytes(path: Path) -> bytes:
    """Every byte of the database and its side files (WAL, shared memory)."""
    found = b""
    for suffix in ("", "-wal", "-shm", "-journal"):
        part = Path(f"{path}{suffix}")
        if part.exists():
            found += part.read_bytes()
    return found


async def test_nothing_of_a_deleted_conversation_stays_in_the_sqlite_file(
    tmp_path: Path,
) -> None:
    """Once `delete` returns, no byte of the conversation's records, snapshots (the latest
    and one replaced before) or marks is left in the database file or its WAL, while the
    conversations beside it are all still there."""
    path = tmp_path / "hub.db"
    async with SqliteStore(path) as store:
        for k in range(50):
            await store.append("beside", L1, k, [b"beside-%d" % k])
        for k in range(40):  # interleaved with another conversation's rows, on shared pages
            await store.append("gone", L1, k, [MARKER + b" record %d " % k + b"x" * 300])
            await store.append("beside", L1, 50 + k, [b"beside-%d" % (50 + k)])
        await store.write_snapshot("gone", L1, 10, MARKER + b" old snapshot" + b"y" * 9000)
        await store.write_snapshot("gone", L1, 40, MARKER + b" new snapshot" + b"z" * 9000)
        await store.append("gone", L1, 40, [b"last"], MARKER.decode(), ClientMark(1, 41, 41))
        assert MARKER in file_bytes(path)
        assert await store.delete("gone", NOW)
        assert MARKER not in file_bytes(path)
        assert await store.list_conversations() == ["beside"]
        beside = await store.read("beside", L1, 0)
        assert beside == [b"beside-%d" % k for k in range(90)]
    assert MARKER not in file_bytes(path)


async def test_nothing_of_a_deleted_conversation_stays_in_postgresql(
    postgres_dsn: str, pg_schema: str
) -> None:
    """After `delete`, the schema's tables hold no row of the conversation but its tombstone
    (and no byte of its text anywhere)."""
    from server.store import PostgresStore

    async with PostgresStore(postgres_dsn, schema=pg_schema) as store:
        texts = [MARKER + b" 1", MARKER + b" 2"]
        await store.append("gone", L1, 0, texts, "c", ClientMark(1, 1, 2))
        await store.write_snapshot("gone", L1, 2, MARKER + b" snapshot")
        await store.append("kept", L1, 0, [b"kept"])
        assert await store.delete("gone", NOW)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        tables = [
            row["table_name"]
            for row in await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                pg_schema,
            )
        ]
        assert {"conversations", "records", "snapshots", "clients"} <= set(tables)
        for table in tables:
            rows = await conn.fetch(f'SELECT * FROM "{pg_schema}"."{table}"')
            text = repr([dict(row) for row in rows]).encode()
            assert MARKER not in text, table
            if table in ("records", "snapshots", "clients"):
                assert all(row["conversation_id"] != "gone" for row in rows), table
        heads = await conn.fetch(f'SELECT id, revision FROM "{pg_schema}".conversations')
        assert sorted((r["id"], r["revision"]) for r in heads) == [("gone", int(NOW)), ("kept", 1)]
    finally:
        await conn.close()


async def test_a_restore_keeps_tombstones_and_never_brings_a_deleted_conversation_back(
    tmp_path: Path,
) -> None:
    """A backup taken after a delete restores the other conversations under fresh lineages
    and the deleted one as its tombstone: still refused, still absent from the list."""
    from server.store.backup import backup, restore

    path, copy, restored = tmp_path / "hub.db", tmp_path / "copy.db", tmp_path / "new.db"
    async with SqliteStore(path) as store:
        await store.append("gone", L1, 0, [b"a"])
        await store.append("kept", L1, 0, [b"x"])
        await store.delete("gone", NOW)
        backup(str(path), str(copy))
    assert restore(str(copy), str(restored)).conversations == 1
    async with SqliteStore(restored) as store:
        assert await store.list_conversations() == ["kept"]
        with pytest.raises(Deleted):
            await store.load("gone")
        with pytest.raises(Deleted):
            await store.append("gone", L2, 0, [b"back"])
        kept = await store.load("kept")
        assert kept is not None and kept.lineage != L1 and kept.records == [b"x"]


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
async def test_a_reader_holding_an_old_snapshot_delays_the_scrub_to_the_next_write(
    tmp_path: Path, synchronous: str
) -> None:
    """A reader of another process keeping a read transaction open stops the WAL from being
    emptied (its old pages hold the conversation); the store's next write empties it, once
    that reader is gone, and then nothing of the conversation is left."""
    import sqlite3

    path = tmp_path / "hub.db"
    async with SqliteStore(path, busy_timeout=0.2, synchronous=synchronous) as store:
        await store.append("gone", L1, 0, [MARKER + b" record"])
        await store.append("kept", L1, 0, [b"x"])
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM records").fetchone() == (2,)
        assert await store.delete("gone", NOW)
        assert MARKER in file_bytes(path)  # the WAL could not be emptied under the reader
        reader.execute("ROLLBACK")
        reader.close()
        await store.append("kept", L1, 1, [b"y"])
        assert MARKER not in file_bytes(path)
        assert await store.read("kept", L1, 0) == [b"x", b"y"]


def test_the_core_closes_every_connection_when_a_store_call_meets_the_tombstone() -> None:
    """Whatever store call met the tombstone (here a hello's mark read on a shared store),
    the room closes every connection, joined or joining, `deleted`, holds nothing more, and
    closes the same way each later hello and push (no event loop: the pure core)."""
    from server.core import Close, CoreConfig, ReadMark, RoomCore
    from server.store import Loaded
    from sync import Lineage
    from sync.protocol import Hello, PushBatch

    room: RoomCore[str] = RoomCore("c", CoreConfig(max_frame=1 << 20, shared_store=True))
    lineage = Lineage.fresh()
    room.load(Loaded(lineage, 0, None, 0, [], {}))
    assert room.join("joining", Hello("x", lineage, 0, None)) == [ReadMark("x")]
    actions = room.resume(Deleted("c", NOW))
    assert actions == [Close("joining", "deleted", "the conversation was deleted")]
    assert (room.gone, room.exists, room.waiting, room.subscribers) == (True, False, False, {})
    assert room.join("late", Hello("y", lineage, 0, None)) == [
        Close("late", "deleted", "the conversation was deleted")
    ]
    push = PushBatch(1, lineage, 0, [])
    assert room.push("late", push, 0) == [Close("late", "deleted", "the conversation was deleted")]
