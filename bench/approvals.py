"""How long a worker's `ask` takes to return once a person decided (issue 29, SPEC 12).

Run from the repository root:

    .venv/bin/python bench/approvals.py            # the full run; writes docs/benchmarks.md
    .venv/bin/python bench/approvals.py --quick    # a smoke run; writes nothing

What it measures: a hub in a process of its own (`bench/_hubproc.py`, SQLite store with
`synchronous=FULL`, on 127.0.0.1), a worker replica and a UI replica in this process. The
worker opens a turn, makes a tool call and awaits `replica.ask(call=...)`; the UI waits until
it holds the open approval, then the clock starts, the UI calls `decide(...)` (its push goes
at once) and the clock stops when the worker's `ask` returns. Two figures per round: from
the decision landing (when the UI holds the hub's ack: the record is durable, and the hub
sent it to the worker right after that ack) to `ask` returning, which is what the bar is
about; and the whole span from `decide()`, which adds the UI's push and the hub's durable
append (an fsync). Rounds run one after another, one conversation per round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import _engine  # noqa: F401  (first: the run's copy of the engine)
from _report import median, now, publish, spread

from client import connect
from sync import Assistant, Message, Text, ToolCall

SECTION = "A person in the loop: decision to `ask` returning (`bench/approvals.py`, issue 29)"
BAR_P99_MS = 20.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_round(url: str, conversation: str) -> tuple[float, float]:
    async with (
        connect(url, conversation, client="worker") as worker,
        connect(url, conversation, client="ui") as ui,
    ):
        worker.conversation.push(Message.user("clean up"))
        worker.conversation.open_turn()
        worker.conversation.push(Assistant([Text("may I?"), ToolCall("c1", "delete", {})]))
        await worker.flush()
        asking = asyncio.create_task(worker.ask(call="c1", prompt="delete build/?"))
        while not any(a.is_open for a in ui.approvals.values()):  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        (id_,) = [id_ for id_, a in ui.approvals.items() if a.is_open]
        started = time.perf_counter()
        marks: dict[str, float] = {}
        ui.decide(id_, approve=True)
        acked = asyncio.create_task(ui.flush())
        acked.add_done_callback(lambda _: marks.setdefault("ack", time.perf_counter()))
        asking.add_done_callback(lambda _: marks.setdefault("ask", time.perf_counter()))
        await asyncio.gather(asking, acked)
        return (marks["ask"] - started) * 1000, max(0.0, marks["ask"] - marks["ack"]) * 1000


async def run(rounds: int) -> list[tuple[float, float]]:
    with TemporaryDirectory() as tmp:
        hub = subprocess.Popen(  # noqa: ASYNC220 (once, before anything is timed)
            [
                sys.executable,
                str(Path(__file__).with_name("_hubproc.py")),
                "hub",
                "--store",
                "sqlite",
                "--path",
                str(Path(tmp) / "bench.db"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert hub.stdout is not None
            port = json.loads(hub.stdout.readline())["port"]
            url = f"ws://127.0.0.1:{port}"
            for k in range(3):  # warm up: imports, the store's first writes
                await one_round(url, f"warm-{k}")
            return [await one_round(url, f"ask-{k}") for k in range(rounds)]
        finally:
            assert hub.stdin is not None
            hub.stdin.write('{"cmd": "quit"}\n')
            hub.stdin.flush()
            hub.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    rounds = 10 if args.quick else args.rounds
    started, clock = now(), time.monotonic()
    results = asyncio.run(run(rounds))
    span = [total for total, _ in results]
    landed = [after for _, after in results]
    p99 = percentile(landed, 0.99)
    verdict = "PASS" if p99 <= BAR_P99_MS else "FAIL"
    table = (
        f"{rounds} rounds; figures in ms.\n\n"
        "| Measurement | p50 | p99 | Spread (min-max) | Bar | Result |\n"
        "|---|---|---|---|---|---|\n"
        f"| the decision landing (the UI's ack) to `ask()` returning | {median(landed):.2f} "
        f"| {p99:.2f} | {spread(landed, '{:.2f}')} | p99 <= {BAR_P99_MS:g} ms | {verdict} |\n"
        f"| `decide()` on the UI to `ask()` returning (push, fsync, broadcast, fold) "
        f"| {median(span):.2f} | {percentile(span, 0.99):.2f} | {spread(span, '{:.2f}')} | | |\n"
    )
    publish(SECTION, __doc__, table, started, time.monotonic() - clock, write=not args.quick)


if __name__ == "__main__":
    main()
