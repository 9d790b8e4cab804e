"""`bench/hub.py durable`: acked one-record pushes on SQLite (FULL), 1 writer vs 20."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from pathlib import Path

# First, before `bench._engine` (which then puts its code copy ahead of it): appended, an
# editable install of another checkout (the venv's) shadowed this one's `bench` package, so
# a run from a worktree measured, and wrote into, that other checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench._hub import (
    ServerProcess,
    Settings,
    Topic,
    bounded,
    client_cpu,
    fsync_ms,
    log,
    payload_messages,
    profiled,
    rate,
    rates,
    servers,
)
from bench._report import (
    Row,
    median,
)
from client.replica import Replica


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

        before, cpu0 = await server.ask("stats"), client_cpu()
        started = time.perf_counter()
        deadline = started + seconds
        ends = await bounded(
            asyncio.gather(*(write(k, r, deadline) for k, r in enumerate(replicas)))
        )
        elapsed = max(ends) - started
        cpu1, after = client_cpu(), await server.ask("stats")
    commits = after["commits"] - before["commits"]
    appends = after["appends"] - before["appends"]
    records = sum(counts)
    return {
        "rate": records / elapsed,
        "records": records,
        "commits": commits,
        "appends": appends,
        "per_commit": appends / commits if commits else 0.0,
        "hub_cpu": (after["cpu"] - before["cpu"]) / records,
        "client_cpu": (cpu1 - cpu0) / records,
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
        "the run, read in the hub process (commits also count the snapshots a conversation "
        "gets now and then: at least 1,000 records apart). CPU per push: CPU seconds "
        "(user + system) of the hub process and of this process over the run / acked "
        "records.\n\n"
        "Informative rows: the same runs against a hub on `MemoryStore` (no disk: the ceiling "
        "the per-push CPU of hub and replicas sets on this machine), and the median time of "
        "a 4 KiB write + `fsync` in the same directory (the disk's floor for one commit).",
    )
    results = topic.results
    tmp = tempfile.TemporaryDirectory(prefix="convsync-bench-")
    fsync = fsync_ms(tmp.name)
    kinds = ("sqlite", "memory")
    samples: dict[tuple[str, int], list[dict[str, float]]] = {}
    async with servers() as start:
        hubs = {
            "sqlite": await start("hub", "--store", "sqlite", "--path", f"{tmp.name}/durable.db"),
            "memory": await start("hub", "--store", "memory"),
        }
        for hub in hubs.values():
            await run_durable(hub, one, min(1.0, settings.durable_seconds))  # warm-up
        for repeat in range(settings.repeats):
            for kind in kinds:
                for writers in (one, many):
                    outcome = await run_durable(hubs[kind], writers, settings.durable_seconds)
                    samples.setdefault((kind, writers), []).append(outcome)
                    log(
                        f"durable {kind:<6} {writers:>2} writers #{repeat}: "
                        f"{outcome['rate']:,.0f} records/s, "
                        f"{outcome['per_commit']:.2f} appends/commit, hub "
                        f"{outcome['hub_cpu'] * 1e6:.0f} µs/push, client "
                        f"{outcome['client_cpu'] * 1e6:.0f} µs/push"
                    )
        if args.profile:
            hub = hubs["sqlite"]
            topic.profiles.append(
                (
                    f"hub process, {many} durable writers",
                    await profiled(hub, lambda: run_durable(hub, many, settings.durable_seconds)),
                )
            )
    tmp.cleanup()
    for kind in kinds:
        label = "SQLite" if kind == "sqlite" else "MemoryStore (informative)"
        for writers in (one, many):
            sample = samples[(kind, writers)]
            rates_ = [s["rate"] for s in sample]
            per_commit = median([s["per_commit"] for s in sample])
            hub_cpu = median([s["hub_cpu"] for s in sample]) * 1e6
            client = median([s["client_cpu"] for s in sample]) * 1e6
            what = f"{writers} writer{'s' if writers > 1 else ''}"
            figure = f"{rate(median(rates_))}"
            if kind == "sqlite":
                figure += f"; {per_commit:.2f} appends/commit"
            figure += f"; CPU per push: hub {hub_cpu:.0f} µs, replicas {client:.0f} µs"
            results.add(Row(f"{label}, {what}: acked records/s", figure, spread=rates(rates_)))
        ratio = median([s["rate"] for s in samples[(kind, many)]]) / median(
            [s["rate"] for s in samples[(kind, one)]]
        )
        bar = kind == "sqlite"
        results.add(
            Row(
                f"{label}: {many} writers / 1 writer",
                f"{ratio:.3f}",
                bar=">= 5" if bar else "",
                passed=(ratio >= 5) if bar else None,
            )
        )
    results.add(Row("4 KiB write + fsync on this disk (informative)", f"{fsync:.2f} ms"))
    return topic
