"""The `LogStore` contract, run against every backend, plus SQLite's group commit and durability."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sqlite3
import sys
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

import server.store.memory as memory
import server.store.postgres_notices
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
from server.store.base import StoreLocked, prefix_range
from server.store.postgres import Notice
from server.store.postgres_notices import _keep_newest
from sync.errors import UsageError

TIMEOUT = 10.0 * float(os.environ.get("CONVSYNC_TIMEOUT_SCALE", "1"))

L1 = 1111
L2 = 2222


def recs(*names: str) -> list[bytes]:
    return [name.encode() for name in names]


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


async def test_rewrite_from_a_stale_base_writes_nothing(store: LogStore) -> None:
    """A rewrite whose base is not the log's position raises LogMoved and changes nothing."""
    await store.append("c", L1, 0, recs("r1", "r2"), client="a", mark=ClientMark(1, 1, 2))
    await store.write_snapshot("c", L1, 1, b"state@1")
    before = await store.load("c")

    for stale in ((L1, 1), (L2, 2), (L1, 3)):
        with pytest.raises(LogMoved) as moved:
            await store.rewrite("c", 3333, recs("lost"), base=stale)
        assert (moved.value.lineage, moved.value.revision) == (L1, 2)
    with pytest.raises(LogMoved) as missing:
        await store.rewrite("new", 3333, recs("x"), base=(L1, 2))
    assert (missing.value.lineage, missing.value.revision) == (0, 0)

    assert await store.load("c") == before
    assert await store.list_conversations() == ["c"]
    await store.rewrite("c", 3333, recs("kept"), base=(L1, 2))
    assert await store.read("c", 3333, 0) == recs("kept")


async def test_list_conversations_by_prefix_and_page(store: LogStore) -> None:
    """A prefix lists exactly the ids that start with it, pattern characters included."""
    ids = ["a", "a_b", "a.b", "ab", "ab:1", "ab:2", "ab;", "abc", "axb", "a%", "b", "~z"]
    for cid in ids:
        await store.append(cid, L1, 0, recs("r1"))

    assert await store.list_conversations() == sorted(ids)
    assert await store.list_conversations("ab") == ["ab", "ab:1", "ab:2", "ab;", "abc"]
    assert await store.list_conversations("ab:") == ["ab:1", "ab:2"]
    assert await store.list_conversations("a_") == ["a_b"]
    assert await store.list_conversations("a%") == ["a%"]
    assert await store.list_conversations("~") == ["~z"]
    assert await store.list_conversations("zz") == []
    assert await store.list_conversations("ab", after="ab:1", limit=2) == ["ab:2", "ab;"]
    assert await store.list_conversations(limit=0) == []
    with pytest.raises(UsageError):
        await store.list_conversations(limit=-1)


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


# ---------------------------------------------------------------------- SQLite: one hub per file
# (the holder lock of `SqliteStore`; kept apart from the backend-independent contract above)

HOLDER_SCRIPT = """
import asyncio, sys
from server.store import SqliteStore

async def main():
    async with SqliteStore(sys.argv[1]):
        print("holding", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_sqlite_second_store_on_one_file_is_refused(tmp_path: Path) -> None:
    """A second store on a file another store holds raises StoreLocked naming file and holder."""
    path = tmp_path / "db"
    async with SqliteStore(path) as first:
        await first.append("c", L1, 0, recs("r1"))
        second = SqliteStore(path)
        with pytest.raises(StoreLocked) as refused:
            async with asyncio.timeout(TIMEOUT), second:
                pass
        assert refused.value.reason == "locked"
        assert isinstance(refused.value, StoreError)
        assert str(path) in refused.value.message
        assert f"{os.getpid()}@{socket.gethostname()}" in refused.value.message
        assert refused.value.holder == f"{os.getpid()}@{socket.gethostname()}"
        with pytest.raises(UsageError):  # the refused store is closed, not half open
            await second.load("c")
        assert await first.read("c", L1, 0) == recs("r1")  # the holder is untouched
    async with SqliteStore(path) as third:  # closing the holder frees the file
        assert await third.read("c", L1, 0) == recs("r1")


async def test_sqlite_lock_of_a_killed_holder_is_released(tmp_path: Path) -> None:
    """A store held by a process killed with SIGKILL opens as soon as the process is gone."""
    path = tmp_path / "db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER_SCRIPT,
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(TIMEOUT):
            assert await proc.stdout.readline() == b"holding\n"
        with pytest.raises(StoreLocked) as refused:
            async with asyncio.timeout(TIMEOUT), SqliteStore(path):
                pass
        assert f"{proc.pid}@{socket.gethostname()}" in refused.value.message
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
        async with asyncio.timeout(TIMEOUT):
            await proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    async with asyncio.timeout(TIMEOUT), SqliteStore(path) as successor:
        assert await successor.list_conversations() == []


def test_prefix_range_bounds_exactly_the_prefixed_ids() -> None:
    """The upper bound steps the last character up, over surrogates and past the top."""
    assert prefix_range("ab") == ("ab", "ac")
    assert prefix_range("") == ("", None)
    assert prefix_range("a\U0010ffff") == ("a\U0010ffff", "b")
    assert prefix_range("\U0010ffff") == ("\U0010ffff", None)
    assert prefix_range("a\ud7ff") == ("a\ud7ff", "a\ue000")


# PostgreSQL: what only a shared database server can show (several stores, one database).


@pytest.fixture
def pg(postgres_dsn: str, pg_schema: str) -> Callable[..., PostgresStore]:
    """Makes stores (one per "hub") that share this test's schema."""
    return lambda **options: PostgresStore(postgres_dsn, schema=pg_schema, **options)


async def test_postgres_racing_hubs_get_exactly_one_winner(
    pg: Callable[..., PostgresStore],
) -> None:
    """Eight hubs appending at one position: one lands, seven get LogMoved at its revision."""
    hubs = [pg() for _ in range(8)]
    async with contextlib.AsyncExitStack() as stack:
        for hub in hubs:
            await stack.enter_async_context(hub)
        for revision in (0, 1):  # creating the log, then extending it
            async with asyncio.timeout(TIMEOUT):
                outcomes = await asyncio.gather(
                    *(
                        hub.append("c", L1, revision, [f"hub{i}".encode()])
                        for i, hub in enumerate(hubs)
                    ),
                    return_exceptions=True,
                )
            won = [i for i, outcome in enumerate(outcomes) if outcome == revision + 1]
            lost = [o for o in outcomes if isinstance(o, LogMoved)]
            assert len(won) == 1, outcomes
            assert len(lost) == 7
            assert {(m.lineage, m.revision) for m in lost} == {(L1, revision + 1)}
            assert (await hubs[0].read("c", L1, revision)) == [f"hub{won[0]}".encode()]
        loaded = await hubs[3].load("c")
        assert loaded is not None
        assert loaded.revision == 2


async def test_postgres_one_push_from_two_hubs_lands_once(
    pg: Callable[..., PostgresStore],
) -> None:
    """The same client seq sent through two hubs at once: one append, the other SeqTaken."""
    async with pg() as first, pg() as second:
        await first.append("c", L1, 0, recs("r1"))
        async with asyncio.timeout(TIMEOUT):
            outcomes = await asyncio.gather(
                first.append("c", L1, 1, recs("push"), client="a", mark=ClientMark(1, 2, 2)),
                second.append("c", L1, 1, recs("push"), client="a", mark=ClientMark(1, 2, 2)),
                return_exceptions=True,
            )
        assert sorted(map(type, outcomes), key=str) == sorted([int, SeqTaken], key=str)
        assert await second.read("c", L1, 0) == recs("r1", "push")
        assert await second.client_mark("c", "a") == ClientMark(1, 2, 2)


async def test_postgres_lagging_rewrite_cannot_erase_an_acked_append(
    pg: Callable[..., PostgresStore],
) -> None:
    """A hub compacting from the revision it knew loses to another hub's append in between."""
    async with pg() as lagging, pg() as current:
        await lagging.append("c", L1, 0, recs("r1"))
        await current.append("c", L1, 1, recs("acked"))
        with pytest.raises(LogMoved) as moved:
            await lagging.rewrite("c", L2, recs("compacted"), base=(L1, 1))
        assert (moved.value.lineage, moved.value.revision) == (L1, 2)
        assert await lagging.read("c", L1, 0) == recs("r1", "acked")


async def test_postgres_second_store_hears_an_append(pg: Callable[..., PostgresStore]) -> None:
    """A watcher on another store hears each append's head after it commits, and a rewrite."""
    async with pg() as writer, pg() as listener, listener.watch() as notices:
        await writer.append("c", L1, 0, recs("r1", "r2"))
        async with asyncio.timeout(TIMEOUT):
            assert await anext(notices) == Notice("c", L1, 2)
            assert await listener.read("c", L1, 0) == recs("r1", "r2")  # sent after commit
            await writer.rewrite("c", L2, recs("new"))
            assert await anext(notices) == Notice("c", L2, 1)
            assert await listener.read("c", L2, 0) == recs("new")


async def test_postgres_notices_are_coalesced_per_conversation(
    pg: Callable[..., PostgresStore],
) -> None:
    """Fifty appends to one log heard by a busy watcher arrive as a few notices, in order."""
    async with pg() as writer, pg() as listener, listener.watch() as notices:
        for revision in range(50):
            await writer.append("c", L1, revision, [b"r"])
        await writer.append("z", L1, 0, [b"last"])
        heard: list[Notice] = []
        async with asyncio.timeout(TIMEOUT):
            async for notice in notices:
                heard.append(notice)
                if notice.conversation == "z":
                    break
        revisions = [n.revision for n in heard if n.conversation == "c"]
        assert revisions[-1] == 50
        assert revisions == sorted(set(revisions))
        assert len(revisions) < 25, revisions


async def test_postgres_refused_writes_and_foreign_payloads_are_not_heard(
    pg: Callable[..., PostgresStore], postgres_dsn: str
) -> None:
    """A refused append sends no notice; a payload that is not a notice is ignored."""
    async with pg() as writer, pg() as listener, listener.watch() as notices:
        await writer.append("c", L1, 0, recs("r1"))
        with pytest.raises(LogMoved):
            await writer.append("c", L1, 0, recs("late"))
        other = await asyncpg.connect(postgres_dsn)
        try:
            await other.execute("SELECT pg_notify($1, 'not json')", writer.channel)
        finally:
            await other.close()
        await writer.append("d", L1, 0, recs("r1"))
        async with asyncio.timeout(TIMEOUT):
            heard = [await anext(notices), await anext(notices)]
        assert heard == [Notice("c", L1, 1), Notice("d", L1, 1)]


def test_notices_coalesce_to_the_newest_head() -> None:
    """Within a lineage a late, lower revision never replaces a higher one. Lineages have no
    order, so a rewrite's notice and a late one of the old lineage are both kept: either way
    round, the rewrite's is never hidden (a hub at the old head would ignore the late one and
    miss the rewrite until its periodic re-read)."""
    pending: dict[tuple[str, int], Notice] = {}
    for notice in (Notice("c", L1, 6), Notice("c", L1, 5), Notice("d", L1, 1)):
        _keep_newest(pending, notice)
    assert list(pending.values()) == [Notice("c", L1, 6), Notice("d", L1, 1)]
    _keep_newest(pending, Notice("c", L2, 1))
    _keep_newest(pending, Notice("c", L1, 7))  # a late notice of the old lineage
    assert list(pending.values()) == [
        Notice("c", L1, 7),
        Notice("d", L1, 1),
        Notice("c", L2, 1),
    ]


async def test_postgres_watch_reports_a_lost_connection_and_ends_on_close(
    pg: Callable[..., PostgresStore], postgres_dsn: str
) -> None:
    """A watch whose connection dies raises StoreError(unavailable); closing ends a watch."""
    store = pg()
    async with store, store.watch() as notices:
        killer = await asyncpg.connect(postgres_dsn)
        try:
            # Only this test's listener: other test runs may share the server.
            killed = await killer.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE query = $1 AND application_name = 'convsync'",
                f'LISTEN "{store.channel}"',
            )
            assert killed == 1
        finally:
            await killer.close()
        with pytest.raises(StoreError) as lost:
            async with asyncio.timeout(TIMEOUT):
                await anext(notices)
        assert lost.value.reason == "unavailable"

    other = pg()
    async with other.watch() as notices:
        await other.close()
        async with asyncio.timeout(TIMEOUT):
            assert [n async for n in notices] == []


async def test_postgres_unreachable_server_names_host_not_password() -> None:
    """No server at the address: StoreError(unavailable) with host:port, never the password."""
    store = PostgresStore("postgresql://convsync:s3cret-pw@127.0.0.1:1/db", connect_timeout=5)
    with pytest.raises(StoreError) as unavailable:
        async with asyncio.timeout(TIMEOUT), store:
            pass
    assert unavailable.value.reason == "unavailable"
    assert "127.0.0.1:1" in str(unavailable.value)
    assert "s3cret" not in str(unavailable.value)
    assert "s3cret" not in repr(unavailable.value.__cause__)
    with pytest.raises(UsageError):
        await store.load("c")


async def test_postgres_refuses_a_newer_schema(
    pg: Callable[..., PostgresStore], postgres_dsn: str, pg_schema: str
) -> None:
    """A database written by a newer convsync is refused with reason `schema`, untouched."""
    async with pg() as store:
        await store.append("c", L1, 0, recs("r1"))
    conn = await asyncpg.connect(postgres_dsn, server_settings={"search_path": pg_schema})
    try:
        await conn.execute("UPDATE convsync_meta SET value = '99' WHERE key = 'schema_version'")
        with pytest.raises(StoreError) as newer:
            async with pg():
                pass
        assert newer.value.reason == "schema"
        assert "99" in str(newer.value)
        assert await conn.fetchval("SELECT value FROM convsync_meta") == "99"
        assert await conn.fetchval("SELECT count(*) FROM records") == 1
    finally:
        await conn.close()


async def test_postgres_hubs_starting_together_share_one_schema(
    pg: Callable[..., PostgresStore],
) -> None:
    """Four stores opening an empty schema at once all start, and see one another's logs."""
    stores = [pg() for _ in range(4)]
    async with asyncio.timeout(TIMEOUT):
        await asyncio.gather(*(store.__aenter__() for store in stores))
    try:
        await stores[0].append("c", L1, 0, recs("r1"))
        assert await stores[3].list_conversations() == ["c"]
    finally:
        for store in stores:
            await store.close()


class Relay:
    """A TCP relay on 127.0.0.1 to the test's PostgreSQL server. `hold` stops what the server
    sends back on every connection, which stay open: a network path that died without a
    reset (or a reply still on its way)."""

    def __init__(self, dsn: str) -> None:
        self._target = urlsplit(dsn)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def hold(self) -> bool:
        return not self._flowing.is_set()

    @hold.setter
    def hold(self, hold: bool) -> None:
        if hold:
            self._flowing.clear()
        else:
            self._flowing.set()

    async def __aenter__(self) -> str:
        """Start relaying; the DSN that goes through the relay."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        user = self._target.netloc.rpartition("@")[0]
        return self._target._replace(netloc=f"{user}@127.0.0.1:{port}").geturl()

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(
            self._target.hostname or "127.0.0.1", self._target.port or 5432
        )

        async def pump(
            source: asyncio.StreamReader, sink: asyncio.StreamWriter, held: bool
        ) -> None:
            try:
                while data := await source.read(65536):
                    if held:
                        await self._flowing.wait()
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        for task in (pump(reader, up_writer, False), pump(up_reader, writer, True)):
            pumping = asyncio.create_task(task)
            self._pumps.add(pumping)
            pumping.add_done_callback(self._pumps.discard)


async def test_postgres_a_lock_never_let_go_fails_calls_instead_of_hanging_them(
    pg: Callable[..., PostgresStore], postgres_dsn: str, pg_schema: str
) -> None:
    """Another session holds the log's head row and never lets go: an append fails with
    StoreError(unavailable) after the command timeout instead of waiting for good, a read
    that waits for the pool's only connection meanwhile ends too (it fails, or gets the
    connection once the append gave it up), and `close` ends, all while the lock is held."""
    store = pg(command_timeout=0.5, max_size=1)
    await store.__aenter__()
    await store.append("c", L1, 0, recs("r1"))
    other = await asyncpg.connect(postgres_dsn, server_settings={"search_path": pg_schema})
    try:
        async with other.transaction():
            await other.execute("SELECT 1 FROM conversations WHERE id = 'c' FOR UPDATE")
            async with asyncio.timeout(TIMEOUT):
                append = asyncio.create_task(store.append("c", L1, 1, recs("r2")))
                await asyncio.sleep(0.1)
                read = asyncio.create_task(store.read("c", L1, 0))
                with pytest.raises(StoreError) as failed:
                    await append
                assert failed.value.reason == "unavailable"
                try:
                    assert await read == recs("r1")
                except StoreError as unavailable:
                    assert unavailable.reason == "unavailable"
                await store.close()
    finally:
        await other.close()
    async with pg() as again:
        assert await again.read("c", L1, 0) == recs("r1")


async def test_postgres_a_dead_network_path_fails_calls_and_the_watch(
    postgres_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path to the server dies without a reset (nothing comes back, nothing is closed):
    a write fails after the command timeout, the watch reports its connection lost (it is
    checked every so often) once and then ends, and `close` still ends."""
    monkeypatch.setattr(server.store.postgres_notices, "_PING_EVERY", 0.2)
    relay = Relay(postgres_dsn)
    async with relay as relayed:
        store = PostgresStore(relayed, schema=pg_schema, command_timeout=0.5, connect_timeout=2)
        await store.__aenter__()
        async with store.watch() as notices:
            await store.append("c", L1, 0, recs("r1"))
            async with asyncio.timeout(TIMEOUT):
                assert await anext(notices) == Notice("c", L1, 1)
            relay.hold = True
            async with asyncio.timeout(TIMEOUT):
                with pytest.raises(StoreError) as failed:
                    await store.append("c", L1, 1, recs("r2"))
                assert failed.value.reason == "unavailable"
                with pytest.raises(StoreError) as lost:
                    await anext(notices)
                assert lost.value.reason == "unavailable"
                with pytest.raises(StopAsyncIteration):  # raised once, then it is over
                    await anext(notices)
        async with asyncio.timeout(TIMEOUT):
            await store.close()
            await store.close()  # closed all the same: a second close returns too


async def test_postgres_close_on_a_dead_path_cuts_the_connections_and_returns(
    postgres_dsn: str, pg_schema: str
) -> None:
    """`close` while the path to the server is dead: the pool's connections cannot be closed
    politely, so they are cut after the command timeout and `close` returns; a second
    `close` returns too. (It raised the pool's `TimeoutError`, every time it was called: a
    review of this stop's changes.)"""
    relay = Relay(postgres_dsn)
    async with relay as relayed:
        store = PostgresStore(relayed, schema=pg_schema, command_timeout=0.5, min_size=2)
        await store.__aenter__()
        await store.append("c", L1, 0, recs("r1"))
        relay.hold = True
        async with asyncio.timeout(TIMEOUT):
            await store.close()
            await store.close()
        assert store._pg.pool is None


async def test_postgres_close_cancelled_or_called_twice_still_closes_everything(
    pg: Callable[..., PostgresStore], postgres_dsn: str, pg_schema: str
) -> None:
    """`close` waits for a call under way. Cancelled meanwhile, the closing still goes on to
    the end; a second `close` (during the first, or after it was cancelled) returns only
    once every connection of the store is closed."""

    other = await asyncpg.connect(postgres_dsn, server_settings={"search_path": pg_schema})
    try:
        for cancel_first in (True, False):
            cid = f"c{cancel_first}"
            store = pg()
            await store.__aenter__()
            await store.append(cid, L1, 0, recs("r1"))
            async with other.transaction():
                await other.execute("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE", cid)
                busy = asyncio.create_task(store.append(cid, L1, 1, recs("r2")))
                await asyncio.sleep(0.1)
                first = asyncio.create_task(store.close())
                await asyncio.sleep(0.1)
                if cancel_first:
                    first.cancel()
                second = asyncio.create_task(store.close())
                await asyncio.sleep(0.1)
                assert not second.done()  # the append under way still holds a connection
            async with asyncio.timeout(TIMEOUT):
                assert await busy == 2
                await second
                assert store._pg.pool is None
                with contextlib.suppress(asyncio.CancelledError):
                    await first
    finally:
        await other.close()


async def test_postgres_close_while_entering_or_watching_leaves_nothing_open(
    pg: Callable[..., PostgresStore],
) -> None:
    """`close` while the store is still opening (`async with`, or a `watch` that opens it)
    waits for the opening, then closes what it made: the opening fails `closed`, and no pool
    or listening connection outlives the store."""
    async with pg() as made:  # the schema exists: only the pool and LISTEN race
        await made.append("c", L1, 0, recs("r1"))
    for opening in ("enter", "watch"):
        store = pg()

        async def watch(store: PostgresStore = store) -> None:
            async with store.watch() as notices:
                async for _ in notices:
                    pass

        task = asyncio.create_task(store.__aenter__() if opening == "enter" else watch())
        await asyncio.sleep(0)  # the opening is under way
        async with asyncio.timeout(TIMEOUT):
            await store.close()
            with pytest.raises(UsageError) as refused:
                await task
        assert refused.value.reason == "closed"
        assert store._pg.pool is None and not store.notices._listeners


async def test_postgres_a_cancelled_append_that_landed_is_still_heard(
    pg: Callable[..., PostgresStore], postgres_dsn: str, pg_schema: str
) -> None:
    """An append whose caller is cancelled after the server committed it (the reply still on
    its way) landed all the same: other hubs are told, so they need not wait for their
    periodic re-read."""
    relay = Relay(postgres_dsn)
    async with relay as relayed, pg() as listener:
        hub = PostgresStore(relayed, schema=pg_schema)
        async with hub, listener.watch() as notices:
            await hub.append("c", L1, 0, recs("r1"))
            async with asyncio.timeout(TIMEOUT):
                assert await anext(notices) == Notice("c", L1, 1)

                def settled() -> bool:  # its notice sent, its connection back in the pool
                    pool, notifier = hub._pg.pool, hub.notices._notifier
                    idle = pool is not None and pool.get_idle_size() > 0
                    return idle and (notifier is None or notifier.done())

                while not settled():  # noqa: ASYNC110 - nothing to wait on but this
                    await asyncio.sleep(0.01)
            relay.hold = True
            append = asyncio.create_task(hub.append("c", L1, 1, recs("r2")))
            async with asyncio.timeout(TIMEOUT):
                while await listener.read("c", L1, 0) != recs("r1", "r2"):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)  # until committed; its reply is held
            append.cancel()
            await asyncio.sleep(0.1)
            relay.hold = False
            with pytest.raises(asyncio.CancelledError):
                await append
            async with asyncio.timeout(TIMEOUT):
                assert await anext(notices) == Notice("c", L1, 2)


async def test_postgres_a_notice_that_cannot_go_out_does_not_sink_the_others(
    pg: Callable[..., PostgresStore],
) -> None:
    """A notice PostgreSQL would refuse (a conversation id of kilobytes: the payload limit is
    8,000 bytes) is left out; the notices sent with it or after it still go out."""
    async with pg() as writer, pg() as listener, listener.watch() as notices:
        long_id = "x" * 9000
        await asyncio.gather(
            writer.append(long_id, L1, 0, recs("r1")), writer.append("b", L1, 0, recs("r1"))
        )
        await writer.append("d", L1, 0, recs("r1"))
        heard: list[Notice] = []
        async with asyncio.timeout(TIMEOUT):
            while len(heard) < 2:
                heard.append(await anext(notices))
        assert sorted(n.conversation for n in heard) == ["b", "d"]


async def test_postgres_a_notice_that_fails_to_go_out_is_sent_again(
    pg: Callable[..., PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NOTIFY that fails (its connection dropped) is sent again after a pause, rather than
    lost with every notice queued behind it."""
    async with pg() as writer, pg() as listener, listener.watch() as notices:
        await writer.append("a", L1, 0, recs("r1"))  # the pool is open; the notice goes out
        async with asyncio.timeout(TIMEOUT):
            assert await anext(notices) == Notice("a", L1, 1)
        pool = writer._pg.pool
        assert pool is not None
        acquire = asyncpg.pool.Pool.acquire
        calls = 0

        def second_fails(self: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            if self is pool:
                calls += 1
                if calls == 2:  # the append's own, then the notifier's
                    raise asyncpg.ConnectionDoesNotExistError("the connection was dropped")
            return acquire(self, *args, **kwargs)

        monkeypatch.setattr(asyncpg.pool.Pool, "acquire", second_fails)
        await writer.append("b", L1, 0, recs("r1"))
        async with asyncio.timeout(TIMEOUT):
            assert await anext(notices) == Notice("b", L1, 1)
        assert calls == 3


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        ("postgresql://postgres:S3CRET/x@127.0.0.1:5432/test", "cannot be read"),
        ("postgresql://postgres:S3CRET#x@127.0.0.1:5432/test", "cannot be read"),
        ("postgresql://postgres:12/S3CRET@127.0.0.1:5432/test", "'@' after its host"),
        ("postgresql://postgres:S3CRET@127.0.0.1:notaport/test", "cannot be read"),
        ("host=127.0.0.1 user=postgres password=S3CRET dbname=test", "postgresql://"),
        ("postgresql://postgres:s3cr@S3CRET@127.0.0.1:5432/test", "'@' twice"),
    ],
)
def test_postgres_a_bad_url_is_refused_without_repeating_it(dsn: str, says: str) -> None:
    """A URL asyncpg would misread (a password with `/`, `#`, `?` or `@` not percent-encoded,
    a port that is not a number, a `key=value` string) is refused when the store is made,
    with `bad_dsn`, and neither the message nor any exception behind it holds the password."""
    with pytest.raises(UsageError) as refused:
        PostgresStore(dsn)
    assert refused.value.reason == "bad_dsn"
    assert says in refused.value.message
    error: BaseException | None = refused.value
    while error is not None:
        assert "S3CRET" not in str(error)
        error = error.__cause__ or error.__context__


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write",  # several hosts
        "postgresql://u@127.0.0.1/db?user=ops@example.com",  # '@' in a query value
        "postgresql://u@[::1]:5432/db",
        "postgresql:///db?host=/tmp",  # a unix socket
        "postgres://u:p%40ss%2Fword@h/db",  # an encoded password
        "postgresql://h",
    ],
)
def test_postgres_urls_people_use_are_taken(dsn: str) -> None:
    """The URL check refuses only what asyncpg would misread: several hosts, a `@` in a
    query value, IPv6, unix sockets and encoded passwords pass (the first version of the
    check refused the first two: a review of this stop's changes)."""
    PostgresStore(dsn)


def test_open_store_picks_postgres_for_its_urls() -> None:
    """`postgresql://` and `postgres://` give a PostgresStore, without connecting yet."""
    assert isinstance(open_store("postgresql://u@127.0.0.1:1/db"), PostgresStore)
    assert isinstance(open_store("postgres://u@127.0.0.1:1/db"), PostgresStore)
    with pytest.raises(UsageError):
        PostgresStore("postgresql://u@127.0.0.1:1/db", schema="Bad Name")


async def test_postgres_a_connection_left_mid_operation_is_discarded(
    pg: Callable[..., PostgresStore],
) -> None:
    """A store call that fails with an operation still in progress on its connection (the
    state asyncpg reports as "cannot switch to state 12; another operation is in progress",
    which reached a client as `unavailable`, issue 27) never hands that connection out
    again: the next call runs on a fresh backend and succeeds. A cancelled call's
    connection, which asyncpg cancels cleanly on the server, is kept and works."""
    store = pg(min_size=1, max_size=1)
    async with store:
        await store.append("c", L1, 0, [b"{}"])
        pid = await store._pg.run(lambda conn: conn.fetchval("SELECT pg_backend_pid()"))

        async def overlapping(conn: Any) -> Any:
            sleeping = asyncio.ensure_future(conn.fetchval("SELECT pg_sleep(2)"))
            await asyncio.sleep(0.1)
            try:
                return await conn.fetchval("SELECT 1")  # the sleep is still running on it
            finally:
                sleeping.cancel()
                with contextlib.suppress(BaseException):
                    await sleeping

        with pytest.raises(StoreError) as failed:
            async with asyncio.timeout(TIMEOUT):
                await store._pg.run(overlapping)
        assert failed.value.reason == "unavailable"
        for _ in range(3):
            async with asyncio.timeout(TIMEOUT):
                assert (await store.load("c")) is not None
                fresh = await store._pg.run(lambda conn: conn.fetchval("SELECT pg_backend_pid()"))
        assert fresh != pid
        sleeping = asyncio.create_task(
            store._pg.run(lambda conn: conn.fetchval("SELECT pg_sleep(30)"))
        )
        await asyncio.sleep(0.3)
        sleeping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeping
        async with asyncio.timeout(TIMEOUT):
            assert (await store.load("c")) is not None


async def test_the_memory_store_keeps_a_snapshot_compressed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A memory store's snapshot repeats what its records hold and is read only when a room
    loads: it is kept compressed (issue 32: 45 MiB of 240 in the memory row), compressed in a
    worker thread so the room goes on at once; a load gives back the very bytes written,
    before and after. A newer snapshot is never replaced by an older one compressed late."""

    async def compressed(store: MemoryStore) -> tuple[int, int, bytes, bool]:
        async with asyncio.timeout(TIMEOUT):
            while True:
                held = store._logs["c"].snapshot
                assert held is not None
                if held[3]:
                    return held
                await asyncio.sleep(0.005)

    state = b'{"entries": [' + b'{"text": "the same words again"},' * 20_000 + b"{}]}"
    async with MemoryStore() as store:
        await store.append("c", L1, 0, recs("a", "b"))
        await store.write_snapshot("c", L1, 2, state)
        loaded = await store.load("c")  # at once, compressed or not
        assert loaded is not None and loaded.snapshot == state and loaded.snapshot_revision == 2
        held = await compressed(store)
        assert len(held[2]) * 20 < len(state)
        loaded = await store.load("c")
        assert loaded is not None and loaded.snapshot == state and loaded.snapshot_revision == 2
        # Two snapshots written back to back: the later stands, and the first, replaced
        # before it stood `SNAPSHOT_QUIET`, is never compressed (a busy conversation's
        # snapshots come every `snapshot_every` records: compressing each cost a core).
        await store.append("c", L1, 2, recs("c", "d"))
        large = bytes(range(256)) * 100_000  # 26 MB that compress slowly
        sizes: list[int] = []
        compress = zlib.compress

        def counted(data: bytes, level: int) -> bytes:
            sizes.append(len(data))
            return compress(data, level)

        monkeypatch.setattr(memory.zlib, "compress", counted)
        await store.write_snapshot("c", L1, 3, large)
        await store.write_snapshot("c", L1, 4, state)
        held = await compressed(store)
        assert held[1] == 4 and sizes == [len(state)]
        await asyncio.sleep(2 * memory.SNAPSHOT_QUIET)
        assert store._logs["c"].snapshot is held and sizes == [len(state)]
        loaded = await store.load("c")
        assert loaded is not None and loaded.snapshot == state and loaded.snapshot_revision == 4
        # A conversation deleted before its snapshot stood: nothing is compressed for it.
        await store.append("d", L1, 0, recs("a"))
        await store.write_snapshot("d", L1, 1, state)
        assert await store.delete("d", 0.0)
        await asyncio.sleep(2 * memory.SNAPSHOT_QUIET)
        assert sizes == [len(state)]
