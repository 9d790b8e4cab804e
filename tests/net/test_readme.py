"""The README's Python example runs as written (docs that match the code)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import anyio
from conftest import bound

from client import fetch_conversation
from server import Hub
from sync import decode_state

ROOT = Path(__file__).resolve().parents[2]


def readme_block(after: str | None = None, lang: str = "python") -> str:
    """The first ```lang block of README.md (after the text `after`, if given)."""
    text = (ROOT / "README.md").read_text()
    fence = f"```{lang}\n"
    start = text.index(fence, text.index(after) if after else 0) + len(fence)
    return text[start : text.index("```", start)]


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter in `cwd`, the repository importable; bounded."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=bound(60),
    )


def test_readme_worker_and_ui_example_runs(tmp_path: Path) -> None:
    """The worker + UI example in README.md runs and its replicas agree."""
    code = readme_block()
    assert "assert ui.conversation == worker.conversation" in code
    result = run_python(code, tmp_path)  # the example's ./convsync.db lands here
    assert result.returncode == 0, result.stderr
    assert "Lisbon" in result.stdout
    assert (tmp_path / "convsync.db").exists()


def test_readme_worker_and_ui_example_run_twice_refuses_the_reused_call_id(
    tmp_path: Path,
) -> None:
    """Run a second time on the same database, the README example's turn reuses call id
    `c1`: the hub refuses it, the example says so (as the README explains) and still ends
    with both replicas equal."""
    text = (ROOT / "README.md").read_text()
    code = readme_block()
    runs = [run_python(code, tmp_path) for _ in range(2)]
    assert [run.returncode for run in runs] == [0, 0], runs[-1].stderr
    assert "refused" not in runs[0].stdout
    said = "worker had 5 edits refused: strict pairing: tool call 'c1' of message 5 reuses"
    assert said in runs[1].stdout
    assert said in text.replace("\n", " ").replace("`", "")


def test_readme_draft_example_stops_the_model_call(tmp_path: Path) -> None:
    """The drafts example in README.md runs: the UI's stop cancels the worker's model call."""
    code = readme_block(after="## Streaming an answer")
    assert "cancel_on_end()" in code
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ui sees: Once upon a time," in result.stdout
    assert "drafting" in result.stdout or "thinking" in result.stdout
    stopped_at = int(result.stdout.split("stopped after ")[1].split()[0])
    assert stopped_at < 100  # the model call was cancelled about a round trip after the halt


def test_readme_steering_example_queues_then_stops(tmp_path: Path) -> None:
    """The steering example in README.md runs: the message typed while the tool ran lands
    after its result, and Stop cancels the second tool run and halts the turn `stopped`."""
    code = readme_block(after="## Steering a running agent")
    assert "cancel_on_stop()" in code and "finish_stopped(talk)" in code
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "worker holds: ['', 'Only direct flights, please.']" in result.stdout
    assert "tool cancelled: True" in result.stdout
    assert "ui halted: stopped" in result.stdout


def test_readme_running_it_for_real_example_runs(tmp_path: Path) -> None:
    """The token-protected example in "Running it for real" runs: the read-only UI's edit is
    refused as `forbidden` and a conversation outside its token is refused at once."""
    code = readme_block(after="## Running it for real")
    assert "token=" in code and "mint_token" in code
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["ui edit: forbidden", "billing-1: forbidden"]


async def test_readme_command_line_runs_as_written(hub: Hub, tmp_path: Path) -> None:
    """The README's command-line block runs as written in a shell with no `convsync` on its
    PATH until the block's first line activates `.venv`, against the test's hub
    (`CONVSYNC_URL`; the `serve` line and the live `tail` are left out, they do not end):
    both sends land, the export imports as an equal conversation, the snapshot says what it
    left out."""
    lines = readme_block(after="The same from the command line", lang="sh").splitlines()
    assert lines[0].startswith(". .venv/bin/activate")
    script = "\n".join(
        line for line in lines if not line.startswith(("convsync serve ", "convsync tail "))
    )
    assert (Path(sys.prefix) / "bin" / "activate").exists(), "the tests run outside a venv"
    (tmp_path / ".venv").symlink_to(sys.prefix)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVSYNC_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join(
        folder
        for folder in env.get("PATH", "").split(os.pathsep)
        if folder and not (Path(folder) / "convsync").exists()
    )
    env.update(CONVSYNC_URL=hub.url, PYTHONPATH=str(ROOT))
    run = functools.partial(
        subprocess.run,
        ["sh", "-e", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(60),
    )
    result = await anyio.to_thread.run_sync(run)
    assert result.returncode == 0, result.stderr
    *revisions, snapshot = result.stdout.splitlines()
    assert revisions == ["1", "2"]
    assert '"version":1' in snapshot
    assert "convsync: snapshot v1 left out entry ids" in result.stderr
    original = (await fetch_conversation(hub.url, "support-42")).conversation
    copy = (await fetch_conversation(hub.url, "support-43")).conversation
    assert decode_state((tmp_path / "chat.json").read_bytes()) == original == copy
    assert original.messages()[1].content[0].text == "line one\nline two"


def _run_sdk_example(hub: Hub, heading_after: str, env: dict[str, str], cwd: Path) -> str:
    code = readme_block(after=heading_after)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT), CONVSYNC_URL=hub.url, **env),
        capture_output=True,
        text=True,
        timeout=bound(60),
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_readme_anthropic_sdk_loop_runs_against_the_fake_provider(
    hub: Hub, tmp_path: Path
) -> None:
    """The README's Anthropic worker loop runs with the real SDK against the fake provider:
    a tool call, its result sent back, the answer printed and in the hub's log."""
    from fakeprovider import FakeProvider, anthropic_stream

    with FakeProvider().running() as provider:
        call = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}
        provider.script(anthropic_stream([call], stop_reason="tool_use"))
        provider.script(anthropic_stream([{"type": "text", "text": "Sunny in Paris."}]))
        env = {"ANTHROPIC_BASE_URL": provider.url, "ANTHROPIC_API_KEY": "test-key"}
        out = await anyio.to_thread.run_sync(
            functools.partial(_run_sdk_example, hub, "## With the OpenAI", env, tmp_path)
        )
        assert "answer: Sunny in Paris." in out
        assert provider.requests[1][1]["messages"][2]["content"][0]["tool_use_id"] == "toolu_1"
    log = (await fetch_conversation(hub.url, "sdk-anthropic")).conversation
    assert len(log) == 4 and log.messages()[-1].content[0].text == "Sunny in Paris."  # type: ignore[union-attr]


async def test_readme_openai_sdk_loop_runs_against_the_fake_provider(
    hub: Hub, tmp_path: Path
) -> None:
    """The README's OpenAI Responses worker loop runs with the real SDK against the fake
    provider, through a tool call to the answer."""
    from fakeprovider import FakeProvider, responses_stream

    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather"}
    call |= {"arguments": '{"city": "Paris"}', "status": "completed"}
    said = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
    said["content"] = [{"type": "output_text", "text": "Sunny in Paris.", "annotations": []}]
    with FakeProvider().running() as provider:
        provider.script(responses_stream([call]))
        provider.script(responses_stream([said]))
        env = {"OPENAI_BASE_URL": provider.url + "/v1", "OPENAI_API_KEY": "test-key"}
        out = await anyio.to_thread.run_sync(
            functools.partial(_run_sdk_example, hub, "The same loop with OpenAI", env, tmp_path)
        )
        assert "answer: Sunny in Paris." in out
        assert provider.requests[1][1]["input"][-1]["call_id"] == "call_1"
    log = (await fetch_conversation(hub.url, "sdk-openai")).conversation
    assert len(log) == 4


def test_readme_asking_a_person_example_runs(tmp_path: Path) -> None:
    """The "Asking a person" example runs: the UI approves, the worker's `ask` returns the
    decision, asking again finds the same card, a question's bad answer is refused."""
    code = readme_block(after="## Asking a person")
    assert "worker.ask(" in code and "ui.decide(" in code
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "ui sees: Delete build/?",
        "worker got: approved by anonymous - only build output",
        "cards: 1 same decision: True",
        'refused: bad_answer: answer: expected one of "ops", "dev"',
        "answer: ops",
    ]
