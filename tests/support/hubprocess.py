"""A hub in a process of its own, on a SQLite file or a PostgreSQL url: for kill -9 and chaos
tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import msgspec
from conftest import bound

HUB_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from server import Hub, HubConfig
    from server.store import open_store

    async def main(db, port, host):
        config = HubConfig.from_env(ping_interval=None)
        async with Hub(open_store(db), host=host, port=port, config=config) as hub:
            print(hub.port, flush=True)
            await hub.serve_forever()

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
    """
)


class HubProcess:
    """A hub in its own process on a SQLite file (a path) or PostgreSQL (a `postgresql://`
    url, `?schema=` for a schema of its own)."""

    def __init__(
        self, path: Path | str, env: dict[str, str] | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.path = path
        self.host = host
        self.port = 0
        self.env = env or {}
        self.process: subprocess.Popen[str] | None = None

    def start(self, *, attempts: int = 5) -> None:
        """Start the hub on its port (any free one the first time). After a kill the port can
        be briefly taken by another socket of this machine: try again, then give up."""
        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ, PYTHONPATH=str(root), **self.env)
        for attempt in range(attempts):
            process = subprocess.Popen(
                [sys.executable, "-c", HUB_SCRIPT, str(self.path), str(self.port), self.host],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL if attempt < attempts - 1 else None,
                text=True,
                env=env,
            )
            assert process.stdout is not None
            line = process.stdout.readline()
            if line.strip().isdigit():
                self.process = process
                self.port = int(line)
                return
            process.wait(timeout=bound(10))
            process.stdout.close()
            time.sleep(0.2)
        raise AssertionError(f"the hub did not start on port {self.port}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

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
        return f"ws://{self.host}:{self.port}"

    def state(self, conversation_id: str) -> dict[str, object]:
        url = f"http://{self.host}:{self.port}/v1/conversations/{conversation_id}"
        with urllib.request.urlopen(url, timeout=bound(5)) as response:
            result: dict[str, object] = msgspec.json.decode(response.read())
            return result
