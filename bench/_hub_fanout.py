"""`bench/hub.py fanout`: records per second to 1, 10 and 100 readers, convsync vs a plain relay."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

# First, before `bench._engine` (which then puts its code copy ahead of it): appended, an
# editable install of another checkout (the venv's) shadowed this one's `bench` package, so
# a run from a worktree measured, and wrote into, that other checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.asyncio.client import ClientConnection

from bench._hub import (
    PAYLOAD_CHARS,
    OldCode,
    ServerProcess,
    Settings,
    Topic,
    bounded,
    client_cpu,
    count_frames,
    count_records,
    log,
    old_code_intro,
    open_raw,
    payload_messages,
    profiled,
    rate,
    rates,
    raw_hello,
    records_of,
    run_order,
    servers,
)
from bench._report import (
    Row,
    gc_paused,
    median,
    no_worse_row,
)
from client.replica import Replica
from client.session import ReplicaSession
from server.config import HubConfig
from server.metrics import Metrics
from server.room import Room
from server.store import MemoryStore
from sync import Message, decode_record, encode
from sync.protocol import (
    Ack,
    PushBatch,
    Welcome,
    decode_client_message,
    decode_hub_message,
)

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


# ---------------------------------------------------------------------------- pipeline costs


class _Sink:
    """Stands in for a hub `Subscriber` (same duck type): keeps the frames sent to it."""

    def __init__(self, client: str) -> None:
        self.client = client
        self.frames: list[bytes] = []
        self.closing = False

    def send(self, frame: bytes, catch_up: bool = False) -> None:
        self.frames.append(frame)

    def fail(self, code: str, detail: str) -> None:
        raise RuntimeError(f"the room failed the push: {code}: {detail}")

    def close(self, code: int, reason: str) -> None:
        self.closing = True


async def pipeline_costs(messages: list[Message], repeats: int) -> list[tuple[str, float]]:
    """CPU microseconds per record of each stage a record goes through in the fan-out, run
    in this process without sockets (`time.process_time`, garbage collector paused, median
    of `repeats`): the same objects the hub and the replicas use, minus websockets and I/O."""
    n = len(messages)
    stages: dict[str, list[float]] = {}

    def note(stage: str, seconds: float) -> None:
        stages.setdefault(stage, []).append(seconds / n * 1e6)

    clock = time.process_time
    for _ in range(repeats):
        with gc_paused():
            room = Room("pipeline", MemoryStore(), HubConfig(), Metrics())
            await room.load()
            writer = ReplicaSession("writer")
            began = clock()
            for item in messages:
                writer.local.push(item)
            note("writer: `Conversation.push` (the application's edit)", clock() - began)
            writer.receive(Welcome(room.lineage, 0, 0))
            frames: list[bytes] = []
            pushing = acking = 0.0
            revision = 0
            while True:
                left = len(writer.local.unsaved())
                began = clock()
                frame, _ = writer.next_push()
                pushing += clock() - began
                if frame is None:
                    break
                frames.append(frame)
                count = left - len(writer.local.unsaved())
                began = clock()
                writer.receive(Ack(writer.seq, revision, revision + count))
                acking += clock() - began
                revision += count
            note(
                f"writer replica: `next_push` for a {n:,}-record backlog "
                f"({len(frames)} pushes, one in flight)",
                pushing,
            )
            note("writer replica: fold its batch into `confirmed` on `ack`", acking)
            began = clock()
            batches = [decode_client_message(frame) for frame in frames]
            note("hub: decode the push frames", clock() - began)
            pusher, reader = _Sink("writer"), _Sink("reader")
            room.core.subscribers[reader] = "reader"  # type: ignore[index]
            room.core.subscribers[pusher] = "writer"  # type: ignore[index]
            began = clock()
            for batch in batches:
                assert isinstance(batch, PushBatch)
                await room.push(pusher, batch)  # type: ignore[arg-type]
            note(
                "hub: `Room.push` (check, fold, strict pairing, stamp `at`, encode, "
                "append to `MemoryStore`, ack, `records` frame)",
                clock() - began,
            )
            assert room.revision == n, room.revision
            began = clock()
            decoded = [decode_hub_message(frame) for frame in reader.frames]
            note("reader replica: decode the `records` frames", clock() - began)
            session = ReplicaSession("reader")
            session.receive(Welcome(room.lineage, 0, 0))
            began = clock()
            for message_ in decoded:
                session.receive(message_)
            note(
                "reader replica: `receive` of the `records` messages (one fold per record)",
                clock() - began,
            )
            assert session.confirmed.revision == n
            records = records_of(messages)
            payloads = [encode(r) for r in records]
            began = clock()
            for payload in payloads:
                decode_record(payload)
            note("baseline reader: decode each relayed frame as a `ChangeRecord`", clock() - began)
            began = clock()
            for record in records:
                encode(record)
            note("(reference) `sync.encode` of each record once", clock() - began)
            del room, writer, session, decoded, batches
    return [(stage, median(values)) for stage, values in stages.items()]


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
        "marks that process as the bottleneck."
        + old_code_intro(args, "the three convsync kinds are"),
    )
    results = topic.results
    old: OldCode | None = args.old
    all_messages = payload_messages(settings.fanout_records)
    payloads = [encode(r) for r in records_of(all_messages)]
    record_bytes = statistics.mean(len(p) for p in payloads)
    tmp = tempfile.TemporaryDirectory(prefix="convsync-bench-")
    new_kinds = ["convsync", "convsync raw readers", "convsync SQLite"]
    kinds = ["baseline"]
    for kind in new_kinds:  # new, old, new, old...: each pair back to back
        kinds += [kind, old.label(kind)] if old else [kind]
    runs: dict[tuple[str, int], list[Run]] = {}
    async with servers() as start:
        baseline = await start("baseline")
        hubs = {
            "memory": await start("hub", "--store", "memory"),
            "sqlite": await start("hub", "--store", "sqlite", "--path", f"{tmp.name}/fan.db"),
        }
        hub = hubs["memory"]
        old_hubs = {}
        if old:
            old_hubs = {
                "memory": await start("hub", "--store", "memory", code=old.path),
                "sqlite": await start(
                    "hub", "--store", "sqlite", "--path", f"{tmp.name}/fan-old.db", code=old.path
                ),
            }
        for server in [baseline, *hubs.values(), *old_hubs.values()]:  # first-use costs
            if server is baseline:
                await run_baseline(server, 1, payloads[:500])
            else:
                await run_convsync(server, 1, all_messages[:500])
        for readers in settings.fanout_sizes:
            for repeat in range(settings.fanout_repeats):
                for kind in run_order(kinds, old, repeat):
                    if kind == "baseline":
                        run = await run_baseline(baseline, readers, payloads)
                    else:
                        server = (old_hubs if old and old.owns(kind) else hubs)[
                            "sqlite" if "SQLite" in kind else "memory"
                        ]
                        raw = "raw readers" in kind
                        run = await run_convsync(server, readers, all_messages, raw=raw)
                    runs.setdefault((kind, readers), []).append(run)
                    log(
                        f"fanout {readers:>3} readers, {kind:<36} #{repeat}: "
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
    costs = await pipeline_costs(all_messages, settings.fanout_repeats)
    for stage, micros in costs:
        log(f"pipeline: {stage}: {micros:.2f} µs/record")
    results.notes.append(
        "Where the CPU goes, per record, measured in this process without sockets "
        f"(`bench/hub.py` `pipeline_costs`: the {settings.fanout_records:,} records of a run "
        "through the same objects the hub and the replicas use, `time.process_time`, garbage "
        f"collector paused, median of {settings.fanout_repeats}); the websocket framing and the "
        "system calls come on top:\n\n"
        "| Stage | CPU per record |\n|---|---|\n"
        + "\n".join(f"| {stage} | {micros:.2f} µs |" for stage, micros in costs)
    )
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
        for kind in kinds[1:]:
            ratio = median([r.rate for r in runs[(kind, readers)]]) / base_rate
            bar = kind == "convsync"
            results.add(
                Row(
                    f"{readers} reader{'s' if readers > 1 else ''}: {kind} / baseline",
                    f"{ratio:.3f}",
                    bar=">= 0.7" if bar else "",
                    passed=(ratio >= 0.7) if bar else None,
                )
            )
        if old:
            for kind in new_kinds:
                results.add(
                    no_worse_row(
                        f"{readers} reader{'s' if readers > 1 else ''}: {kind}, records/s "
                        f"new / old ({old.version})",
                        [r.rate for r in runs[(kind, readers)]],
                        [r.rate for r in runs[(old.label(kind), readers)]],
                        higher_is_better=True,
                    )
                )
    results.notes.append(
        f"Record size: {record_bytes:.0f} bytes of JSON on average (the baseline relays "
        "exactly these bytes). Each figure is the median of "
        f"{settings.fanout_repeats} runs; the kinds' runs are interleaved, a fresh conversation "
        "per convsync run."
    )
    return topic
