"""`bench/hub.py latency`: push-to-apply latency at steady rates, relay vs memory vs SQLite."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# First, before `bench._engine` (which then puts its code copy ahead of it): appended, an
# editable install of another checkout (the venv's) shadowed this one's `bench` package, so
# a run from a worktree measured, and wrote into, that other checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.asyncio.client import ClientConnection

from bench._hub import (
    PAYLOAD_CHARS,
    PROFILE_TOP,
    OldCode,
    ServerProcess,
    Settings,
    TimedReplica,
    Topic,
    bounded,
    client_cpu,
    log,
    old_code_intro,
    open_raw,
    payload_messages,
    profile_text,
    profiled,
    records_of,
    run_order,
    servers,
)
from bench._hubproc import GC_PAUSES, profile_tables
from bench._report import (
    Row,
    gc_paused,
    median,
    no_worse_row,
    ratio_row,
    spread,
)
from client.replica import Replica
from client.session import Disconnected
from sync import Conversation, decode_record, encode


@dataclass
class LatencyRun:
    """One steady run: latency over every record and subscriber after the warm-up (ms), and
    what the processes did meanwhile."""

    samples: int
    p50: float
    p99: float
    p999: float
    max: float
    achieved: float  # records/s the writer sent
    per_push: float  # records per push frame (1 for the relay: one frame per record)
    hub_cpu: float  # share of one core over the run
    client_cpu: float
    gc_client: tuple[int, float]  # full collections, longest (s)
    gc_hub: tuple[int, float]
    # p50 over records of the earliest and of the latest subscriber to have each one (ms): the
    # first is the writer's and the server's part, the gap to the last the subscribers' turns.
    first_p50: float = 0.0
    last_p50: float = 0.0
    writer_drops: int = 0  # connections of the writer that ended during the run (a cut)


def percentile(ordered: list[float], p: float) -> float:
    """The `p`th percentile of sorted `ordered` (nearest rank)."""
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def paced(
    total: int, rate: float, send: Callable[[int], Awaitable[None]], sent_at: list[float]
) -> float:
    """Hand items 0..total-1 to `send` on a fixed schedule of `rate` per second (when the loop
    wakes late, every item due goes at once, so the average rate holds), `sent_at[k]` being
    `perf_counter()` just before item k is handed over; returns the achieved rate."""
    interval = 1.0 / rate
    clock = time.perf_counter
    started = clock()
    k = 0
    while k < total:
        due = min(total, int((clock() - started) / interval) + 1)
        while k < due:
            sent_at[k] = clock()
            await send(k)
            k += 1
        await asyncio.sleep(max(0.0, started + k * interval - clock()))
    return total / (clock() - started)


async def measured(
    server: ServerProcess,
    rate: float,
    send: Callable[[int], Awaitable[None]],
    sent_at: list[float],
    delivered: Callable[[], Awaitable[Any]],
    *,
    client_gc: bool,
    profiler: cProfile.Profile | None,
) -> dict[str, Any]:
    """The timed part of a latency run: the paced sends, then `delivered()` (every subscriber
    got everything); CPU, garbage collections and the hub's push counter around it."""
    before, cpu0 = await server.ask("stats"), client_cpu()
    gc0 = GC_PAUSES.snapshot()
    GC_PAUSES.reset_longest()
    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if not client_gc:
            stack.enter_context(gc_paused())
        if profiler is not None:
            profiler.enable()
            stack.callback(profiler.disable)
        achieved = await paced(len(sent_at), rate, send, sent_at)
        await bounded(delivered())
    elapsed = time.perf_counter() - began
    cpu1, after = client_cpu(), await server.ask("stats")
    gc1 = GC_PAUSES.snapshot()
    return {
        "achieved": achieved,
        "pushes": after.get("pushes_accepted", 0) - before.get("pushes_accepted", 0),
        "hub_cpu": (after["cpu"] - before["cpu"]) / elapsed,
        "client_cpu": (cpu1 - cpu0) / elapsed,
        "gc_client": (int(gc1["count"][2] - gc0["count"][2]), GC_PAUSES.reset_longest()[2]),
        "gc_hub": (int(after["gc"]["count"][2] - before["gc"]["count"][2]), after["gc_longest"][2]),
    }


def latency_run(
    latencies: list[float], total: int, timing: dict[str, Any], subscribers: int
) -> LatencyRun:
    """`latencies` lists each subscriber's records in turn, the same records in the same
    order for every subscriber."""
    ordered = sorted(latencies)
    each = len(latencies) // subscribers
    assert each * subscribers == len(latencies), "every subscriber has every record"
    chunks = [latencies[k * each : (k + 1) * each] for k in range(subscribers)]
    by_record = list(zip(*chunks, strict=True))
    return LatencyRun(
        len(ordered),
        percentile(ordered, 50) * 1000,
        percentile(ordered, 99) * 1000,
        percentile(ordered, 99.9) * 1000,
        ordered[-1] * 1000,
        timing["achieved"],
        total / timing["pushes"] if timing["pushes"] else 1.0,
        timing["hub_cpu"],
        timing["client_cpu"],
        timing["gc_client"],
        timing["gc_hub"],
        median([min(record) for record in by_record]) * 1000,
        median([max(record) for record in by_record]) * 1000,
    )


def latency_load(settings: Settings, rate: float) -> tuple[int, int]:
    """(records sent in a run, records of its warm-up) at `rate`."""
    return (
        int((settings.latency_warmup + settings.latency_seconds) * rate),
        int(settings.latency_warmup * rate),
    )


async def run_latency(
    server: ServerProcess,
    settings: Settings,
    rate: float,
    *,
    client_gc: bool = True,
    profiler: cProfile.Profile | None = None,
) -> LatencyRun:
    """convsync: a writer `Replica` pushing `rate` records/s to a fresh conversation, and the
    subscriber `TimedReplica`s; with `client_gc=False` the cyclic garbage collector of this
    (the client) process is paused for the run; `profiler` runs over the timed part."""
    conversation = f"lat-{uuid.uuid4().hex[:12]}"
    total, warm = latency_load(settings, rate)
    messages = payload_messages(total)
    sent_at = [0.0] * total
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(Replica(server.url, conversation, client="writer"))
        subscribers = [
            await stack.enter_async_context(
                TimedReplica(server.url, conversation, client=f"sub-{k}")
            )
            for k in range(settings.latency_subscribers)
        ]
        push = writer.conversation.push

        async def send(k: int) -> None:  # never suspends: `push` only queues the edit
            push(messages[k])

        def delivered() -> Awaitable[Any]:
            return asyncio.gather(*(s.wait_for(total) for s in subscribers))

        timing = await measured(
            server, rate, send, sent_at, delivered, client_gc=client_gc, profiler=profiler
        )
        drops = sum(1 for e in writer.events_nowait() if isinstance(e, Disconnected))
    latencies = []
    for sub in subscribers:
        for revision, count, stamp in sub.arrivals:
            for rev in range(revision - count + 1, revision + 1):
                if rev > warm:  # revision r holds item r - 1: the writer is the only pusher
                    latencies.append(stamp - sent_at[rev - 1])
    run = latency_run(latencies, total, timing, settings.latency_subscribers)
    return replace(run, writer_drops=drops)


PROBE = b"probe"  # a frame the relay's readers skip: sent until every reader got one


async def run_relay_latency(
    server: ServerProcess, settings: Settings, rate: float, payloads: list[bytes]
) -> LatencyRun:
    """The plain relay: the writer sends each record's JSON as one text frame on the same
    schedule; each reader decodes every frame as a `ChangeRecord` and stamps it."""
    total, warm = latency_load(settings, rate)
    n = settings.latency_subscribers
    sent_at = [0.0] * total
    stamps: list[list[float]] = [[] for _ in range(n)]
    registered = [asyncio.Event() for _ in range(n)]

    async def read(conn: ClientConnection, stamps_k: list[float], seen: asyncio.Event) -> None:
        clock = time.perf_counter
        while len(stamps_k) < total:
            data = await conn.recv(decode=False)
            if data == PROBE:
                seen.set()
                continue
            decode_record(data)
            stamps_k.append(clock())

    async with contextlib.AsyncExitStack() as stack:
        readers = [await open_raw(server.url, "/read", None) for _ in range(n)]
        for conn in readers:
            stack.push_async_callback(conn.close)
        writer = await open_raw(server.url, "/write", None)
        stack.push_async_callback(writer.close)
        tasks = [
            asyncio.create_task(read(conn, stamps[k], registered[k]))
            for k, conn in enumerate(readers)
        ]
        for task in tasks:
            stack.callback(task.cancel)
        deadline = time.perf_counter() + 60
        while not all(seen.is_set() for seen in registered):  # the relay knows every reader
            if time.perf_counter() > deadline:
                raise TimeoutError("the relay did not register every reader within 60 s")
            await writer.send(PROBE, text=True)
            await asyncio.sleep(0.02)

        async def send(k: int) -> None:
            await writer.send(payloads[k], text=True)

        def delivered() -> Awaitable[Any]:
            return asyncio.gather(*tasks)

        timing = await measured(
            server, rate, send, sent_at, delivered, client_gc=True, profiler=None
        )
    latencies = [
        stamp - sent_at[k] for stamps_k in stamps for k, stamp in enumerate(stamps_k) if k >= warm
    ]
    return latency_run(latencies, total, timing, settings.latency_subscribers)


WAKE_IDLE = 0.01  # seconds asleep before each cold probe: the gap between records at 100/s


def wake_probe(count: int) -> tuple[list[float], list[float], list[float]]:
    """This process's cost of running cold: seconds of `count` empty timings (two
    `perf_counter` calls) and of `count` `Conversation.push` calls of a ~300-byte user
    message, each right after `WAKE_IDLE` seconds asleep, as every process sleeps between
    records at 100/s; then of `count` pushes back to back. Returns (empty, cold, hot)."""
    messages = payload_messages(2 * count)
    conversation = Conversation()
    clock = time.perf_counter
    empty, cold, hot = [], [], []
    for k in range(count):
        time.sleep(WAKE_IDLE)
        began = clock()
        empty.append(clock() - began)
        time.sleep(WAKE_IDLE)
        began = clock()
        conversation.push(messages[k])
        cold.append(clock() - began)
    for k in range(count, 2 * count):
        began = clock()
        conversation.push(messages[k])
        hot.append(clock() - began)
    return empty, cold, hot


def fsync_probe(
    directory: str,
    count: int,
    size: int = 512,
    idle: float = 0.0,
    sync: Callable[[int], None] = os.fsync,
) -> list[float]:
    """Seconds of each of `count` appends of `size` bytes + `sync` (`os.fsync`) to a new file
    in `directory` (as a WAL commit appends and syncs), each after `idle` seconds asleep."""
    path = os.path.join(directory, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        times = []
        for _ in range(count):
            if idle:
                time.sleep(idle)
            began = time.perf_counter()
            os.write(fd, b"x" * size)
            sync(fd)
            times.append(time.perf_counter() - began)
    finally:
        os.close(fd)
        os.unlink(path)
    return times


def ms_pair(sample: Sequence[LatencyRun]) -> tuple[str, str]:
    """(`p50 / p99` of the medians, their spreads) of some runs, in milliseconds."""
    p50, p99 = [r.p50 for r in sample], [r.p99 for r in sample]
    return (
        f"{median(p50):.2f} / {median(p99):.2f} ms",
        f"{spread(p50, '{:.2f}')} / {spread(p99, '{:.2f}')} ms",
    )


DEFAULTS = ("--default-limits",)
"""The latency topic's hubs run with the limits a user gets (issue 32: a lifted rate limit
hid that the default one cut a writer at 1,000 records/s)."""


async def topic_latency(settings: Settings, args: argparse.Namespace) -> Topic:
    n = settings.latency_subscribers
    old: OldCode | None = args.old
    rates_ = settings.latency_rates
    top = max(rates_)
    rate_names = " and ".join(f"{r:,.0f}" for r in rates_)
    topic = Topic(
        "Hub: append-to-apply latency (`bench/hub.py latency`)",
        f"One writer and {n} subscribers of one stream, all in this process (the client "
        "process), against servers that each run in a process of their own (127.0.0.1): the "
        f"writer sends one record at a steady {rate_names} records/s on a fixed schedule "
        "(when the loop wakes late it sends every record due at once, so the average rate "
        f"holds). The records are user messages of {PAYLOAD_CHARS} characters whose push "
        "records are ~300 bytes of JSON. Latency = `time.perf_counter()` when a subscriber "
        "has the record (defined per kind below) minus `perf_counter()` just before the "
        "writer handed it over, for every record and subscriber after a "
        f"{settings.latency_warmup:g} s warm-up; then {settings.latency_seconds:g} s measured "
        f"per run. {settings.latency_repeats} repeats; in each repeat every rate and every "
        "server kind runs once, interleaved (in the order of the table), a fresh "
        "conversation per convsync run. Figures: the medians over the repeats of each run's "
        "p50 and p99; spreads: min-max over the repeats; a ratio is the ratio of the medians "
        "and its spread the min-max of the per-repeat ratios (runs of one repeat are back "
        "to back).\n\n"
        "- **relay** (the baseline): `bench/_hubproc.py baseline`, a minimal `websockets` "
        "server: every frame a `/write` connection sends goes to every `/read` connection "
        "with `websockets.broadcast` (no parsing, no store, no backpressure). The writer sends "
        "each record's JSON bytes (exactly what convsync's log holds) as one text frame "
        "(`await ws.send`); each subscriber is a raw connection that decodes each frame with "
        "msgspec as a `ChangeRecord` (`sync.decode_record`) and then stamps it. Before the "
        "timed part the writer sends small probe frames until every reader has seen one (so "
        "the relay has registered every reader); readers skip probes.\n"
        "- **memory**: a hub on `MemoryStore`. The writer is a real `Replica` calling "
        "`replica.conversation.push(message)`; its replica batches what accumulated while a "
        "push is in flight (one in flight), as the protocol does. The subscribers are real "
        "`Replica`s; a record's stamp is taken when the replica emits `Applied` for it, right "
        "after folding it (into `local`: a subscriber with no edits of its own keeps no "
        "second value).\n"
        "- **SQLite**: the same against a hub on `SqliteStore` (`synchronous=FULL`, WAL, "
        "group commit; the hub acks and forwards after the commit) on a fresh file in a "
        "temporary directory on this machine's disk (ext4).\n"
        "- **fsync**: in each repeat, "
        f"{settings.fsync_probes} appends of 512 bytes + `os.fsync` to a file in the same "
        "directory as the SQLite file; the figure is the median over all of them (spread: "
        "min-max of the per-repeat medians). The bar uses these, back to back. "
        f"Informative: as many again, each right after {WAKE_IDLE * 1000:g} ms asleep, as "
        "a commit at 100/s runs.\n"
        f"- **wake probe** (informative): in each repeat, {settings.wake_probes} "
        "`Conversation.push` calls of one of these messages in this process, each right "
        f"after {WAKE_IDLE * 1000:g} ms asleep (the gap between records at 100/s), then "
        f"{settings.wake_probes} back to back, and {settings.wake_probes} empty timings "
        "(two `perf_counter` calls) after the same sleep. Every process sleeps between "
        "records at 100/s, and code that runs right after a sleep runs cold (caches, and on "
        "a VM the virtual core itself, warm up again): "
        "where that costs many times the hot figure, the 100/s ratio weighs each step "
        "convsync takes per record beyond the relay's by that factor, not by its CPU "
        "profile.\n\n"
        "Bars (issue 8), at each rate: memory p50 <= 1.3x and p99 <= 1.6x the relay's; "
        "SQLite p50 <= memory p50 + 1.5 x one fsync. The garbage collector runs normally in "
        "every process; full (generation 2) collections are counted with `gc.callbacks`. "
        f"Informative, at {top:,.0f} records/s: one more memory run per repeat with the "
        f"client process's garbage collector paused (all {n + 1} replicas live in that one "
        f"process, so its heap holds {n + 2} copies of the conversation: one per subscriber, "
        "two for the writer, which keeps `confirmed` beside `local` while it has pushes in "
        "flight). CPU shares: CPU seconds of the server process (all "
        "threads) and of the client process over the run / its wall time."
        + old_code_intro(args, "the memory and SQLite kinds are"),
    )
    results = topic.results
    tmp = tempfile.TemporaryDirectory(prefix="convsync-bench-")
    kinds = ["relay"]
    for kind in ("memory", "SQLite"):
        kinds += [kind, old.label(kind)] if old else [kind]
    payloads = [encode(r) for r in records_of(payload_messages(latency_load(settings, top)[0]))]
    runs: dict[tuple[str, float], list[LatencyRun]] = {}
    quiet: list[LatencyRun] = []
    fsyncs: list[float] = []
    fsync_medians: list[float] = []
    idle_fsyncs: list[float] = []
    idle_fsync_medians: list[float] = []
    wakes: dict[str, list[float]] = {"empty": [], "cold": [], "hot": []}
    cold_medians: list[float] = []
    async with servers() as start:
        procs = {
            "relay": await start("baseline"),
            "memory": await start("hub", "--store", "memory", *DEFAULTS),
            "SQLite": await start(
                "hub", "--store", "sqlite", "--path", f"{tmp.name}/lat.db", *DEFAULTS
            ),
        }
        if old:
            procs[old.label("memory")] = await start(
                "hub", "--store", "memory", *DEFAULTS, code=old.path
            )
            procs[old.label("SQLite")] = await start(
                "hub",
                "--store",
                "sqlite",
                "--path",
                f"{tmp.name}/lat-old.db",
                *DEFAULTS,
                code=old.path,
            )
        for repeat in range(settings.latency_repeats):
            probe = fsync_probe(tmp.name, settings.fsync_probes)
            fsyncs += probe
            fsync_medians.append(median(probe) * 1000)
            probe = fsync_probe(tmp.name, settings.fsync_probes, idle=WAKE_IDLE)
            idle_fsyncs += probe
            idle_fsync_medians.append(median(probe) * 1000)
            empty, cold, hot = wake_probe(settings.wake_probes)
            for name, taken in (("empty", empty), ("cold", cold), ("hot", hot)):
                wakes[name] += taken
            cold_medians.append(median(cold) * 1e6)
            log(f"latency #{repeat}: fsync {fsync_medians[-1]:.3f} ms (median)")
            for rate in rates_:
                for kind in run_order(kinds, old, repeat):
                    server = procs[kind]
                    if kind == "relay":
                        run = await run_relay_latency(server, settings, rate, payloads)
                    else:
                        run = await run_latency(server, settings, rate)
                    runs.setdefault((kind, rate), []).append(run)
                    log(
                        f"latency {rate:>5,.0f}/s {kind:<26} #{repeat}: p50 {run.p50:.2f} ms "
                        f"p99 {run.p99:.2f} ms ({run.samples:,} samples, {run.achieved:,.0f}/s, "
                        f"{run.per_push:.2f} records/push, server cpu {run.hub_cpu:.2f}, client "
                        f"cpu {run.client_cpu:.2f}, full gc client {run.gc_client}, "
                        f"server {run.gc_hub})"
                    )
                    gc.collect()
            quiet.append(await run_latency(procs["memory"], settings, top, client_gc=False))
            log(
                f"latency {top:,.0f}/s memory, client gc paused #{repeat}: "
                f"p50 {quiet[-1].p50:.2f} ms p99 {quiet[-1].p99:.2f} ms"
            )
            gc.collect()
        if args.profile:
            hub = procs["memory"]
            client_profiler = cProfile.Profile()
            hub_profile = await profiled(
                hub, lambda: run_latency(hub, settings, top, profiler=client_profiler)
            )
            topic.profiles.append(
                (f"hub process (`MemoryStore`), {top:,.0f} records/s", hub_profile)
            )
            topic.profiles.append(
                (
                    f"client process (the writer and {n} subscriber replicas), the same run",
                    profile_text(profile_tables(client_profiler, PROFILE_TOP)),
                )
            )
            sqlite_hub = procs["SQLite"]
            topic.profiles.append(
                (
                    f"hub process (`SqliteStore`, FULL), {top:,.0f} records/s (the event loop's "
                    "thread only: it runs the appends' statements; the store's thread, which "
                    "syncs the WAL and checkpoints, is not in it)",
                    await profiled(sqlite_hub, lambda: run_latency(sqlite_hub, settings, top)),
                )
            )
    tmp.cleanup()
    fsync_ms_ = median(fsyncs) * 1000
    for rate in rates_:
        at = f"{rate:,.0f}/s"
        relay = runs[("relay", rate)]
        for kind in kinds:
            sample = runs[(kind, rate)]
            figure, spread_ = ms_pair(sample)
            if kind != "relay":
                figure += (
                    f" ({median([r.p50 for r in sample]) / median([r.p50 for r in relay]):.2f}x"
                    f" / {median([r.p99 for r in sample]) / median([r.p99 for r in relay]):.2f}x"
                    f" the relay; {median([r.per_push for r in sample]):.2f} records/push)"
                )
            figure += (
                f"; CPU server {median([r.hub_cpu for r in sample]):.2f}, "
                f"client {median([r.client_cpu for r in sample]):.2f}"
            )
            results.add(Row(f"{at}, {kind}: p50 / p99", figure, spread=spread_))
        memory = runs[("memory", rate)]
        results.add(
            ratio_row(
                f"{at}: memory p50 / relay p50",
                [r.p50 for r in memory],
                [r.p50 for r in relay],
                1.3,
                "<= 1.3 (issue 8)",
            ),
            f"{at} memory p50 / relay",
        )
        results.add(
            ratio_row(
                f"{at}: memory p99 / relay p99",
                [r.p99 for r in memory],
                [r.p99 for r in relay],
                1.6,
                "<= 1.6 (issue 8)",
            ),
            f"{at} memory p99 / relay",
        )
        sqlite_p50 = median([r.p50 for r in runs[("SQLite", rate)]])
        memory_p50 = median([r.p50 for r in memory])
        allowed = memory_p50 + 1.5 * fsync_ms_
        results.add(
            Row(
                f"{at}: SQLite p50 vs memory p50 + 1.5 fsyncs",
                f"{sqlite_p50:.2f} ms vs {memory_p50:.2f} + 1.5 x {fsync_ms_:.3f} = "
                f"{allowed:.2f} ms (SQLite - memory = {sqlite_p50 - memory_p50:.2f} ms = "
                f"{(sqlite_p50 - memory_p50) / fsync_ms_:.1f} fsyncs)",
                bar="SQLite p50 <= memory p50 + 1.5 fsyncs (issue 8)",
                passed=sqlite_p50 <= allowed,
            ),
            f"{at} SQLite p50 - memory p50",
        )
        arrivals = []
        for kind in ("relay", "memory", "SQLite"):
            sample = runs[(kind, rate)]
            first = median([r.first_p50 for r in sample])
            last = median([r.last_p50 for r in sample])
            arrivals.append(f"{kind} {first:.2f} / {last:.2f} ms")
        results.add(
            Row(
                f"{at}: p50 of the first / the last subscriber to have each record "
                "(informative: the first is the writer's and the server's part)",
                "; ".join(arrivals),
            )
        )
        if old:
            for kind in ("memory", "SQLite"):
                for name in ("p50", "p99"):
                    results.add(
                        no_worse_row(
                            f"{at}: {kind} {name}, new / old ({old.version})",
                            [getattr(r, name) for r in runs[(kind, rate)]],
                            [getattr(r, name) for r in runs[(old.label(kind), rate)]],
                            higher_is_better=False,
                        ),
                        f"{at} {kind} {name} new / old",
                    )
    every = [r for sample in runs.values() for r in sample]

    def runs_at(rate: float) -> list[LatencyRun]:
        return [r for (_, at), sample in runs.items() if at == rate for r in sample]

    for rate in rates_:
        kinds = [kind for (kind, at) in runs if at == rate and kind != "relay"]
        cut = {kind: sum(r.writer_drops for r in runs[(kind, rate)]) for kind in kinds}
        results.add(
            Row(
                f"{rate:,.0f}/s: the writer's connections cut during a run, default limits "
                "(bar: 0 on this code, issue 32)",
                "; ".join(f"{kind} {count}" for kind, count in cut.items())
                + f" (in {len(runs[(kinds[0], rate)])} runs each)",
            )
        )
    achieved = [r.achieved / rate for (_, rate), sample in runs.items() for r in sample]
    results.add(
        Row(
            "achieved send rate / the rate asked, every run",
            f"{min(achieved):.3f}-{max(achieved):.3f}",
        )
    )
    results.add(
        Row(
            "one fsync (512-byte append + `os.fsync`, the SQLite file's directory)",
            f"{fsync_ms_:.3f} ms ({len(fsyncs):,} fsyncs)",
            spread=spread(fsync_medians, "{:.3f}") + " ms",
        )
    )
    results.add(
        Row(
            f"one fsync as above, each right after {WAKE_IDLE * 1000:g} ms asleep (as at "
            "100/s; informative)",
            f"{median(idle_fsyncs) * 1000:.3f} ms ({len(idle_fsyncs):,} fsyncs)",
            spread=spread(idle_fsync_medians, "{:.3f}") + " ms",
        )
    )
    cold_us, hot_us = median(wakes["cold"]) * 1e6, median(wakes["hot"]) * 1e6
    results.add(
        Row(
            f"wake probe: `Conversation.push` right after {WAKE_IDLE * 1000:g} ms asleep / back "
            "to back; an empty timing after the same sleep (informative)",
            f"{cold_us:.1f} / {hot_us:.1f} µs ({cold_us / hot_us:.0f}x); "
            f"{median(wakes['empty']) * 1e6:.1f} µs",
            spread=spread(cold_medians, "{:.1f}") + " µs (cold push)",
        )
    )
    memory_top = runs[("memory", top)]
    results.add(
        Row(
            f"{top:,.0f}/s, memory: p99.9 / max latency (informative)",
            f"{median([r.p999 for r in memory_top]):.2f} / "
            f"{median([r.max for r in memory_top]):.2f} ms",
            spread=f"{spread([r.p999 for r in memory_top], '{:.2f}')} / "
            f"{spread([r.max for r in memory_top], '{:.2f}')} ms",
        )
    )
    figure, spread_ = ms_pair(quiet)
    results.add(
        Row(
            f"{top:,.0f}/s, memory, client process's garbage collector paused: p50 / p99 "
            "(informative)",
            figure,
            spread=spread_,
        )
    )
    for side in ("client", "hub"):
        pauses = [r.gc_client if side == "client" else r.gc_hub for r in memory_top]
        results.add(
            Row(
                f"{top:,.0f}/s, memory: full (generation 2) garbage collections per run in the "
                f"{side} process, longest",
                f"{median([c for c, _ in pauses]):.0f}, "
                f"{median([t for _, t in pauses]) * 1000:.1f} ms",
                spread=spread([t * 1000 for _, t in pauses], "{:.2f}") + " ms",
            )
        )
    samples = ", ".join(
        f"{rate:,.0f}/s: {median([r.samples for r in every if r in runs_at(rate)]):,.0f}"
        for rate in rates_
    )
    results.notes.append(
        f"Latency samples per run (records after the warm-up x {n} subscribers): {samples}."
    )
    return topic
