"""Several hubs on one PostgreSQL database (SPEC 9): notices, the head check, marks, failover."""

from __future__ import annotations

import contextlib
import hashlib
import socket
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from cliproc import Running, run
from conftest import bound, hub_config
from hubprocess import HubProcess

from client import Replica, connect
from client.cli import CliError, build_parser
from server import Hub
from server.core import CoreConfig, ReadMark, ReadRecords, RoomCore, Send
from server.store import ClientMark, Loaded, LogMoved, PostgresStore
from sync import ChangeRecord, Conversation, Lineage, Message, decode_record, encode
from sync.errors import UsageError
from sync.protocol import Hello, Records, Welcome, decode_hub_message

CONVERSATION = "multi"


def digest(record: ChangeRecord) -> str:
    """A record as the log holds it, minus the `at` the hub stamps."""
    return hashlib.sha1(encode(ChangeRecord(record.change, record.by, None))).hexdigest()


@contextlib.asynccontextmanager
async def hubs(
    dsn: str, schema: str, count: int, *, notify: bool = True, **config: Any
) -> AsyncIterator[list[Hub]]:
    """`count` in-process hubs, each with a `PostgresStore` of its own on `schema`."""
    async with contextlib.AsyncExitStack() as stack:
        running = []
        for _ in range(count):
            store = PostgresStore(dsn, schema=schema, notify=notify)
            hub = Hub(store, config=hub_config(**config))
            running.append(await stack.enter_async_context(hub))
        yield running


def texts(conversation: Conversation) -> list[str]:
    return [m.content[0].text for m in conversation.messages()]  # type: ignore[union-attr]


async def store_log(dsn: str, schema: str) -> list[bytes]:
    """Every record of the test conversation, read from the database itself."""
    async with PostgresStore(dsn, schema=schema) as store:
        loaded = await store.load(CONVERSATION)
        assert loaded is not None
        records = await store.read(CONVERSATION, loaded.lineage, 0)
        assert records is not None
        return records


def folded(records: list[bytes]) -> Conversation:
    conversation = Conversation()
    for data in records:
        conversation.apply(decode_record(data))
    return conversation


async def test_replicas_on_three_hubs_converge_through_notices(
    postgres_dsn: str, pg_schema: str
) -> None:
    """Three hubs, a writer on each: with no periodic re-read (an hour apart), the store's
    notices alone bring every replica on every hub to the whole log."""
    async with hubs(postgres_dsn, pg_schema, 3, head_check=3600.0) as running:
        async with contextlib.AsyncExitStack() as stack:
            replicas = [
                await stack.enter_async_context(
                    connect(hub.url, CONVERSATION, client=f"w{k}", connect_timeout=bound(10))
                )
                for k, hub in enumerate(running)
            ]
            with anyio.fail_after(bound(30)):
                async with anyio.create_task_group() as group:
                    for k, replica in enumerate(replicas):

                        async def write(replica: Replica = replica, k: int = k) -> None:
                            for n in range(10):
                                replica.conversation.push(Message.user(f"{k}.{n}"))
                                await anyio.sleep(0.005)
                            await replica.flush()

                        group.start_soon(write)
                log = await store_log(postgres_dsn, pg_schema)
                assert len(log) >= 1
                for replica in replicas:
                    await replica.wait_for(len(log))
            expected = folded(log)
            assert sorted(texts(expected)) == sorted(
                f"{k}.{n}" for k in range(3) for n in range(10)
            )
            for replica in replicas:
                assert replica.conversation == expected


async def test_the_periodic_head_check_alone_brings_other_hubs_along(
    postgres_dsn: str, pg_schema: str
) -> None:
    """With every notice off, a replica on hub B still gets what was pushed through hub A,
    within a few head-check periods."""
    async with hubs(postgres_dsn, pg_schema, 2, notify=False, head_check=0.05) as (a, b):
        async with (
            connect(a.url, CONVERSATION, client="writer") as writer,
            connect(b.url, CONVERSATION, client="watcher") as watcher,
        ):
            with anyio.fail_after(bound(10)):
                for n in range(3):
                    writer.conversation.push(Message.user(f"m{n}"))
                    await writer.flush()
                await watcher.wait_for(writer.revision)
            assert texts(watcher.conversation) == ["m0", "m1", "m2"]


async def test_head_checks_leave_a_conversation_without_a_log_alone(
    postgres_dsn: str, pg_schema: str
) -> None:
    """A room whose conversation has no log yet keeps its lineage through head checks: its
    replicas get no state, and pushes made meanwhile land without a reconnect."""
    async with hubs(postgres_dsn, pg_schema, 1, head_check=0.01) as (hub,):
        async with connect(hub.url, CONVERSATION, client="early") as replica:
            lineage = hub._rooms.loaded[CONVERSATION].lineage
            with anyio.fail_after(bound(10)):
                for n in range(20):
                    await anyio.sleep(0.01)
                    assert hub._rooms.loaded[CONVERSATION].lineage == lineage
                    if n == 10:
                        replica.conversation.push(Message.user("first"))
                await replica.flush()
            events = replica.events_nowait()
            assert [type(e).__name__ for e in events if type(e).__name__ == "Reset"] == []
            assert replica.connects == 1
            assert texts(replica.conversation) == ["first"]


async def listeners(dsn: str, schema: str, terminate: bool = False) -> int:
    """How many sessions LISTEN on this schema's channel; end them all with `terminate`."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE query = $1", f'LISTEN "convsync:{schema}"'
        )
        if terminate:
            for row in rows:
                await conn.execute("SELECT pg_terminate_backend($1)", row["pid"])
        return len(rows)
    finally:
        await conn.close()


async def test_a_hub_whose_watch_dies_rechecks_its_rooms_and_watches_again(
    postgres_dsn: str, pg_schema: str
) -> None:
    """Hub A's listening connection is killed while it lags an append it was never told of:
    A re-reads its loaded rooms (its replica gets the record without any notice or periodic
    check) and listens again."""
    async with (
        hubs(postgres_dsn, pg_schema, 1, head_check=3600.0) as (a,),
        hubs(postgres_dsn, pg_schema, 1, notify=False) as (b,),
        connect(a.url, CONVERSATION, client="watcher") as watcher,
        connect(b.url, CONVERSATION, client="writer") as writer,
    ):
        with anyio.fail_after(bound(20)):
            writer.conversation.push(Message.user("unannounced"))
            await writer.flush()
            await anyio.sleep(0.1)
            assert watcher.revision == 0  # A was not told
            assert await listeners(postgres_dsn, pg_schema, terminate=True) == 2
            await watcher.wait_for(1)
            for _ in range(200):  # the hubs listen again (polled: no event to wait on)
                if await listeners(postgres_dsn, pg_schema) == 2:
                    break
                await anyio.sleep(0.05)
            else:
                raise AssertionError("the hubs did not listen again")
        assert texts(watcher.conversation) == ["unannounced"]


async def test_two_hubs_racing_give_one_winner_per_revision(
    postgres_dsn: str, pg_schema: str
) -> None:
    """Two writers on each of two hubs push as fast as they can: every acknowledged record is
    in the log exactly once, the log holds nothing else, and all four replicas equal it."""
    async with hubs(postgres_dsn, pg_schema, 2) as (a, b):
        acked: Counter[str] = Counter()
        async with contextlib.AsyncExitStack() as stack:
            replicas = []
            for k, hub in enumerate([a, b, a, b]):
                replica = connect(hub.url, CONVERSATION, client=f"racer{k}")
                replica.session.on_landed = lambda seq, records: acked.update(
                    digest(r) for r in records
                )
                replicas.append(await stack.enter_async_context(replica))

            async def write(replica: Replica) -> None:
                for n in range(25):
                    replica.conversation.push(Message.user(f"{replica.client} {n}"))
                    await anyio.sleep(0.001)
                await replica.flush()

            with anyio.fail_after(bound(60)):
                async with anyio.create_task_group() as group:
                    for replica in replicas:
                        group.start_soon(write, replica)
                log = await store_log(postgres_dsn, pg_schema)
                for replica in replicas:
                    await replica.wait_for(len(log))
        in_log = Counter(digest(decode_record(data)) for data in log)
        assert in_log == acked
        assert max(in_log.values()) == 1
        assert len(texts(folded(log))) == 100
        rejected = sum(a.metrics.pushes_rejected.values()) + sum(b.metrics.pushes_rejected.values())
        assert rejected > 0  # the hubs did race (else this test shows nothing)
        for replica in replicas:
            assert replica.conversation == folded(log)


async def test_a_lagging_hubs_rewrite_cannot_erase_acknowledged_records(
    postgres_dsn: str, pg_schema: str
) -> None:
    """Hub B has not heard of an append acknowledged on hub A (no notices, no head check in
    time): B's rewrite is refused with LogMoved, the record stays, B's replica gets it."""
    async with hubs(postgres_dsn, pg_schema, 2, notify=False, head_check=3600.0) as (a, b):
        async with (
            connect(a.url, CONVERSATION, client="writer") as writer,
            connect(b.url, CONVERSATION, client="watcher") as watcher,
        ):
            with anyio.fail_after(bound(10)):
                writer.conversation.push(Message.user("acknowledged on A"))
                await writer.flush()
                assert watcher.revision == 0  # B lags: it has not heard
                with pytest.raises(LogMoved):
                    await b.rewrite(CONVERSATION, Conversation.from_messages([]))
                await watcher.wait_for(1)
            assert texts(watcher.conversation) == ["acknowledged on A"]
            assert len(await store_log(postgres_dsn, pg_schema)) == 1


async def test_kill_9_of_one_hub_process_fails_its_replicas_over(
    postgres_dsn: str, pg_schema: str
) -> None:
    """Two hub processes on one database, four writers given both urls (half start on each);
    hub A gets SIGKILL mid-run: its writers fail over to B, every acknowledged record is in
    the log exactly once, the log holds nothing else, and every replica equals it."""
    db = f"{postgres_dsn}?schema={pg_schema}"
    processes = [HubProcess(db), HubProcess(db)]
    try:
        for process in processes:
            await anyio.to_thread.run_sync(process.start)
        acked: Counter[str] = Counter()
        async with contextlib.AsyncExitStack() as stack:
            replicas = []
            for k in range(4):
                urls = [processes[k % 2].url, processes[(k + 1) % 2].url]
                replica = Replica(urls, CONVERSATION, client=f"w{k}", backoff=0.02, max_backoff=0.2)
                replica.session.on_landed = lambda seq, records: acked.update(
                    digest(r) for r in records
                )
                replicas.append(await stack.enter_async_context(replica))

            async def write(replica: Replica) -> None:
                for n in range(40):
                    replica.conversation.push(Message.user(f"{replica.client} {n}"))
                    await anyio.sleep(0.005)
                await replica.flush()

            with anyio.fail_after(bound(60)):
                async with anyio.create_task_group() as group:
                    for replica in replicas:
                        group.start_soon(write, replica)
                    await anyio.sleep(0.1)
                    await anyio.to_thread.run_sync(processes[0].kill)
                log = await store_log(postgres_dsn, pg_schema)
                for replica in replicas:
                    await replica.wait_for(len(log))
            assert not processes[0].running
            for replica in replicas[0::2]:  # started on A: now on B
                assert replica.url.startswith(processes[1].url)
                assert replica.connects >= 2
        in_log = Counter(digest(decode_record(data)) for data in log)
        assert in_log == acked
        assert max(in_log.values()) == 1
        assert len(texts(folded(log))) == 160
        for replica in replicas:
            assert replica.conversation == folded(log)
    finally:
        for process in processes:
            process.stop()


def test_two_serve_processes_on_one_database_serve_one_conversation(
    postgres_dsn: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two `convsync serve --db postgresql://...` processes: a live `tail` on hub B shows what
    `send` pushed through hub A and through B; `send` given a dead url first uses the next."""
    db = f"{postgres_dsn}?schema={pg_schema}"
    first = Running("serve", "--db", db, "--port", "0")
    second = Running("serve", "--db", db, "--port", "0")
    watcher: Running | None = None
    try:
        url_a, url_b = first.url(), second.url()
        watcher = Running("tail", "shared", "--url", url_b)
        assert run(capsys, "send", "shared", "through A", "--url", url_a)[:2] == (0, "1\n")
        watcher.wait_for("through A")
        with socket.socket() as sock:  # a port nothing listens on
            sock.bind(("127.0.0.1", 0))
            dead = f"ws://127.0.0.1:{sock.getsockname()[1]}"
        code, out, err = run(capsys, "send", "shared", "through B", "--url", f"{dead},{url_b}")
        assert (code, out) == (0, "2\n"), err
        watcher.wait_for("through B")
    finally:
        for proc in (watcher, second, first):
            if proc is not None:
                code, err = proc.stop()
                assert code == 0, err


def test_a_hello_on_a_shared_store_reads_the_clients_mark_from_the_store() -> None:
    """On a shared store the room asks the store for the client's mark before the welcome;
    a mark ahead of the room's makes it fold the missing records first, so the welcome's
    `acked` and the catch-up agree."""
    room: RoomCore[str] = RoomCore("c", CoreConfig(max_frame=1 << 20, shared_store=True))
    lineage = Lineage.fresh()
    maker = Conversation()
    maker.push(Message.user("landed through another hub"))
    record = encode(maker.take_unsaved()[0])
    room.load(Loaded(lineage, 0, None, 0, [], {"x": ClientMark(1, 0, 0)}))
    actions = room.join("conn", Hello("x", lineage, 0, None))
    assert actions == [ReadMark("x")]
    actions = room.resume(ClientMark(2, 0, 1))  # pushed through another hub
    assert actions == [ReadRecords(lineage, 0)]
    actions = room.resume([record])
    sent = [decode_hub_message(a.frame) for a in actions if isinstance(a, Send)]
    assert sent[0] == Welcome(lineage, 1, 2, features=["hub_rebase"])
    assert room.revision == 1 and "conn" in room.subscribers
    catch_up = [m for m in sent if isinstance(m, Records)]
    assert [(m.from_, len(m.records)) for m in catch_up] == [(0, 1)]  # the acked record


def test_a_hello_on_an_unshared_store_trusts_the_room() -> None:
    """SQLite and memory stores keep the old path: no store read before the welcome."""
    room: RoomCore[str] = RoomCore("c", CoreConfig(max_frame=1 << 20))
    room.load(None)
    actions = room.join("conn", Hello("x", Lineage.EMPTY, 0, None))
    assert [type(a) for a in actions] == [Send]
    assert isinstance(decode_hub_message(actions[0].frame), Welcome)  # type: ignore[union-attr]


def test_a_replica_takes_several_urls_and_refuses_none() -> None:
    """`Replica([a, b])` starts on a and moves round robin; an empty list is a usage error."""
    replica = Replica(["ws://a:1", "ws://b:2/"], "c")
    assert replica.urls == ["ws://a:1/v1/conversations/c", "ws://b:2/v1/conversations/c"]
    assert replica.url == replica.urls[0]
    replica._fail_over()
    assert replica.url == replica.urls[1]
    replica._fail_over()
    assert replica.url == replica.urls[0]
    with pytest.raises(UsageError):
        Replica([], "c")


def test_the_url_option_takes_several_hubs_repeated_or_comma_separated() -> None:
    """`--url a --url b,c` names three hubs, in order; a bad one is a usage error."""
    parser = build_parser()
    args = parser.parse_args(["send", "c", "hi", "--url", "ws://a:1", "--url", "ws://b:2,ws://c:3"])
    assert args.url == ["ws://a:1", "ws://b:2", "ws://c:3"]
    with pytest.raises(CliError, match="not a ws:// or wss:// url"):
        parser.parse_args(["send", "c", "hi", "--url", "ws://a:1,http://b"])


async def test_a_summary_feed_on_one_hub_follows_pushes_made_through_another(
    postgres_dsn: str, pg_schema: str
) -> None:
    """With notices off, a dashboard on hub B sees each push made through hub A (brought by
    B's head checks) in its row, and B's list says the same."""
    import client

    async with hubs(postgres_dsn, pg_schema, 2, notify=False, head_check=0.05) as (a, b):
        async with (
            connect(a.url, CONVERSATION, client="writer") as writer,
            connect(b.url, CONVERSATION, client="watcher") as watcher,
        ):
            with anyio.fail_after(bound(20)):
                writer.conversation.push(Message.user("m0"))
                await writer.flush()
                await watcher.wait_for(writer.revision)
                async for window in client.summary(b.url, prefix=CONVERSATION):
                    row = window.rows[CONVERSATION]
                    if row["revision"] == 1 and len(writer.conversation) == 1:
                        writer.conversation.push(Message.user("m1 through hub a"))
                        await writer.flush()
                    if row["revision"] == 2:
                        assert row["last"]["text"] == "m1 through hub a"
                        break
            page = await client.list_conversations(b.url, prefix=CONVERSATION)
            assert page.rows[0]["revision"] == 2
