"""SqliteStore beyond the shared contract: a commit's mix of writes, the file as the only
truth, database errors, and the schema migration."""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import server.store.sqlite
import server.store.sqlite_sql
import server.store.sqlite_writer
from server.store import ClientMark, Loaded, LogMoved, SeqTaken, SqliteStore, StoreError
from server.store.sqlite import SCHEMA_VERSION
from sync.errors import UsageError

TIMEOUT = 10.0 * float(os.environ.get("CONVSYNC_TIMEOUT_SCALE", "1"))

L1 = 1111
L2 = 2222


def recs(*names: str) -> list[bytes]:
    return [name.encode() for name in names]


@contextmanager
def write_lock_held(path: Path) -> Iterator[None]:
    """Hold the database's write lock from another connection, so appends queue up."""
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            blocker.execute("ROLLBACK")
    finally:
        blocker.close()


def foreign_write(path: Path, sql: str, *args: object) -> None:
    """Change the file behind the store's back (what no supported use does)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(sql, args)
    finally:
        conn.close()


async def test_one_commit_holds_chained_refused_and_other_writes_in_queue_order(
    tmp_path: Path,
) -> None:
    """In one transaction: appends that build on each other land, a stale one and a resent
    seq are refused alone, a snapshot and a rewrite see the appends queued before them."""
    path = tmp_path / "db"
    async with SqliteStore(path) as store:
        await store.append("r", L1, 0, recs("old"))
        commits = store.commits
        with write_lock_held(path):
            tasks = [
                asyncio.create_task(call)
                for call in (
                    store.append("c", L1, 0, recs("c1"), client="a", mark=ClientMark(1, 1, 1)),
                    store.append(
                        "c", L1, 1, recs("c2", "c3"), client="a", mark=ClientMark(2, 2, 3)
                    ),
                    store.append("c", L1, 1, recs("stale")),
                    store.append("c", L1, 3, recs("resent"), client="a", mark=ClientMark(2, 9, 9)),
                    store.append("d", L1, 0, recs("d1")),
                    store.write_snapshot("c", L1, 3, b"state@3"),
                    store.append("r", L1, 1, recs("r2")),
                    store.rewrite("r", L2, recs("reset")),
                    store.append("r", L1, 2, recs("late")),
                    store.append("r", L2, 1, recs("after")),
                    store.append("c", L1, 3, recs("c4")),
                )
            ]
            await asyncio.sleep(0)  # every call has queued its job
        async with asyncio.timeout(TIMEOUT):
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert store.commits == commits + 1
    assert outcomes[:2] == [1, 3]
    assert isinstance(outcomes[2], LogMoved) and outcomes[2].revision == 3
    assert isinstance(outcomes[3], SeqTaken) and outcomes[3].mark == ClientMark(2, 2, 3)
    assert outcomes[4:8] == [1, None, 2, None]
    assert isinstance(outcomes[8], LogMoved) and (outcomes[8].lineage, outcomes[8].revision) == (
        L2,
        1,
    )
    assert outcomes[9:] == [2, 4]
    async with SqliteStore(path) as reopened:
        assert await reopened.load("c") == Loaded(
            L1, 4, b"state@3", 3, recs("c4"), {"a": ClientMark(2, 2, 3)}
        )
        assert await reopened.read("d", L1, 0) == recs("d1")
        assert await reopened.read("r", L2, 0) == recs("reset", "after")


async def test_a_log_moved_behind_the_store_is_caught_not_overwritten(tmp_path: Path) -> None:
    """A log moved in the file behind the store's back refuses an append on the old position
    with the file's position, writes nothing, and the store goes on from the file."""
    path = tmp_path / "db"
    async with SqliteStore(path) as store:
        await store.append("c", L1, 0, recs("r1"))
        foreign_write(path, "UPDATE conversations SET revision = 5 WHERE id = 'c'")
        with pytest.raises(LogMoved) as moved:
            await store.append("c", L1, 1, recs("r2"))
        assert (moved.value.lineage, moved.value.revision) == (L1, 5)
        assert await store.read("c", L1, 1) is None  # record 2 was not written
        foreign_write(path, "UPDATE conversations SET revision = 1 WHERE id = 'c'")
        assert await store.append("c", L1, 1, recs("r2")) == 2
        assert await store.read("c", L1, 0) == recs("r1", "r2")


async def test_a_mark_moved_behind_the_store_is_caught(tmp_path: Path) -> None:
    """A client's seq taken in the file behind the store's back refuses the push (SeqTaken)."""
    path = tmp_path / "db"
    async with SqliteStore(path) as store:
        await store.append("c", L1, 0, recs("r1"), client="a", mark=ClientMark(1, 1, 1))
        foreign_write(path, "UPDATE clients SET seq = 7 WHERE client = 'a'")
        with pytest.raises(SeqTaken) as taken:
            await store.append("c", L1, 1, recs("r2"), client="a", mark=ClientMark(2, 2, 2))
        assert taken.value.mark == ClientMark(7, 1, 1)
        assert await store.read("c", L1, 0) == recs("r1")


async def test_an_append_on_the_files_position_lands_whatever_the_store_saw_before(
    tmp_path: Path,
) -> None:
    """An append on the file's position and the file's next seq lands even when both moved
    behind the store's back (nothing the store remembers can refuse it)."""
    path = tmp_path / "db"
    async with SqliteStore(path) as store:
        await store.append("c", L1, 0, recs("r1"), client="a", mark=ClientMark(1, 1, 1))
        for revision in (2, 3):
            foreign_write(path, "INSERT INTO records VALUES ('c', ?, x'00')", revision)
        foreign_write(path, "UPDATE conversations SET revision = 3 WHERE id = 'c'")
        foreign_write(path, "UPDATE clients SET seq = 0 WHERE client = 'a'")
        async with asyncio.timeout(TIMEOUT):
            assert (
                await store.append("c", L1, 3, recs("r4"), client="a", mark=ClientMark(1, 4, 4))
                == 4
            )
        assert await store.client_mark("c", "a") == ClientMark(1, 4, 4)
        assert await store.read("c", L1, 3) == recs("r4")


async def test_a_database_error_fails_only_the_append_at_fault(tmp_path: Path) -> None:
    """A database error (a record row already in the file) fails only its append, with
    StoreError; the other append of the same commit lands."""
    path = tmp_path / "db"
    async with SqliteStore(path) as store:
        await store.append("c", L1, 0, recs("c1"))
        await store.append("d", L1, 0, recs("d1"))
        foreign_write(path, "INSERT INTO records VALUES ('c', 2, x'00')")
        with write_lock_held(path):
            bad = asyncio.create_task(store.append("c", L1, 1, recs("c2")))
            good = asyncio.create_task(store.append("d", L1, 1, recs("d2")))
            await asyncio.sleep(0)
        async with asyncio.timeout(TIMEOUT):
            with pytest.raises(StoreError):
                await bad
            assert await good == 2
        assert await store.read("d", L1, 0) == recs("d1", "d2")
        foreign_write(path, "DELETE FROM records WHERE conversation_id = 'c' AND revision = 2")
        assert await store.append("c", L1, 1, recs("c2")) == 2  # the log stayed at 1
        assert await store.read("c", L1, 0) == recs("c1", "c2")


async def test_a_refused_append_alone_is_not_counted_as_a_commit(tmp_path: Path) -> None:
    """`commits` and `appends` count what committed transactions carried: an append refused
    on its own was rolled back, so neither moves."""
    async with SqliteStore(tmp_path / "db") as store:
        await store.append("c", L1, 0, recs("c1"))
        before = (store.commits, store.appends)
        with pytest.raises(LogMoved):
            await store.append("c", L1, 0, recs("x1"))
        assert (store.commits, store.appends) == before
        await store.append("c", L1, 1, recs("c2"))
        assert (store.commits, store.appends) == (before[0] + 1, before[1] + 1)


async def test_an_error_that_ends_the_transaction_fails_the_batch_with_its_own_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error after which SQLite has rolled the whole transaction back (an I/O error, a
    full disk) fails every append of the batch with that error's text, not with what a
    rollback to the append's savepoint would say; nothing of the batch lands, and the next
    write starts afresh."""
    insert = server.store.sqlite_sql._insert_records

    def failing(conn: Any, conversation_id: str, after: int, records: Any) -> None:
        if conversation_id == "c":
            conn.execute("ROLLBACK")  # what SQLite does itself after such an error
            raise sqlite3.OperationalError("disk I/O error")
        insert(conn, conversation_id, after, records)

    path = tmp_path / "db"
    async with SqliteStore(path) as store:
        monkeypatch.setattr(server.store.sqlite_sql, "_insert_records", failing)
        async with asyncio.timeout(TIMEOUT):
            for first in ("c", "d"):  # the failing append first, then last, in one batch
                other = "d" if first == "c" else "c"
                tasks = [
                    asyncio.create_task(store.append(cid, L1, 0, recs(cid + "1")))
                    for cid in (first, other)
                ]
                for task in tasks:
                    with pytest.raises(StoreError, match="disk I/O error"):
                        await task
            alone = asyncio.create_task(store.append("c", L1, 0, recs("c1")))
            with pytest.raises(StoreError, match="disk I/O error"):
                await alone
            assert await store.read("d", L1, 0) is None
            monkeypatch.setattr(server.store.sqlite_sql, "_insert_records", insert)
            assert await store.append("c", L1, 0, recs("c1")) == 1
            assert await store.append("d", L1, 0, recs("d1")) == 1


def write_version_1(path: Path) -> None:
    """A file as version 1 of the schema left it: records clustered on their key."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(
        """
        PRAGMA journal_mode = WAL;
        CREATE TABLE conversations (id TEXT PRIMARY KEY, lineage INTEGER NOT NULL,
            revision INTEGER NOT NULL) WITHOUT ROWID;
        CREATE TABLE records (conversation_id TEXT NOT NULL, revision INTEGER NOT NULL,
            data BLOB NOT NULL, PRIMARY KEY (conversation_id, revision)) WITHOUT ROWID;
        CREATE TABLE snapshots (conversation_id TEXT PRIMARY KEY, lineage INTEGER NOT NULL,
            revision INTEGER NOT NULL, data BLOB NOT NULL);
        CREATE TABLE clients (conversation_id TEXT NOT NULL, client TEXT NOT NULL,
            seq INTEGER NOT NULL, ack_from INTEGER NOT NULL, ack_revision INTEGER NOT NULL,
            PRIMARY KEY (conversation_id, client)) WITHOUT ROWID;
        INSERT INTO conversations VALUES ('c', 1111, 3), ('d', 1111, 1);
        INSERT INTO records VALUES ('c', 1, x'7231'), ('c', 2, x'7232'), ('c', 3, x'7233'),
            ('d', 1, x'6431');
        INSERT INTO snapshots VALUES ('c', 1111, 1, x'7331');
        INSERT INTO clients VALUES ('c', 'a', 4, 2, 3);
        PRAGMA user_version = 1;
        """
    )
    conn.close()


async def test_a_version_1_file_is_migrated_with_everything_in_it(tmp_path: Path) -> None:
    """Opening a version 1 file moves its records to the current layout; loads, reads and
    appends then behave as before."""
    path = tmp_path / "db"
    write_version_1(path)
    async with SqliteStore(path) as store:
        assert await store.load("c") == Loaded(
            L1, 3, b"s1", 1, recs("r2", "r3"), {"a": ClientMark(4, 2, 3)}
        )
        assert await store.append("d", L1, 1, recs("d2")) == 2
        assert await store.read("d", L1, 0) == recs("d1", "d2")
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'records'").fetchone()
        assert "WITHOUT ROWID" not in sql
    finally:
        conn.close()


async def test_a_newer_schema_is_refused_and_left_alone(tmp_path: Path) -> None:
    """A file of an unknown (newer) schema version fails with StoreError and is not changed."""
    path = tmp_path / "db"
    write_version_1(path)
    foreign_write(path, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError):
        async with SqliteStore(path):
            pass
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION + 1,)
        assert conn.execute("SELECT count(*) FROM records").fetchone() == (4,)
    finally:
        conn.close()


async def test_nothing_touches_the_disk_until_the_store_is_used(tmp_path: Path) -> None:
    """Making a store creates no file (a hub that fails to bind leaves none); a store closed
    unused leaves none; entering it creates the database and its lock file."""
    path = tmp_path / "lazy.db"
    unused = SqliteStore(path)
    await asyncio.sleep(0.05)
    assert os.listdir(tmp_path) == []
    await unused.close()
    assert os.listdir(tmp_path) == []
    async with SqliteStore(path):
        assert set(os.listdir(tmp_path)) >= {"lazy.db", "lazy.db.lock"}


async def test_a_failed_open_names_the_path_and_removes_what_it_made(tmp_path: Path) -> None:
    """A file that is not a database: the error names the file and the cause, the lock file
    the open made is gone again, the file itself is untouched."""
    path = str(tmp_path / "notes.txt")
    with open(path, "wb") as file:  # noqa: ASYNC230 - a test's setup
        file.write(b"not a database, just notes\n" * 10)
    with pytest.raises(StoreError) as caught:
        async with SqliteStore(path):
            pass
    assert caught.value.message == f"{path!r} is not a SQLite database (file is not a database)"
    assert os.listdir(tmp_path) == ["notes.txt"]
    with open(path, "rb") as file:  # noqa: ASYNC230 - a test's check
        assert file.read() == b"not a database, just notes\n" * 10


class HeldSync:
    """Stands in for `os.fdatasync` in the store: each call waits until `release` (then syncs
    for real), or raises `fail` if one is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.released = threading.Event()
        self.fail: OSError | None = None
        self.synced = threading.Event()  # a call has returned (or raised)
        self._real = os.fdatasync

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.entered.set()
        if not self.released.wait(TIMEOUT):
            raise AssertionError("the test never released the sync")
        try:
            if self.fail is not None:
                raise self.fail
            self._real(fd)
        finally:
            self.synced.set()

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, TIMEOUT), "the store never synced"

    async def release_after(self, seconds: float, *waiting: asyncio.Task[Any]) -> None:
        """Check that none of `waiting` ends within `seconds` of the sync held; then let the
        sync go (also when the check fails, so that the store can close)."""
        try:
            await asyncio.sleep(seconds)
            assert not any(task.done() for task in waiting)
        finally:
            self.released.set()


@pytest.fixture
def held_sync(monkeypatch: pytest.MonkeyPatch) -> HeldSync:
    held = HeldSync()
    monkeypatch.setattr(os, "fdatasync", held)  # the store calls os.fdatasync
    return held


async def test_a_write_resolves_and_reads_see_it_only_once_the_wal_is_synced(
    tmp_path: Path, held_sync: HeldSync
) -> None:
    """The commit is written by the event loop and synced by the store's thread: until the
    WAL is on the disk the append does not resolve, and a read started meanwhile waits for
    it rather than return a record a crash could still take back."""
    async with SqliteStore(tmp_path / "db") as store:
        append = asyncio.create_task(store.append("c", L1, 0, recs("r1")))
        await held_sync.wait_entered()
        read = asyncio.create_task(store.read("c", L1, 0))
        await held_sync.release_after(0.1, append, read)
        async with asyncio.timeout(TIMEOUT):
            assert await append == 1
            assert await read == recs("r1")
    assert held_sync.calls == 1


async def test_a_failed_sync_fails_its_writes_and_every_later_one(
    tmp_path: Path, held_sync: HeldSync
) -> None:
    """A failed fsync may have lost what the kernel held: the writes of that commit fail with
    StoreError and so does every later one, until the store is opened again."""
    path = tmp_path / "db"
    held_sync.fail = OSError(errno.EIO, "Input/output error")
    held_sync.released.set()
    async with SqliteStore(path) as store:
        async with asyncio.timeout(TIMEOUT):
            with pytest.raises(StoreError, match="failed to sync the WAL"):
                await store.append("c", L1, 0, recs("r1"))
            held_sync.fail = None
            with pytest.raises(StoreError, match="failed to sync the WAL"):
                await store.append("d", L1, 0, recs("d1"))
    async with SqliteStore(path) as reopened:
        assert await reopened.append("d", L1, 0, recs("d1")) == 1


async def test_the_event_loop_never_waits_for_the_write_lock(tmp_path: Path) -> None:
    """With the write lock held outside the store, a batch goes to the store's thread, which
    waits for the lock; the event loop goes on running meanwhile. (A loop that waited would
    sit in SQLite's lock wait for `busy_timeout`: one gap between ticks that long.)"""
    path = tmp_path / "db"
    wait = 4.0
    async with SqliteStore(path, busy_timeout=wait) as store:
        await store.append("c", L1, 0, recs("r1"))
        locked, unlock = threading.Event(), threading.Event()

        def hold() -> None:
            with write_lock_held(path):
                locked.set()
                unlock.wait(TIMEOUT)

        holder = asyncio.create_task(asyncio.to_thread(hold))
        async with asyncio.timeout(TIMEOUT):
            await asyncio.to_thread(locked.wait, TIMEOUT)
            append = asyncio.create_task(store.append("c", L1, 1, recs("r2")))
            gaps = []
            for _ in range(20):  # 0.2 s in steps the loop only takes if it is free
                before = time.monotonic()
                await asyncio.sleep(0.01)
                gaps.append(time.monotonic() - before)
            assert max(gaps) < wait / 2 and not append.done()
            unlock.set()
            assert await append == 2
            await holder
        assert await store.read("c", L1, 0) == recs("r1", "r2")


async def test_the_store_checkpoints_the_wal_every_so_many_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's own checkpoints are off (they would run in a commit, on the event loop); the
    store's thread runs one every CHECKPOINT_EVERY commits, so the WAL starts over instead of
    growing with every commit."""

    async def wal_after(commits: int, path: Path) -> int:
        async with SqliteStore(path) as store:
            for revision in range(commits):
                await store.append("c", L1, revision, [b"x" * 2000])
            return (await asyncio.to_thread(os.stat, f"{path}-wal")).st_size

    every = server.store.sqlite_writer.CHECKPOINT_EVERY
    checkpointed = await wal_after(3 * every, tmp_path / "a.db")
    monkeypatch.setattr(server.store.sqlite_writer, "CHECKPOINT_EVERY", 10**9)
    never = await wal_after(3 * every, tmp_path / "b.db")
    assert checkpointed < never / 2


async def test_a_store_serves_one_event_loop_at_a_time(tmp_path: Path, held_sync: HeldSync) -> None:
    """While writes are under way on one event loop, a write from another is refused with a
    clear error and changes nothing; once they are done, another loop may use the store."""

    async def on_another_loop(call: Awaitable[int]) -> int:
        """`call` run to its end in a thread of its own, on an event loop of its own."""
        return await asyncio.to_thread(asyncio.run, asyncio.wait_for(call, TIMEOUT))

    async with SqliteStore(tmp_path / "db") as store:
        append = asyncio.create_task(store.append("c", L1, 0, recs("r1")))
        await held_sync.wait_entered()
        try:
            with pytest.raises(UsageError) as refused:
                await on_another_loop(store.append("d", L1, 0, recs("d1")))
            assert refused.value.reason == "wrong_loop"
        finally:
            held_sync.released.set()
        async with asyncio.timeout(TIMEOUT):
            assert await append == 1
            assert await on_another_loop(store.append("d", L1, 0, recs("d1"))) == 1
            assert await store.append("c", L1, 1, recs("r2")) == 2
        assert await store.read("d", L1, 0) == recs("d1")


async def test_a_read_that_sees_a_commit_before_its_sync_waits_for_the_sync(
    tmp_path: Path, held_sync: HeldSync, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that starts before a write's batch does, and takes its snapshot after the batch
    committed but before the WAL is synced, sees the record: it returns only once the sync
    is done."""
    run = server.store.sqlite._Readers.run

    def after_the_commit(readers: Any, read: Any) -> Any:
        assert held_sync.entered.wait(TIMEOUT)  # the batch committed; its sync is under way
        return run(readers, read)

    monkeypatch.setattr(server.store.sqlite._Readers, "run", after_the_commit)
    async with SqliteStore(tmp_path / "db") as store:
        append = asyncio.create_task(store.append("c", L1, 0, recs("r1")))
        read = asyncio.create_task(store.read("c", L1, 0))  # queued before the batch starts
        await held_sync.wait_entered()
        await held_sync.release_after(0.2, append, read)
        async with asyncio.timeout(TIMEOUT):
            assert await read == recs("r1")
            assert await append == 1


async def with_a_held_append(
    path: Path, held_sync: HeldSync
) -> tuple[SqliteStore, asyncio.Task[int]]:
    """An open store with one append committed and its sync held."""
    store = SqliteStore(path)
    await store.__aenter__()
    append = asyncio.create_task(store.append("c", L1, 0, recs("r1")))
    await held_sync.wait_entered()
    return store, append


async def test_a_cancelled_close_still_stops_the_store_and_lets_the_file_go(
    tmp_path: Path, held_sync: HeldSync
) -> None:
    """`close` cancelled while it waits for the writes under way still stops the store's
    thread, so the file's lock is let go; the write under way still lands."""
    path = tmp_path / "db"
    store, append = await with_a_held_append(path, held_sync)
    closing = asyncio.create_task(store.close())
    await asyncio.sleep(0.05)
    closing.cancel()
    held_sync.released.set()
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert await append == 1
    async with SqliteStore(path) as reopened:  # StoreLocked if the thread still held it
        assert await reopened.read("c", L1, 0) == recs("r1")


async def test_writes_left_under_way_by_a_closed_loop_do_not_hold_the_store(
    tmp_path: Path, held_sync: HeldSync
) -> None:
    """An event loop that closes while its batch is being synced leaves nobody to call back:
    the store finishes the batch anyway, and another loop may write afterwards."""
    async with SqliteStore(tmp_path / "db") as store:

        def write_and_leave() -> None:
            async def leave() -> None:
                asyncio.get_running_loop().create_task(store.append("c", L1, 0, recs("r1")))
                assert await asyncio.to_thread(held_sync.entered.wait, TIMEOUT)

            asyncio.run(leave())  # cancels the append's caller and closes its loop

        await asyncio.to_thread(write_and_leave)
        held_sync.released.set()
        async with asyncio.timeout(TIMEOUT):
            while True:  # until the thread is done with the closed loop's batch
                try:
                    assert await store.append("c", L1, 1, recs("r2")) == 2
                    break
                except UsageError as refused:
                    assert refused.reason == "wrong_loop"
                    await asyncio.sleep(0.01)
        assert await store.read("c", L1, 0) == recs("r1", "r2")


async def test_a_loop_that_stops_and_closes_before_taking_its_batch_back_does_not_hold_the_store(
    tmp_path: Path, held_sync: HeldSync
) -> None:
    """A loop that stops (not closed yet) while its batch is being synced takes the batch's
    callback, then drops it when it closes: reads elsewhere do not wait for it forever, and
    another loop may write once that loop is closed."""
    async with SqliteStore(tmp_path / "db") as store:

        def stop_then_close() -> None:
            loop = asyncio.new_event_loop()
            left: list[asyncio.Task[int]] = []  # left pending: its loop stops under it

            async def write() -> None:
                left.append(loop.create_task(store.append("c", L1, 0, recs("r1"))))
                assert await asyncio.to_thread(held_sync.entered.wait, TIMEOUT)

            loop.run_until_complete(write())  # stopped, with the append's batch at the thread
            held_sync.released.set()
            assert held_sync.synced.wait(TIMEOUT)
            time.sleep(0.1)  # the thread hands the batch back to the stopped loop
            loop.close()  # which drops it

        await asyncio.to_thread(stop_then_close)
        async with asyncio.timeout(TIMEOUT):
            assert await store.read("c", L1, 0) == recs("r1")
            assert await store.append("c", L1, 1, recs("r2")) == 2
            assert await store.read("c", L1, 0) == recs("r1", "r2")


async def test_a_read_racing_a_stop_never_returns_what_is_not_synced(
    tmp_path: Path, held_sync: HeldSync, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that sees a commit whose sync is under way, while the store is told to stop (a
    cancelled `close`), fails instead of returning the record: the sync may still fail."""
    run = server.store.sqlite._Readers.run

    def once_stopping(readers: Any, read: Any) -> Any:
        deadline = time.monotonic() + TIMEOUT
        while not readers._writer.stopping and time.monotonic() < deadline:
            time.sleep(0.01)
        return run(readers, read)

    monkeypatch.setattr(server.store.sqlite._Readers, "run", once_stopping)
    held_sync.fail = OSError(errno.EIO, "Input/output error")
    store = SqliteStore(tmp_path / "db")
    await store.__aenter__()
    append = asyncio.create_task(store.append("c", L1, 0, recs("r1")))
    await held_sync.wait_entered()  # committed on the loop, the sync held
    read = asyncio.create_task(store.read("c", L1, 0))
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(store.close())
    await asyncio.sleep(0.05)
    closing.cancel()
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(UsageError) as refused:
            await read
        assert refused.value.reason == "closed"
        held_sync.released.set()
        with pytest.raises(StoreError, match="failed to sync the WAL"):
            await append
        with pytest.raises(asyncio.CancelledError):
            await closing
        await asyncio.to_thread(store._writer.thread.join, TIMEOUT)


async def test_a_read_under_way_at_close_does_not_open_the_file_after_it(tmp_path: Path) -> None:
    """A read that went to its worker thread before `close` ran does not start the store's
    thread after `close` returned (which would take the file and its lock then)."""
    for k in range(5):
        path = tmp_path / f"db{k}"
        store = SqliteStore(path)
        read = asyncio.create_task(store.read("c", L1, 0))
        await asyncio.sleep(0)  # the read is in its worker thread
        await store.close()
        assert not store._writer.thread.is_alive()
        async with SqliteStore(path) as reopened:  # StoreLocked if the read took the file
            assert await reopened.read("c", L1, 0) is None
        async with asyncio.timeout(TIMEOUT):
            try:
                assert await read is None  # it ran before close
            except UsageError as refused:
                assert refused.reason == "closed"


async def test_close_waits_for_a_batch_at_the_thread_without_holding_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`close` with a snapshot's batch handed to the store's thread, not yet begun there,
    waits for it without keeping the event loop busy (it spun on the loop until then)."""
    begin = server.store.sqlite_writer._Writer._commit
    hold = threading.Event()

    def held_commit(writer: Any, batch: Any) -> Any:
        hold.wait(TIMEOUT)
        return begin(writer, batch)

    monkeypatch.setattr(server.store.sqlite_writer._Writer, "_commit", held_commit)
    store = SqliteStore(tmp_path / "db")
    await store.__aenter__()
    hold.set()
    await store.append("c", L1, 0, recs("r1"))
    hold.clear()
    snapshot = asyncio.create_task(store.write_snapshot("c", L1, 1, b"state"))
    await asyncio.sleep(0.01)  # the snapshot's batch is at the thread, held before it begins
    closing = asyncio.create_task(store.close())
    gaps = []
    async with asyncio.timeout(TIMEOUT):
        for _ in range(20):
            before = time.monotonic()
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - before)
        hold.set()
        await closing
        await snapshot
    assert max(gaps) < 0.5


async def test_a_second_close_returns_once_the_file_is_let_go(
    tmp_path: Path, held_sync: HeldSync
) -> None:
    """A `close` while another is still waiting for a write returns only once the store's
    thread has ended, so the file can be opened again right after it."""
    path = tmp_path / "db"
    store, append = await with_a_held_append(path, held_sync)
    first = asyncio.create_task(store.close())
    await asyncio.sleep(0.05)
    second = asyncio.create_task(store.close())
    await held_sync.release_after(0.1, first, second)
    async with asyncio.timeout(TIMEOUT):
        await second
        assert not store._writer.thread.is_alive()
        async with SqliteStore(path) as reopened:
            assert await reopened.read("c", L1, 0) == recs("r1")
        await first
        assert await append == 1


async def test_a_broken_store_fails_each_write_with_an_error_of_its_own(
    tmp_path: Path, held_sync: HeldSync
) -> None:
    """After a failed sync every write fails, each with a new `StoreError`: raising one kept
    object again and again made its traceback (and the frames it holds) grow with every
    write."""
    held_sync.fail = OSError(errno.EIO, "Input/output error")
    held_sync.released.set()

    def depth(error: BaseException) -> int:
        tb, n = error.__traceback__, 0
        while tb is not None:
            tb, n = tb.tb_next, n + 1
        return n

    async with SqliteStore(tmp_path / "db") as store:
        errors: list[StoreError] = []
        async with asyncio.timeout(TIMEOUT):
            for k in range(30):
                with pytest.raises(StoreError, match="failed to sync the WAL") as failed:
                    await store.append("c", L1, 0, recs(f"r{k}"))
                errors.append(failed.value)
        assert len({id(error) for error in errors}) == len(errors)
        assert depth(errors[-1]) == depth(errors[1])
        assert isinstance(errors[-1].__cause__, OSError)
