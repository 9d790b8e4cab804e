"""A dashboard's data in Python (SPEC 17): `client.list_conversations`, `client.summary`,
and `convsync list` (plain lines when piped, live with --watch)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from cliproc import Running, convsync
from conftest import bound
from hubprocess import HubProcess

import client
from client import HubError, connect
from server import Hub
from sync import Message, UsageError
from sync.errors import Refused


async def fill(url: str, conversation_id: str, *texts: str) -> None:
    async with connect(url, conversation_id, client="filler") as replica:
        for text in texts:
            replica.conversation.push(Message.user(text))
        with anyio.fail_after(bound(10)):
            await replica.flush()


async def test_list_conversations_pages_by_id_and_by_activity(hub: Hub) -> None:
    for n in range(3):
        await fill(hub.url, f"pl.{n}", f"text {n}")
    await fill(hub.url, "pl.0", "latest")
    page = await client.list_conversations(hub.url, prefix="pl.", limit=2)
    assert [row["id"] for row in page.rows] == ["pl.0", "pl.1"] and page.more
    page = await client.list_conversations(hub.url, prefix="pl.", after="pl.1")
    assert [row["id"] for row in page.rows] == ["pl.2"] and not page.more
    page = await client.list_conversations(hub.url, prefix="pl.", order="updated", limit=1)
    assert [row["id"] for row in page.rows] == ["pl.0"]
    assert page.rows[0]["last"]["text"] == "latest"
    with pytest.raises(HubError) as refused:
        await client.list_conversations(hub.url, prefix="no spaces")
    assert "400: prefix: not the start of a conversation id" in refused.value.message
    with pytest.raises(UsageError):
        await client.list_conversations(hub.url, order="newest")


async def test_summary_yields_the_window_live(hub: Hub) -> None:
    await fill(hub.url, "sw.1", "first")
    seen: list[client.Window] = []
    with anyio.fail_after(bound(20)):
        async for window in client.summary(hub.url, prefix="sw.", limit=2):
            seen.append(window)
            if len(seen) == 1:
                assert list(window.rows) == ["sw.1"] and window.connected
                await fill(hub.url, "sw.0", "enters")
                await fill(hub.url, "sw.2", "past the window")
            if list(window.rows) == ["sw.0", "sw.1"] and window.more:
                break
    assert all("sw.2" not in window.rows for window in seen)


async def test_summary_with_a_bad_window_is_refused(hub: Hub) -> None:
    with anyio.fail_after(bound(10)), pytest.raises(Refused) as refused:
        async for _ in client.summary(hub.url, prefix="no spaces"):
            pass
    assert refused.value.code == "bad_message"


@pytest.fixture
def hub_process(tmp_path: Path) -> Iterator[HubProcess]:
    process = HubProcess(tmp_path / "hub.db")
    process.start()
    try:
        yield process
    finally:
        process.stop()


async def test_summary_says_disconnected_then_comes_back(hub_process: HubProcess) -> None:
    """A hub killed under the feed: one window with `connected=False`, then the snapshot of
    the restarted hub (same port) replaces the rows."""
    await fill(hub_process.url, "back.1", "kept")
    states: list[bool] = []
    with anyio.fail_after(bound(30)):
        async for window in client.summary(hub_process.url, max_backoff=0.3):
            states.append(window.connected)
            if states == [True]:
                await anyio.to_thread.run_sync(hub_process.kill)
            elif states == [True, False]:
                assert list(window.rows) == ["back.1"]  # the rows it had
                await anyio.to_thread.run_sync(hub_process.start)
            elif window.connected:
                break
    assert states == [True, False, True]


def test_convsync_list_prints_plain_lines_when_piped(tmp_path: Path) -> None:
    proc = Running("serve", "--db", str(tmp_path / "hub.db"), "--port", "0")
    try:
        url = proc.url()
        for conversation_id, text in [("cl.a", "alpha"), ("cl.b", "beta\tand\nmore")]:
            assert convsync("send", conversation_id, text, "--url", url).returncode == 0
        done = convsync("list", "--url", url, "--prefix", "cl.")
        assert done.returncode == 0, done.stderr
        lines = [line.split("\t") for line in done.stdout.splitlines()]
        assert [cells[0] for cells in lines] == ["cl.a", "cl.b"]
        assert lines[1][1:3] == ["1", "1"] and lines[1][-1] == "user: beta and more"
        done = convsync("list", "--url", url, "--order", "updated", "--limit", "1")
        assert [line.split("\t")[0] for line in done.stdout.splitlines()] == ["cl.b"]
        refused = convsync("list", "--url", url, "--order", "updated", "--after", "cl.a")
        assert refused.returncode == 2 and "--after pages by id" in refused.stderr
        watch = Running("list", "--url", url, "--prefix", "cl.", "--watch")
        try:
            watch.wait_for("cl.b\t1\t1")
            assert convsync("send", "cl.b", "again", "--url", url).returncode == 0
            watch.wait_for("cl.b\t2\t2")
        finally:
            code, err = watch.stop()
        assert code == 0, err
    finally:
        proc.stop()


def test_a_listed_row_says_what_waits_and_the_tokens_used() -> None:
    """`convsync list` shows queued input and approvals waiting, and the tokens a
    conversation used (input plus output), from the row's fields."""
    from client.dashboard import COLUMNS, cells

    row = {
        "id": "c.1",
        "revision": 4,
        "entries": 4,
        "updated": None,
        "turn": {"index": 0, "state": "running", "owner": "w"},
        "drafts": {"open": 0, "producers": []},
        "queued": 2,
        "approvals": 1,
        "usage": {"input_tokens": 1200, "output_tokens": 34, "cache_read_tokens": 1000},
        "online": ["w"],
        "last": {"id": None, "role": "user", "text": "hi"},
    }
    shown = dict(zip(COLUMNS, cells(row), strict=True))
    assert shown["waiting"] == "2 queued, 1 to approve" and shown["tokens"] == "1234"
    quiet = dict(
        zip(COLUMNS, cells({**row, "queued": 0, "approvals": 0, "usage": None}), strict=True)
    )
    assert shown["turn"] == "0 running" and (quiet["waiting"], quiet["tokens"]) == ("-", "-")
