"""A hub process killed with SIGKILL right after acks loses nothing; replicas resume by records."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest
from conftest import bound

from client import Applied, Replica, Reset
from sync import Message

HUB_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from server import Hub, HubConfig, SqliteStore

    async def main(path, port):
        config = HubConfig(ping_interval=None)
        async with Hub(SqliteStore(path), host="127.0.0.1", port=port, config=config) as hub:
            print(hub.port, flush=True)
            await hub.serve_forever()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


class HubProcess:
    """A hub in its own process on a SQLite file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.port = 0
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        root = Path(__file__).resolve().parent.parent
        env = dict(os.environ, PYTHONPATH=str(root))
        self.process = subprocess.Popen(
            [sys.executable, "-c", HUB_SCRIPT, str(self.path), str(self.port)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.strip().isdigit(), f"the hub did not start: {line!r}"
        self.port = int(line)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=bound(10))
        if self.process.stdout is not None:
            self.process.stdout.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=bound(10))
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def state(self, conversation_id: str) -> dict[str, object]:
        url = f"http://127.0.0.1:{self.port}/v1/conversations/{conversation_id}"
        with urllib.request.urlopen(url, timeout=bound(5)) as response:
            result: dict[str, object] = msgspec.json.decode(response.read())
            return result


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
