"""The shared harness of `bench/hub.py`: settings, results, server processes, clients, profiles.

Every topic module (`bench/_hub_<topic>.py`) builds on these; `bench/hub.py` is the entry point
and runs them (`TOPICS`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# First, before `bench._engine` (which then puts its code copy ahead of it): appended, an
# editable install of another checkout (the venv's) shadowed this one's `bench` package, so
# a run from a worktree measured, and wrote into, that other checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from bench._engine import CODE, ROOT
from bench._hubproc import message
from bench._report import (
    Results,
    median,
)
from client.replica import Replica
from client.session import Applied
from sync import Conversation, Lineage, Message, decode_record
from sync.protocol import (
    SUBPROTOCOL,
    Hello,
    Records,
    decode_hub_message,
    encode_message,
)

HUBPROC = Path(__file__).resolve().parent / "_hubproc.py"

# Every wait in this script is bounded by this many seconds (scaled for a slow machine).
TIMEOUT = 300.0 * float(os.environ.get("CONVSYNC_TIMEOUT_SCALE", "1"))

# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    repeats: int
    fanout_repeats: int  # even, so that old and new each go first equally often
    fanout_sizes: tuple[int, ...]
    fanout_records: int
    latency_subscribers: int
    latency_rates: tuple[float, ...]  # records/s
    latency_seconds: float  # per repeat, after the warm-up
    latency_warmup: float
    latency_repeats: int
    fsync_probes: int  # fsyncs timed per repeat of the latency topic
    wake_probes: int  # pushes timed after a sleep (and back to back) per latency repeat
    durable_writers: tuple[int, int]
    durable_seconds: float
    contention_writers: tuple[int, int]
    contention_seconds: float
    memory_conversations: int
    memory_messages: int
    idle_connections: int
    idle_conversations: int
    catchup_sizes: tuple[int, ...]
    compression_readers: int


FULL = Settings(
    repeats=5,
    fanout_repeats=8,
    fanout_sizes=(1, 10, 100),
    fanout_records=5_000,
    latency_subscribers=10,
    latency_rates=(100.0, 1000.0),
    latency_seconds=5.0,
    latency_warmup=1.0,
    latency_repeats=4,
    fsync_probes=100,
    wake_probes=100,
    durable_writers=(1, 20),
    durable_seconds=4.0,
    contention_writers=(1, 10),
    contention_seconds=4.0,
    memory_conversations=100,
    memory_messages=500,
    idle_connections=1000,
    idle_conversations=100,
    catchup_sizes=(5_000, 10_000, 20_000, 50_000),
    compression_readers=10,
)
QUICK = Settings(
    repeats=1,
    fanout_repeats=1,
    fanout_sizes=(1, 10),
    fanout_records=500,
    latency_subscribers=3,
    latency_rates=(100.0, 1000.0),
    latency_seconds=1.0,
    latency_warmup=0.3,
    latency_repeats=1,
    fsync_probes=20,
    wake_probes=20,
    durable_writers=(1, 5),
    durable_seconds=1.0,
    contention_writers=(1, 10),
    contention_seconds=1.0,
    memory_conversations=5,
    memory_messages=100,
    idle_connections=50,
    idle_conversations=5,
    catchup_sizes=(1_000, 2_000),
    compression_readers=3,
)

PAYLOAD_CHARS = 120  # message text of the fan-out/latency/durable records: ~300-byte records
MESSAGE_CHARS = 300  # message text of the memory and catch-up conversations

# ---------------------------------------------------------------------------- results


def rate(value: float) -> str:
    return f"{value:,.0f}/s"


def rates(values: Sequence[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f}/s"


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class OldCode:
    """The engine copy of `--baseline REV`: hub processes started with it run REV's code."""

    rev: str
    path: Path
    version: str  # "git 2c86be2"

    def label(self, kind: str) -> str:
        return f"{kind} (old: {self.version})"

    def owns(self, kind: str) -> bool:
        return kind.endswith(f"(old: {self.version})")


def run_order(kinds: list[str], old: OldCode | None, repeat: int) -> list[str]:
    """The kinds in the order of one repeat: each new kind right next to its old twin, new
    first in even repeats and old first in odd ones (so neither side always runs first)."""
    order = []
    for kind in kinds:
        if old is not None and old.owns(kind):
            continue
        pair = [kind, old.label(kind)] if old is not None and old.label(kind) in kinds else [kind]
        order += pair if repeat % 2 == 0 else pair[::-1]
    return order


def old_code_intro(args: argparse.Namespace, what: str) -> str:
    """The paragraph a topic's intro gets with `--baseline`; empty without it."""
    old: OldCode | None = args.old
    if old is None:
        return ""
    return (
        f"\n\n**Old vs new code** (`--baseline {old.rev}`): {what} also run against hubs "
        "started from the packages `sync/`, `server/` and `client/` as they were at "
        f"{old.version} (`git archive` into a temporary directory; those hub processes import "
        "the engine only from there, which the script checks), interleaved with the current "
        "code's runs: each new run next to its old twin, new first in even repeats and old "
        "first in odd ones. Same workload, same client code (this process runs the current "
        "code). new / old = the ratio of the medians; its spread is the min-max of the "
        "per-repeat ratios (each new run against its old twin of the same repeat). Bar "
        "(issue 7, no worse than before): FAIL only when the new code was worse in every "
        "repeat; a median on the worse side that some repeat contradicts is marked *within "
        "noise*."
    )


# ---------------------------------------------------------------------------- processes


class ServerProcess:
    """A hub or baseline relay started from `bench/_hubproc.py`, answering JSON commands.

    `code` is the engine copy the process imports (`CONVSYNC_BENCH_CODE` for that process
    only): the run's copy, or a `--baseline` revision's; `start` checks that it did.
    """

    def __init__(self, proc: asyncio.subprocess.Process, port: int, pid: int) -> None:
        self.proc = proc
        self.port = port
        self.pid = pid
        self.url = f"ws://127.0.0.1:{port}"
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, *args: str, code: Path = CODE, wrap: Sequence[str] = ()) -> ServerProcess:
        """Start the process (`wrap`: a command it runs under, e.g. valgrind's)."""
        env = dict(os.environ, PYTHONPATH=str(ROOT), CONVSYNC_BENCH_CODE=str(code))
        proc = await asyncio.create_subprocess_exec(
            *wrap,
            sys.executable,
            str(HUBPROC),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            cwd=str(ROOT),
            limit=1 << 24,
        )
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 600 if wrap else 60)
            hello = json.loads(line)
        except BaseException:
            await _end(proc)
            raise
        server = cls(proc, int(hello["port"]), int(hello["pid"]))
        stats = await server.ask("stats")
        engine, foreign = stats["engine"], stats["foreign"]
        if not engine.startswith(str(code)) or foreign:
            await server.stop()
            raise RuntimeError(
                f"the server process runs {engine} (and {foreign or 'nothing else'} from "
                f"elsewhere), not the engine copy {code}"
            )
        return server

    async def ask(self, cmd: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        async with self._lock:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}).encode() + b"\n")
            await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), TIMEOUT)
        if not line:
            raise RuntimeError(f"server process {self.pid} exited")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"server process {self.pid}: {answer['error']}")
        return answer

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ask("quit"), 5)
        await _end(self.proc)


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Let `proc` exit (stdin closed), then terminate, then kill it; bounded."""
    if proc.stdin is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
    for signal_it in (None, proc.terminate, proc.kill):
        if signal_it is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal_it()
        try:
            await asyncio.wait_for(proc.wait(), 10)
            return
        except TimeoutError:
            continue


@contextlib.asynccontextmanager
async def servers() -> Any:
    """A registry of started server processes, all stopped on the way out."""
    started: list[ServerProcess] = []

    async def start(*args: str, code: Path = CODE) -> ServerProcess:
        server = await ServerProcess.start(*args, code=code)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            await server.stop()


def cpu_pressure_us() -> int | None:
    """Microseconds some task has waited for a core since boot (`/proc/pressure/cpu`)."""
    try:
        with open("/proc/pressure/cpu", encoding="ascii") as pressure:
            for line in pressure:
                if line.startswith("some"):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def load_average() -> float:
    return os.getloadavg()[0]


class MachineLoad:
    """How busy the shared machine was over a stretch of time (other jobs included)."""

    def __init__(self) -> None:
        self.load_start = load_average()
        self.pressure_start = cpu_pressure_us()
        self.began = time.perf_counter()

    def describe(self) -> str:
        text_ = (
            f"load average (1 min) {self.load_start:.1f} at the start, "
            f"{load_average():.1f} at the end"
        )
        pressure = cpu_pressure_us()
        if pressure is not None and self.pressure_start is not None:
            share = (pressure - self.pressure_start) / ((time.perf_counter() - self.began) * 1e6)
            text_ += (
                f"; some task was waiting for a core {share:.0%} of the time (`/proc/pressure/cpu`)"
            )
        return text_


def client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def bounded(awaitable: Awaitable[Any], seconds: float = TIMEOUT) -> Any:
    return await asyncio.wait_for(awaitable, seconds)


# ---------------------------------------------------------------------------- clients


class TimedReplica(Replica):
    """A `Replica` that notes when each `Applied` event is emitted (`perf_counter`), right
    where the replica folds the records in (before the event waits in the events queue)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrivals: list[tuple[int, int, float]] = []  # (revision, count, time)

    def _emit(self, events: list[Any]) -> None:
        stamp = time.perf_counter()
        for event in events:
            if isinstance(event, Applied):
                self.arrivals.append((event.revision, event.count, stamp))
        super()._emit(events)
        # The events queue is not read here; keep it from growing with the run.
        self.events_nowait()


def payload_messages(count: int) -> list[Message]:
    """User messages whose push records are ~300 bytes of JSON."""
    return [message(i, PAYLOAD_CHARS, alternate=False) for i in range(count)]


async def open_raw(url: str, path: str, compression: str | None) -> ClientConnection:
    return await ws_connect(
        url + path,
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        compression=compression,
        max_size=None,
        open_timeout=60,
        ping_interval=None,
    )


async def raw_hello(ws: ClientConnection, client: str) -> None:
    """Open a convsync session as a fresh replica; returns after the welcome."""
    await ws.send(encode_message(Hello(client, Lineage.EMPTY, 0)), text=True)
    data = await ws.recv(decode=False)
    decode_hub_message(data)


async def count_records(ws: ClientConnection, total: int) -> float:
    """Read `records` frames (decoding each) until `total` records came; returns when."""
    seen = 0
    while seen < total:
        message_ = decode_hub_message(await ws.recv(decode=False))
        if isinstance(message_, Records):
            seen += len(message_.records)
    return time.perf_counter()


async def count_frames(ws: ClientConnection, total: int) -> float:
    """Read relay frames (decoding each payload as a record) until `total` came."""
    for _ in range(total):
        decode_record(await ws.recv(decode=False))
    return time.perf_counter()


# ---------------------------------------------------------------------------- profiles


PROFILE_TOP = 15  # functions listed per profile table


def profile_text(tables: dict[str, str]) -> str:
    """The two `pstats` tables of `profile_tables` (own time, then cumulative), as one text."""
    return tables["idle"] + "\n\n" + tables["tottime"] + "\n\n" + tables["cumulative"]


async def profiled(
    server: ServerProcess, work: Callable[[], Awaitable[Any]], top: int = PROFILE_TOP
) -> str:
    """Run `work` with the server process under cProfile (its event loop's thread); its top
    functions by own time and by cumulative time."""
    await server.ask("profile_start")
    try:
        await work()
    finally:
        answer = await server.ask("profile_stop", top=top)
    return profile_text(answer)


# ---------------------------------------------------------------------------- topics


@dataclass
class Topic:
    heading: str
    intro: str
    results: Results = field(default_factory=Results)
    profiles: list[tuple[str, str]] = field(default_factory=list)


def records_of(messages: list[Message]) -> list[Any]:
    source = Conversation()
    for item in messages:
        source.push(item)
    return source.take_unsaved()


def fsync_ms(directory: str, count: int = 50) -> float:
    """Median milliseconds of a 4 KiB write + `os.fsync` in `directory` (the disk's floor)."""
    path = os.path.join(directory, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        times = []
        for _ in range(count):
            began = time.perf_counter()
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
            times.append(time.perf_counter() - began)
    finally:
        os.close(fd)
        os.unlink(path)
    return median(times) * 1000
