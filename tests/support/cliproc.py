"""The installed `convsync` console script, run by tests on this tree's code: to its end
(`convsync`), or in the background with its output read as it comes (`Running`).

Every run gets this process's environment without convsync's own settings and terminal hints
(`CONVSYNC_*`, `COLUMNS`, `NO_COLOR`, ...: they would change what the command does), with this
tree first on `PYTHONPATH`, plus what the test adds. Every wait is bounded.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

SCALE = float(os.environ.get("CONVSYNC_TIMEOUT_SCALE", "1"))
TIMEOUT = 20.0 * SCALE
ROOT = Path(__file__).resolve().parents[2]
CONVSYNC = Path(sys.executable).with_name("convsync")  # the installed console script

_DROP = ("CONVSYNC_", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_")


def cli_env(**extra: str) -> dict[str, str]:
    """The environment a `convsync` process gets: see the module doc."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env | extra


def convsync(
    *argv: str,
    stdin: bytes = b"",
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """`convsync *argv` run to its end (bounded), fed `stdin` (empty by default, never this
    process's), with `env` added to its environment; stdout and stderr decoded (a byte that
    is not UTF-8 shows as U+FFFD)."""
    assert CONVSYNC.exists(), f"no {CONVSYNC}: pip install -e . first"
    result = subprocess.run(
        [str(CONVSYNC), *argv],
        input=stdin,
        capture_output=True,
        env=cli_env(**(env or {})),
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
    return subprocess.CompletedProcess(
        result.args,
        result.returncode,
        result.stdout.decode(errors="replace"),
        result.stderr.decode(errors="replace"),
    )


class Running:
    """`convsync *argv` in the background: threads queue its stdout lines as they come
    (`wait_for`, `read_for`; every line read is kept in `seen`) and keep its stderr
    (`errors`); `stop` ends it."""

    def __init__(self, *argv: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(CONVSYNC), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(**(env or {})),
            cwd=ROOT,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.errors: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=_read, args=(self.proc.stdout, self.lines.put), daemon=True),
            threading.Thread(target=_keep, args=(self.proc.stderr, self.errors), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def cpu_seconds(self) -> float | None:
        """The CPU time (user + system) the process has used so far, from `/proc`; None
        once it has ended. A moment of its start-up measured this way is the same moment on
        a quiet machine and on one loaded ten times over, unlike a wall-clock delay."""
        fields = self._stat()
        if fields is None:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _stat(self) -> list[str] | None:
        """The fields of `/proc/PID/stat` after the command name (state first); None once the
        process has ended."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            return None
        return None if fields[0] == "Z" else fields  # Z: exited, not yet reaped

    def run_for_cpu(self, seconds: float, within: float = TIMEOUT) -> None:
        """Wait until the process has used `seconds` of CPU time, has ended, or has slept for
        half a second using none (it waits: a hub serving).

        Raises:
            TimeoutError: it is alive and has not used that much within `within` seconds.
        """
        deadline = time.monotonic() + within
        last, since = -1.0, time.monotonic()
        while (used := self.cpu_seconds()) is not None and used < seconds:
            now = time.monotonic()
            if used != last:
                last, since = used, now
            elif now - since > 0.5 and (self._stat() or ["S"])[0] == "S":
                return  # asleep, using none for half a second: it waits (a hub serving);
                # a process the loaded machine does not run is "R", and is waited for
            if now > deadline:
                raise TimeoutError(f"{used:.3f} s of CPU within {within:g}s, not {seconds:g}")
            time.sleep(0.002)

    def wait_for(self, text: str, within: float = TIMEOUT) -> str:
        """The next stdout line holding `text`.

        Raises:
            TimeoutError: none within `within` seconds.
            AssertionError: the process ended first.
        """
        deadline = time.monotonic() + within
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise TimeoutError(f"no {text!r} within {within:g}s; saw {self.seen}") from None
            if line is None:
                raise AssertionError(f"exited before printing {text!r}: {self.errors}")
            self.seen.append(line)
            if text in line:
                return line

    def read_for(self, seconds: float) -> list[str]:
        """The stdout lines printed in the next `seconds` (fewer if it ends)."""
        lines: list[str] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            lines.append(line)
        self.seen += lines
        return lines

    def url(self) -> str:
        """The url a `serve` process printed."""
        line = self.wait_for("convsync hub at ")
        return line.split(" at ", 1)[1].split()[0]

    def signal(self, sig: int) -> None:
        """Send `sig` if the process still runs."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> tuple[int, str]:
        """SIGCONT (a stopped process must see the next) and SIGTERM if it still runs, then
        a bounded wait (killed past it, and the timeout raised); the exit code and stderr."""
        proc = self.proc
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finally:
            for reader in self._readers:
                reader.join(timeout=TIMEOUT)
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            proc.stderr.close()
        return code, "".join(self.errors)


def _read(stream: IO[str], put: Callable[[str | None], None]) -> None:
    for line in stream:
        put(line)
    put(None)  # the end


def _keep(stream: IO[str], lines: list[str]) -> None:
    lines.extend(stream)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`convsync ARGV` run in this process (`client.cli.main`): exit code, stdout, stderr."""
    from client.cli import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err
