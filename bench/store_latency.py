"""Where one `SqliteStore.append` spends its time when appends come 10 ms apart (100/s).

Run from the repository root:

    .venv/bin/python bench/store_latency.py            # the full run; writes docs/benchmarks.md
    .venv/bin/python bench/store_latency.py --quick    # a smoke run; writes nothing

One conversation, one appender on an asyncio loop: append one ~300-byte record, await it, sleep
10 ms, and again (the first 50 appends of a run are not counted). Each append is cut into
phases by stamps (`time.perf_counter`) taken by thin wrappers around the store's own
functions: the call on the loop until the job is queued; the hand-off until the writer thread
has it; each statement the writer runs (`BEGIN IMMEDIATE`, the UPDATE and INSERTs of the
append, `COMMIT`, which writes the WAL and, with synchronous=FULL, `fdatasync`s it); the
hand-back until the loop runs the resolving callback; and the resume until `await` returns.
Runs alternate synchronous=FULL and OFF (OFF: no fsync at all). Besides, the disk alone:
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

import server.store.sqlite as sqlite_module
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
    run_batch = sqlite_module._Writer._run_batch

    class Cursor:
        def __init__(self, cursor: Any) -> None:
            self.cursor = cursor

        def execute(self, sql: str, *args: Any) -> Any:
            result = self.cursor.execute(sql, *args)
            _stamps["statements"].append((sql.split()[0], pc()))
            return result

        def executemany(self, *args: Any) -> Any:
            return self.cursor.executemany(*args)

    def stamped_run_batch(self: Any, conn: Any, cursor: Any, first: Any) -> bool:
        _stamps["taken"] = pc()
        return run_batch(self, conn, Cursor(cursor), first)  # type: ignore[arg-type]

    sqlite_module._Writer._run_batch = stamped_run_batch  # type: ignore[method-assign]
    resolve_all = sqlite_module._resolve_all

    def stamped_resolve_all(settled: Any) -> None:
        _stamps["resolving"] = pc()
        resolve_all(settled)

    sqlite_module._resolve_all = stamped_resolve_all


async def one_run(folder: str, synchronous: str, appends: int) -> list[dict[str, float]]:
    store = SqliteStore(os.path.join(folder, f"latency-{synchronous}.db"), synchronous=synchronous)
    rows: list[dict[str, float]] = []
    async with store:
        revision = 0
        for i in range(appends + WARM_UP):
            _stamps.clear()
            _stamps["statements"] = []
            started = time.perf_counter()
            revision = await store.append("c", 1, revision, [RECORD])
            ended = time.perf_counter()
            if i >= WARM_UP:
                row = {"call": _stamps["queued"] - started}
                row["hand-off to the writer"] = _stamps["taken"] - _stamps["queued"]
                at = _stamps["taken"]
                for sql, stamp in _stamps["statements"]:
                    name = sql if sql != "INSERT" or "INSERT" not in row else "INSERT (2)"
                    row[name] = stamp - at
                    at = stamp
                row["hand-back to the loop"] = _stamps["resolving"] - at
                row["resume"] = ended - _stamps["resolving"]
                row["total"] = ended - started
                rows.append(row)
            await asyncio.sleep(GAP)
    os.unlink(store.path)
    return rows


def fsync_probe(folder: str, idle: bool, count: int) -> list[float]:
    path = os.path.join(folder, "probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    chunk = b"x" * 12 * 1024
    times = []
    try:
        for i in range(count):
            if idle:
                time.sleep(GAP)
            os.pwrite(fd, chunk, i * len(chunk))
            started = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        os.unlink(path)
    return times


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
                probes[name].append(fsync_probe(folder, idle, appends // 3))
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
    lines += ["", "| The disk alone: 12 KiB written, then `fdatasync` | Median |", "|---|---|"]
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
