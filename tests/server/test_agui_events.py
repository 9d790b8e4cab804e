"""The pure AG-UI mapping (server/agui_events.py): a conversation's state to AG-UI events,
checked by `ag_ui.core`'s models and by `@ag-ui/client`'s own schemas, verifier and
accumulation (tests/support/agui_apply.mjs)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from ag_ui.core import BaseEvent, Event, ResumeEntry, ToolMessage, UserMessage
from aguiclient import apply_runs
from pydantic import TypeAdapter

from server.agui_events import (
    ResumeError,
    Run,
    history,
    resume_decisions,
    sent_messages,
    tool_results,
)
from server.kitstate import SentReading, read_sent
from sync import (
    Aside,
    Assistant,
    Author,
    Conversation,
    Entry,
    Message,
    Reasoning,
    Stop,
    Text,
    ToolCall,
    TurnEnd,
    User,
)
from sync import approvals as approvals_
from sync.ids import IdMinter

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)
MINT = IdMinter()  # a producer's draft ids, as a worker mints them


@dataclass
class Draft:
    parts: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)


def wire(events: list[BaseEvent]) -> list[dict[str, Any]]:
    """The events as the stream carries them, each parsed back by `ag_ui.core`'s models."""
    out = []
    for event in events:
        data = json.loads(event.model_dump_json(by_alias=True))
        assert EVENTS.validate_python(data).type == event.type
        out.append(data)
    return out


def snapshot(conversation: Conversation) -> list[dict[str, Any]]:
    return [json.loads(m.model_dump_json(by_alias=True)) for m in history(conversation)]


class Script:
    """A worker's turn played step by step, with every state a run may be fed."""

    def __init__(self) -> None:
        self.c = Conversation()
        self.c.push(Entry(Message.user("weather in Paris?")))
        self.c.open_turn()
        self.draft_id = MINT.message_id()
        self.drafts: dict[str, Draft] = {}

    def steps(self) -> None:
        """Play the whole turn."""
        for _ in _lazy(self):
            pass


def record(*attach_at: int) -> tuple[list[list[BaseEvent]], Conversation]:
    """The events of runs on one script, each attached at a state (0: the user's message
    in and the turn open, nothing drafted yet; k: after k steps), fed every state after."""
    script = Script()
    runs = [Run("t", f"r{i}", expect_turn=at == 0) for i, at in enumerate(attach_at)]
    events: list[list[BaseEvent]] = [[] for _ in runs]
    step = 0
    for _ in itertools.chain([None], _lazy(script)):  # lazily: each state in turn
        for run, at, out in zip(runs, attach_at, events, strict=True):
            if step == at:
                out += run.begin(script.c, script.drafts)
            elif step > at:
                out += run.update(script.c, script.drafts)
        step += 1
    assert all(run.finished for run in runs)
    return events, script.c


def _lazy(script: Script) -> Any:
    """The turn, one state change per step: reasoning, text and a call drafted in pieces, the
    call committed, its result, the answer drafted and committed, the turn ended."""
    d = Draft()
    script.drafts[script.draft_id] = d
    for piece in ("Let me ", "look it up."):
        d.parts["reasoning"] = d.parts.get("reasoning", "") + piece
        yield
    for piece in ("Checking ", "the weather."):
        d.parts["text"] = d.parts.get("text", "") + piece
        yield
    d.names["call:c1"] = "weather"
    for piece in ('{"city":', ' "Paris"}'):
        d.parts["call:c1"] = d.parts.get("call:c1", "") + piece
        yield
    del script.drafts[script.draft_id]
    script.c.push(
        Entry(
            Assistant(
                [
                    Reasoning("Let me look it up."),
                    Text("Checking the weather."),
                    ToolCall("c1", "weather", {"city": "Paris"}),
                ],
                stop=Stop("tool_use"),
            ),
            id=script.draft_id,
        )
    )
    yield
    script.c.push(Entry(Message.tool_result("c1", "weather", "18C, sunny")))
    yield
    answer = MINT.message_id()
    d2 = Draft()
    script.drafts[answer] = d2
    for piece in ("It is ", "18C and ", "sunny."):
        d2.parts["text"] = d2.parts.get("text", "") + piece
        yield
    del script.drafts[answer]
    script.c.push(Entry(Message.assistant("It is 18C and sunny."), id=answer))
    script.c.end_turn(TurnEnd.answered(answer))
    yield


def types(events: list[BaseEvent]) -> list[str]:
    return [str(e.type.value) for e in events]


def test_a_turn_streams_as_events_the_client_accepts_and_ends_with_the_log() -> None:
    """A turn (reasoning, text, a tool call, its result, an answer) gives events that pass
    `ag_ui.core`'s models and the client's verifier; the client ends holding the log's
    history, ids being the entries' ids, with no corrective snapshot needed."""
    [events], conversation = record(0)
    names = types(events)
    assert names[:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"]
    assert names[-1] == "RUN_FINISHED" and names.count("MESSAGES_SNAPSHOT") == 1
    for kind in ("REASONING_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT", "TOOL_CALL_ARGS"):
        assert names.count(kind) >= 2, kind  # streamed in pieces, not at the end
    assert "TOOL_CALL_RESULT" in names
    out = apply_runs([wire(events)])
    assert out["error"] is None, out
    assert out["messages"] == snapshot(conversation)
    ids = [m["id"] for m in out["messages"]]
    assert ids[0] == conversation.id(0) and conversation.id(1) in ids
    assert not [w for w in out["warnings"] if "ag-ui" in w or "No message" in w], out["warnings"]


@pytest.mark.parametrize("attach_at", [1, 3, 5, 7, 8, 10, 12])
def test_a_run_attached_mid_turn_ends_with_exactly_the_uncut_clients_messages(
    attach_at: int,
) -> None:
    """A client that attaches at any point of the turn (a reload, a second tab) gets the
    history, the draft so far and the rest, and ends with the uncut client's messages."""
    [uncut, late], conversation = record(0, attach_at)
    assert types(late).count("MESSAGES_SNAPSHOT") == 1  # streamed exactly, not corrected
    whole = apply_runs([wire(uncut)])
    joined = apply_runs([wire(late)])
    assert joined["error"] is None, joined
    assert joined["messages"] == whole["messages"] == snapshot(conversation)


def test_the_text_streamed_is_every_character_once() -> None:
    """Across a reattach, the text deltas the late run sends are the draft so far and the
    rest: nothing lost, nothing twice."""
    [late], _ = record(10)  # mid-answer: "It is 18C and " drafted
    answer = "".join(
        e.delta  # type: ignore[attr-defined]
        for e in late
        if str(e.type.value) == "TEXT_MESSAGE_CONTENT"
    )
    assert answer == "It is 18C and sunny."


def test_an_open_approval_ends_the_run_with_an_interrupt_named_by_its_aside() -> None:
    """An approval opened in the turn ends the run with `RUN_FINISHED`, outcome
    `interrupt`, the interrupt's id the approval's aside id, every message closed first."""
    c = Conversation()
    c.push(Entry(Message.user("delete it")))
    c.open_turn()
    run = Run("t", "r", expect_turn=True)
    events = run.begin(c, {})
    draft_id = MINT.message_id()
    drafts = {draft_id: Draft({"text": "I will delete"})}
    events += run.update(c, drafts)
    c.push(
        Entry(
            Assistant([Text("I will delete it."), ToolCall("k1", "rm", {"path": "/x"})]),
            id=draft_id,
        )
    )
    aside, _, _ = approvals_.ask(
        c, key="k1", asked_by="anonymous", asked_client="w", call="k1", prompt="Delete /x?"
    )
    events += run.update(c, {})
    assert run.finished
    data = wire(events)
    last = data[-1]
    assert last["type"] == "RUN_FINISHED"
    assert last["outcome"]["type"] == "interrupt"
    [interrupt] = last["outcome"]["interrupts"]
    assert interrupt == {
        "id": aside,
        "reason": "tool_approval",
        "message": "Delete /x?",
        "toolCallId": "k1",
    }
    out = apply_runs([data])
    assert out["error"] is None, out
    assert out["messages"] == snapshot(c)


def test_a_draft_open_when_the_turn_is_stopped_is_closed_and_the_run_cancelled() -> None:
    """A stop ends the run with the `cancelled` outcome; a draft that never committed still
    gets its `*_END`, and a closing snapshot takes its text out of the client."""
    c = Conversation()
    c.push(Entry(Message.user("write a poem")))
    c.open_turn()
    run = Run("t", "r", expect_turn=True)
    drafts = {MINT.message_id(): Draft({"text": "Roses", "reasoning": "hmm"})}
    events = run.begin(c, drafts)
    c.end_turn(TurnEnd.stopped())
    events += run.update(c, drafts)  # the turn ends while the (stopping) draft still shows
    data = wire(events)
    assert [d["type"] for d in data][-5:] == [
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TEXT_MESSAGE_END",
        "MESSAGES_SNAPSHOT",
        "RUN_FINISHED",
    ]
    assert data[-1]["outcome"] == {"type": "cancelled"}
    out = apply_runs([data])
    assert out["error"] is None, out
    # the aborted text is gone; the client keeps reasoning a snapshot without any leaves out
    # (its rule for producers that do not replay reasoning), so only that stays
    assert [m["id"] for m in out["messages"] if m["role"] != "reasoning"] == [c.id(0)]


def test_a_failed_turn_ends_the_run_with_run_error() -> None:
    """A turn that fails gives `RUN_ERROR` with its reason."""
    c = Conversation()
    c.push(Entry(Message.user("hi")))
    c.open_turn()
    run = Run("t", "r", expect_turn=True)
    events = run.begin(c, {})
    assert not run.finished
    c.end_turn(TurnEnd.failed("the worker went away"))
    events += run.update(c, {})
    data = wire(events)
    assert data[-1] == {
        "type": "RUN_ERROR",
        "message": "the worker went away",
        "code": "turn_failed",
    }
    assert run.update(c, {}) == []


def test_a_reattach_to_an_idle_conversation_shows_the_history_and_finishes() -> None:
    """A run that pushed nothing and finds no turn running finishes at once, after the
    history (a reload's view)."""
    script = Script()
    script.steps()
    run = Run("t", "r", expect_turn=False)
    events = run.begin(script.c, {})
    assert types(events) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    out = apply_runs([wire(events)])
    assert out["messages"] == snapshot(script.c)


def test_a_pushed_message_waits_for_the_turn_that_answers_it() -> None:
    """A run whose message awaits a model stays open until a worker's turn opens and ends."""
    c = Conversation()
    c.push(Entry(Message.user("hi")))
    run = Run("t", "r", expect_turn=True)
    run.begin(c, {})
    assert not run.finished
    c.open_turn()
    assert run.update(c, {}) == [] and not run.finished
    answer = MINT.message_id()
    c.push(Entry(Message.assistant("hello"), id=answer))
    c.end_turn(TurnEnd.answered(answer))
    names = types(run.update(c, {}))
    assert names == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]


def test_frontend_calls_end_the_run_with_their_ids_pending() -> None:
    """A turn waiting only for a UI's tool ends the run as success with
    `pendingToolCallIds`, for the client to answer in its next run."""
    c = Conversation()
    c.add_aside(Aside("rig.tools", None, Author.rig(), {"tools": ["pick_color"]}))
    c.push(Entry(Message.user("pick a color")))
    c.open_turn()
    run = Run("t", "r", expect_turn=True)
    events = run.begin(c, {})
    c.push(Entry(Assistant([ToolCall("f1", "pick_color", {})])))
    data = wire(events + run.update(c, {}))
    assert data[-1]["outcome"] == {"type": "success", "pendingToolCallIds": ["f1"]}
    assert apply_runs([data])["error"] is None


def test_a_runs_history_reads_as_new_messages_once_and_edits_as_a_rewrite() -> None:
    """A run's messages, read by the kits' rule (`kitstate.read_sent`): a new user message
    is new; sent again after it landed (shown under the kit's id), it is not; an edited
    one is a problem (409); the ids derived from an entry's stand for it."""
    c = Conversation()
    c.push(Entry(Message.user("first")))
    c.open_turn()
    c.push(Entry(Assistant([Reasoning("hm"), Text("ok")])))
    c.end_turn(TurnEnd.answered(c.id(1)))
    shown = [m for m in history(c)]
    sent = [*shown, UserMessage(id="kit-2", content="second")]
    reading = read_sent(c, sent_messages(sent))
    assert reading.problem is None
    assert [(m.id, m.text) for m in reading.new] == [("kit-2", "second")]
    c.push(Entry(Message.user("second"), source_id="kit-2"))
    again = [m for m in history(c)]
    assert again[-1].id == "kit-2"  # the kit's own id, kept in source_id
    assert read_sent(c, sent_messages(again)) == SentReading((), None)
    edited = [UserMessage(id=c.id(0), content="changed"), *again[1:]]
    assert read_sent(c, sent_messages(edited)).problem is not None


def test_a_tool_message_answers_a_waiting_frontend_call_once() -> None:
    """A `tool` message answering a call the log waits on is a result to push; once the
    log holds one, the same message brings nothing."""
    c = Conversation()
    c.push(Entry(Message.user("pick")))
    c.push(Entry(Assistant([ToolCall("f1", "pick_color", {})])))
    sent = [ToolMessage(id="kit-r", tool_call_id="f1", content="red")]
    [result] = tool_results(c, sent)
    assert (result.call_id, result.name, result.content) == ("f1", "pick_color", [Text("red")])
    c.push(Entry(User([result])))
    assert tool_results(c, sent) == []


def test_resume_decides_open_approvals_and_refuses_decided_ones() -> None:
    """`resume[]` entries decide open approvals (approve, deny by payload or cancel); one
    naming a decided approval is `decided`, an unknown id `unknown_interrupt`."""
    c = Conversation()
    c.push(Entry(Message.user("go")))
    c.open_turn()
    c.push(Entry(Assistant([ToolCall("k1", "rm", {}), ToolCall("k2", "rm", {})])))
    a1, _, _ = approvals_.ask(c, key="k1", asked_by="w", asked_client="w", call="k1")
    a2, _, _ = approvals_.ask(c, key="k2", asked_by="w", asked_client="w", call="k2")
    [yes, no] = resume_decisions(
        c,
        [
            ResumeEntry(interrupt_id=a1, status="resolved", payload=True),
            ResumeEntry(interrupt_id=a2, status="resolved", payload={"approved": False}),
        ],
    )
    assert (yes.id, yes.approve, no.id, no.approve) == (a1, True, a2, False)
    [cancelled] = resume_decisions(c, [ResumeEntry(interrupt_id=a2, status="cancelled")])
    assert not cancelled.approve
    approvals_.decide(c, a1, approve=True, decided_by="ui", at=1)
    with pytest.raises(ResumeError) as refused:
        resume_decisions(c, [ResumeEntry(interrupt_id=a1, status="resolved", payload=True)])
    assert refused.value.code == "decided"
    with pytest.raises(ResumeError) as unknown:
        resume_decisions(c, [ResumeEntry(interrupt_id="aside_nope", status="resolved")])
    assert unknown.value.code == "unknown_interrupt"


def test_arguments_streamed_in_another_spelling_end_as_the_logs() -> None:
    """A call whose arguments were streamed spelled otherwise than the log's encoding (no
    spaces) gets a closing snapshot, so a client that watched it and one that attached after
    hold the same arguments text."""
    c = Conversation()
    c.push(Entry(Message.user("weather?")))
    c.open_turn()
    draft = MINT.message_id()
    watched = Run("t", "a", expect_turn=True)
    events = watched.begin(c, {draft: Draft({"call:c1": '{"city":"Paris"}'}, {"call:c1": "w"})})
    c.push(Entry(Assistant([ToolCall("c1", "w", {"city": "Paris"})]), id=draft))
    later = Run("t", "b", expect_turn=True)
    late = later.begin(c, {})
    c.push(Entry(Message.tool_result("c1", "w", "sunny")))
    answer = MINT.message_id()
    c.push(Entry(Message.assistant("Sunny."), id=answer))
    c.end_turn(TurnEnd.answered(answer))
    events += watched.update(c, {})
    late += later.update(c, {})
    assert types(events).count("MESSAGES_SNAPSHOT") == 2
    first, second = apply_runs([wire(events)]), apply_runs([wire(late)])
    assert first["messages"] == second["messages"] == snapshot(c)
