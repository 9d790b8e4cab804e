"""AG-UI's own client against a real hub (client/web/test/agui.test.mjs, run by `node --test`
with this Python for the hub and its workers), and every raw event stream it read checked
with the Python `ag_ui.core` models. Fails, never skips, without node or the npm packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ag_ui.core import Event, EventType
from aguiclient import require_client
from conftest import bound
from pydantic import TypeAdapter

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "client" / "web" / "test" / "agui.test.mjs"
EVENTS: TypeAdapter[Any] = TypeAdapter(Event)


def test_httpagent_runs_reattaches_resumes_and_stops_against_a_hub(tmp_path: Path) -> None:
    """`HttpAgent` runs a turn (reasoning, text, a tool call) whose events its verifier
    accepts, a reattaching client ends with the uncut one's messages, a resume decides an
    approval once (a second gets RUN_ERROR), a stop cancels; each raw stream parses with
    `ag_ui.core`'s models, opens with RUN_STARTED and ends with RUN_FINISHED or RUN_ERROR."""
    node = require_client()
    env = dict(os.environ, CONVSYNC_PYTHON=sys.executable, CONVSYNC_AGUI_RAW=str(tmp_path))
    done = subprocess.run(
        [node, "--no-warnings", "--test", str(TESTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(240),
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "# fail 0" in done.stdout
    assert "# skipped 0" in done.stdout, "the AG-UI Node tests must run here, not skip"
    streams = sorted(tmp_path.glob("*.sse"))
    assert len(streams) >= 6, [p.name for p in streams]  # turn, uncut, late, 3 for approval, stop
    for path in streams:
        text = path.read_text()
        assert text.endswith("\n\n"), path.name
        events = []
        for block in text.split("\n\n")[:-1]:
            assert block.startswith("data: "), (path.name, block[:80])
            events.append(EVENTS.validate_python(json.loads(block[len("data: ") :])))
        kinds = [e.type for e in events]
        assert kinds[0] in (EventType.RUN_STARTED, EventType.RUN_ERROR), path.name
        assert kinds[-1] in (EventType.RUN_FINISHED, EventType.RUN_ERROR), path.name
        assert kinds.count(EventType.RUN_FINISHED) + kinds.count(EventType.RUN_ERROR) == 1
