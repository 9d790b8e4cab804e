"""Approvals survive processes dying (SPEC 12): a worker killed with SIGKILL while it waits
gets the decision when it comes back, with no second card; a hub killed with SIGKILL keeps an
open approval, decided once after the restart; two hubs on PostgreSQL racing decisions let
one land."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from conftest import bound, hub_config
from hubprocess import HubProcess

from client import Conflict, Replica, connect
from server import Hub
from server.store import PostgresStore
from sync import Assistant, Message, Text, ToolCall

ROOT = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    from client import connect
    from sync import Assistant, Message, Text, ToolCall

    async def main(url, run):
        async with connect(url, "killed", client=f"worker-{run}", max_backoff=0.2) as worker:
            if run == "1":
                worker.conversation.push(Message.user("clean up"))
                worker.conversation.open_turn()
                worker.conversation.push(Assistant([Text("may I?"), ToolCall("c1", "rm", {})]))
                await worker.flush()
            print("asking", flush=True)
            decision = await worker.ask(call="c1", prompt="delete build/?")
            print(json.dumps({"state": decision.state, "cards": len(worker.approvals),
                              "by": decision.decided_by}), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.fixture
def hub_process(tmp_path: Path) -> Iterator[HubProcess]:
    process = HubProcess(tmp_path / "convsync.db")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def worker(url: str, run: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, url, run], stdout=subprocess.PIPE, text=True, env=env
    )


async def until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    with anyio.fail_after(bound(seconds)):
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.01)


def open_ids(replica: Replica) -> list[str]:
    return [id_ for id_, approval in replica.approvals.items() if approval.is_open]


async def test_a_worker_killed_while_it_waits_gets_the_decision_without_a_second_card(
    hub_process: HubProcess,
) -> None:
    """SIGKILL the waiting worker, decide meanwhile, start it again: its `ask` returns the
    decision at once and the conversation still holds one approval."""
    first = worker(hub_process.url, "1")
    try:
        async with connect(hub_process.url, "killed", client="ui") as ui:
            await until(lambda: len(open_ids(ui)) == 1, 20)
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=bound(10))
            (id_,) = open_ids(ui)
            ui.decide(id_, approve=True, reason="go ahead")
            with anyio.fail_after(bound(10)):
                await ui.flush()
            second = worker(hub_process.url, "2")
            try:
                out, _ = await anyio.to_thread.run_sync(
                    lambda: second.communicate(timeout=bound(30))
                )
            finally:
                if second.poll() is None:
                    second.kill()
            result = json.loads(out.splitlines()[-1])
            assert result == {"state": "approved", "cards": 1, "by": "anonymous"}
            assert len(ui.approvals) == 1
    finally:
        if first.poll() is None:
            first.kill()
        if first.stdout is not None:
            first.stdout.close()


async def test_an_open_approval_survives_kill_9_of_the_hub_and_is_decided_once(
    hub_process: HubProcess,
) -> None:
    """The approval is in the log: after the hub's SIGKILL and restart it is still open,
    the UIs decide it, one decision lands, the worker's `ask` returns it."""
    async with (
        connect(hub_process.url, "durable", client="worker", max_backoff=0.2) as w,
        connect(hub_process.url, "durable", client="ui-a", max_backoff=0.2) as a,
        connect(hub_process.url, "durable", client="ui-b", max_backoff=0.2) as b,
    ):
        w.conversation.push(Message.user("clean up"))
        w.conversation.open_turn()
        w.conversation.push(Assistant([Text("may I?"), ToolCall("c1", "rm", {})]))
        with anyio.fail_after(bound(10)):
            await w.flush()
        async with anyio.create_task_group() as group:
            decisions = []

            async def ask() -> None:
                decisions.append(await w.ask(call="c1"))

            group.start_soon(ask)
            await until(lambda: len(open_ids(a)) == 1 and len(open_ids(b)) == 1)
            hub_process.kill()
            await anyio.to_thread.run_sync(hub_process.start)
            state = await anyio.to_thread.run_sync(hub_process.state, "durable")
            asides = state["state"]["asides"]  # type: ignore[index]
            assert [x["value"]["state"] for x in asides if x["kind"] == "rig.approval"] == ["open"]
            await until(lambda: a.connected and b.connected, 20)
            (id_,) = open_ids(a)
            a.decide(id_, approve=True)
            b.decide(id_, approve=False)
            with anyio.fail_after(bound(20)):
                await a.flush()
                await b.flush()
        (decision,) = decisions
        for replica in (w, a, b):
            await until(lambda replica=replica: replica.approvals[id_].state == decision.state)
        conflicts = [e.reason for r in (a, b) for e in r.events_nowait() if isinstance(e, Conflict)]
        assert conflicts == ["decided"]
        state = await anyio.to_thread.run_sync(hub_process.state, "durable")
        asides = state["state"]["asides"]  # type: ignore[index]
        assert [x["value"]["state"] for x in asides if x["kind"] == "rig.approval"] == [
            decision.state
        ]


async def test_two_hubs_on_postgresql_racing_decisions_one_lands(
    postgres_dsn: str, pg_schema: str
) -> None:
    """A UI on each hub decides the same approval at once: the store takes one, the other
    hub answers `behind`, its replica rebases into a `Conflict(decided)`."""
    async with contextlib.AsyncExitStack() as stack:
        hubs = []
        for _ in range(2):
            store = PostgresStore(postgres_dsn, schema=pg_schema)
            hubs.append(await stack.enter_async_context(Hub(store, config=hub_config())))
        w = await stack.enter_async_context(connect(hubs[0].url, "pg", client="worker"))
        a = await stack.enter_async_context(connect(hubs[0].url, "pg", client="ui-a"))
        b = await stack.enter_async_context(connect(hubs[1].url, "pg", client="ui-b"))
        w.conversation.push(Message.user("clean up"))
        w.conversation.open_turn()
        w.conversation.push(Assistant([Text("may I?"), ToolCall("c1", "rm", {})]))
        with anyio.fail_after(bound(10)):
            await w.flush()
        async with anyio.create_task_group() as group:
            decisions = []

            async def ask() -> None:
                decisions.append(await w.ask(call="c1"))

            group.start_soon(ask)
            await until(lambda: len(open_ids(a)) == 1 and len(open_ids(b)) == 1)
            (id_,) = open_ids(a)
            a.decide(id_, approve=True)
            b.decide(id_, approve=False)
            with anyio.fail_after(bound(20)):
                await a.flush()
                await b.flush()
        (decision,) = decisions
        for replica in (w, a, b):
            await until(lambda replica=replica: replica.approvals[id_].state == decision.state)
        conflicts = [e.reason for r in (a, b) for e in r.events_nowait() if isinstance(e, Conflict)]
        assert conflicts == ["decided"]
        async with PostgresStore(postgres_dsn, schema=pg_schema) as store:
            loaded = await store.load("pg")
            assert loaded is not None
            records = await store.read("pg", loaded.lineage, 0)
        approvals = [r for r in records or [] if b'"rig.approval"' in r]
        assert len(approvals) == 2  # the ask and one decision
