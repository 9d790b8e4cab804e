"""Steering a running agent over real websockets on 127.0.0.1 (SPEC 10): a message sent while
a tool runs, Stop while a tool runs, a steer sent mid-answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anyio
import pytest
from conftest import bound, hub_config
from fakeprovider import anthropic_stream
from faultproxy import FaultProxy

from client import Replica, connect
from server import Hub, MemoryStore
from sync import Aside, Assistant, Halt, Message, Push, Stop, Text, ToolCall, User
from sync.entries import Stopped, is_stopped_note
from sync.steer import QUEUED_KIND, STEP_KIND, STOP_KIND, STOPPED_RESULT, SUPERSEDED, finish_stopped

CALL = Assistant([Text("looking"), ToolCall("c1", "search", {"q": "x"})])
RESULT = Message.tool_result("c1", "search", "found")


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    async with Hub(MemoryStore(), port=0, config=hub_config()) as running:
        yield running


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """Wait, bounded, until `check()` holds (a UI's redraw loop polls its state the same way)."""
    with anyio.fail_after(bound(seconds)):
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.005)


def texts(replica: Replica) -> list[str]:
    return [
        "".join(p.text for p in m.content if isinstance(p, Text))
        for m in replica.conversation.messages()
        if isinstance(m, User | Assistant)
    ]


def queued(replica: Replica) -> int:
    return sum(aside.kind == QUEUED_KIND for _, aside in replica.conversation.asides())


async def asked(ui: Replica, worker: Replica, text: str) -> None:
    """The user asks `text`; the worker sees it."""
    ui.conversation.push(Message.user(text))
    with anyio.fail_after(bound(10)):
        await ui.flush()
    await until(worker.conversation.awaits_model)


async def test_a_message_sent_while_a_tool_runs_lands_after_its_result_and_is_answered(
    hub: Hub,
) -> None:
    async with (
        connect(hub.url, "tool", client="worker") as worker,
        connect(hub.url, "tool", client="ui") as ui,
    ):
        await asked(ui, worker, "find x")
        worker.begin_step()
        worker.conversation.push(CALL)
        worker.end_step()
        with anyio.fail_after(bound(10)):
            await worker.flush()
        await until(lambda: len(ui.conversation) == 2)
        # The tool runs; the user types meanwhile.
        ui.conversation.push(Message.user("also y"))
        with anyio.fail_after(bound(10)):
            await ui.flush()
        assert texts(ui) == ["find x", "looking"] and queued(ui) == 1
        await until(lambda: queued(worker) == 1)
        # The tool's result lands, then the message; the worker holds both once flushed.
        worker.conversation.push(RESULT)
        with anyio.fail_after(bound(10)):
            await worker.flush()
        assert texts(worker) == ["find x", "looking", "", "also y"]
        assert worker.conversation.awaits_model() and queued(worker) == 0
        worker.begin_step()
        worker.conversation.push(Message.assistant("x is found; y too"))
        worker.end_step()
        with anyio.fail_after(bound(10)):
            await worker.flush()
        await until(lambda: len(ui.conversation) == 5)
        assert texts(ui) == ["find x", "looking", "", "also y", "x is found; y too"]
        ui.conversation.validate()
        assert ui.conversation == worker.conversation


async def test_stop_while_a_tool_runs_cancels_it_and_ends_the_turn_stopped(hub: Hub) -> None:
    async with (
        connect(hub.url, "stop", client="worker") as worker,
        connect(hub.url, "stop", client="ui") as ui,
    ):
        await asked(ui, worker, "find x")
        worker.conversation.open_turn()
        worker.begin_step()
        worker.conversation.push(CALL)
        worker.end_step()
        with anyio.fail_after(bound(10)):
            await worker.flush()
        await until(lambda: len(ui.conversation) == 2 and bool(ui.conversation.turns()))
        cancelled = anyio.Event()
        started = anyio.Event()

        async def run_tool() -> None:
            with worker.cancel_on_stop() as scope:
                started.set()
                await anyio.sleep(bound(30))  # a slow tool: only the stop ends it
            if scope.cancelled_caught:
                cancelled.set()

        async with anyio.create_task_group() as group:
            group.start_soon(run_tool)
            await started.wait()
            assert ui.stop()
            ui.conversation.push(Message.user("next, please"))  # typed after Stop
            with anyio.fail_after(bound(10)):
                await ui.flush()
                await cancelled.wait()  # within the round trip that brought the stop
        assert queued(ui) == 1  # a stop stands: input waits for it
        assert finish_stopped(worker.conversation)
        with anyio.fail_after(bound(10)):
            await worker.flush()
        await until(lambda: len(ui.conversation) == 5)
        conversation = ui.conversation
        messages = conversation.messages()
        result = messages[2]
        assert isinstance(result, User) and result.tool_results()[0].is_error
        assert STOPPED_RESULT in str(result.tool_results()[0])
        # The STOPPED note, then the input typed after Stop, which the model now owes.
        note = conversation.entry(3)
        assert note is not None and is_stopped_note(note.message, note.author)
        assert texts(ui)[4] == "next, please" and conversation.awaits_model()
        assert isinstance(conversation.turns()[-1][1].end, Stopped)
        assert not any(aside.kind in (STOP_KIND, QUEUED_KIND) for _, aside in conversation.asides())
        conversation.validate()
        assert conversation.halted() is None  # the new input cleared the halt
        assert worker.conversation == conversation


async def test_a_steer_sent_mid_answer_lands_after_the_answer_and_is_answered(hub: Hub) -> None:
    async with (
        connect(hub.url, "steer", client="worker", draft_interval=0.01) as worker,
        connect(hub.url, "steer", client="ui") as ui,
    ):
        await asked(ui, worker, "write a poem")
        worker.begin_step()  # the model call begins; the draft's commit ends it
        async with worker.draft() as d:
            d.append("Roses are red")
            with anyio.fail_after(bound(10)):
                await worker.flush()
            ui.conversation.push(Message.user("make it about the sea"))
            with anyio.fail_after(bound(10)):
                await ui.flush()
            assert queued(ui) == 1 and len(ui.conversation) == 1
            await d.commit(Message.assistant("Roses are red"))
        with anyio.fail_after(bound(10)):
            await worker.flush()
        # The answer landed first, the steer after it, in the worker's hands at its flush.
        assert texts(worker) == ["write a poem", "Roses are red", "make it about the sea"]
        assert worker.conversation.awaits_model()
        worker.begin_step()
        async with worker.draft() as d:
            await d.commit(Message.assistant("The sea is blue"))
        with anyio.fail_after(bound(10)):
            await worker.flush()
        await until(lambda: len(ui.conversation) == 4)
        assert texts(ui)[-2:] == ["make it about the sea", "The sea is blue"]
        assert ui.conversation == worker.conversation
        assert ui.conversation.halted() is not Halt.STOPPED


async def test_an_answer_refused_superseded_is_kept_aborted_and_the_model_called_again(
    hub: Hub,
) -> None:
    """The reply went out before a new request landed (its push still on the way): the hub
    refuses it `superseded`; `answer()` keeps it as an aborted message and calls the model
    again, which sees the new request and answers it."""
    async with (
        FaultProxy(hub.url) as proxy,
        connect(proxy.url, "sup", client="worker", draft_interval=0.01) as worker,
        connect(hub.url, "sup", client="ui") as ui,
    ):
        await asked(ui, worker, "first question")
        proxy.delay = 0.5  # each frame of the worker's link takes half a second
        worker.conversation.add_aside(Aside.note("n", "busy", None))  # a push in flight
        seen: list[list[str]] = []

        def call_model() -> list[dict[str, object]]:
            seen.append(texts(worker))
            if len(seen) == 2:
                proxy.delay = 0.0
            return anthropic_stream([{"type": "text", "text": f"answer {len(seen)}"}])

        async with anyio.create_task_group() as group:
            group.start_soon(lambda: worker.answer(call_model, format="anthropic"))
            # Once the reply's push is on its way, a new request lands before it.
            await until(lambda: _sending_a_reply(worker), 10)
            ui.conversation.push(Message.user("second question"))
            with anyio.fail_after(bound(10)):
                await ui.flush()
        with anyio.fail_after(bound(20)):
            await worker.flush()
        assert "superseded" in hub.metrics.pushes_rejected
        assert seen[0] == ["first question"] and "second question" in seen[1]
        await until(lambda: ui.revision == worker.revision)
        messages = ui.conversation.messages()
        assert isinstance(messages[-1], Assistant) and texts(ui)[-1] == "answer 2"
        assert messages[-1].stop == Stop("stop")  # a reply the next model call reads
        kept = [m for m in messages if isinstance(m, Assistant) and m.stop == SUPERSEDED]
        assert [texts_of(m) for m in kept] == ["answer 1"]
        assert ui.conversation == worker.conversation


def _sending_a_reply(worker: Replica) -> bool:
    batch = worker.session._inflight
    return batch is not None and any(
        type(record.change) is Push
        and any(isinstance(entry.message, Assistant) for entry in record.change.entries)
        for record in batch.records
    )


def texts_of(message: Assistant) -> str:
    return "".join(p.text for p in message.content if isinstance(p, Text))


async def test_a_draft_marks_the_step_so_a_steer_waits_for_the_answer(hub: Hub) -> None:
    """No `begin_step()`: opening the draft puts the step marker, so a steer typed while it
    streams is queued and lands after the answer; the commit removes the marker."""
    async with (
        connect(hub.url, "marked", client="worker", draft_interval=0.01) as worker,
        connect(hub.url, "marked", client="ui") as ui,
    ):
        await asked(ui, worker, "write a poem")
        async with worker.draft() as d:
            d.append("Roses are red")
            with anyio.fail_after(bound(10)):
                await worker.flush()
            assert any(aside.kind == STEP_KIND for _, aside in ui.conversation.asides())
            ui.conversation.push(Message.user("make it about the sea"))
            with anyio.fail_after(bound(10)):
                await ui.flush()
            assert queued(ui) == 1
            await d.commit(Message.assistant("Roses are red"))
        with anyio.fail_after(bound(10)):
            await worker.flush()
        assert texts(worker) == ["write a poem", "Roses are red", "make it about the sea"]
        assert not any(aside.kind == STEP_KIND for _, aside in worker.conversation.asides())


async def test_stop_mid_answer_keeps_the_partial_as_an_aborted_message_in_every_ui(
    hub: Hub,
) -> None:
    """Issue 26: Stop pressed in one UI while the answer streams: the draft is marked
    `stopping` (no more appends), the worker finishes the turn with what it streamed, and
    every UI, the one that stopped and one that only watched, holds the partial text as an
    aborted message (`Stop("aborted", "stopped")`), then the halt, the turn ended `stopped`."""
    async with (
        connect(hub.url, "stop-mid", client="worker", draft_interval=0.01) as worker,
        connect(hub.url, "stop-mid", client="ui") as ui,
        connect(hub.url, "stop-mid", client="watcher") as watcher,
    ):
        await asked(ui, worker, "write a poem")
        worker.open_turn()
        worker.begin_step()
        async with worker.draft() as d:
            d.append("Roses are red, ")
            await until(lambda: any(x.text for x in ui.drafts.values()))
            assert ui.stop()
            with anyio.fail_after(bound(10)):
                await ui.flush()
            await until(lambda: d.status is not None)  # the hub marked it stopping
            d.append("violets are")  # too late: nothing more goes out
            partial = d.text
        assert partial == "Roses are red, "
        assert worker.stop_requested()
        assert finish_stopped(worker.conversation, partial)
        with anyio.fail_after(bound(10)):
            await worker.flush()
        kept = Assistant([Text("Roses are red, ")], Stop("aborted", "stopped"))
        for replica in (ui, watcher):
            await until(lambda r=replica: r.conversation == worker.conversation)
            messages = replica.conversation.messages()
            assert kept in messages, messages
            assert replica.conversation.halted() is Halt.STOPPED
            assert replica.conversation.turns()[-1][1].end is not None
            assert not replica.drafts
