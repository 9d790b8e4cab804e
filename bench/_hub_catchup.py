"""`bench/hub.py catchup`: a fresh replica catching up on long conversations."""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# First, before `bench._engine` (which then puts its code copy ahead of it): appended, an
# editable install of another checkout (the venv's) shadowed this one's `bench` package, so
# a run from a worktree measured, and wrote into, that other checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.asyncio.client import ClientConnection

from bench._hub import MESSAGE_CHARS, TIMEOUT, Settings, Topic, log, open_raw, profiled, servers
from bench._report import (
    Row,
    median,
    spread,
)
from client.replica import Replica
from sync import Lineage
from sync.protocol import (
    Entries,
    Hello,
    Records,
    State,
    decode_hub_message,
    encode_message,
)


@dataclass
class RawCatchUp:
    seconds: float
    frames: int
    size: int  # bytes received
    path: str  # what the hub sent: "state" (state + entries frames) or "records"


async def receive_catch_up(conn: ClientConnection, messages: int) -> tuple[int, int, str]:
    """After `hello`: read the welcome and the catch-up until `messages` entries came
    (records or a state); returns (frames, bytes, what the hub sent)."""
    frames = size = entries = 0
    kinds: set[str] = set()
    state_done = False
    while not state_done and entries < messages:
        data = await conn.recv(decode=False)
        frames += 1
        size += len(data)
        message_ = decode_hub_message(data)
        if isinstance(message_, Records):
            kinds.add("records")
            for record in message_.records:
                entries += len(getattr(record.change, "entries", ()))
        elif isinstance(message_, State):
            kinds.add("state")
            entries += len(message_.state.entries)
            state_done = not message_.more
        elif isinstance(message_, Entries):
            entries += len(message_.entries)
            state_done = not message_.more
    return frames, size, " + ".join(sorted(kinds))


async def raw_catch_up(url: str, conversation_id: str, messages: int) -> RawCatchUp:
    """A raw protocol client's catch-up, from connect until it holds `messages` entries."""
    started = time.perf_counter()
    conn = await open_raw(url, f"/v1/conversations/{conversation_id}", None)
    try:
        await conn.send(encode_message(Hello("raw", Lineage.EMPTY, 0)), text=True)
        frames, size, path = await receive_catch_up(conn, messages)
        return RawCatchUp(time.perf_counter() - started, frames, size, path)
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
    shapes = {"1 entry per record": 1, "2 entries per record": 2}
    topic = Topic(
        "Hub: catch-up (`bench/hub.py catchup`)",
        "A hub on `SqliteStore` (temporary file) in its own process. For each size N, two "
        f"logs of N messages (alternating user/assistant, {MESSAGE_CHARS} characters each) "
        "are written straight into its store: one push record per message (what a replica "
        "pushing messages one by one leaves), and one push record per two messages (an "
        "`extend` of a question and its answer). The hub chooses what a fresh replica gets "
        "(SPEC 2.4 rule 1: the records, or the state when that is cheaper); the path column "
        "says what it sent, as the raw client saw it (`state`: one `state` frame and "
        "`entries` frames). Both logs are loaded into the hub first (the cold load is shown, "
        "informative). Catch-up time = from a fresh real `Replica`'s connect to its "
        "`async with` returning (welcome, every frame, the state or records folded, `local` "
        "rebuilt), checked to hold N entries. The raw client: hello, decode every frame, no "
        f"fold; with the frames and bytes it got (frame limit 1 MiB). Median of "
        f"{settings.repeats} runs, sizes interleaved. Bar: the time per message at the "
        "largest size is at most 1.5x that at the smallest (the cost grows linearly).",
    )
    results = topic.results
    tmp = tempfile.TemporaryDirectory(prefix="convsync-bench-")
    times: dict[tuple[str, int], list[float]] = {}
    raw: dict[tuple[str, int], list[RawCatchUp]] = {}
    loads: dict[tuple[str, int], float] = {}
    state_bytes: dict[int, int] = {}
    log_records: dict[tuple[str, int], int] = {}

    def conversation_of(shape: str, n: int) -> str:
        return f"cu-{shapes[shape]}-{n}"

    async with servers() as start:
        hub = await start(
            "hub", "--store", "sqlite", "--path", f"{tmp.name}/catchup.db", "--idle-unload", "3600"
        )
        for n in sizes:
            for shape, per_record in shapes.items():
                conversation_id = conversation_of(shape, n)
                answer = await hub.ask(
                    "seed",
                    id=conversation_id,
                    messages=n,
                    chars=MESSAGE_CHARS,
                    per_record=per_record,
                )
                state_bytes[n] = answer["state_bytes"]
                log_records[(shape, n)] = answer["revision"]
                load = await hub.ask("load", ids=[conversation_id])
                loads[(shape, n)] = load["seconds"][0]
                log(f"catchup seeded {shape}, {n:,}: cold load {loads[(shape, n)]:.2f} s")
        for shape in shapes:  # warm-up: first-use costs of the code paths
            await replica_catch_up(hub.url, conversation_of(shape, min(sizes)), min(sizes))
        for repeat in range(settings.repeats):
            for n in sizes:
                for shape in shapes:
                    conversation_id = conversation_of(shape, n)
                    seconds = await replica_catch_up(hub.url, conversation_id, n)
                    times.setdefault((shape, n), []).append(seconds)
                    raw.setdefault((shape, n), []).append(
                        await raw_catch_up(hub.url, conversation_id, n)
                    )
                    log(
                        f"catchup {shape}, {n:>6,} #{repeat}: replica {seconds:.3f} s, "
                        f"raw {raw[(shape, n)][-1].seconds:.3f} s ({raw[(shape, n)][-1].path})"
                    )
                    gc.collect()
        if args.profile:
            n = max(sizes)
            conversation_id = conversation_of("1 entry per record", n)
            topic.profiles.append(
                (
                    f"hub process, catch-up of {n:,} messages",
                    await profiled(hub, lambda: replica_catch_up(hub.url, conversation_id, n)),
                )
            )
    tmp.cleanup()
    for shape in shapes:
        for n in sizes:
            sample = times[(shape, n)]
            raw_sample = raw[(shape, n)]
            raw_seconds = median([r.seconds for r in raw_sample])
            first = raw_sample[0]
            paths = sorted({r.path for r in raw_sample})
            results.add(
                Row(
                    f"{n:,} messages, {shape} ({log_records[(shape, n)]:,} records; state "
                    f"{state_bytes[n] / 2**20:.1f} MiB): path {' / '.join(paths)}",
                    f"{median(sample):.3f} s = {median(sample) / n * 1e6:.1f} µs/message "
                    f"(raw client {raw_seconds:.3f} s, {first.frames} frames, "
                    f"{first.size / 2**20:.1f} MiB; cold load {loads[(shape, n)]:.2f} s)",
                    spread=spread(sample, "{:.3f}") + " s",
                )
            )
        small, large = min(sizes), max(sizes)
        ratio = (median(times[(shape, large)]) / large) / (median(times[(shape, small)]) / small)
        results.add(
            Row(
                f"{shape}: time per message at {large:,} / at {small:,}",
                f"{ratio:.3f}",
                bar="<= 1.5",
                passed=ratio <= 1.5,
            )
        )
    return topic
