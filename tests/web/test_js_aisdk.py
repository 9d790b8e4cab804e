"""The AI SDK's own chat client against /v1/aisdk (SPEC 13; tests/support/aisdk_chat.mjs,
run by `node --test` with the packages of client/web/package.json): a hub on a SQLite store
and a Python worker streaming reasoning, text and a tool call through drafts. The message
the SDK reads is the one the worker's replica holds; 50 clients cut at random bytes and
resumed read it whole (0 lost, 0 duplicated); an approval answered in the SDK's parts lands
once; after a hub restart the history is there on the first request."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import anyio
from conftest import bound, hub_config
from kitworker import Turn, answer_turns

from client import connect
from server import Hub
from server.store import SqliteStore
from sync import Assistant, Reasoning, Text, ToolCall, User

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "support" / "aisdk_chat.mjs"
MODULES = ROOT / "client" / "web" / "node_modules" / "ai"


async def _node(url: str, chat: str, phase: str, out: Path) -> None:
    node = shutil.which("node")
    assert node is not None, "node is needed for the kit tests (scripts/ensure-node)"
    assert MODULES.is_dir(), "client/web/node_modules is missing: run scripts/ensure-npm"
    env = dict(
        os.environ,
        CONVSYNC_HUB=url,
        CONVSYNC_CHAT=chat,
        CONVSYNC_PHASE=phase,
        CONVSYNC_OUT=str(out),
        CONVSYNC_SEED="7",
    )
    with anyio.fail_after(bound(180)):
        done = await anyio.run_process(
            [node, "--no-warnings", "--test", str(SCRIPT)], env=env, check=False
        )
    stdout = done.stdout.decode()
    assert done.returncode == 0, stdout[-6000:] + done.stderr.decode()[-2000:]
    assert "# fail 0" in stdout and "# pass 1" in stdout, stdout[-3000:]


def _expected(messages: list) -> list[dict]:
    """What each step of the worker's answers holds, read from its replica's messages."""
    steps: list[dict] = []
    results: dict[str, str] = {}
    for message in messages:
        if isinstance(message, User):
            for result in message.tool_results():
                results[result.call_id] = "".join(p.text for p in result.content)  # type: ignore[union-attr]
    for message in messages:
        if isinstance(message, Assistant):
            step: dict = {"reasoning": "", "text": "", "calls": []}
            for part in message.content:
                if isinstance(part, Reasoning):
                    step["reasoning"] += part.text
                elif isinstance(part, Text):
                    step["text"] += part.text
                elif isinstance(part, ToolCall):
                    step["calls"].append([part.id, part.name, part.arguments, results[part.id]])
            steps.append(step)
    return steps


def _read(ui_messages: list[dict]) -> list[dict]:
    """The same from the UIMessages the SDK built."""
    steps: list[dict] = []
    for message in ui_messages:
        if message["role"] != "assistant":
            continue
        for part in message["parts"]:
            if part["type"] == "step-start":
                steps.append({"reasoning": "", "text": "", "calls": []})
            elif part["type"] == "reasoning":
                steps[-1]["reasoning"] += part["text"]
            elif part["type"] == "text":
                steps[-1]["text"] += part["text"]
            elif part["type"].startswith("tool-"):
                name = part["type"][len("tool-") :]
                steps[-1]["calls"].append([part["toolCallId"], name, part["input"], part["output"]])
    return steps


async def test_the_ai_sdk_chat_reads_resumes_approves_and_reloads(tmp_path: Path) -> None:
    """The SDK's chat reads the worker's message; cut clients resume it whole; an approval
    lands once; the history survives a hub restart."""
    db = tmp_path / "hub.db"
    out = tmp_path / "seen.json"
    chat = "aisdk-chat-1"
    async with Hub(SqliteStore(db), port=0, config=hub_config()) as hub:
        url = f"http://127.0.0.1:{hub.port}"
        async with connect(hub.url, chat, client="worker", kind="agent") as worker:
            async with anyio.create_task_group() as group:
                group.start_soon(answer_turns, worker, Turn(tokens=150, delay=0.02))
                await _node(url, chat, "turn", out)
                group.cancel_scope.cancel()
            talk = worker.conversation
            users = [m for m in talk.messages() if isinstance(m, User) and not m.only_results()]
            assert len(users) == 2, "each message pushed once (the resend was not)"
            approvals = list(worker.approvals.values())
            assert [(a.state, a.reason) for a in approvals] == [("approved", "fine")]
            expected = _expected(talk.messages())
    seen = json.loads(out.read_text())
    assert (seen["cuts"], seen["lost"], seen["duplicated"]) == (50, 0, 0)
    assert _read(seen["messages"]) == expected
    assert len(expected) == 4  # two turns of two steps
    async with Hub(SqliteStore(db), port=0, config=hub_config()) as again:
        await _node(f"http://127.0.0.1:{again.port}", chat, "history", out)
    assert json.loads(out.read_text())["historyMs"] >= 0
