"""A hub process killed with SIGKILL right after acks loses nothing; replicas resume by records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from conftest import bound
from hubprocess import HubProcess

from client import Applied, Replica, Reset
from sync import Message


@pytest.fixture
def hub_process(tmp_path: Path) -> Iterator[HubProcess]:
    process = HubProcess(tmp_path / "convsync.db")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def texts(state: dict[str, object]) -> list[str]:
    entries = state["state"]["entries"]  # type: ignore[index]
    return [entry["message"]["content"][0]["text"] for entry in entries]  # type: ignore[attr-defined]


async def test_kill_9_after_acks_loses_nothing(hub_process: HubProcess) -> None:
    """Every acknowledged record survives `kill -9` of the hub; after a restart on the same
    database the replica resumes by records (no state), and its pending edits land."""
    replica = Replica(hub_process.url, "durable", client="writer", max_backoff=0.1)
    async with replica:
        acked: list[str] = []
        for batch in range(10):
            texts_now = [f"m{batch}-{k}" for k in range(20)]
            replica.conversation.extend([Message.user(text) for text in texts_now])
            with anyio.fail_after(bound(10)):
                await replica.flush()
            acked += texts_now
        revision = replica.session.confirmed.revision
        hub_process.kill()  # right after the last ack
        replica.conversation.push(Message.user("written while the hub was down"))
        replica.events_nowait()
        await anyio.to_thread.run_sync(hub_process.start)  # same port, same file
        with anyio.fail_after(bound(20)):
            await replica.flush()
        events = replica.events_nowait()
        assert not [event for event in events if isinstance(event, Reset)]
        assert replica.session.confirmed.revision == revision + 1
        state = await anyio.to_thread.run_sync(hub_process.state, "durable")
        assert texts(state) == [*acked, "written while the hub was down"]
        assert state["revision"] == revision + 1
        assert any(isinstance(event, Applied) for event in events) or replica.pending == 0
