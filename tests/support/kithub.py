"""A hub with Python workers, for the chat kits' Node tests (SPEC 13).

Run as `python tests/support/kithub.py`: starts a hub on 127.0.0.1 port 0 (in-memory store)
and prints one JSON line `{"url": "http://127.0.0.1:PORT"}`. Then it reads commands on
stdin, one JSON object a line, and answers each with one JSON line:

- `{"worker": ID, "tokens": int, "delay": float}`: a worker on conversation ID answering
  every user message with `kitworker.Turn` (reasoning, text, a `weather` call, its result,
  an answer of `tokens` words); when the message says "approve", it asks a person to approve
  the call first. Answers `{"ok": true}` once the worker is connected.
- `{"state": ID}`: the conversation as the hub holds it: `{"entries": [...], "asides":
  [...]}` (the state's JSON).

It ends when stdin closes (the Node test ending, or dying), with every worker.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]  # helpers; conftest; root

from conftest import hub_config  # noqa: E402
from kitworker import Turn, answer_turns  # noqa: E402

from client import Replica  # noqa: E402
from server import Hub, MemoryStore  # noqa: E402
from sync import encode  # noqa: E402


def say(value: Any) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


async def main() -> None:
    async with (
        Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub,
        anyio.create_task_group() as group,
    ):
        say({"url": f"http://127.0.0.1:{hub.port}"})
        lines = anyio.wrap_file(sys.stdin)
        async for line in lines:
            if not line.strip():
                continue
            command = json.loads(line)
            if "worker" in command:
                turn = Turn(
                    tokens=int(command.get("tokens", 120)),
                    delay=float(command.get("delay", 0.01)),
                )
                started = anyio.Event()
                group.start_soon(work, hub.url, command["worker"], turn, started)
                await started.wait()
                say({"ok": True})
            elif "state" in command:
                async with Replica(hub.url, command["state"], client="probe") as probe:
                    say(json.loads(encode(probe.conversation)))
        group.cancel_scope.cancel()


async def work(url: str, conversation_id: str, turn: Turn, started: anyio.Event) -> None:
    async with Replica(url, conversation_id, client=f"worker-{conversation_id}") as worker:
        started.set()
        await answer_turns(worker, turn)


if __name__ == "__main__":
    anyio.run(main)
