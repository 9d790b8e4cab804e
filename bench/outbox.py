"""The persisted outbox's cost: push latency with `outbox=` on and off (`docs/benchmarks.md`).

Run from the repository root:

    PYTHONPATH=. python bench/outbox.py [--edits 300] [--burst 1000] [--repeats 5] [--write]

How it works: a hub runs in a process of its own (in-memory store, so its own writes cost
nothing here). In this process one replica (`client.connect`, the public API) per mode, the
outbox off and on (a SQLite file in a temporary folder), makes `--edits` edits one at a time:
`conversation.push(...)` of a 300-character user message, then `await replica.flush()`.
Measured per edit: the edit call itself (with the outbox: the record's commit on the outbox's
thread, which the call waits for) and the push latency, from the edit to its ack. Then a burst
of `--burst` edits made back to back, flushed once: edits per second. The modes alternate,
repeat by repeat, so the machine's drift hits both alike; the garbage collector is paused
during each timing loop. The load average is shown beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from bench._report import Results, Row, gc_paused, median, now, publish, spread, text  # noqa: E402
from bench._support import use_test_helpers  # noqa: E402

use_test_helpers()

from hubprocess import HubProcess  # noqa: E402

from client import connect  # noqa: E402
from sync import Message  # noqa: E402


def git_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_run(
    url: str, outbox: Path | None, edits: int, burst: int, tag: str
) -> dict[str, float]:
    """One replica's run: per-edit call and push latency (seconds), and a burst's rate."""
    calls: list[float] = []
    latencies: list[float] = []
    async with connect(url, f"bench-{tag}", outbox=outbox) as replica:
        conversation = replica.conversation
        with gc_paused():
            for i in range(edits):
                message = Message.user(text(i))
                start = time.perf_counter()
                conversation.push(message)
                made = time.perf_counter()
                await replica.flush()
                done = time.perf_counter()
                calls.append(made - start)
                latencies.append(done - start)
            messages = [Message.user(text(edits + i)) for i in range(burst)]
            start = time.perf_counter()
            for message in messages:
                conversation.push(message)
            await replica.flush()
            rate = burst / (time.perf_counter() - start)
    return {
        "call_p50": percentile(calls, 0.5),
        "call_p99": percentile(calls, 0.99),
        "push_p50": percentile(latencies, 0.5),
        "push_p99": percentile(latencies, 0.99),
        "rate": rate,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--edits", type=int, default=300)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args()
    started, clock = now(), time.monotonic()
    loads = [os.getloadavg()[0]]
    hub = HubProcess(":memory:")
    hub.start()
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    try:
        with tempfile.TemporaryDirectory(prefix="convsync-bench-outbox-") as folder:
            for repeat in range(args.repeats):
                for mode in ("off", "on"):
                    outbox = Path(folder, f"{repeat}.outbox") if mode == "on" else None
                    runs[mode].append(
                        await one_run(hub.url, outbox, args.edits, args.burst, f"{mode}-{repeat}")
                    )
                loads.append(os.getloadavg()[0])
    finally:
        hub.stop()

    def figures(mode: str, key: str) -> list[float]:
        return [run[key] for run in runs[mode]]

    results = Results()
    for key, name in (
        ("call_p50", "edit call, p50"),
        ("call_p99", "edit call, p99"),
        ("push_p50", "push latency (edit to ack), p50"),
        ("push_p99", "push latency (edit to ack), p99"),
    ):
        for mode in ("off", "on"):
            values = [v * 1e3 for v in figures(mode, key)]
            bar, passed = "", None
            if key == "call_p50" and mode == "on":
                bar, passed = "<= 1 ms (the per-edit write stays cheap)", median(values) <= 1.0
            results.add(
                Row(
                    f"{name}, outbox {mode}",
                    f"{median(values):.3f} ms",
                    spread(values),
                    bar,
                    passed,
                )
            )
    off, on = figures("off", "push_p50"), figures("on", "push_p50")
    added = [(b - a) * 1e3 for a, b in zip(off, on, strict=True)]
    pairs = [b / a for a, b in zip(off, on, strict=True)]
    results.add(
        Row(
            "push latency p50 added by the outbox (on - off)",
            f"{median(added):.3f} ms",
            spread(added),
            "<= 1 ms (two commits on the outbox's thread: the record, then the seq)",
            median(added) <= 1.0,
        )
    )
    results.add(Row("push latency p50, on / off", f"{median(pairs):.2f}", spread(pairs, "{:.2f}")))
    for mode in ("off", "on"):
        values = figures(mode, "rate")
        results.add(
            Row(
                f"burst of {args.burst} edits, outbox {mode}",
                f"{median(values):,.0f} edits/s",
                spread(values, "{:,.0f}"),
            )
        )
    table = results.table() + (
        f"\n\nCode: git commit {git_commit()}. Load average (1 min) over the run: "
        f"{min(loads):.1f}-{max(loads):.1f} "
        f"({os.cpu_count()} cores), sampled before the run and after each repeat."
    )
    publish(
        "Persisted outbox: push latency with and without",
        __doc__ or "",
        table,
        started,
        time.monotonic() - clock,
        write=args.write,
    )
    if results.failed:
        print(f"bars failed: {results.failed}")


if __name__ == "__main__":
    asyncio.run(main())
