"""Benchmarks of the hub and its replicas over real websockets (issue 3's bar, SPEC section 2).

Run from the repository root:

    .venv/bin/python bench/hub.py all            # every topic, full size; writes docs/benchmarks.md
    .venv/bin/python bench/hub.py fanout         # one topic: fanout, latency, durable, memory,
                                                 #   catchup or compression
    .venv/bin/python bench/hub.py all --quick    # a smoke run at small sizes; writes nothing
    .venv/bin/python bench/hub.py fanout --profile   # also print a cProfile of the hub process

Each topic writes its own `## Hub: ...` section of docs/benchmarks.md with the command, the date,
the machine, its figures, the bar and PASS/FAIL. Every server under test (a hub, or the baseline
relay) runs in a process of its own, started by this script from `bench/_hubproc.py` on
127.0.0.1 port 0; the writer and the readers run here, in this process. Every wait is bounded
and every server process is stopped (then killed if it does not exit) when the script leaves.

What each topic measures (bars from issue 3):

1. fanout: records delivered per second to 1, 10 and 100 readers, convsync vs a plain
   `websockets` relay of the same record bytes (bar: convsync >= 0.7x the relay, each size).
2. latency: push-to-apply latency p50/p99 with 10 subscribers at a steady 1,000 records/s.
3. durable: records/s of acked one-record pushes with SqliteStore (synchronous=FULL), 1 writer
   vs 20 writers on 20 conversations (bar: 20 writers >= 5x one), and appends per commit.
4. memory: hub memory per loaded conversation vs its JSON size (bar: <= 3x), and the hub's RSS
   with 1,000 idle connections (bar: fits in 300 MB).
5. catchup: a fresh replica catching up on 5k..50k-message conversations (bar: time per
   message roughly flat: at 50k <= 1.5x at 5k; 50k must work).
6. compression: permessage-deflate on vs off, delivery rate and hub CPU per delivery
   (expected 2-4x the CPU per delivery; bar: <= 4x).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from bench._hubproc import message, raise_fd_limit, records_for
from bench._report import (
    command_line,
    machine,
    median,
    now,
    spread,
    write_section,
)
from client.replica import Replica
from client.session import Applied
from server.config import HubConfig
from server.hub import Hub
from server.store import SqliteStore
from sync import Lineage, Message, decode_record, encode
from sync.protocol import (
    SUBPROTOCOL,
    Hello,
    Records,
    State,
    decode_hub_message,
    encode_message,
)

ROOT = Path(__file__).resolve().parent.parent
HUBPROC = Path(__file__).resolve().parent / "_hubproc.py"

# Every wait in this script is bounded by this many seconds (scaled for a slow machine).
TIMEOUT = 300.0 * float(os.environ.get("CONVSYNC_TIMEOUT_SCALE", "1"))

# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    repeats: int
    fanout_sizes: tuple[int, ...]
    fanout_records: int
    latency_subscribers: int
    latency_rate: float  # records/s
    latency_seconds: float  # per repeat, after the warm-up
    latency_warmup: float
    latency_repeats: int
    durable_writers: tuple[int, int]
    durable_seconds: float
    memory_conversations: int
    memory_messages: int
    idle_connections: int
    idle_conversations: int
    catchup_sizes: tuple[int, ...]
    compression_readers: int


FULL = Settings(
    repeats=5,
    fanout_sizes=(1, 10, 100),
    fanout_records=5_000,
    latency_subscribers=10,
    latency_rate=1000.0,
    latency_seconds=8.0,
    latency_warmup=1.0,
    latency_repeats=3,
    durable_writers=(1, 20),
    durable_seconds=4.0,
    memory_conversations=100,
    memory_messages=500,
    idle_connections=1000,
    idle_conversations=100,
    catchup_sizes=(5_000, 10_000, 20_000, 50_000),
    compression_readers=10,
)
QUICK = Settings(
    repeats=1,
    fanout_sizes=(1, 10),
    fanout_records=500,
    latency_subscribers=3,
    latency_rate=1000.0,
    latency_seconds=1.0,
    latency_warmup=0.3,
    latency_repeats=1,
    durable_writers=(1, 5),
    durable_seconds=1.0,
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


@dataclass
class Row:
    name: str
    figure: str
    spread: str = ""
    bar: str = ""
    passed: bool | None = None

    @property
    def result(self) -> str:
        return "" if self.passed is None else ("PASS" if self.passed else "FAIL")


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        if row.passed is False:
            self.failed.append(row.name)

    def table(self) -> str:
        header = ["Measurement", "Figure (median)", "Spread (min-max)", "Bar", "Result"]
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for row in self.rows:
            cells = [row.name, row.figure, row.spread, row.bar, row.result]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def rate(value: float) -> str:
    return f"{value:,.0f}/s"


def rates(values: Sequence[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f}/s"


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- processes


class ServerProcess:
    """A hub or baseline relay started from `bench/_hubproc.py`, answering JSON commands."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int, pid: int) -> None:
        self.proc = proc
        self.port = port
        self.pid = pid
        self.url = f"ws://127.0.0.1:{port}"
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, *args: str) -> ServerProcess:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = await asyncio.create_subprocess_exec(
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
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            hello = json.loads(line)
        except BaseException:
            await _end(proc)
            raise
        return cls(proc, int(hello["port"]), int(hello["pid"]))

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

    async def start(*args: str) -> ServerProcess:
        server = await ServerProcess.start(*args)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            await server.stop()


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


# ---------------------------------------------------------------------------- runs


@dataclass
class Run:
    """One timed delivery run."""

    delivered: int
    seconds: float
    hub_cpu: float
    client_cpu: float
    pushes: int = 0

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds


async def run_baseline(server: ServerProcess, readers: int, payloads: list[bytes]) -> Run:
    """The writer sends each payload as one frame; the relay sends it to every reader."""
    async with contextlib.AsyncExitStack() as stack:
        conns = [await open_raw(server.url, "/read", None) for _ in range(readers)]
        for conn in conns:
            stack.push_async_callback(conn.close)
        writer = await open_raw(server.url, "/write", None)
        stack.push_async_callback(writer.close)
        await asyncio.sleep(0.2)  # every reader registered on the relay
        total = len(payloads)
        before, cpu0 = await server.ask("stats"), client_cpu()
        started = time.perf_counter()
        tasks = [asyncio.create_task(count_frames(conn, total)) for conn in conns]
        for payload in payloads:
            await writer.send(payload, text=True)
        ends = await bounded(asyncio.gather(*tasks))
        seconds = max(ends) - started
        cpu1, after = client_cpu(), await server.ask("stats")
    return Run(readers * total, seconds, after["cpu"] - before["cpu"], cpu1 - cpu0)


async def run_convsync(
    server: ServerProcess,
    readers: int,
    messages: list[Message],
    *,
    raw: bool = False,
    compression: str | None = None,
) -> Run:
    """The writer pushes every message into its replica at once; the replica sends batches
    (at most 1,000 records, one in flight); readers are Replicas (or raw protocol clients)."""
    conversation = f"fan-{uuid.uuid4().hex[:12]}"
    total = len(messages)
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(
            Replica(server.url, conversation, client="writer", compression=compression)
        )
        replicas: list[Replica] = []
        conns: list[ClientConnection] = []
        for k in range(readers):
            if raw:
                conn = await open_raw(server.url, f"/v1/conversations/{conversation}", compression)
                stack.push_async_callback(conn.close)
                await raw_hello(conn, f"reader-{k}")
                conns.append(conn)
            else:
                replica = Replica(
                    server.url, conversation, client=f"reader-{k}", compression=compression
                )
                replicas.append(await stack.enter_async_context(replica))
        before, cpu0 = await server.ask("stats"), client_cpu()
        started = time.perf_counter()
        if raw:
            tasks = [asyncio.create_task(count_records(conn, total)) for conn in conns]
        else:

            async def caught_up(replica: Replica) -> float:
                await replica.wait_for(total)
                return time.perf_counter()

            tasks = [asyncio.create_task(caught_up(replica)) for replica in replicas]
        for item in messages:
            writer.conversation.push(item)
        ends = await bounded(asyncio.gather(*tasks))
        seconds = max(ends) - started
        cpu1, after = client_cpu(), await server.ask("stats")
        await bounded(writer.flush())
    return Run(
        readers * total,
        seconds,
        after["cpu"] - before["cpu"],
        cpu1 - cpu0,
        pushes=after["pushes_accepted"] - before["pushes_accepted"],
    )


# ---------------------------------------------------------------------------- profiles


async def profiled(server: ServerProcess, work: Callable[[], Awaitable[Any]], top: int = 30) -> str:
    """Run `work` with the server process under cProfile; its top functions by own time."""
    await server.ask("profile_start")
    try:
        await work()
    finally:
        answer = await server.ask("profile_stop", top=top)
    return answer["tottime"] + "\n" + answer["cumulative"]


# ---------------------------------------------------------------------------- topics


@dataclass
class Topic:
    heading: str
    intro: str
    results: Results = field(default_factory=Results)
    profiles: list[tuple[str, str]] = field(default_factory=list)


async def topic_fanout(settings: Settings, args: argparse.Namespace) -> Topic:
    topic = Topic(
        "Hub: fan-out (`bench/hub.py fanout`)",
        "Records delivered per second = records received by all readers / time from the "
        "writer's first send to the last reader's last record. Every server runs in a process "
        "of its own; the writer and all the readers run in one client process (this script), "
        f"`compression=None`. {settings.fanout_records:,} records per run: user messages of "
        f"{PAYLOAD_CHARS} characters, whose push records are ~300 bytes of JSON.\n\n"
        "- **baseline**: a minimal `websockets` relay (`bench/_hubproc.py baseline`): every "
        "frame it receives goes to every reader with `websockets.broadcast` (no backpressure). "
        "The writer sends each record's JSON bytes as one text frame (`await ws.send`); each "
        "reader decodes each frame as a `ChangeRecord`.\n"
        "- **convsync**: a hub (`MemoryStore`; the SQLite row: `SqliteStore`, "
        "synchronous=FULL, on a temporary file). The writer is a real `Replica`: it pushes all "
        "records into `replica.conversation` at once and the replica sends them as the "
        "protocol allows (batches of at most 1,000 records and 1 MiB, one in flight). The "
        "readers are real `Replica`s (decode, fold into `confirmed`, fold into `local`); the "
        "raw rows use raw protocol clients instead (`hello`, then decode every `records` "
        "frame with `sync.protocol.decode_hub_message`, no fold).\n\n"
        "CPU columns: CPU seconds the server process and the client process used during the "
        "run, as a share of the run's wall time (1.0 = one core busy): a figure near 1.0 "
        "marks that process as the bottleneck.",
    )
    results = topic.results
    all_messages = payload_messages(settings.fanout_records)
    payloads = [encode(r) for r in _records_of(all_messages)]
    record_bytes = statistics.mean(len(p) for p in payloads)
    tmp = tempfile.TemporaryDirectory(prefix="convsync-bench-")
    kinds = ["baseline", "convsync", "convsync raw readers", "convsync SQLite"]
    runs: dict[tuple[str, int], list[Run]] = {}
    async with servers() as start:
        baseline = await start("baseline")
        hub = await start("hub", "--store", "memory")
        sqlite_hub = await start("hub", "--store", "sqlite", "--path", f"{tmp.name}/fan.db")
        for readers in settings.fanout_sizes:
            for repeat in range(settings.repeats):
                for kind in kinds:
                    if kind == "baseline":
                        run = await run_baseline(baseline, readers, payloads)
                    elif kind == "convsync SQLite":
                        run = await run_convsync(sqlite_hub, readers, all_messages)
                    else:
                        raw = kind == "convsync raw readers"
                        run = await run_convsync(hub, readers, all_messages, raw=raw)
                    runs.setdefault((kind, readers), []).append(run)
                    log(
                        f"fanout {readers:>3} readers, {kind:<22} #{repeat}: "
                        f"{run.rate:>9,.0f} records/s, server cpu {run.hub_cpu / run.seconds:.2f},"
                        f" client cpu {run.client_cpu / run.seconds:.2f}"
                    )
                gc.collect()
        if args.profile:
            readers = max(settings.fanout_sizes)
            topic.profiles.append(
                (
                    f"hub process, convsync fan-out to {readers} Replica readers",
                    await profiled(hub, lambda: run_convsync(hub, readers, all_messages)),
                )
            )
            topic.profiles.append(
                (
                    f"baseline relay process, fan-out to {readers} readers",
                    await profiled(baseline, lambda: run_baseline(baseline, readers, payloads)),
                )
            )
    tmp.cleanup()
    for readers in settings.fanout_sizes:
        base = runs[("baseline", readers)]
        base_rate = median([r.rate for r in base])
        for kind in kinds:
            sample = runs[(kind, readers)]
            rates_ = [r.rate for r in sample]
            share = median([r.hub_cpu / r.seconds for r in sample])
            client = median([r.client_cpu / r.seconds for r in sample])
            extra = ""
            if kind != "baseline":
                pushes = median([r.pushes for r in sample])
                extra = f"; {settings.fanout_records / pushes:,.0f} records/push"
            results.add(
                Row(
                    f"{readers} reader{'s' if readers > 1 else ''}: {kind}",
                    f"{rate(median(rates_))} (server CPU {share:.2f}, client CPU {client:.2f}"
                    f"{extra})",
                    spread=rates(rates_),
                )
            )
        for kind in ("convsync", "convsync SQLite"):
            ratio = median([r.rate for r in runs[(kind, readers)]]) / base_rate
            bar = kind == "convsync"
            results.add(
                Row(
                    f"{readers} reader{'s' if readers > 1 else ''}: {kind} / baseline",
                    f"{ratio:.2f}",
                    bar=">= 0.7" if bar else "",
                    passed=(ratio >= 0.7) if bar else None,
                )
            )
    results.notes.append(
        f"Record size: {record_bytes:.0f} bytes of JSON on average (the baseline relays "
        "exactly these bytes). Each figure is the median of "
        f"{settings.repeats} runs; the four kinds' runs are interleaved, a fresh conversation "
        "per convsync run."
    )
    return topic


def _records_of(messages: list[Message]) -> list[Any]:
    from sync import Conversation

    source = Conversation()
    for item in messages:
        source.push(item)
    return source.take_unsaved()


async def run_latency(server: ServerProcess, settings: Settings) -> tuple[list[float], float, int]:
    """One steady run: (latencies in seconds after the warm-up, achieved rate, pushes)."""
    conversation = f"lat-{uuid.uuid4().hex[:12]}"
    interval = 1.0 / settings.latency_rate
    total = int((settings.latency_warmup + settings.latency_seconds) * settings.latency_rate)
    warm = int(settings.latency_warmup * settings.latency_rate)
    messages = payload_messages(total)
    pushed_at = [0.0] * (total + 1)  # by revision (the writer is the only pusher)
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(Replica(server.url, conversation, client="writer"))
        subscribers = [
            await stack.enter_async_context(
                TimedReplica(server.url, conversation, client=f"sub-{k}")
            )
            for k in range(settings.latency_subscribers)
        ]
        before = await server.ask("stats")
        push = writer.conversation.push
        clock = time.perf_counter
        started = clock()
        k = 0
        while k < total:
            due = min(total, int((clock() - started) / interval) + 1)
            while k < due:
                pushed_at[k + 1] = clock()
                push(messages[k])
                k += 1
            delay = started + k * interval - clock()
            await asyncio.sleep(max(0.0, delay))
        achieved = total / (clock() - started)
        await bounded(asyncio.gather(*(s.wait_for(total) for s in subscribers)))
        after = await server.ask("stats")
    latencies = []
    for sub in subscribers:
        for revision, count, stamp in sub.arrivals:
            for rev in range(revision - count + 1, revision + 1):
                if rev > warm:
                    latencies.append(stamp - pushed_at[rev])
    return latencies, achieved, after["pushes_accepted"] - before["pushes_accepted"]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def topic_latency(settings: Settings, args: argparse.Namespace) -> Topic:
    n = settings.latency_subscribers
    topic = Topic(
        "Hub: append-to-apply latency (`bench/hub.py latency`)",
        f"A hub (`MemoryStore`) in its own process; in this process a writer `Replica` and "
        f"{n} subscriber `Replica`s of one conversation. The writer pushes one record (a "
        f"{PAYLOAD_CHARS}-character user message, ~300-byte record) every "
        f"{1000 / settings.latency_rate:g} ms on a fixed schedule (when the loop wakes late it "
        "pushes the records due, so the average rate holds); its replica batches what "
        "accumulated while a push is in flight, as the protocol does. Latency = "
        "`time.perf_counter()` when a subscriber's replica emits `Applied` for the record "
        "(right after folding it into its local value) minus `perf_counter()` just before the "
        f"writer's `push` call, for every record and subscriber after a "
        f"{settings.latency_warmup:g} s warm-up. {settings.latency_repeats} runs of "
        f"{settings.latency_seconds:g} s; the figures are the medians of the runs' "
        "percentiles.",
    )
    results = topic.results
    p50s, p99s, p999s, maxes, achieved_rates, batch = [], [], [], [], [], []
    async with servers() as start:
        hub = await start("hub", "--store", "memory")
        for repeat in range(settings.latency_repeats):
            latencies, achieved, pushes = await run_latency(hub, settings)
            total = int(
                (settings.latency_warmup + settings.latency_seconds) * settings.latency_rate
            )
            p50s.append(percentile(latencies, 50) * 1000)
            p99s.append(percentile(latencies, 99) * 1000)
            p999s.append(percentile(latencies, 99.9) * 1000)
            maxes.append(max(latencies) * 1000)
            achieved_rates.append(achieved)
            batch.append(total / pushes)
            log(
                f"latency #{repeat}: p50 {p50s[-1]:.2f} ms p99 {p99s[-1]:.2f} ms "
                f"({len(latencies):,} samples, {achieved:,.0f} records/s, "
                f"{batch[-1]:.1f} records/push)"
            )
        if args.profile:
            topic.profiles.append(
                (
                    "hub process, steady 1,000 records/s",
                    await profiled(hub, lambda: run_latency(hub, settings)),
                )
            )
    ms = "{:.2f}"
    results.add(
        Row("achieved push rate", rate(median(achieved_rates)), spread=rates(achieved_rates))
    )
    results.add(Row("records per push (the writer's batching)", f"{median(batch):.2f}"))
    results.add(
        Row(
            f"p50 latency, {n} subscribers",
            f"{median(p50s):.2f} ms",
            spread=spread(p50s, ms) + " ms",
        )
    )
    results.add(
        Row(
            f"p99 latency, {n} subscribers",
            f"{median(p99s):.2f} ms",
            spread=spread(p99s, ms) + " ms",
        )
    )
    results.add(
        Row(
            "p99.9 latency (informative)",
            f"{median(p999s):.2f} ms",
            spread=spread(p999s, ms) + " ms",
        )
    )
    results.add(
        Row(
            "max latency (informative)", f"{median(maxes):.2f} ms", spread=spread(maxes, ms) + " ms"
        )
    )
    return topic


async def run_durable(server: ServerProcess, writers: int, seconds: float) -> dict[str, float]:
    """`writers` replicas, each on its own conversation, each pushing one record and waiting
    for its ack, again and again, for `seconds`."""
    tag = uuid.uuid4().hex[:8]
    messages = payload_messages(64)
    async with contextlib.AsyncExitStack() as stack:
        replicas = [
            await stack.enter_async_context(
                Replica(server.url, f"dur-{tag}-{k}", client=f"writer-{k}")
            )
            for k in range(writers)
        ]
        counts = [0] * writers

        async def write(k: int, replica: Replica, deadline: float) -> float:
            push = replica.conversation.push
            while time.perf_counter() < deadline:
                push(messages[counts[k] % len(messages)])
                await replica.flush()
                counts[k] += 1
            return time.perf_counter()

        before = await server.ask("stats")
        started = time.perf_counter()
        deadline = started + seconds
        ends = await bounded(
            asyncio.gather(*(write(k, r, deadline) for k, r in enumerate(replicas)))
        )
        elapsed = max(ends) - started
        after = await server.ask("stats")
    commits = after["commits"] - before["commits"]
    appends = after["appends"] - before["appends"]
    return {
        "rate": sum(counts) / elapsed,
        "records": sum(counts),
        "commits": commits,
        "appends": appends,
        "per_commit": appends / commits if commits else 0.0,
    }


async def topic_durable(settings: Settings, args: argparse.Namespace) -> Topic:
    one, many = settings.durable_writers
    topic = Topic(
        "Hub: durable appends, group commit (`bench/hub.py durable`)",
        "A hub on `SqliteStore` (synchronous=FULL, WAL) on a temporary file on the machine's "
        "disk (ext4), in its own process. In this process, 1 or "
        f"{many} writer `Replica`s, **each on a conversation of its own** (pushes to one "
        "conversation are serialized by the hub, so only pushes to different conversations "
        "can share a commit). Each writer pushes one record (a ~300-byte user-message push "
        "record), waits for its ack (`await replica.flush()`: the hub acks only after the "
        "commit that holds it), and repeats, for "
        f"{settings.durable_seconds:g} s. Records/s = acked records of all writers / elapsed. "
        "Appends per commit: the deltas of the store's `appends` and `commits` counters over "
        "the run, read in the hub process (commits also count the snapshot written every "
        "1,000 records of a conversation).",
    )
    results = topic.results
    tmp = tempfile.TemporaryDirectory(prefix="convsync-bench-")
    samples: dict[int, list[dict[str, float]]] = {one: [], many: []}
    async with servers() as start:
        hub = await start("hub", "--store", "sqlite", "--path", f"{tmp.name}/durable.db")
        await run_durable(hub, one, min(1.0, settings.durable_seconds))  # warm-up
        for repeat in range(settings.repeats):
            for writers in (one, many):
                outcome = await run_durable(hub, writers, settings.durable_seconds)
                samples[writers].append(outcome)
                log(
                    f"durable {writers:>2} writers #{repeat}: {outcome['rate']:,.0f} records/s,"
                    f" {outcome['per_commit']:.2f} appends/commit"
                )
        if args.profile:
            topic.profiles.append(
                (
                    f"hub process, {many} durable writers",
                    await profiled(hub, lambda: run_durable(hub, many, settings.durable_seconds)),
                )
            )
    tmp.cleanup()
    for writers in (one, many):
        rates_ = [s["rate"] for s in samples[writers]]
        per_commit = [s["per_commit"] for s in samples[writers]]
        results.add(
            Row(
                f"{writers} writer{'s' if writers > 1 else ''}: acked records/s",
                rate(median(rates_)),
                spread=rates(rates_),
            )
        )
        results.add(
            Row(
                f"{writers} writer{'s' if writers > 1 else ''}: appends per commit",
                f"{median(per_commit):.2f}",
                spread=spread(per_commit, "{:.2f}"),
            )
        )
    ratio = median([s["rate"] for s in samples[many]]) / median([s["rate"] for s in samples[one]])
    results.add(Row(f"{many} writers / 1 writer", f"{ratio:.2f}", bar=">= 5", passed=ratio >= 5))
    return topic


async def topic_memory(settings: Settings, args: argparse.Namespace) -> Topic:
    n, size = settings.memory_conversations, settings.memory_messages
    topic = Topic(
        "Hub: memory (`bench/hub.py memory`)",
        f"**Per conversation** (hub in this process): {n} conversations of {size} messages "
        f"(alternating user/assistant, {MESSAGE_CHARS} characters each, one push record per "
        "message) are written straight into a `SqliteStore` file; then, with `tracemalloc` "
        "tracing, the hub loads each one (`hub.room_for_read`: a `Room` folded from the "
        "store's records and kept loaded). Retained = tracemalloc's traced total after "
        "`gc.collect()` minus the total before loading. JSON size = the sum of "
        "`len(sync.encode(conversation))` (the state as `GET /v1/conversations/{id}` "
        "sends it). The same load is also measured in a hub process of its own (RSS before and "
        "after, informative: RSS includes allocator slack).\n\n"
        f"**Idle connections**: a hub (`MemoryStore`) in its own process holding "
        f"{settings.idle_conversations} conversations of 10 messages; this process opens "
        f"{settings.idle_connections:,} raw protocol connections spread evenly over them, "
        "each sends `hello` and reads its `welcome` and catch-up, then stays idle. The hub's "
        "`VmRSS` (`/proc/PID/status`) is read before the first connection and 2 s after the "
        "last. The open-files limit is raised to the hard limit in both processes.",
    )
    results = topic.results
    tmp = tempfile.TemporaryDirectory(prefix="convsync-bench-")
    path = f"{tmp.name}/memory.db"
    ids = [f"mem-{k}" for k in range(n)]

    # --- per conversation, tracemalloc, hub in this process
    json_total = 0
    async with SqliteStore(path, synchronous="OFF") as store:
        for conversation_id in ids:
            records = records_for(size, MESSAGE_CHARS)
            await store.append(conversation_id, Lineage.fresh(), 0, records)
            del records
    config = HubConfig(idle_unload=3600, ping_interval=None)
    async with Hub(SqliteStore(path), host="127.0.0.1", port=0, config=config) as hub:
        await hub.room_for_read("warm-up")  # first-use allocations of the code paths
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for conversation_id in ids:
            await hub.room_for_read(conversation_id)
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
        snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()
        for conversation_id in ids:
            room = await hub.room_for_read(conversation_id)
            assert room is not None and len(room.conversation) == size
            json_total += len(encode(room.conversation))
    ratio = retained / json_total
    results.add(
        Row(
            f"retained by {n} loaded conversations (tracemalloc)",
            f"{retained / 2**20:.1f} MiB = {retained / n / 1024:.0f} KiB each",
        )
    )
    results.add(
        Row(
            f"their JSON size ({size} messages each)",
            f"{json_total / 2**20:.1f} MiB = {json_total / n / 1024:.0f} KiB each",
        )
    )
    results.add(Row("memory / JSON size", f"{ratio:.2f}", bar="<= 3", passed=ratio <= 3))
    top = snapshot.statistics("lineno")[:8]
    topic.results.notes.append(
        "Retained memory by allocating line (tracemalloc, top 8): "
        + "; ".join(
            f"`{Path(stat.traceback[0].filename).name}:{stat.traceback[0].lineno}` "
            f"{stat.size / 2**20:.1f} MiB"
            for stat in top
        )
    )

    async with servers() as start:
        # --- the same load in a hub process of its own: RSS
        hub_proc = await start("hub", "--store", "sqlite", "--path", path)
        await hub_proc.ask("load", ids=["warm-up"])
        rss0 = (await hub_proc.ask("stats"))["rss_kb"]
        await hub_proc.ask("load", ids=ids)
        rss1 = (await hub_proc.ask("stats"))["rss_kb"]
        rss_ratio = (rss1 - rss0) * 1024 / json_total
        results.add(
            Row(
                f"hub process RSS growth loading the same {n} conversations (informative)",
                f"{(rss1 - rss0) / 1024:.1f} MiB = {rss_ratio:.2f}x their JSON size",
            )
        )
        await hub_proc.stop()

        # --- idle connections
        hub = await start("hub", "--store", "memory")
        conversations = [f"idle-{k}" for k in range(settings.idle_conversations)]
        for conversation_id in conversations:
            await hub.ask("seed", id=conversation_id, messages=10, chars=MESSAGE_CHARS)
        await hub.ask("load", ids=conversations)
        gc.collect()
        await asyncio.sleep(1)
        stats0 = await hub.ask("stats")
        conns: list[ClientConnection] = []
        try:
            for k in range(settings.idle_connections):
                conversation_id = conversations[k % len(conversations)]
                conn = await open_raw(hub.url, f"/v1/conversations/{conversation_id}", None)
                conns.append(conn)
                await raw_hello(conn, f"idle-{k}")
                await bounded(count_records(conn, 10), 30)
            await asyncio.sleep(2)
            stats1 = await hub.ask("stats")
            assert stats1["connections"] == settings.idle_connections, stats1
        finally:
            for conn in conns:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), 5)
    growth = stats1["rss_kb"] - stats0["rss_kb"]
    count = settings.idle_connections
    results.add(Row("hub RSS before the connections", f"{stats0['rss_kb'] / 1024:.1f} MiB"))
    results.add(
        Row(
            f"hub RSS growth with {count:,} idle connections",
            f"{growth / 1024:.1f} MiB = {growth / count:.1f} KiB per connection",
        )
    )
    total = stats1["rss_kb"] / 1024
    results.add(
        Row(
            f"hub RSS with {count:,} idle connections (total)",
            f"{total:.1f} MiB",
            bar="<= 300 MB (total RSS)",
            passed=stats1["rss_kb"] * 1024 <= 300e6,
        )
    )
    tmp.cleanup()
    return topic


async def raw_catch_up(url: str, conversation_id: str, messages: int) -> tuple[float, int, int]:
    """A raw protocol client's catch-up: (seconds, frames, bytes) from connect to complete."""
    started = time.perf_counter()
    conn = await open_raw(url, f"/v1/conversations/{conversation_id}", None)
    try:
        await conn.send(encode_message(Hello("raw", Lineage.EMPTY, 0)), text=True)
        frames = size = entries = 0
        state_done = False
        while not state_done and entries < messages:
            data = await conn.recv(decode=False)
            frames += 1
            size += len(data)
            message_ = decode_hub_message(data)
            if isinstance(message_, Records):
                entries += len(message_.records)
            elif isinstance(message_, State):
                entries += len(message_.state.entries)
                state_done = not message_.more
            elif hasattr(message_, "entries"):
                entries += len(message_.entries)
                state_done = not message_.more
        return time.perf_counter() - started, frames, size
    finally:
        await conn.close()


async def replica_catch_up(url: str, conversation_id: str, messages: int) -> float:
    """Seconds from a fresh `Replica`'s connect to its `async with` returning (caught up)."""
    started = time.perf_counter()
    async with Replica(url, conversation_id, connect_timeout=TIMEOUT) as replica:
        seconds = time.perf_counter() - started
        assert len(replica.conversation) == messages, len(replica.conversation)
    return seconds


async def topic_catchup(settings: Settings, args: argparse.Namespace) -> Topic:
    sizes = settings.catchup_sizes
    topic = Topic(
        "Hub: catch-up (`bench/hub.py catchup`)",
        f"A hub on `SqliteStore` (temporary file) in its own process. For each size, two logs "
        f"are written straight into its store: N one-entry push records (alternating "
        f"user/assistant messages of {MESSAGE_CHARS} characters) — a fresh replica gets "
        "these as `records` frames (**records path**) — and the same N records plus one "
        "record more (a `halt` change to no halt, which changes nothing), so the log is "
        "longer than the state and a fresh replica gets `state` + `entries` frames "
        "(**state path**, SPEC 2.4 rule 1). Both are loaded into the hub first (the cold "
        "load is shown, informative). Catch-up time = from a fresh real `Replica`'s connect "
        "to its `async with` returning (welcome, every frame, the state or records folded, "
        "`local` rebuilt), checked to hold N entries. The raw rows: a raw protocol client "
        "(hello, decode every frame, no fold) on the same log, with the frames and bytes it "
        f"got (frame limit 1 MiB). Median of {settings.repeats} runs, sizes interleaved. "
        "Bar: the time per message at the largest size is at most 1.5x that at the smallest.",
    )
    results = topic.results
    tmp = tempfile.TemporaryDirectory(prefix="convsync-bench-")
    paths = ("state", "records")
    times: dict[tuple[str, int], list[float]] = {}
    raw: dict[tuple[str, int], list[tuple[float, int, int]]] = {}
    loads: dict[tuple[str, int], float] = {}
    state_bytes: dict[int, int] = {}
    async with servers() as start:
        hub = await start("hub", "--store", "sqlite", "--path", f"{tmp.name}/catchup.db")
        for n in sizes:
            for path in paths:
                answer = await hub.ask(
                    "seed",
                    id=f"cu-{path}-{n}",
                    messages=n,
                    chars=MESSAGE_CHARS,
                    tail_halt=path == "state",
                )
                state_bytes[n] = answer["state_bytes"]
                load = await hub.ask("load", ids=[f"cu-{path}-{n}"])
                loads[(path, n)] = load["seconds"][0]
                log(f"catchup seeded {path} {n:,}: cold load {loads[(path, n)]:.2f} s")
        for repeat in range(settings.repeats):
            for n in sizes:
                for path in paths:
                    conversation_id = f"cu-{path}-{n}"
                    seconds = await replica_catch_up(hub.url, conversation_id, n)
                    times.setdefault((path, n), []).append(seconds)
                    raw.setdefault((path, n), []).append(
                        await raw_catch_up(hub.url, conversation_id, n)
                    )
                    log(
                        f"catchup {path:<7} {n:>6,} #{repeat}: replica {seconds:.3f} s, "
                        f"raw {raw[(path, n)][-1][0]:.3f} s"
                    )
                    gc.collect()
        if args.profile:
            n = max(sizes)
            topic.profiles.append(
                (
                    f"hub process, catch-up of {n:,} messages (state path)",
                    await profiled(hub, lambda: replica_catch_up(hub.url, f"cu-state-{n}", n)),
                )
            )
    tmp.cleanup()
    for path in paths:
        for n in sizes:
            sample = times[(path, n)]
            raw_sample = raw[(path, n)]
            raw_seconds = median([r[0] for r in raw_sample])
            _, frames, size = raw_sample[0]
            results.add(
                Row(
                    f"{path} path, {n:,} messages (state {state_bytes[n] / 2**20:.1f} MiB)",
                    f"{median(sample):.3f} s = {median(sample) / n * 1e6:.1f} µs/message "
                    f"(raw client {raw_seconds:.3f} s, {frames} frames, "
                    f"{size / 2**20:.1f} MiB; cold load {loads[(path, n)]:.2f} s)",
                    spread=spread(sample, "{:.3f}") + " s",
                )
            )
        small, large = min(sizes), max(sizes)
        ratio = (median(times[(path, large)]) / large) / (median(times[(path, small)]) / small)
        results.add(
            Row(
                f"{path} path: time per message at {large:,} / at {small:,}",
                f"{ratio:.2f}",
                bar="<= 1.5",
                passed=ratio <= 1.5,
            )
        )
    return topic


async def topic_compression(settings: Settings, args: argparse.Namespace) -> Topic:
    readers = settings.compression_readers
    topic = Topic(
        "Hub: compression (`bench/hub.py compression`)",
        f"The fan-out run (writer `Replica` pushing {settings.fanout_records:,} ~300-byte "
        f"records at once, {readers} reader `Replica`s, all in this process; hub on "
        "`MemoryStore` in its own process) against two hubs: one with "
        '`HubConfig(compression=None)` (the default) and one with `compression="deflate"`; '
        'the replicas use the same setting (`Replica(..., compression="deflate")`). Hub CPU '
        "per delivery = CPU seconds of the hub process during the run (user + system, "
        "`getrusage` in that process) / records delivered. Runs interleaved, median of "
        f"{settings.repeats}. The messages are words of a small vocabulary, so they compress "
        "well (as chat text does).",
    )
    results = topic.results
    messages = payload_messages(settings.fanout_records)
    samples: dict[str, list[Run]] = {"off": [], "deflate": []}
    async with servers() as start:
        hubs = {
            "off": await start("hub", "--store", "memory"),
            "deflate": await start("hub", "--store", "memory", "--compression", "deflate"),
        }
        for repeat in range(settings.repeats):
            for setting, hub in hubs.items():
                compression = None if setting == "off" else "deflate"
                run = await run_convsync(hub, readers, messages, compression=compression)
                samples[setting].append(run)
                log(
                    f"compression {setting:<7} #{repeat}: {run.rate:,.0f} records/s, "
                    f"hub {run.hub_cpu / run.delivered * 1e6:.2f} µs/delivery"
                )
        if args.profile:
            hub = hubs["deflate"]
            topic.profiles.append(
                (
                    "hub process, deflate fan-out",
                    await profiled(
                        hub, lambda: run_convsync(hub, readers, messages, compression="deflate")
                    ),
                )
            )
    per_delivery = {}
    for setting, sample in samples.items():
        rates_ = [r.rate for r in sample]
        cpu = [r.hub_cpu / r.delivered * 1e6 for r in sample]
        per_delivery[setting] = median(cpu)
        results.add(
            Row(f"compression {setting}: delivery rate", rate(median(rates_)), spread=rates(rates_))
        )
        results.add(
            Row(
                f"compression {setting}: hub CPU per delivery",
                f"{median(cpu):.2f} µs",
                spread=spread(cpu, "{:.2f}") + " µs",
            )
        )
    ratio = per_delivery["deflate"] / per_delivery["off"]
    results.add(
        Row(
            "hub CPU per delivery, deflate / off",
            f"{ratio:.2f}",
            bar="<= 4 (expected 2-4)",
            passed=ratio <= 4,
        )
    )
    off = median([r.rate for r in samples["off"]])
    on = median([r.rate for r in samples["deflate"]])
    results.add(Row("delivery rate, deflate / off", f"{on / off:.2f}"))
    return topic


# ---------------------------------------------------------------------------- main

TOPICS: dict[str, Callable[[Settings, argparse.Namespace], Awaitable[Topic]]] = {
    "fanout": topic_fanout,
    "latency": topic_latency,
    "durable": topic_durable,
    "memory": topic_memory,
    "catchup": topic_catchup,
    "compression": topic_compression,
}


def section(topic: Topic, started: str, seconds: float) -> str:
    results = topic.results
    if results.failed:
        verdict = "FAILED: " + "; ".join(results.failed)
    elif any(row.passed for row in results.rows):
        verdict = "all bars PASS"
    else:
        verdict = "no bar (figures reported)"
    return "\n".join(
        [
            f"Command: `{command_line()}` (from the repository root)  ",
            f"Date: {started}; this topic took {seconds:.0f} s  ",
            f"Machine: {machine()}, shared with other jobs  ",
            f"Result: **{verdict}**",
            "",
            topic.intro,
            "",
            results.table(),
            "",
            "\n\n".join(results.notes),
        ]
    )


async def amain(args: argparse.Namespace) -> int:
    settings = QUICK if args.quick else FULL
    raise_fd_limit()
    names = list(TOPICS) if args.topic == "all" else [args.topic]
    failed = False
    for name in names:
        log(f"... {name}")
        started = now()
        began = time.perf_counter()
        topic = await TOPICS[name](settings, args)
        seconds = time.perf_counter() - began
        failed = failed or bool(topic.results.failed)
        print(f"\n## {topic.heading}\n")
        print(topic.results.table())
        for note in topic.results.notes:
            print("\n" + note)
        for title, profile in topic.profiles:
            print(f"\ncProfile of the {title}:\n{profile}")
        if args.quick or args.no_write:
            print("\n(not written to docs/benchmarks.md)")
        else:
            path = write_section(topic.heading, section(topic, started, seconds))
            print(f"\nwrote the {topic.heading!r} section of {path}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topic", choices=[*TOPICS, "all"])
    parser.add_argument("--quick", action="store_true", help="a smoke run (writes nothing)")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile of the hub process"
    )
    args = parser.parse_args(argv)
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
