"""What deleting a conversation costs on SQLite, where the file is scrubbed, by store size.

Run from the repository root:

    .venv/bin/python bench/delete.py            # the full run; writes docs/benchmarks.md
    .venv/bin/python bench/delete.py --quick    # a smoke run; writes nothing

A `SqliteStore` (synchronous=FULL, WAL) on a temporary file holds `--conversations`
conversations of ~300-byte records, filled to the size given; then conversations are deleted
one at a time (`LogStore.delete`, which returns once the delete is durable and the file has
been rewritten by `VACUUM` and its WAL emptied by a `TRUNCATE` checkpoint: SPEC 15, "nothing
of it in the file"). Each delete is timed from the call to its return; meanwhile one append
to another conversation is started right after the delete and timed too: writes wait for the
scrub, so that is the stall a delete costs every writer. Then the same number of deletes is
made at once (as a retention sweep does), which the store commits, and scrubs for, together.
Medians and spreads (min-max) over the deletes of a run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import median, now, publish, spread, text
from server.store import SqliteStore

SECTION = "SQLite: deleting a conversation, file scrubbed (`bench/delete.py`)"
LINEAGE = 1111
BATCH = 200  # records per append while filling


async def fill(store: SqliteStore, conversations: int, megabytes: int) -> None:
    record = text(0).encode()
    per_conversation = megabytes * 1024 * 1024 // len(record) // conversations
    for c in range(conversations):
        done = 0
        while done < per_conversation:
            count = min(BATCH, per_conversation - done)
            await store.append(f"c{c:04}", LINEAGE, done, [record] * count)
            done += count


def file_size(path: Path) -> int:
    """The database and its WAL, in bytes."""
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())


async def run(megabytes: int, conversations: int, deletes: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.db"
        async with SqliteStore(path) as store:
            await fill(store, conversations, megabytes)
            await store.append("writer", LINEAGE, 0, [b"x"])
            size = file_size(path)
            one, stalls = [], []
            for k in range(deletes):
                started = time.perf_counter()
                deleting = asyncio.ensure_future(store.delete(f"c{k:04}", time.time()))
                await asyncio.sleep(0)  # the delete is queued first
                appended = time.perf_counter()
                await store.append("writer", LINEAGE, 1 + k, [b"x"])
                stalls.append(time.perf_counter() - appended)
                await deleting
                one.append(time.perf_counter() - started)
            started = time.perf_counter()
            ids = [f"c{k:04}" for k in range(deletes, 2 * deletes)]
            await asyncio.gather(*(store.delete(i, time.time()) for i in ids))
            together = time.perf_counter() - started
    return {"size": size, "one": one, "stalls": stalls, "together": together}


def row(megabytes: int, result: dict[str, object], deletes: int) -> str:
    one = result["one"]
    stalls = result["stalls"]
    assert isinstance(one, list) and isinstance(stalls, list)
    ms = [x * 1000 for x in one]
    stall_ms = [x * 1000 for x in stalls]
    together = result["together"]
    assert isinstance(together, float)
    size = result["size"]
    assert isinstance(size, int)
    ms_ = "{:.0f}"
    return (
        f"| {megabytes} MiB | {size / 2**20:.0f} MiB | {median(ms):.0f} ms ({spread(ms, ms_)}) "
        f"| {median(stall_ms):.0f} ms ({spread(stall_ms, ms_)}) "
        f"| {together * 1000:.0f} ms for {deletes} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument("--conversations", type=int, default=100)
    args = parser.parse_args()
    sizes = [2] if args.quick else [8, 64]
    deletes = 3 if args.quick else 5
    started, clock = now(), time.monotonic()
    lines = [
        "| records | file + WAL | one delete (median, min-max) | an append behind it "
        "| deletes at once |",
        "|---|---|---|---|---|",
    ]
    for megabytes in sizes:
        result = asyncio.run(run(megabytes, args.conversations, deletes))
        lines.append(row(megabytes, result, deletes))
        print(lines[-1], flush=True)
    publish(
        SECTION,
        __doc__ or "",
        "\n".join(lines),
        started,
        time.monotonic() - clock,
        write=not args.quick,
    )


if __name__ == "__main__":
    main()
