"""Several protocols on one conversation at once (SPEC 13): a Python UI replica, an AG-UI
client and an AI SDK client (tests/support/kits_together.mjs) see the same answer stream
and the same stop, made through AG-UI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
from aguiclient import require_client
from conftest import bound
from kitworker import Turn, answer_turns

from client import DraftChanged, connect
from server import Hub
from sync import Assistant, Text
from sync.entries import Stopped

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "kits_together.mjs"


async def test_a_python_ui_an_agui_client_and_an_ai_sdk_client_see_one_answer_and_one_stop(
    hub: Hub,
) -> None:
    """While a worker streams a long answer, the AG-UI client, the AI SDK client and a Python
    UI replica all watch it; the AG-UI client stops it: both kits' streams end there, with
    the same text, which is the aborted answer the log keeps and the draft the Python UI saw
    grow."""
    node = require_client()
    chat = "together-1"
    drafted: dict[str, str] = {}
    async with (
        connect(hub.url, chat, client="worker") as worker,
        connect(hub.url, chat, client="ui") as ui,
        anyio.create_task_group() as group,
    ):
        group.start_soon(answer_turns, worker, Turn(tokens=2000, delay=0.01))

        async def watch() -> None:
            async for event in ui.events():
                if isinstance(event, DraftChanged):
                    draft = ui.drafts.get(event.id)
                    if draft is not None and draft.text:
                        drafted[event.id] = draft.text

        group.start_soon(watch)
        env = {"CONVSYNC_HUB": f"http://127.0.0.1:{hub.port}", "CONVSYNC_CHAT": chat}
        with anyio.fail_after(bound(120)):
            done = await anyio.run_process(
                [node, "--no-warnings", str(SCRIPT)],
                env={**os.environ, **env},
                check=False,
                stderr=subprocess.PIPE,
            )
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        out = json.loads(done.stdout.decode().strip().splitlines()[-1])
        with anyio.fail_after(bound(30)):
            while not any(r.end is not None for _, r in ui.conversation.turns()):
                async for _ in ui.events():
                    break
        group.cancel_scope.cancel()

    assert out["stopped"] == {"stopped": True}
    assert out["agui"]["end"] == "RUN_FINISHED"
    assert out["agui"]["outcome"] == {"type": "cancelled"}
    [(_, turn)] = ui.conversation.turns()
    assert isinstance(turn.end, Stopped)
    kept = [r for r in ui.conversation.entries() if isinstance(r.message, Assistant)][-1]
    assert kept.message.stop is not None and kept.message.stop.reason == "aborted"
    text = "".join(p.text for p in kept.message.content if isinstance(p, Text))
    assert "w1999" not in text and "w6 " in text  # stopped mid-answer
    assert out["agui"]["text"] == text
    assert out["aisdk"]["text"] == text
    # the Python UI saw the same draft grow (the stop keeps its text as a new entry)
    [seen] = [t for t in drafted.values() if t.startswith("w0 ")]
    assert text.startswith(seen) and len(seen) > len("w0 w1 w2 w3 ")
