"""A worker for the chat-kit tests (SPEC 13): answers each user message with a turn that
streams reasoning, text and a tool call through drafts, lands the tool's result, then
streams the answer token by token, as a real agent on an LLM's stream would.

`answer_turns(replica, ...)` runs until cancelled; `Turn` says what one turn writes, so a
test can compare what a kit's client read with what the worker wrote.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import anyio

from client import Replica
from sync import Assistant, Message, Reasoning, Text, ToolCall, TurnEnd, User
from sync.steer import finish_stopped


@dataclass(frozen=True)
class Turn:
    """What each turn writes: its first step (reasoning, text, a `weather` call), the tool's
    result, and its answer of `tokens` words."""

    reasoning: str = "The user wants the weather; I should call the tool."
    lead: str = "Let me check."
    city: str = "Lisbon"
    result: str = "18°C, clear"
    tokens: int = 120
    delay: float = 0.01  # seconds between two appends
    ask: bool = False  # ask a person to approve every call before running it
    ask_when: str = "approve"  # ...or only when the request's text holds this word

    def answer(self, n: int) -> str:
        return "".join(f"w{i} " for i in range(self.tokens)) + f"(turn {n})"


def _request_text(replica: Replica) -> str:
    for message in reversed(replica.conversation.messages()):
        if isinstance(message, User) and not message.only_results():
            return "".join(p.text for p in message.content if isinstance(p, Text))
    return ""


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


async def answer_turns(replica: Replica, turn: Turn = Turn()) -> None:
    """Answer every user message that waits for the model, one turn each, until cancelled."""
    done = 0
    while True:
        while not replica.conversation.awaits_model():
            async for _ in replica.events():
                break
        done += 1
        await run_turn(replica, turn, done)


async def run_turn(replica: Replica, turn: Turn, n: int) -> None:
    """One turn, as `Turn` says; ends the turn `answered`, or `stopped` on a stop (the
    text streamed so far kept as the aborted answer)."""
    talk = replica.conversation
    replica.open_turn()
    partial: list[str] = []
    with replica.cancel_on_stop() as scope:
        await _steps(replica, turn, n, partial)
    if scope.cancelled_caught:
        finish_stopped(talk, "".join(partial) or None)
        await replica.flush()


async def _steps(replica: Replica, turn: Turn, n: int, partial: list[str]) -> None:
    talk = replica.conversation
    call_id = f"call_{uuid.uuid4().hex[:10]}"
    arguments = {"city": turn.city}
    async with replica.draft() as d:
        for piece in _pieces(turn.reasoning):
            d.append(piece, part="reasoning")
            await anyio.sleep(turn.delay)
        for piece in _pieces(turn.lead):
            d.append(piece)
            await anyio.sleep(turn.delay)
        for piece in _pieces(json.dumps(arguments), 4):
            d.append(piece, part=f"call:{call_id}", name="weather")
            await anyio.sleep(turn.delay)
        step = Assistant(
            [Reasoning(turn.reasoning), Text(turn.lead), ToolCall(call_id, "weather", arguments)]
        )
        await d.commit(step)
    denied = False
    if turn.ask or (turn.ask_when and turn.ask_when in _request_text(replica)):
        decision = await replica.ask(call=call_id, prompt=f"Look up the weather in {turn.city}?")
        denied = not decision.approved
    if denied:
        talk.push(Message.tool_result(call_id, "weather", "the user said no", is_error=True))
    else:
        talk.push(Message.tool_result(call_id, "weather", turn.result))
    await replica.flush()
    async with replica.draft() as d:
        for word in turn.answer(n).split(" "):
            d.append(word + " ")
            partial.append(word + " ")
            await anyio.sleep(turn.delay)
        answer_id = await d.commit(Message.assistant(d.text))
    talk.end_turn(TurnEnd.answered(answer_id))
    await replica.flush()
