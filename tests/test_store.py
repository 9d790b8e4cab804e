"""The `LogStore` contract, run against every backend, plus SQLite's group commit and durability."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from server.store import (
    ClientMark,
    Loaded,
    LogMoved,
    LogStore,
    MemoryStore,
    PostgresStore,
    SeqTaken,
    SqliteStore,
    StoreError,
    open_store,
)
from sync.errors import UsageError

TIMEOUT = 10.0 * float(os.environ.get("CONVSYNC_TIMEOUT_SCALE", "1"))

L1 = 1111
L2 = 2222


def recs(*names: str) -> list[bytes]:
    return [name.encode() for name in names]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], LogStore]:
    """Makes a fresh store of one kind; PostgreSQL in a schema of the test's own."""
    if request.param == "memory":
        return MemoryStore
    if request.param == "sqlite":
        return lambda: SqliteStore(tmp_path / "db")
    # Resolved here, outside the event loop: finding the server may start a cluster.
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema: str = request.getfixturevalue("pg_schema")
    return lambda: PostgresStore(dsn, schema=schema)


@pytest.fixture
async def store(backend: Callable[[], LogStore]) -> AsyncIterator[LogStore]:
    async with backend() as made:
        yield made


@contextmanager
def write_lock_held(path: Path) -> Iterator[None]:
    """Hold the database's write lock from another connection, as another process would."""
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            blocker.execute("ROLLBACK")
    finally:
        blocker.close()


async def test_append_load_read_round_trip(store: LogStore) -> None:
    """Appended records come back from load and read, in order, at the revisions they got."""
    assert await store.load("c") is None
    assert await store.append("c", L1, 0, recs("r1", "r2", "r3")) == 3
    assert await store.append("c", L1, 3, recs("r4", "r5")) == 5

    loaded = await store.load("c")
    assert loaded == Loaded(L1, 5, None, 0, recs("r1", "r2", "r3", "r4", "r5"), {})
    assert await store.read("c", L1, 0) == recs("r1", "r2", "r3", "r4", "r5")
    assert await store.read("c", L1, 2, limit=2) == recs("r3", "r4")
    assert await store.read("c", L1, 5) == []
    assert await store.read("c", L1, 6) is None
    assert await store.read("missing", L1, 0) is None


async def test_append_rejects_stale_lineage_and_revision(store: LogStore) -> None:
    """A stale lineage or revision raises LogMoved with the log's real position; nothing changes."""
    await store.append("c", L1, 0, recs("r1", "r2"), client="a", mark=ClientMark(1, 1, 2))
    before = await store.load("c")

    with pytest.raises(LogMoved) as stale_lineage:
        await store.append("c", L2, 2, recs("x"), client="b", mark=ClientMark(1, 3, 3))
    assert (stale_lineage.value.lineage, stale_lineage.value.revision) == (L1, 2)

    with pytest.raises(LogMoved) as stale_revision:
        await store.append("c", L1, 1, recs("x"), client="b", mark=ClientMark(1, 2, 2))
    assert (stale_revision.value.lineage, stale_revision.value.revision) == (L1, 2)

    with pytest.raises(LogMoved) as missing:
        await store.append("new", L1, 3, recs("x"))
    assert (missing.value.lineage, missing.value.revision) == (0, 0)

    assert await store.load("c") == before
    assert await store.client_mark("c", "b") is None
    assert await store.list_conversations() == ["c"]


async def test_client_mark_lands_with_records(store: LogStore) -> None:
    """The client's mark is stored with its records and a reused seq is refused with the mark."""
    await store.append("c", L1, 0, recs("r1"), client="a", mark=ClientMark(1, 1, 1))
    await store.append("c", L1, 1, recs("r2", "r3"), client="a", mark=ClientMark(2, 2, 3))

    loaded = await store.load("c")
    assert loaded is not None
    assert loaded.clients == {"a": ClientMark(2, 2, 3)}
    assert await store.client_mark("c", "a") == ClientMark(2, 2, 3)

    with pytest.raises(SeqTaken) as taken:
        await store.append("c", L1, 3, recs("again"), client="a", mark=ClientMark(2, 4, 4))
    assert taken.value.mark == ClientMark(2, 2, 3)
    assert await store.load("c") == loaded

    with pytest.raises(UsageError):
        await store.append("c", L1, 3, recs("x"), client="a")


async def test_snapshot_makes_load_return_only_the_tail(store: LogStore) -> None:
    """After a snapshot, load returns it and only the records after it; older ones are ignored."""
    await store.append("c", L1, 0, recs("r1", "r2", "r3", "r4", "r5"))
    await store.write_snapshot("c", L1, 3, b"state@3")
    await store.write_snapshot("c", L1, 2, b"state@2")  # older: ignored
    await store.write_snapshot("c", L2, 5, b"other lineage")  # log is not at L2: ignored

    assert await store.load("c") == Loaded(L1, 5, b"state@3", 3, recs("r4", "r5"), {})
    assert await store.read("c", L1, 0) == recs("r1", "r2", "r3", "r4", "r5")
    with pytest.raises(UsageError):
        await store.write_snapshot("c", L1, 6, b"past the end")


async def test_read_returns_none_for_another_lineage(store: LogStore) -> None:
    """Reading under a lineage the log does not have gives None, so the hub sends a state."""
    await store.append("c", L1, 0, recs("r1"))
    assert await store.read("c", L2, 0) is None
    assert await store.read("c", L1, 0) == recs("r1")


async def test_rewrite_replaces_the_log_under_a_new_lineage(store: LogStore) -> None:
    """A rewrite drops old records and snapshots, keeps client marks, and moves the lineage."""
    await store.append("c", L1, 0, recs("r1", "r2"), client="a", mark=ClientMark(4, 1, 2))
    await store.write_snapshot("c", L1, 2, b"state@2")

    await store.rewrite("c", L2, recs("reset"))

    assert await store.load("c") == Loaded(
        L2, 1, None, 0, recs("reset"), {"a": ClientMark(4, 1, 2)}
    )
    assert await store.read("c", L1, 0) is None
    with pytest.raises(LogMoved) as moved:
        await store.append("c", L1, 2, recs("late"))
    assert (moved.value.lineage, moved.value.revision) == (L2, 1)
    with pytest.raises(LogMoved):
        await store.rewrite("c", 3333, recs("x"), base=(L1, 2))
    with pytest.raises(UsageError):
        await store.rewrite("c", L2, recs("x"))
    assert await store.append("c", L2, 1, recs("r2")) == 2


async def test_list_conversations(store: LogStore) -> None:
    """Every conversation with a log is listed, sorted, once."""
    assert await store.list_conversations() == []
    for cid in ("b", "a", "c"):
        await store.append(cid, L1, 0, recs("r1"))
    await store.append("a", L1, 1, recs("r2"))
    await store.rewrite("d", L2, [])
    assert await store.list_conversations() == ["a", "b", "c", "d"]


async def test_concurrent_appends_all_land(store: LogStore) -> None:
    """Twenty tasks appending to their own conversations all land, each log intact."""

    async def writer(cid: str) -> None:
        for revision in range(10):
            await store.append(cid, L1, revision, [f"{cid}:{revision + 1}".encode()])

    async with asyncio.timeout(TIMEOUT):
        await asyncio.gather(*(writer(f"c{i}") for i in range(20)))

    for i in range(20):
        loaded = await store.load(f"c{i}")
        assert loaded is not None
        assert loaded.records == [f"c{i}:{r}".encode() for r in range(1, 11)]
    assert store.appends == 200


async def test_closed_store_refuses_calls(store: LogStore) -> None:
    """After close every call raises UsageError; closing twice is fine."""
    await store.close()
    await store.close()
    with pytest.raises(UsageError):
        await store.load("c")
    with pytest.raises(UsageError):
        await store.append("c", L1, 0, recs("r1"))


async def test_sqlite_group_commit_takes_all_waiting_appends(tmp_path: Path) -> None:
    """Appends queued while the writer waits all go out in one commit."""
    path = tmp_path / "db"
    async with SqliteStore(path) as store:
        with write_lock_held(path):
            tasks = [
                asyncio.create_task(store.append(f"c{i}", L1, 0, recs("r1"))) for i in range(20)
            ]
            await asyncio.sleep(0)  # every task has queued its append
        async with asyncio.timeout(TIMEOUT):
            revisions = await asyncio.gather(*tasks)
        assert revisions == [1] * 20
        assert (store.appends, store.commits) == (20, 1)


async def test_sqlite_failing_append_fails_alone_in_its_batch(tmp_path: Path) -> None:
    """In one group commit, an append that lost the race raises LogMoved; the others land."""
    path = tmp_path / "db"
    async with SqliteStore(path) as store:
        with write_lock_held(path):
            first = asyncio.create_task(store.append("c", L1, 0, recs("first")))
            second = asyncio.create_task(store.append("c", L1, 0, recs("second")))
            other = asyncio.create_task(store.append("d", L1, 0, recs("other")))
            await asyncio.sleep(0)
        async with asyncio.timeout(TIMEOUT):
            assert await first == 1
            with pytest.raises(LogMoved) as moved:
                await second
            assert await other == 1
        assert (moved.value.lineage, moved.value.revision) == (L1, 1)
        assert await store.read("c", L1, 0) == recs("first")
        assert store.commits == 1


async def test_sqlite_keeps_everything_across_reopen(tmp_path: Path) -> None:
    """Closing and reopening the file gives back the same logs, snapshots and marks."""
    path = tmp_path / "db"
    async with SqliteStore(path) as store:
        await store.append("c", L1, 0, recs("r1", "r2"), client="a", mark=ClientMark(1, 1, 2))
        await store.write_snapshot("c", L1, 1, b"state@1")
        before = await store.load("c")
    async with open_store(str(path)) as reopened:
        assert isinstance(reopened, SqliteStore)
        assert await reopened.load("c") == before


async def test_sqlite_unopenable_file_raises_store_error(tmp_path: Path) -> None:
    """A database file that cannot be opened fails on enter with StoreError, not a hang."""
    store = SqliteStore(tmp_path / "missing" / "db")
    with pytest.raises(StoreError):
        async with asyncio.timeout(TIMEOUT), store:
            pass
    with pytest.raises(UsageError):
        await store.append("c", L1, 0, recs("r1"))


def test_open_store_picks_the_backend(tmp_path: Path) -> None:
    """`:memory:` gives a MemoryStore; SqliteStore refuses it; unknown schemes are refused."""
    assert isinstance(open_store(":memory:"), MemoryStore)
    with pytest.raises(UsageError):
        SqliteStore(":memory:")
    with pytest.raises(UsageError):
        open_store("mysql://localhost/convsync")


DURABILITY_SCRIPT = """
import asyncio, sys
from server.store import ClientMark, SqliteStore

async def writer(store, cid):
    revision, seq = 0, 0
    while True:
        seq += 1
        records = [f"{cid}:{revision + 1}".encode(), f"{cid}:{revision + 2}".encode()]
        mark = ClientMark(seq, revision + 1, revision + 2)
        revision = await store.append(cid, 7, revision, records, client="w", mark=mark)
        print("acked", cid, revision, seq, flush=True)

async def main():
    async with SqliteStore(sys.argv[1]) as store:
        await asyncio.gather(*(writer(store, f"c{i}") for i in range(8)))

asyncio.run(main())
"""


async def test_sqlite_acked_appends_survive_kill_9(tmp_path: Path) -> None:
    """Every append acked before a SIGKILL is in the file when it is reopened."""
    path = tmp_path / "db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DURABILITY_SCRIPT,
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    lines: list[bytes] = []
    try:
        async with asyncio.timeout(TIMEOUT):
            while len(lines) < 200:
                line = await proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
        async with asyncio.timeout(TIMEOUT):
            rest, err = await proc.communicate()
    assert len(lines) == 200, err.decode()
    assert proc.returncode == -signal.SIGKILL

    acked: dict[str, tuple[int, int]] = {}
    for line in [*lines, *rest.splitlines()]:
        if line.startswith(b"acked "):
            _, cid, revision_text, seq_text = line.decode().split()
            acked[cid] = max(acked.get(cid, (0, 0)), (int(revision_text), int(seq_text)))

    async with SqliteStore(path) as reopened:
        for cid, (revision, seq) in acked.items():
            loaded = await reopened.load(cid)
            assert loaded is not None
            assert loaded.revision >= revision
            assert loaded.records == [f"{cid}:{r}".encode() for r in range(1, loaded.revision + 1)]
            assert loaded.clients["w"].seq >= seq
