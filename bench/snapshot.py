"""What the hub's snapshots cost a long conversation: per push, on the event loop, on disk.

Run from the repository root:

    .venv/bin/python bench/snapshot.py            # the full run; writes docs/benchmarks.md
    .venv/bin/python bench/snapshot.py --quick    # a smoke run; writes nothing

A room (`RoomCore`, carried out exactly as `Room._carry_out` does, minus the lock and the
sockets) holds a conversation of N user messages (~300 bytes of JSON each), loaded from its
store as a snapshot; then one writer pushes `--pushes` one-message records, each acked before
the next, and nobody else is joined. Each push is timed from `RoomCore.push` to the end of
everything it asked for: the append, and the snapshot when one is due (encoded on the event
loop, then written; the room's lock would be held for all of it, so the next push to this
conversation waits for it).

Two snapshot rules, interleaved in every repeat, on the same code:
- **every 1,000 records**: the rule before this change (`RoomCore._snapshot_due` replaced by
  `revision - snapshot_revision >= snapshot_every` alone);
- **weighed**: the rule now: also wait until the records since the latest snapshot weigh as
  much as it, or until there are `SNAPSHOT_SPAN` (10) times `snapshot_every` of them.
The cost of the weighed rule is at load: the room then folds more records after the snapshot.
After each run the store is loaded into a fresh room (`LogStore.load` + `RoomCore.load`) and
timed. Stores: `MemoryStore`, and `SqliteStore` (synchronous=FULL, WAL) on a temporary file.
Garbage collector paused in the timed parts (after a `gc.collect()`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import gc_paused, median, now, publish, spread, text
from server.core import SNAPSHOT_SPAN, CoreConfig, RoomCore, deliver
from server.room import store_call
from server.store import LogStore, MemoryStore, SqliteStore
from sync import Author, ChangeRecord, Conversation, Lineage, Message, Reset, decode_state, encode
from sync.protocol import Hello, PushBatch

SECTION = "Hub: snapshots of a long conversation (`bench/snapshot.py`)"
SNAPSHOT_EVERY = 1000
CONVERSATION = "c"


def _old_rule(core: RoomCore[Any]) -> bool:
    return core.revision - core._snapshot_revision >= core.config.snapshot_every


RULES: dict[str, Callable[[RoomCore[Any]], bool] | None] = {
    "every 1,000 records": _old_rule,
    "weighed": None,  # RoomCore's own rule
}


def _discard(*_: object) -> None:
    pass


async def _carry_out(store: LogStore, core: RoomCore[str], actions: list[Any]) -> None:
    while (call := deliver(actions, _discard, _discard, _discard, _discard)) is not None:
        try:
            outcome: object = await store_call(store, CONVERSATION, call)
        except Exception as exc:
            outcome = exc
        actions = core.resume(outcome)


async def _seed(store: LogStore, size: int) -> None:
    """A log of one `reset` record holding `size` messages, and a snapshot of it."""
    conversation = Conversation()
    conversation.extend([Message.user(text(i)) for i in range(size)])
    lineage = Lineage.fresh()
    state = encode(conversation)
    await store.rewrite(CONVERSATION, lineage, [_reset_record(conversation)])
    await store.write_snapshot(CONVERSATION, lineage, 1, state)


def _reset_record(conversation: Conversation) -> bytes:
    return encode(ChangeRecord(Reset(conversation.state()), Author.rig(), 0))


async def _loaded(store: LogStore) -> tuple[RoomCore[str], float]:
    started = time.perf_counter()
    core: RoomCore[str] = RoomCore(
        CONVERSATION, CoreConfig(max_frame=1 << 24, snapshot_every=SNAPSHOT_EVERY)
    )
    core.load(await store.load(CONVERSATION))
    return core, time.perf_counter() - started


async def one_run(
    make_store: Callable[[], Awaitable[LogStore]], size: int, pushes: int, rule: str
) -> dict[str, float]:
    store = await make_store()
    try:
        await _seed(store, size)
        core, _ = await _loaded(store)
        old = RULES[rule]
        if old is not None:
            core._snapshot_due = lambda: old(core)  # type: ignore[method-assign]
        core.join("w", Hello("w", core.lineage, core.revision))
        writer = Conversation()
        writer.continue_log(core.lineage, core.revision)
        writes = _count_snapshot_bytes(store)
        times: list[float] = []
        with gc_paused():
            for seq in range(1, pushes + 1):
                writer.push(Message.user(text(size + seq)))
                records = writer.take_unsaved()
                batch = PushBatch(seq, core.lineage, core.revision, records)
                started = time.perf_counter()
                await _carry_out(store, core, core.push("w", batch, 0))
                times.append(time.perf_counter() - started)
                writer.continue_log(core.lineage, core.revision)
        times.sort()
        with gc_paused():
            _, load = await _loaded(store)
        return {
            "p50": times[len(times) // 2],
            "p99": times[int(len(times) * 0.99)],
            "p999": times[int(len(times) * 0.999)],
            "max": times[-1],
            "mean": sum(times) / len(times),
            "snapshots": writes["count"],
            "snapshot_bytes_per_record": writes["bytes"] / pushes,
            "load": load,
        }
    finally:
        await store.close()


def _count_snapshot_bytes(store: LogStore) -> dict[str, int]:
    """Count the snapshots `store` is asked to write from now on, and their bytes."""
    counts = {"count": 0, "bytes": 0}
    write = store.write_snapshot

    async def counted(conversation_id: str, lineage: int, revision: int, state: bytes) -> None:
        counts["count"] += 1
        counts["bytes"] += len(state)
        await write(conversation_id, lineage, revision, state)

    store.write_snapshot = counted  # type: ignore[method-assign]
    return counts


async def worst_load(
    make_store: Callable[[], Awaitable[LogStore]], size: int, records: int, at_start: bool
) -> float:
    """Load time of a snapshot of `size` messages with `records` one-message records after it:
    pushed at the end, or (`at_start`) each inserted before the first entry."""
    store = await make_store()
    try:
        await _seed(store, size)
        core, _ = await _loaded(store)
        writer = decode_state(encode(core.conversation))
        writer.continue_log(core.lineage, core.revision)
        for i in range(records):
            message = Message.user(text(size + i))
            if at_start:
                writer.splice(slice(0, 0), [message], None)
            else:
                writer.push(message)
        tail = [encode(record) for record in writer.take_unsaved()]
        await store.append(CONVERSATION, core.lineage, core.revision, tail)
        with gc_paused():
            _, load = await _loaded(store)
        return load
    finally:
        await store.close()


def _stores(folder: str) -> dict[str, Callable[[], Awaitable[LogStore]]]:
    made = [0]

    async def memory() -> LogStore:
        return MemoryStore()

    async def sqlite() -> LogStore:
        made[0] += 1
        store = SqliteStore(os.path.join(folder, f"bench-{made[0]}.db"))
        return await store.__aenter__()

    return {"memory": memory, "SQLite": sqlite}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


async def main_async(args: argparse.Namespace) -> str:
    sizes = [1_000, 100_000] if not args.quick else [1_000, 5_000]
    pushes = args.pushes if not args.quick else 1_200
    repeats = args.repeats if not args.quick else 1
    results: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    loads: dict[tuple[str, int, int, bool], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="convsync-bench-") as folder:
        stores = _stores(folder)
        for repeat in range(repeats):
            order = list(RULES) if repeat % 2 == 0 else list(reversed(RULES))
            for store_name, make in stores.items():
                for size in sizes:
                    for rule in order:
                        figures = await one_run(make, size, pushes, rule)
                        results.setdefault((store_name, size, rule), []).append(figures)
                        print(
                            f"#{repeat} {store_name:6} {size:>7,} {rule:20} "
                            f"p50 {_ms(figures['p50'])} p99 {_ms(figures['p99'])} "
                            f"p99.9 {_ms(figures['p999'])} "
                            f"max {_ms(figures['max'])} mean {_ms(figures['mean'])} "
                            f"snapshots {figures['snapshots']:.0f} "
                            f"({figures['snapshot_bytes_per_record'] / 1024:,.1f} KiB/record) "
                            f"load {figures['load']:.2f} s",
                            flush=True,
                        )
                        gc.collect()
                for size in sizes:
                    tail = min(size, SNAPSHOT_SPAN * SNAPSHOT_EVERY)
                    for at_start in (False, True):
                        worst = await worst_load(make, size, tail, at_start)
                        loads.setdefault((store_name, size, tail, at_start), []).append(worst)
                        print(f"#{repeat} {store_name:6} {size:>7,} worst load {worst:.2f} s")
                        gc.collect()
    lines = [
        "| Store, messages held | Rule | Push p50 / p99 / p99.9 / max | Mean per push | Snapshots"
        " (bytes written per record) | Load after (store + fold) |",
        "|---|---|---|---|---|---|",
    ]
    for (store_name, size, rule), runs in results.items():

        def pick(key: str, runs: list[dict[str, float]] = runs) -> list[float]:
            return [run[key] for run in runs]

        lines.append(
            f"| {store_name}, {size:,} | {rule} | {_ms(median(pick('p50')))} /"
            f" {_ms(median(pick('p99')))} / {_ms(median(pick('p999')))} /"
            f" {_ms(median(pick('max')))}"
            f" (max {spread([m * 1000 for m in pick('max')], '{:.1f}')} ms)"
            f" | {_ms(median(pick('mean')))} ({spread([m * 1000 for m in pick('mean')], '{:.3f}')})"
            f" | {median(pick('snapshots')):.0f}"
            f" ({median(pick('snapshot_bytes_per_record')) / 1024:,.1f} KiB)"
            f" | {median(pick('load')):.3f} s ({spread(pick('load'), '{:.3f}')})"
            " |"
        )
    lines += [
        "",
        "The most the weighed rule leaves to fold at load: a snapshot of N messages and T"
        " one-message records after it, T = min(N, the span of"
        f" {SNAPSHOT_SPAN} x {SNAPSHOT_EVERY:,} records); the records pushed at the end, or each"
        " inserted before the first entry (a splice, which shifts every entry after it). The"
        f" every-1,000 rule leaves at most {SNAPSHOT_EVERY:,}.",
        "",
        "| Store, N | T | Load, records pushed at the end | Load, records inserted at the start |",
        "|---|---|---|---|",
    ]
    for store_name in ("memory", "SQLite"):
        for size in sizes:
            tail = min(size, SNAPSHOT_SPAN * SNAPSHOT_EVERY)
            cells = []
            for at_start in (False, True):
                times = loads[(store_name, size, tail, at_start)]
                cells.append(f"{median(times):.3f} s ({spread(times, '{:.3f}')})")
            lines.append(f"| {store_name}, {size:,} | {tail:,} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + f"\n\n{pushes:,} one-message pushes per run, {repeats} repeats."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (writes nothing)")
    parser.add_argument("--no-write", action="store_true", help="do not write docs")
    parser.add_argument("--pushes", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    started = now()
    began = time.monotonic()
    table = asyncio.run(main_async(args))
    seconds = time.monotonic() - began
    publish(
        SECTION, __doc__ or "", table, started, seconds, write=not (args.quick or args.no_write)
    )


if __name__ == "__main__":
    main()
