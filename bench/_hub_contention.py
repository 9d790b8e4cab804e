"""`bench/hub.py contention`: many writers on one conversation, placing stale pushes or not."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

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
    spread,
)
from client.replica import Replica
from client.session import Disconnected, Rebased
from sync.rebase import Conflict

# ---------------------------------------------------------------------------- contention

# The hubs of the contention topic: (store, whether the hub places stale pushes).
CONTENTION_HUBS: tuple[tuple[str, bool], ...] = (
    ("memory", True),
    ("memory", False),
    ("sqlite", True),
    ("sqlite", False),
)


def contention_label(store: str, placing: bool) -> str:
    name = "MemoryStore" if store == "memory" else "SQLite (FULL)"
    return f"{name}, {'placing' if placing else 'not placing (`hub_rebase` off)'}"


async def run_contention(server: ServerProcess, writers: int, seconds: float) -> dict[str, Any]:
    """`writers` replicas on ONE fresh conversation, each pushing one record and waiting for
    its ack, again and again, for `seconds`. Afterwards (untimed) every replica must reach the
    log's end and hold the same conversation, of exactly the acked records."""
    conversation = f"con-{uuid.uuid4().hex[:12]}"
    messages = payload_messages(64)
    async with contextlib.AsyncExitStack() as stack:
        replicas = [
            await stack.enter_async_context(Replica(server.url, conversation, client=f"writer-{k}"))
            for k in range(writers)
        ]
        counts = [0] * writers
        events: Counter[str] = Counter()

        def drain(replica: Replica) -> None:
            # Nobody reads the events queue here: keep it from growing, and count what matters.
            for event in replica.events_nowait():
                if isinstance(event, Conflict | Rebased | Disconnected):
                    events[type(event).__name__] += 1

        async def write(k: int, replica: Replica, deadline: float) -> float:
            push = replica.conversation.push
            while time.perf_counter() < deadline:
                push(messages[(k + counts[k]) % len(messages)])
                await replica.flush()
                counts[k] += 1
                drain(replica)
            return time.perf_counter()

        before, cpu0 = await server.ask("stats"), client_cpu()
        started = time.perf_counter()
        deadline = started + seconds
        ends = await bounded(
            asyncio.gather(*(write(k, r, deadline) for k, r in enumerate(replicas)))
        )
        elapsed = max(ends) - started
        cpu1, after = client_cpu(), await server.ask("stats")
        acked = sum(counts)
        for replica in replicas:
            await bounded(replica.wait_for(acked), 60)
            drain(replica)
        reference = replicas[0].conversation
        converged = len(reference) == acked and all(
            replica.conversation == reference and replica.pending == 0 for replica in replicas
        )
    rejected = {
        reason: count - before["rejected"].get(reason, 0)
        for reason, count in after["rejected"].items()
        if count != before["rejected"].get(reason, 0)
    }
    placed = after["pushes_placed"] - before["pushes_placed"]
    return {
        "rate": acked / elapsed,
        "acked": acked,
        "accepted": after["pushes_accepted"] - before["pushes_accepted"],
        "appended": after["records_appended"] - before["records_appended"],
        "placed": placed,
        "rejected": rejected,
        "events": dict(events),
        "converged": converged,
        "hub_cpu": (after["cpu"] - before["cpu"]) / acked,
        "client_cpu": (cpu1 - cpu0) / acked,
    }


def contention_ok(outcome: dict[str, Any]) -> bool:
    """Every replica held the log, every acked push landed once, nothing was reported lost."""
    return (
        outcome["converged"]
        and outcome["appended"] == outcome["acked"] == outcome["accepted"]
        and not outcome["events"].get("Conflict")
        and not outcome["events"].get("Disconnected")
    )


async def topic_contention(settings: Settings, args: argparse.Namespace) -> Topic:
    one, many = settings.contention_writers
    topic = Topic(
        "Hub: many writers on one conversation (`bench/hub.py contention`)",
        f"In this process, 1 or {many} writer `Replica`s **on one conversation** (a fresh one "
        "per run). Each writer pushes one record (a ~300-byte user-message push record), waits "
        "for its ack (`await replica.flush()`), and repeats, for "
        f"{settings.contention_seconds:g} s; meanwhile it receives every other writer's records "
        "(each writer is also a subscriber). Records/s = acked records of all writers / "
        "elapsed. Four hubs, each in its own process: `MemoryStore` and `SqliteStore` "
        "(synchronous=FULL, WAL, a temporary file), each placing stale pushes (SPEC 2.4.6, "
        "the default) and with `HubConfig(hub_rebase=False)` (`_hubproc.py hub "
        "--no-hub-rebase`: every push made on a base that moved is rejected `behind`, "
        "rebased by its replica and sent again, as before placement). One run of each hub and "
        "writer count per repeat, in one interleaved order (reversed in odd repeats); "
        f"{settings.repeats} repeats after a warm-up run per hub. Figures are medians over the "
        "repeats; spreads are min-max. Ratios are ratios of the medians; their spread is the "
        "min-max of the per-repeat ratios (each many-writer run over the one-writer run of the "
        "same hub and repeat).\n\n"
        "Placed pushes: the hub's `pushes_placed` counter (`server/metrics.py`, "
        "`convsync_pushes_placed_total`: accepted pushes made on an older revision); rejects: "
        "its `pushes_rejected` by reason; both as deltas over a run, read in the hub process. "
        "CPU per record: CPU seconds (user + system) of the hub process and of this process "
        "(all the writers) over the run / acked records. After each run (untimed) every "
        "replica must reach the log's end and hold the same conversation, whose length is the "
        "number of acked records; the hub must have appended exactly the acked records; no "
        "replica may report a `Conflict` or a disconnect (these writers only append new "
        "messages, which always replay). The bar is issue 8's: MemoryStore, placing, "
        f"{many} writers >= 0.8x one writer.",
    )
    results = topic.results
    tmp = tempfile.TemporaryDirectory(prefix="convsync-bench-")
    samples: dict[tuple[str, bool, int], list[dict[str, Any]]] = {}
    order = [(store, placing, w) for store, placing in CONTENTION_HUBS for w in (one, many)]
    async with servers() as start:
        hubs: dict[tuple[str, bool], ServerProcess] = {}
        for store, placing in CONTENTION_HUBS:
            hub_args = ["hub", "--store", store]
            if store == "sqlite":
                hub_args += ["--path", f"{tmp.name}/contention-{int(placing)}.db"]
            if not placing:
                hub_args.append("--no-hub-rebase")
            hubs[(store, placing)] = await start(*hub_args)
        for hub in hubs.values():
            await run_contention(hub, many, min(1.0, settings.contention_seconds))  # warm-up
        for repeat in range(settings.repeats):
            for store, placing, writers in order if repeat % 2 == 0 else order[::-1]:
                outcome = await run_contention(
                    hubs[(store, placing)], writers, settings.contention_seconds
                )
                samples.setdefault((store, placing, writers), []).append(outcome)
                log(
                    f"contention {store:<6} {'placing' if placing else 'behind '} "
                    f"{writers:>2} writers #{repeat}: {outcome['rate']:,.0f} records/s, "
                    f"placed {outcome['placed']}, rejected {outcome['rejected'] or 0}, "
                    f"events {outcome['events'] or 0}, converged {outcome['converged']}, hub "
                    f"{outcome['hub_cpu'] * 1e6:.0f} µs/record, client "
                    f"{outcome['client_cpu'] * 1e6:.0f} µs/record"
                )
        if args.profile:
            hub = hubs[("memory", True)]
            topic.profiles.append(
                (
                    f"hub process (MemoryStore, placing), {many} writers on one conversation",
                    await profiled(
                        hub, lambda: run_contention(hub, many, settings.contention_seconds)
                    ),
                )
            )
    tmp.cleanup()
    medians: dict[tuple[str, bool, int], float] = {}
    for store, placing in CONTENTION_HUBS:
        label = contention_label(store, placing)
        bar = store == "memory" and placing
        for writers in (one, many):
            sample = samples[(store, placing, writers)]
            rates_ = [s["rate"] for s in sample]
            medians[(store, placing, writers)] = median(rates_)
            figure = rate(median(rates_))
            if writers == many:
                acked = median([s["acked"] for s in sample])
                placed = median([s["placed"] for s in sample])
                reasons = sorted({reason for s in sample for reason in s["rejected"]})
                rejects = ", ".join(
                    f"{reason} {median([s['rejected'].get(reason, 0) for s in sample]):,.0f}"
                    for reason in reasons
                )
                figure += (
                    f"; per run: {acked:,.0f} acked, {placed:,.0f} placed "
                    f"({placed / acked:.0%}), rejected: {rejects or 'none'}"
                )
            hub_cpu = median([s["hub_cpu"] for s in sample])
            client = median([s["client_cpu"] for s in sample])
            busy = median(rates_)
            figure += (
                f"; CPU per record: hub {hub_cpu * 1e6:.0f} µs, writers {client * 1e6:.0f} µs "
                f"(busy: hub {hub_cpu * busy:.0%}, writers {client * busy:.0%} of a core)"
            )
            what = f"{writers} writer{'s' if writers > 1 else ''}"
            results.add(Row(f"{label}, {what}: acked records/s", figure, spread=rates(rates_)))
        ratio = medians[(store, placing, many)] / medians[(store, placing, one)]
        per_repeat = [
            high["rate"] / low["rate"]
            for high, low in zip(
                samples[(store, placing, many)], samples[(store, placing, one)], strict=True
            )
        ]
        results.add(
            Row(
                f"{label}: {many} writers / 1 writer",
                f"{ratio:.2f}",
                spread=spread(per_repeat, "{:.2f}"),
                bar=">= 0.8" if bar else "",
                passed=(ratio >= 0.8) if bar else None,
            ),
            measurement=f"contention ratio ({label})",
        )
    for store in ("memory", "sqlite"):
        label = "MemoryStore" if store == "memory" else "SQLite (FULL)"
        bought = medians[(store, True, many)] / medians[(store, False, many)]
        per_repeat = [
            on["rate"] / off["rate"]
            for on, off in zip(
                samples[(store, True, many)], samples[(store, False, many)], strict=True
            )
        ]
        results.add(
            Row(
                f"{label}, {many} writers: placing / not placing (what placement bought)",
                f"{bought:.2f}",
                spread=spread(per_repeat, "{:.2f}"),
            )
        )
    results.notes.append(
        f"What grows with the writers: with {many} writers on one conversation every acked "
        f"record is one push and {many} or {many + 1} frames from the hub (its pusher gets the "
        f"ack, after the placed records when the hub placed it; each of the other {many - 1} "
        "writers gets the records), each a socket write in the hub and a message decoded and "
        "folded in the writers' process; one writer gets one frame (the ack) per record. "
        "*Busy* is CPU per record x the median rate: the share of one core each process used. "
        "Shares well under 100% mean the runs waited (on each other's turn, and on the shared "
        "machine's cores) rather than ran out of CPU."
    )
    runs = [s for sample in samples.values() for s in sample]
    bad = [s for s in runs if not contention_ok(s)]
    conflicts = sum(s["events"].get("Conflict", 0) for s in runs)
    results.add(
        Row(
            "every run: replicas converged on exactly the acked records, appended once, "
            "no conflict, no disconnect",
            f"{len(runs) - len(bad)} of {len(runs)} runs ({conflicts} conflicts reported)",
            bar="all runs",
            passed=not bad,
        ),
        measurement="contention runs converged",
    )
    return topic
