"""Several protocols on one conversation at once (SPEC 13): a Python UI replica, the viewer
(in Chromium), an AG-UI client and an AI SDK client (tests/support/kits_together.mjs) see the
same answer stream and the same stop, made through AG-UI."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest
from aguiclient import require_client
from conftest import bound
from kitworker import Turn, answer_turns
from test_browser import Pages, browser, hub, page_url, pages  # noqa: F401

from client import DraftChanged, connect
from server import Hub
from sync import Assistant, Text
from sync.entries import Stopped

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "kits_together.mjs"

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the browser's loop (test_browser)

# Run in the viewer page: keeps every text its answer draft showed, in order, as it changed
# (a MutationObserver, so no growth step between two polls is missed).
RECORD_DRAFTS = """() => {
  const seen = [];
  globalThis.seenDrafts = seen;
  const look = () => {
    for (const el of document.querySelectorAll('[data-draft-id] [data-part=text]')) {
      const text = el.textContent;
      if (text.startsWith('w0 ') && seen.at(-1) !== text) seen.push(text);
    }
  };
  new MutationObserver(look).observe(document.body, {
    subtree: true, childList: true, characterData: true,
  });
}"""


async def test_a_python_ui_the_viewer_an_agui_and_an_ai_sdk_client_see_one_answer_and_stop(
    hub: Hub,  # noqa: F811
    pages: Pages,  # noqa: F811
) -> None:
    """While a worker streams a long answer, the AG-UI client, the AI SDK client, the viewer
    and a Python UI replica all watch it; the AG-UI client stops it: both kits' streams end
    there, with the same text, which is the aborted answer the log keeps, the one the viewer
    shows as aborted, and the draft the Python UI and the viewer saw grow."""
    node = require_client()
    chat = "together-1"
    drafted: dict[str, str] = {}
    # the viewer is open on the conversation before anything is asked or streamed
    page = await pages.open(page_url(hub, f"/c/{chat}"))
    await page.wait_for_selector("#app[data-connection-state=connected]")
    await page.evaluate(RECORD_DRAFTS)
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
    # the viewer saw the same draft grow, step by step, each step a prefix of the next ...
    shown: list[str] = await page.evaluate("globalThis.seenDrafts")
    assert len(shown) > 1, shown
    assert all(b.startswith(a) and len(b) > len(a) for a, b in itertools.pairwise(shown))
    assert text.startswith(shown[-1]) and len(shown[-1]) > len("w0 w1 w2 w3 ")
    # ... and once stopped shows no draft, but the kept answer, marked aborted, its text the log's
    await page.wait_for_selector("[data-draft-id]", state="detached")
    answer = page.locator(f'[data-entry-id="{kept.id}"]')
    await answer.wait_for(timeout=bound(15) * 1000)
    assert await answer.locator(".text").text_content() == text
    stop = kept.message.stop if isinstance(kept.message, Assistant) else None
    assert stop is not None
    assert await answer.locator(".stopped").text_content() == f"(aborted: {stop.detail})"
    assert pages.errors == []
