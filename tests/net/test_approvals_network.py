"""A person in the loop over real websockets on 127.0.0.1 (SPEC 12): a worker asks, a UI
decides, the worker unblocks; two UIs race; frontend tools; tokens with `approve`."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable

import anyio
import pytest
from conftest import bound, hub_config

from client import ApprovalAsked, ApprovalDecided, Conflict, Replica, connect
from server import Hub, MemoryStore
from sync import Assistant, Message, Text, ToolCall
from sync.errors import UsageError

CALL = Assistant([Text("may I?"), ToolCall("c1", "delete", {"path": "build/"})])


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    async with Hub(MemoryStore(), port=0, config=hub_config()) as running:
        yield running


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """Wait, bounded, until `check()` holds."""
    with anyio.fail_after(bound(seconds)):
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def in_turn(worker: Replica, *calls: ToolCall) -> None:
    """The worker opened a turn for a request and made `calls`."""
    worker.conversation.push(Message.user("clean up"))
    worker.conversation.open_turn()
    worker.conversation.push(Assistant([Text("may I?"), *calls]))
    with anyio.fail_after(bound(10)):
        await worker.flush()


def open_ids(replica: Replica) -> list[str]:
    return [id_ for id_, approval in replica.approvals.items() if approval.is_open]


async def test_the_worker_asks_a_ui_approves_and_the_worker_unblocks(hub: Hub) -> None:
    """`ask` returns the UI's decision, with who made it and why."""
    async with (
        connect(hub.url, "ask", client="worker") as worker,
        connect(hub.url, "ask", client="ui") as ui,
    ):
        await in_turn(worker, ToolCall("c1", "delete", {"path": "build/"}))
        async with anyio.create_task_group() as group:
            decisions = []

            async def ask() -> None:
                decisions.append(await worker.ask(call="c1", prompt="delete build/?"))

            group.start_soon(ask)
            await until(lambda: len(open_ids(ui)) == 1)
            (id_,) = open_ids(ui)
            assert ui.approvals[id_].prompt == "delete build/?"
            ui.decide(id_, approve=True, reason="it is only build output")
            with anyio.fail_after(bound(10)):
                await ui.flush()
        (decision,) = decisions
        assert decision.state == "approved" and decision.reason == "it is only build output"
        assert decision.decided_by == "anonymous"
        events = ui.events_nowait()
        assert any(isinstance(e, ApprovalAsked) for e in events)
        assert any(isinstance(e, ApprovalDecided) for e in worker.events_nowait())
        # Asking again for the same call returns the decision at once: no second card.
        again = await worker.ask(call="c1", prompt="delete build/?")
        assert again == decision and len(worker.approvals) == 1


async def test_the_asking_worker_cannot_decide_its_own_approval(hub: Hub) -> None:
    """Without auth every socket may decide, except the client that asked."""
    async with connect(hub.url, "self", client="worker") as worker:
        await in_turn(worker, ToolCall("c1", "delete", {}))
        with anyio.move_on_after(bound(0.3)):
            await worker.ask(call="c1")  # waits: nobody decides
        (id_,) = open_ids(worker)
        worker.decide(id_, approve=True)
        with anyio.fail_after(bound(10)):
            await worker.flush()
        conflicts = [e for e in worker.events_nowait() if isinstance(e, Conflict)]
        assert [c.reason for c in conflicts] == ["forbidden"]
        assert open_ids(worker) == [id_]


async def test_two_uis_race_to_decide_one_decision_stands_everywhere(hub: Hub) -> None:
    """Approve and Deny at the same moment: one lands, the other is a `Conflict(decided)`,
    and all three replicas hold the same decision."""
    async with (
        connect(hub.url, "race", client="worker") as worker,
        connect(hub.url, "race", client="ui-a") as a,
        connect(hub.url, "race", client="ui-b") as b,
    ):
        await in_turn(worker, ToolCall("c1", "delete", {}))
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(worker.ask, call="c1"))
            await until(lambda: len(open_ids(a)) == 1 and len(open_ids(b)) == 1)
            (id_,) = open_ids(a)
            a.decide(id_, approve=True)
            b.decide(id_, approve=False)
            with anyio.fail_after(bound(10)):
                await a.flush()
                await b.flush()
        states = {r.approvals[id_].state for r in (worker, a, b)}
        assert len(states) == 1 and states <= {"approved", "denied"}
        reasons = [e.reason for r in (a, b) for e in r.events_nowait() if isinstance(e, Conflict)]
        assert reasons == ["decided"]


async def test_a_question_with_a_schema_gets_an_answer_it_allows(hub: Hub) -> None:
    """A question is answered with a value; a wrong one is refused before it is sent."""
    schema = {"type": "string", "enum": ["ops", "dev"]}
    async with (
        connect(hub.url, "question", client="worker") as worker,
        connect(hub.url, "question", client="ui") as ui,
    ):
        await in_turn(worker)
        async with anyio.create_task_group() as group:
            answers = []

            async def ask() -> None:
                answers.append(
                    await worker.ask(key="account", prompt="which account?", schema=schema)
                )

            group.start_soon(ask)
            await until(lambda: len(open_ids(ui)) == 1)
            (id_,) = open_ids(ui)
            with pytest.raises(UsageError):
                ui.decide(id_, answer="prod")
            ui.decide(id_, answer="ops")
        assert answers[0].state == "answered" and answers[0].answer == "ops"


async def test_ask_with_a_timeout_cancels_its_approval(hub: Hub) -> None:
    """No decision in time: `TimeoutError`, and the card is cancelled for everyone."""
    async with (
        connect(hub.url, "timeout", client="worker") as worker,
        connect(hub.url, "timeout", client="ui") as ui,
    ):
        await in_turn(worker, ToolCall("c1", "delete", {}))
        with pytest.raises(TimeoutError):
            await worker.ask(call="c1", timeout=bound(0.2))
        with anyio.fail_after(bound(10)):
            await worker.flush()
        await until(lambda: [a.state for a in ui.approvals.values()] == ["cancelled"])


async def test_two_uis_race_to_answer_a_frontend_tool_call_one_result_lands(hub: Hub) -> None:
    """The worker awaits `result(call_id)`; two UIs push a result: exactly one lands and the
    worker gets it."""
    async with (
        connect(hub.url, "frontend", client="worker") as worker,
        connect(hub.url, "frontend", client="ui-a") as a,
        connect(hub.url, "frontend", client="ui-b") as b,
    ):
        worker.set_frontend_tools(["pick_file"])
        await in_turn(worker, ToolCall("f1", "pick_file", {}))
        await until(lambda: len(a.conversation) == 2 and len(b.conversation) == 2)
        async with anyio.create_task_group() as group:
            results = []

            async def wait() -> None:
                results.append(await worker.result("f1"))

            group.start_soon(wait)
            a.conversation.push(Message.tool_result("f1", "pick_file", "a.txt"))
            b.conversation.push(Message.tool_result("f1", "pick_file", "b.txt"))
            with anyio.fail_after(bound(10)):
                await a.flush()
                await b.flush()
        (result,) = results
        landed = [r for m in worker.conversation.messages()[2:] for r in m.tool_results()]  # type: ignore[union-attr]
        assert len(landed) == 1 and landed[0] == result
        for replica in (a, b):
            await until(lambda replica=replica: replica.conversation == worker.conversation)


async def test_an_exported_conversation_with_decided_approvals_imports_as_it_was(
    hub: Hub,
) -> None:
    """History goes back in: an ended turn's decided approval is let in by an import (no one
    can wait on it), so export then import round-trips; an open turn's is still forged."""
    from client import fetch_conversation, import_conversation
    from sync import Conversation, TurnEnd, encode
    from sync import approvals as ap

    source = Conversation()
    source.push(Message.user("clean up"))
    source.open_turn()
    answer = source.push(CALL)
    id_, _, _ = ap.ask(source, key="c1", call="c1", asked_by="w", asked_client="w")
    ap.decide(source, id_, approve=True, decided_by="alice", at=5, reason="fine")
    source.push(Message.tool_result("c1", "delete", "done"))
    source.end_turn(TurnEnd.answered(answer))
    await import_conversation(hub.url, encode(source), "imported")
    fetched = await fetch_conversation(hub.url, "imported")
    assert fetched.conversation == source.view()
    held = ap.approval_of(fetched.conversation.aside(id_))
    assert held is not None and (held.state, held.decided_by) == ("approved", "alice")
