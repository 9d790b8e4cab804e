"""Turns end over real sockets (SPEC 10): a worker killed mid-turn (`kill -9` of a real
process) leaves a turn any hub ends `failed` once `turn_grace` passed, and the next worker
answers the request; a worker back within the grace continues its turn; of two hubs on one
PostgreSQL racing to end a lapsed turn, exactly one does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import anyio
from conftest import bound, hub_config

from client import Replica, connect
from server import Hub, MemoryStore
from server.store import Lease
from server.store.postgres import PostgresStore
from sync import (
    AsideChange,
    Assistant,
    Conversation,
    Message,
    Text,
    ToolCall,
    TurnEnd,
    User,
    decode_record,
)
from sync.entries import Answered, Failed
from sync.steer import WENT_AWAY

GRACE = 1.0  # turn_grace, lowered: a real hub's default is 30 s
ROOT = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from client import connect
    from sync import Assistant, Text, ToolCall

    async def main(url, conversation):
        async with connect(url, conversation, client="worker") as worker:
            worker.open_turn()
            worker.begin_step()
            worker.conversation.push(
                Assistant([Text("looking"), ToolCall("c1", "search", {"q": "x"})])
            )
            worker.end_step()
            await worker.flush()
            print("calling", flush=True)
            await asyncio.sleep(3600)  # the tool runs... until the process is killed

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def start_worker(url: str, conversation: str) -> subprocess.Popen[str]:
    """A worker process that opens a turn, calls a tool and waits in it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, url, conversation],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # bounded: the worker prints once it has flushed
    assert line.strip() == "calling", line
    return process


def kill(process: subprocess.Popen[str]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=bound(10))
    if process.stdout is not None:
        process.stdout.close()


async def until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    with anyio.fail_after(bound(seconds)):
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.01)


def last_end(replica: Replica) -> object:
    turns = replica.conversation.turns()
    return turns[-1][1].end if turns else None


async def answer(worker: Replica, text: str) -> None:
    """What a worker does with an owed request: a turn of its own, answered."""
    worker.open_turn()
    worker.begin_step()
    answer_id = worker.conversation.push(Message.assistant(text))
    worker.end_step()
    worker.conversation.end_turn(TurnEnd.answered(answer_id))
    with anyio.fail_after(bound(10)):
        await worker.flush()


async def test_a_worker_killed_mid_turn_leaves_a_turn_that_ends_failed_and_is_answered() -> None:
    """kill -9 of the worker while its tool runs: once `turn_grace` passed the hub ends the
    turn `failed` (even with no one subscribed: the room had unloaded), the call gets an
    error result, and a new worker answers the request."""
    config = hub_config(turn_grace=GRACE, stop_grace=GRACE)
    async with Hub(MemoryStore(), port=0, config=config) as hub:
        async with connect(hub.url, "killed", client="ui") as ui:
            ui.conversation.push(Message.user("find x"))
            with anyio.fail_after(bound(10)):
                await ui.flush()
        process = await anyio.to_thread.run_sync(start_worker, hub.url, "killed")
        kill(process)
        async with connect(hub.url, "killed", client="ui") as ui:
            await until(lambda: isinstance(last_end(ui), Failed))
            end = last_end(ui)
            assert isinstance(end, Failed) and end.why == WENT_AWAY
            result = ui.conversation.messages()[-1]
            assert isinstance(result, User) and result.tool_results()[0].is_error
            assert ui.conversation.awaits_model() and ui.conversation.halted() is None
            async with connect(hub.url, "killed", client="worker-2") as worker:
                assert worker.conversation.awaits_model()
                await answer(worker, "x is not found")
            await until(lambda: isinstance(last_end(ui), Answered))
            messages = ui.conversation.messages()
            assert messages[-1] == Message.assistant("x is not found")
            assert [index for _, index in _turn_indexes(ui)] == [0, 1]
            ui.conversation.validate()


def _turn_indexes(replica: Replica) -> list[tuple[str, int]]:
    return [(id_, record.index) for id_, record in replica.conversation.turns()]


async def test_a_worker_back_within_the_grace_continues_its_turn() -> None:
    """The worker process dies and comes back as the same client at once: its turn is still
    its own past `turn_grace`, and it ends the turn answered."""
    config = hub_config(turn_grace=GRACE, stop_grace=GRACE)
    async with (
        Hub(MemoryStore(), port=0, config=config) as hub,
        connect(hub.url, "back", client="ui") as ui,
    ):
        ui.conversation.push(Message.user("find x"))
        with anyio.fail_after(bound(10)):
            await ui.flush()
        process = await anyio.to_thread.run_sync(start_worker, hub.url, "back")
        kill(process)
        async with connect(hub.url, "back", client="worker") as worker:
            await anyio.sleep(3 * GRACE)  # three graces later the turn is still open
            assert last_end(worker) is None and len(worker.conversation) == 2
            worker.conversation.push(Message.tool_result("c1", "search", "found"))
            answer_id = worker.conversation.push(Message.assistant("x is found"))
            worker.conversation.end_turn(TurnEnd.answered(answer_id))
            with anyio.fail_after(bound(10)):
                await worker.flush()
        await until(lambda: isinstance(last_end(ui), Answered))
        assert len(ui.conversation.turns()) == 1
        ui.conversation.validate()
        assert ui.conversation.messages()[1] == Assistant(
            [Text("looking"), ToolCall("c1", "search", {"q": "x"})]
        )


async def test_of_two_hubs_on_postgresql_exactly_one_ends_a_lapsed_turn(
    postgres_dsn: str, pg_schema: str
) -> None:
    """The worker on hub A went away; hubs A and B end its lapsed turn at the same moment (a
    UI holds the room on each): one compare-and-append wins, the turn ends once, and both UIs
    see the same log."""
    config = hub_config(turn_grace=60.0)  # the hubs' own loops stay out of it
    async with contextlib.AsyncExitStack() as stack:
        first, second = [
            await stack.enter_async_context(
                Hub(PostgresStore(postgres_dsn, schema=pg_schema), config=config)
            )
            for _ in range(2)
        ]
        ui_a = await stack.enter_async_context(connect(first.url, "race", client="ui-a"))
        ui_b = await stack.enter_async_context(connect(second.url, "race", client="ui-b"))
        ui_b.conversation.push(Message.user("find x"))
        with anyio.fail_after(bound(10)):
            await ui_b.flush()
        async with connect(first.url, "race", client="worker") as worker:
            await until(worker.conversation.awaits_model)
            worker.open_turn()
            worker.conversation.push(Assistant([Text("looking"), ToolCall("c1", "s", {})]))
            with anyio.fail_after(bound(10)):
                await worker.flush()
        await until(lambda: ui_a.revision == ui_b.revision == 3)
        lapsed = Lease("race", 0, "worker", 0)  # what both hubs' stores would say by now
        async with anyio.create_task_group() as group:
            for hub in (first, second):
                group.start_soon(hub._rooms.loaded["race"].finish_expired, lapsed)
        async with PostgresStore(postgres_dsn, schema=pg_schema) as store:
            loaded = await store.load("race")
            assert loaded is not None
            records = [decode_record(data) for data in loaded.records]
            assert await store.leases_due(2**62) == []  # the lease went with the turn
        ends = [
            r
            for r in records
            if isinstance(r.change, AsideChange)
            and r.change.aside is not None
            and r.change.aside.kind == "rig.turn"
            and r.change.aside.value.get("end") is not None
        ]
        assert len(ends) == 1 and len(records) == 5  # ask, turn, call, results, end
        await until(lambda: ui_a.revision == ui_b.revision == 5)
        assert isinstance(last_end(ui_a), Failed)
        assert ui_a.conversation == ui_b.conversation
        ui_a.conversation.validate()


async def test_of_two_hubs_on_postgresql_ending_one_step_at_once_one_lands_the_queue(
    postgres_dsn: str, pg_schema: str
) -> None:
    """A frontend tool's call is pending and the user's message waits queued; a UI on hub A
    and one on hub B answer the call at the same moment. Each hub would land the queue with
    its answer: one append wins, so exactly one result and one copy of the message land,
    the message right after the result."""
    async with contextlib.AsyncExitStack() as stack:
        first, second = [
            await stack.enter_async_context(
                Hub(PostgresStore(postgres_dsn, schema=pg_schema), config=hub_config())
            )
            for _ in range(2)
        ]
        ui_a = await stack.enter_async_context(connect(first.url, "queue", client="ui-a"))
        ui_b = await stack.enter_async_context(connect(second.url, "queue", client="ui-b"))
        ui_a.conversation.push(Message.user("pick a date"))
        ui_a.conversation.push(Assistant([ToolCall("c1", "pick_date", {})]))
        with anyio.fail_after(bound(10)):
            await ui_a.flush()
        await until(lambda: ui_b.revision == ui_a.revision)
        ui_b.conversation.push(Message.user("and a time"))  # mid-step: queued
        with anyio.fail_after(bound(10)):
            await ui_b.flush()
        await until(lambda: ui_a.revision == ui_b.revision)
        for ui, day in ((ui_a, "monday"), (ui_b, "tuesday")):
            ui.conversation.push(Message.tool_result("c1", "pick_date", day))
        with anyio.fail_after(bound(20)):
            async with anyio.create_task_group() as group:
                group.start_soon(ui_a.flush)
                group.start_soon(ui_b.flush)
        async with PostgresStore(postgres_dsn, schema=pg_schema) as store:
            loaded = await store.load("queue")
            assert loaded is not None
            log = Conversation()
            for data in loaded.records:
                log.apply(decode_record(data))
        messages = log.messages()
        results = [m for m in messages if isinstance(m, User) and m.tool_results()]
        assert len(results) == 1 and messages.count(Message.user("and a time")) == 1
        assert messages[-1] == Message.user("and a time") and messages[-2] in results
        assert not [a for _, a in log.asides() if a.kind == "rig.queued"]
        await until(lambda: ui_a.revision == ui_b.revision == loaded.revision)
        assert ui_a.conversation == ui_b.conversation == log
