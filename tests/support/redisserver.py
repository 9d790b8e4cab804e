"""A Redis server for the bus tests: the one at `CONVSYNC_TEST_REDIS`, or a throwaway one.

`find_or_start()` tries `CONVSYNC_TEST_REDIS` (default `redis://127.0.0.1:6379/0`); when
nothing answers there it runs the installed `redis-server` on a free loopback port with no
persistence, installing Debian's `redis-server` first when it is missing and we are root with
apt. The caller stops a server it started with `Server.stop()`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def configured_url() -> str:
    """The server the tests should use first."""
    return os.environ.get("CONVSYNC_TEST_REDIS") or DEFAULT_URL


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether a Redis server answers PING at `url`."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


@dataclass
class Server:
    """A server the tests can use; `stop` ends it if we started it."""

    url: str
    process: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None


def binary() -> str | None:
    """`redis-server`, installing Debian's package when missing and we can (root, apt)."""
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    )
    if found is not None or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, check=False)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "redis-server"],
        env=env,
        capture_output=True,
        check=False,
    )
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def find_or_start(timeout: float = 20.0) -> Server | str:
    """A server to test against, or the reason there is none."""
    url = configured_url()
    if answers(url):
        return Server(url)
    path = binary()
    if path is None:
        return f"no Redis answers at {url} and no redis-server is installed"
    port = _free_port()
    process = subprocess.Popen(
        [path, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Server(f"redis://127.0.0.1:{port}/0", process)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(server.url, 0.5):
            return server
        if process.poll() is not None:
            break
        time.sleep(0.05)
    server.stop()
    return f"redis-server did not start on port {port}"
