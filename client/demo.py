"""`convsync demo`: a hub, a scripted agent worker and a UI replica, checked against each other.

How this works: one hub on the SQLite store (port 0) and two replicas of a new conversation.
The worker plays a user and an agent: each turn it pushes a question, opens a turn record,
answers with a tool call, pushes the tool's result, then the answer, and ends the turn. The UI
prints every change it receives as it arrives (`Watcher` lines, prefixed `ui   |`) and, once
in the run, pushes a message of its own right after a tool result, before the answer (a user
message between a call and its result would orphan the result). The worker waits, bounded, to
see that message through its own mirror and answers it. At the end both replicas flush, wait
for the hub's revision, and each must equal the hub's state read over HTTP.

Every model call streams as a draft (SPEC 7) through `replica.answer(events,
format="anthropic")`, the path a worker with a real SDK takes: the fake model (`model_events`)
speaks the Anthropic Messages stream (`message_start`, `content_block_*` deltas, `message_delta`
with the stop reason and usage), word by word with small delays, so the UI shows the draft
growing (`ui   | ...` lines) and `answer` commits the reply with its stop reason, origin and
usage. In the last turn (with 3 turns or more) the UI stops the answer midway (a `stopped`
halt): `answer` closes the model's stream, keeps what it said as an aborted reply (never read
by a model) before the halt, and the turn ends `stopped`; the next request follows a STOPPED
note. Before running its `weather` tool the worker asks a person (SPEC 12, `Replica.ask`);
the UI approves it as soon as the card arrives.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, TextIO

import anyio

from server.config import HubConfig
from server.hub import Hub
from server.store import open_store
from sync import (
    Conversation,
    ConvsyncError,
    Halt,
    Message,
    Text,
    ToolCall,
    TurnEnd,
    User,
)
from sync.messages import AnyMessage

from .http import FetchedConversation, fetch_conversation
from .live import DraftChanged, DraftEnded
from .replica import Replica, connect
from .session import Applied, ApprovalAsked, Conflict, Rebased, Reset
from .tail import Watcher, describe_entry, one_line

__all__ = ["SCRIPT", "DemoError", "model_events", "run_demo"]

SCRIPT: list[tuple[str, str, dict[str, Any], str, str]] = [
    (
        "What's the weather in Lisbon right now?",
        "weather",
        {"city": "Lisbon"},
        "18°C, clear sky, wind 12 km/h from the north",
        "It is 18°C and clear in Lisbon, with a light north wind.",
    ),
    (
        "How many open issues does the convsync repo have?",
        "search_issues",
        {"repo": "convsync", "state": "open"},
        '{"count": 12, "oldest": "2024-11-02"}',
        "There are 12 open issues; the oldest is from November 2024.",
    ),
    (
        "Convert 250 EUR to USD.",
        "convert_currency",
        {"amount": 250, "from": "EUR", "to": "USD"},
        "271.25 USD (rate 1.085)",
        "250 EUR is 271.25 USD at today's rate of 1.085.",
    ),
]
INTERJECTION = "Also: keep the answers short, please."
DEMO_MODEL = "demo-model"
"""The model the demo's fake provider names in its replies (their `Origin`)."""

ASKS_BEFORE = "weather"
"""The tool the worker asks a person about before running it (the UI approves it)."""


def _wait() -> float:
    """Seconds the demo waits for one step: 10, times `CONVSYNC_TIMEOUT_SCALE` (for slow
    machines).

    Raises:
        DemoError: the variable is not a positive number.
    """
    raw = os.environ.get("CONVSYNC_TIMEOUT_SCALE", "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = math.nan
    if not (math.isfinite(scale) and scale > 0):
        raise DemoError(
            "bad_setting", f"CONVSYNC_TIMEOUT_SCALE={raw!r} is not a number more than 0"
        )
    return 10.0 * scale


class DemoError(ConvsyncError):
    """The demo could not finish: a step stalled (reason `stalled`), or
    `CONVSYNC_TIMEOUT_SCALE` is not a positive number (`bad_setting`)."""


class _Printer:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, prefix: str, line: str) -> None:
        print(f"{prefix}| {line}", file=self.out, flush=True)


async def _pause(fast: bool, seconds: float = 0.6) -> None:
    if not fast:
        await anyio.sleep(seconds)


def _interjected(conversation: Conversation, since: int) -> bool:
    """Whether a request (a user message with text) stands at or after `since`."""
    refs = conversation.entries()
    return any(ref.is_request() for ref in refs[since:])


def model_events(text: str, call: ToolCall | None = None) -> Iterator[dict[str, Any]]:
    """What the demo's fake model says, as an Anthropic Messages stream (the events' JSON
    shape, as the SDK gives them with `model_dump()`): `text` word by word, then `call` (its
    arguments in pieces) and stop reason `tool_use`, or stop reason `end_turn`."""
    yield {
        "type": "message_start",
        "message": {
            "id": "msg_demo",
            "type": "message",
            "role": "assistant",
            "model": DEMO_MODEL,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 20, "output_tokens": 1},
        },
    }
    yield {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    words = text.split(" ")
    for at, word in enumerate(words):
        piece = word if at == 0 else " " + word
        yield {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": piece},
        }
    yield {"type": "content_block_stop", "index": 0}
    if call is not None:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        yield {"type": "content_block_start", "index": 1, "content_block": block}
        arguments = json.dumps(call.arguments)
        for start in range(0, len(arguments), 8):
            delta = {"type": "input_json_delta", "partial_json": arguments[start : start + 8]}
            yield {"type": "content_block_delta", "index": 1, "delta": delta}
        yield {"type": "content_block_stop", "index": 1}
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn" if call is None else "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": len(words)},
    }
    yield {"type": "message_stop"}


async def _fake_model(
    text: str, fast: bool, *, call: ToolCall | None = None, long: bool = False
) -> AsyncIterator[dict[str, Any]]:
    """Stands in for an LLM's streamed reply (`model_events`), paced like one: a text delta
    every few tens of milliseconds (a long answer goes on for a while, so a stop can land
    midway)."""
    if long:
        text += " Let me add a few more details on the history of the rate." * 20
    for event in model_events(text, call):
        if event["type"] == "content_block_delta":
            await anyio.sleep(0.01 if fast else 0.08)
        yield event


def _text(message: AnyMessage) -> str:
    if isinstance(message, User):
        return " ".join(part.text for part in message.content if isinstance(part, Text))
    return ""


async def _worker(
    worker: Replica, turns: int, interject_turn: int, stop_turn: int, fast: bool, say: _Printer
) -> None:
    conversation = worker.conversation
    for turn in range(turns):
        question, tool, arguments, result, answer = SCRIPT[turn % len(SCRIPT)]
        await _pause(fast, 1.0)
        conversation.push(Message.user(question))
        say("agent", f"user asks: {question}")
        worker.open_turn()  # owned by this worker: a hub ends it if the worker dies
        say("agent", f"opens turn {turn}")
        await _pause(fast)
        call = ToolCall(f"call_{turn}_{tool}", tool, arguments)
        # Each model call goes through `answer`, as a worker with a real SDK's stream does.
        await worker.answer(_fake_model("Let me check.", fast, call=call), format="anthropic")
        say("agent", f"calls {tool}({one_line(str(arguments), 60)})")
        if tool == ASKS_BEFORE:  # SPEC 12: a person approves this tool before it runs
            await worker.flush()
            say("agent", f"asks the ui before running {tool}")
            decision = await worker.ask(call=call.id, prompt=f"May I run {tool}?")
            why = f": {decision.reason}" if decision.reason else ""
            say("agent", f"{tool} {decision.state} by {decision.decided_by}{why}")
            if not decision.approved:
                result = f"the user did not allow {tool}"
        await _pause(fast, 1.0)
        since = len(conversation)
        conversation.push(Message.tool_result(call.id, tool, result))
        say("agent", f"tool {tool} returns: {result}")
        await worker.flush()
        if turn == interject_turn:
            say("agent", "waits for the ui to chime in")
            with anyio.move_on_after(_wait()):
                while not _interjected(conversation, since):
                    await worker.wait_for(worker.revision + 1)
            if not _interjected(conversation, since):
                say("agent", "heard nothing from the ui; answering anyway")
        await _pause(fast)
        heard = [ref for ref in conversation.entries()[since:] if ref.is_request()]
        if heard:
            text = f"(Noted: {one_line(_text(heard[-1].message), 40)}) {answer}"
        else:
            text = answer
        await worker.set_status("generating")
        # A stop from the UI closes the model's stream; `answer` keeps what was said.
        reply = await worker.answer(
            _fake_model(text, fast, long=turn == stop_turn), format="anthropic"
        )
        streamed = "".join(part.text for part in reply.content if isinstance(part, Text))
        if reply.stop is not None and reply.stop.reason == "aborted":
            say("agent", f"stopped by the ui after {len(streamed)} characters")
            conversation.end_turn(TurnEnd.stopped())
            say("agent", f"ends turn {turn} (stopped)")
        else:
            answer_id = conversation.id(len(conversation) - 1)
            conversation.end_turn(TurnEnd.answered(answer_id))
            say("agent", f"answers: {one_line(streamed, 100)}")
            say("agent", f"ends turn {turn}")
        await worker.set_status(None)
        await worker.flush()
    worker.events_nowait()  # the worker reads the conversation, not its events


async def _ui(
    ui: Replica, interject_turn: int, stop_turn: int, say: _Printer, watcher: Watcher
) -> None:
    conversation = ui.conversation
    interjected = False
    stopped = False
    shown: dict[str, int] = {}  # draft id -> characters shown so far
    async for event in ui.events():
        events = [event, *ui.events_nowait()]
        for item in events:
            if isinstance(item, Conflict):
                say("ui   ", f"conflict: {item.reason} {item.detail}")
            elif isinstance(item, ApprovalAsked) and item.approval.is_open:
                say("ui   ", f"the agent asks: {item.approval.prompt}")
                ui.decide(item.id, approve=True, reason="looks safe")
                say("ui   ", f"user approves {item.approval.key}")
            elif isinstance(item, DraftChanged) and item.id in ui.drafts:
                text = ui.drafts[item.id].text
                if text and (item.id not in shown or len(text) >= shown[item.id] + 40):
                    shown[item.id] = len(text)  # a line per 40 characters, not per token
                    say("ui   ", f"… assistant is typing: {one_line(text, 100)}")
                turns = conversation.turns()
                if (
                    not stopped
                    and len(text) > 60
                    and turns
                    and turns[-1][1].index == stop_turn
                    and turns[-1][1].end is None
                ):
                    stopped = True
                    conversation.halt(Halt.STOPPED)
                    say("ui   ", "user presses stop midway through the answer")
            elif isinstance(item, DraftEnded) and item.status != "committed":
                say("ui   ", f"draft ended: {item.status}")
        if not any(isinstance(item, Applied | Rebased | Reset) for item in events):
            continue
        for line in watcher.changes(conversation):
            say("ui   ", line)
        if interjected:
            continue
        turns = conversation.turns()
        last = conversation.entry(len(conversation) - 1)
        if (
            turns
            and turns[-1][1].index == interject_turn
            and turns[-1][1].end is None
            and last is not None
            and last.message.tool_results()
        ):
            interjected = True
            conversation.push(Message.user(INTERJECTION))
            say("ui   ", f"user types mid-turn: {INTERJECTION}")
            for line in watcher.changes(conversation):
                say("ui   ", line)


async def run_demo(
    db: str,
    *,
    turns: int = 3,
    fast: bool = False,
    out: TextIO,
    serve: int | None = None,
    until: anyio.Event | None = None,
    after: anyio.Event | None = None,
) -> int:
    """Run the demo on store `db`, printing to `out`; 0 when both replicas equal the hub.

    With `serve` (a port; 0 for any free one), the hub listens there on 127.0.0.1, the
    viewer's address of the conversation is printed first, and once the check is printed
    the hub keeps serving until `until` is set (`after` is set when that wait begins), so a
    browser can watch the demo and look at it afterwards.
    """
    wait = _wait()
    say = _Printer(out)
    conversation_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
    interject_turn = 1 if turns > 1 else 0
    stop_turn = turns - 1 if turns >= 3 else -1
    port = 0 if serve is None else serve
    config = HubConfig.from_env()
    async with Hub(store=open_store(db), host="127.0.0.1", port=port, config=config) as hub:
        say("hub  ", f"serving {hub.url} on store {db}")
        say("hub  ", f"conversation {conversation_id}")
        if serve is not None:
            say("hub  ", f"open http://127.0.0.1:{hub.port}/c/{conversation_id} in a browser")
        async with (
            connect(hub.url, conversation_id, client="demo-worker") as worker,
            connect(hub.url, conversation_id, client="demo-ui") as ui,
        ):
            say("agent", f"connected as {worker.client}")
            say("ui   ", f"connected as {ui.client}, mirroring live")
            watcher = Watcher()
            watcher.changes(ui.conversation)
            async with anyio.create_task_group() as group:
                group.start_soon(_ui, ui, interject_turn, stop_turn, say, watcher)
                try:
                    # Every step is bounded: a demo that stalls says so instead of hanging.
                    with anyio.fail_after(wait + turns * (wait + 5)):
                        await _worker(worker, turns, interject_turn, stop_turn, fast, say)
                except TimeoutError:
                    raise DemoError(
                        "stalled", "the demo stalled: the hub stopped answering"
                    ) from None
                try:
                    with anyio.fail_after(wait):
                        await worker.flush()
                        await ui.flush()
                        view: FetchedConversation = await fetch_conversation(
                            hub.url, conversation_id, request_timeout=wait
                        )
                        await worker.wait_for(view.revision)
                        await ui.wait_for(view.revision)
                except TimeoutError:
                    raise DemoError(
                        "stalled", "the replicas did not catch up with the hub in time"
                    ) from None
                group.cancel_scope.cancel()
            for line in watcher.changes(ui.conversation):  # anything not printed yet
                say("ui   ", line)
            hub_state = view.conversation
            say("hub  ", f"revision {view.revision}, {len(hub_state)} entries:")
            for ref in hub_state.entries():
                say("hub  ", describe_entry(ref.index, ref.entry))
            worker_ok = worker.conversation == hub_state
            ui_ok = ui.conversation == hub_state
            print(f"check: worker == hub: {worker_ok}", file=out)
            print(f"check: ui == hub: {ui_ok}", file=out, flush=True)
            if serve is not None:
                say("hub  ", f"still serving http://127.0.0.1:{hub.port}/ (Ctrl-C stops it)")
                if after is not None:
                    after.set()
                await (until or anyio.Event()).wait()
    return 0 if worker_ok and ui_ok else 1
