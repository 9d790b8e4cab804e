"""Approvals from a terminal (SPEC 12): `convsync tail` shows open approvals, and
`convsync approve ID APPROVAL [--deny] [--reason ...]` decides one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from cliproc import Running

from client import connect
from client.cli import main
from sync import Assistant, Message, Text, ToolCall
from sync import approvals as ap


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `convsync serve` process on port 0 and a SQLite file."""
    db = tmp_path_factory.mktemp("hub") / "hub.db"
    proc = Running("serve", "--db", str(db), "--port", "0")
    try:
        yield proc.url()
    finally:
        proc.stop()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def asked(url: str, conversation: str, **question: object) -> None:
    """A worker asks in an open turn, and leaves the approval open."""

    async def ask() -> None:
        async with connect(url, conversation, client="worker") as worker:
            local = worker.conversation
            local.push(Message.user("clean up"))
            local.open_turn()
            local.push(Assistant([Text("may I?"), ToolCall("c1", "delete", {"path": "x"})]))
            await worker.flush()
            ap.ask(local, asked_by="anonymous", asked_client="worker", **question)  # type: ignore[arg-type]
            with anyio.fail_after(10):
                await worker.flush()

    anyio.run(ask)


def test_tail_shows_an_open_approval_and_approve_decides_it_once(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """The open card is shown with how to decide it; `approve` decides it and prints the
    decision; a second `approve` finds nothing open and exits 1."""
    asked(url, "cli-approve", key="c1", call="c1", prompt="delete x?")
    code, out, _ = run(capsys, "tail", "cli-approve", "--url", url, "--once")
    assert code == 0
    assert "approval c1 (call c1, asked by anonymous) “delete x?”: OPEN" in out
    code, out, err = run(
        capsys, "approve", "cli-approve", "c1", "--url", url, "--reason", "only build output"
    )
    assert code == 0, err
    assert out.split()[1:4] == ["c1", "approved", "by"]
    code, out, _ = run(capsys, "tail", "cli-approve", "--url", url, "--once")
    assert "approved by anonymous: only build output" in out and "OPEN" not in out
    code, _, err = run(capsys, "approve", "cli-approve", "c1", "--url", url, "--deny")
    assert code == 1 and "no open approval" in err


def test_approve_answers_a_question_and_refuses_a_bad_answer(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """`--answer` is JSON checked against the question's schema before anything is sent."""
    asked(url, "cli-question", key="account", prompt="which?", schema={"enum": ["ops", "dev"]})
    code, _, err = run(
        capsys, "approve", "cli-question", "account", "--url", url, "--answer", '"prod"'
    )
    assert code == 2 and "expected one of" in err
    code, _, err = run(capsys, "approve", "cli-question", "account", "--url", url, "--answer", "{")
    assert code == 2 and "not JSON" in err
    code, out, err = run(
        capsys, "approve", "cli-question", "account", "--url", url, "--answer", '"ops"'
    )
    assert code == 0, err
    assert '"ops"' in out and "answered" in out
