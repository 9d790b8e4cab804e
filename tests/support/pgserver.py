"""A PostgreSQL server for the tests: the one at `CONVSYNC_TEST_PG`, or a throwaway cluster.

`find_or_start()` tries `CONVSYNC_TEST_PG` (default `postgresql://postgres@127.0.0.1:5432/test`);
when nothing answers there it runs the installed `initdb` and `pg_ctl`
(`/usr/lib/postgresql/*/bin`, or on `PATH`) on a fresh directory and a free loopback port, as
the `postgres` user when we are root (the server refuses to run as root), with fsync off. The
caller stops that cluster with `Server.stop()`.

`python tests/support/pgserver.py check` exits 0 when a server answers or one could be started from
installed binaries, 1 otherwise (`scripts/ensure-services` uses it to decide on installing).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def configured_dsn() -> str:
    """The server the tests should use first."""
    return os.environ.get("CONVSYNC_TEST_PG") or DEFAULT_DSN


def _run_in_thread(coro: Coroutine[Any, Any, None]) -> None:
    # A thread of its own, so this works from inside a running event loop too.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coro).result()


def answers(dsn: str, timeout: float = 3.0) -> bool:
    """Whether a PostgreSQL server accepts a connection at `dsn`."""
    import asyncpg

    async def probe() -> None:
        conn = await asyncpg.connect(dsn, timeout=timeout)
        await conn.close()

    try:
        _run_in_thread(probe())
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    return True


def drop_schema(dsn: str, schema: str) -> None:
    """Drop a test's schema and everything in it (no error when it is not there)."""
    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    _run_in_thread(drop())


def binaries() -> str | None:
    """The directory holding `initdb` and `pg_ctl` (the newest installed version), or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: [int(p) if p.isdigit() else 0 for p in path.split("/")[4].split(".")],
    )
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    """A server the tests can use; `stop` ends it if we started it."""

    dsn: str
    started: bool = False
    _cleanup: list[list[str]] = field(default_factory=list)
    _directory: str | None = None

    def stop(self) -> None:
        """Stop a cluster we started and delete its files; nothing for an external server."""
        for command in self._cleanup:
            subprocess.run(command, capture_output=True, check=False, timeout=60)
        self._cleanup.clear()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


def start_cluster(bindir: str, timeout: float = 60.0) -> Server:
    """Run `initdb` and `pg_ctl start` on a temporary directory and a free port.

    Raises:
        RuntimeError: the cluster did not start (the message holds the server's log).
    """
    directory = tempfile.mkdtemp(prefix="convsync-pg-")
    as_user: list[str] = []
    if os.geteuid() == 0:
        user = "postgres"
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            user = "nobody"
            entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
        as_user = ["runuser", "-u", user, "--"]
    data = os.path.join(directory, "data")
    log = os.path.join(directory, "log")
    server = Server(dsn="", started=True, _directory=directory)
    try:
        subprocess.run(
            [
                *as_user,
                os.path.join(bindir, "initdb"),
                "-D",
                data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            capture_output=True,
            check=True,
            timeout=timeout,
            cwd=directory,
        )
        for _attempt in range(3):
            port = _free_port()
            options = (
                f"-p {port} -k {directory} -c listen_addresses=127.0.0.1"
                " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            )
            ctl = os.path.join(bindir, "pg_ctl")
            started = subprocess.run(
                [*as_user, ctl, "-D", data, "-l", log, "-o", options, "-w", "-t", "60", "start"],
                capture_output=True,
                check=False,
                timeout=timeout + 30,
                cwd=directory,
            )
            if started.returncode == 0:
                server._cleanup.append([*as_user, ctl, "-D", data, "-m", "immediate", "stop"])
                server.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
                return server
        with open(log, errors="replace") as file:
            raise RuntimeError(f"pg_ctl could not start a cluster:\n{file.read()[-2000:]}")
    except subprocess.CalledProcessError as exc:
        server.stop()
        raise RuntimeError(f"initdb failed: {exc.stderr.decode(errors='replace')}") from exc
    except BaseException:
        server.stop()
        raise


def find_or_start() -> Server | str:
    """A server to test against, or the reason there is none."""
    dsn = configured_dsn()
    if answers(dsn):
        return Server(dsn=dsn)
    bindir = binaries()
    if bindir is None:
        return f"no PostgreSQL answers at {dsn} and no initdb/pg_ctl is installed"
    return start_cluster(bindir)


def main(argv: list[str]) -> int:
    """`check`: exit 0 when tests can have a server (without starting one), else 1."""
    if argv[1:] != ["check"]:
        print("usage: python tests/support/pgserver.py check", file=sys.stderr)
        return 2
    return 0 if answers(configured_dsn()) or binaries() is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
