"""Where one `SqliteStore.append` spends its time when appends come 10 ms apart (100/s).

Run from the repository root:

    .venv/bin/python bench/store_latency.py            # the full run; writes docs/benchmarks.md
    .venv/bin/python bench/store_latency.py --quick    # a smoke run; writes nothing

One conversation, one appender on an asyncio loop: append one ~300-byte record, await it, sleep
10 ms, and again (the first 50 appends of a run are not counted). Each append is cut into
phases by stamps (`time.perf_counter`) taken by thin wrappers around the store's own
functions: the call on the loop until the job is queued; the wait until the loop starts the
batch; each statement the loop runs (`BEGIN IMMEDIATE`, the UPDATE and INSERTs of the append,
`COMMIT`, which writes the WAL to the page cache); with synchronous=FULL, the hand-off to the
store's thread, its `fdatasync` of the WAL and the hand-back until the loop resolves the
append; and the resume until `await` returns. Runs alternate synchronous=FULL and OFF (OFF: no
sync at all; the append resolves right after `COMMIT`). Besides, the disk alone:
12 KiB written and `fdatasync`ed in a file next to the database (a commit of one append writes
three pages of the WAL), back to back and each after 10 ms asleep. Medians over every counted
append of every repeat (so the phases' medians need not add up to the total's); the spread is
the min-max of the repeats' medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import server.store.sqlite_writer as sqlite_module
from bench._hub_latency import fsync_probe
from bench._report import median, now, publish, spread
from server.store.sqlite import SqliteStore

SECTION = "SQLite: one append at 100/s, phase by phase (`bench/store_latency.py`)"
RECORD = b'{"change":{"kind":"push","entries":[' + b'"' + b"x" * 260 + b'"]}}'
GAP = 0.010
WARM_UP = 50

_stamps: dict[str, Any] = {}


def _instrument() -> None:
    """Wrap the store's functions to stamp each phase of an append into `_stamps`."""
    pc = time.perf_counter
    write = SqliteStore._write

    async def stamped_write(self: SqliteStore, run: Any, *, is_append: bool) -> Any:
        _stamps["queued"] = pc()
        return await write(self, run, is_append=is_append)

    SqliteStore._write = stamped_write  # type: ignore[method-assign]
    flush = sqlite_module._Committer.flush

    def stamped_flush(self: Any) -> None:
        _stamps.setdefault("taken", pc())
        flush(self)

    sqlite_module._Committer.flush = stamped_flush  # type: ignore[method-assign]
    fsync = sqlite_module._fsync

    def stamped_fsync(fd: int) -> None:
        _stamps["syncing"] = pc()
        fsync(fd)
        _stamps["synced"] = pc()

    sqlite_module._fsync = stamped_fsync
    finish = sqlite_module._Committer._finish

    def stamped_finish(self: Any, *args: Any) -> None:
        _stamps["resolving"] = pc()
        finish(self, *args)

    sqlite_module._Committer._finish = stamped_finish  # type: ignore[method-assign]


class _StampedCursor:
    """The store's cursor, stamping the end of each statement of an append."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor

    def execute(self, sql: str, *args: Any) -> Any:
        result = self.cursor.execute(sql, *args)
        verb = sql.split()[0]
        if verb in ("BEGIN", "UPDATE", "INSERT", "COMMIT"):  # not the thread's checkpoints
            _stamps["statements"].append((verb, time.perf_counter()))
        return result

    def executemany(self, *args: Any) -> Any:
        return self.cursor.executemany(*args)


async def one_run(folder: str, synchronous: str, appends: int) -> list[dict[str, float]]:
    store = SqliteStore(os.path.join(folder, f"latency-{synchronous}.db"), synchronous=synchronous)
    rows: list[dict[str, float]] = []
    async with store:
        store._writer.cursor = _StampedCursor(store._writer.cursor)  # type: ignore[assignment]
        revision = 0
        for i in range(appends + WARM_UP):
            _stamps.clear()
            _stamps["statements"] = []
            started = time.perf_counter()
            revision = await store.append("c", 1, revision, [RECORD])
            ended = time.perf_counter()
            if i >= WARM_UP:
                row = {"call": _stamps["queued"] - started}
                row["until the loop starts the batch"] = _stamps["taken"] - _stamps["queued"]
                at = _stamps["taken"]
                for sql, stamp in _stamps["statements"]:
                    name = sql if sql != "INSERT" or "INSERT" not in row else "INSERT (2)"
                    row[name] = stamp - at
                    at = stamp
                # With OFF nothing is synced: the batch resolves on the loop after COMMIT.
                syncing = _stamps.get("syncing", at)
                synced = _stamps.get("synced", at)
                row["hand-off to the store's thread"] = syncing - at
                row["fdatasync of the WAL"] = synced - syncing
                row["hand-back to the loop"] = _stamps["resolving"] - synced
                row["resume"] = ended - _stamps["resolving"]
                row["total"] = ended - started
                rows.append(row)
            await asyncio.sleep(GAP)
    os.unlink(store.path)
    return rows


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (writes nothing)")
    parser.add_argument("--no-write", action="store_true", help="do not write docs")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--appends", type=int, default=300)
    args = parser.parse_args()
    repeats, appends = (1, 60) if args.quick else (args.repeats, args.appends)
    started, began = now(), time.monotonic()
    _instrument()
    runs: dict[str, list[list[dict[str, float]]]] = {"FULL": [], "OFF": []}
    probes: dict[str, list[list[float]]] = {"back to back": [], "after 10 ms asleep": []}
    with tempfile.TemporaryDirectory(prefix="convsync-bench-") as folder:
        for repeat in range(repeats):
            for synchronous in ("FULL", "OFF") if repeat % 2 == 0 else ("OFF", "FULL"):
                rows = asyncio.run(one_run(folder, synchronous, appends))
                runs[synchronous].append(rows)
                total = statistics.median(row["total"] for row in rows)
                print(f"#{repeat} {synchronous:4} append {_us(total)}", flush=True)
            for name, idle in (("back to back", False), ("after 10 ms asleep", True)):
                times = fsync_probe(
                    folder,
                    appends // 3,
                    size=12 * 1024,
                    idle=GAP if idle else 0.0,
                    sync=os.fdatasync,
                )
                probes[name].append(times)
                print(f"#{repeat} fdatasync {name}: {_us(median(probes[name][-1]))}")
    phases = list(runs["FULL"][0][0])
    lines = ["| Phase | synchronous=FULL | OFF |", "|---|---|---|"]
    for phase in phases:
        cells = []
        for synchronous in ("FULL", "OFF"):
            per_run = [median([row[phase] for row in rows]) for rows in runs[synchronous]]
            every = [row[phase] for rows in runs[synchronous] for row in rows]
            figure = _us(median(every))
            if phase == "total":
                figure = f"**{figure}**"
            cells.append(f"{figure} ({spread([t * 1e6 for t in per_run], '{:.0f}')})")
        lines.append(f"| {phase} | {cells[0]} | {cells[1]} |")
    lines += ["", "| The disk alone: 12 KiB written and `fdatasync`ed | Median |", "|---|---|"]
    for name, per_run_times in probes.items():
        every_time = [t for times in per_run_times for t in times]
        per_run_median = [median(times) * 1e6 for times in per_run_times]
        lines.append(f"| {name} | {_us(median(every_time))} ({spread(per_run_median, '{:.0f}')}) |")
    table = "\n".join(lines)
    table += f"\n\n{appends:,} counted appends per run, {repeats} repeats of each setting."
    seconds = time.monotonic() - began
    publish(
        SECTION, __doc__ or "", table, started, seconds, write=not (args.quick or args.no_write)
    )


if __name__ == "__main__":
    main()
