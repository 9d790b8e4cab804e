"""Benchmarks of the hub and its replicas over real websockets (issue 3's bar, SPEC section 2).

Run from the repository root:

    .venv/bin/python bench/hub.py all            # every topic, full size; writes docs/benchmarks.md
    .venv/bin/python bench/hub.py fanout         # one topic: fanout, latency, durable,
                                                 #   contention, memory, catchup or compression
    .venv/bin/python bench/hub.py all --quick    # a smoke run at small sizes; writes nothing
    .venv/bin/python bench/hub.py fanout --profile   # also a cProfile of the hub process
    .venv/bin/python bench/hub.py latency --baseline 2c86be2   # old vs new code, one run

Each topic writes its own `## Hub: ...` section of docs/benchmarks.md with the command, the date,
the machine, its figures, the bar and PASS/FAIL. Every server under test (a hub, or the baseline
relay) runs in a process of its own, started by this script from `bench/_hubproc.py` on
127.0.0.1 port 0; the writer and the readers run here, in this process. Every wait is bounded
and every server process is stopped (then killed if it does not exit) when the script leaves.

What each topic measures (bars from issue 3):

1. fanout: records delivered per second to 1, 10 and 100 readers, convsync vs a plain
   `websockets` relay of the same record bytes (bar: convsync >= 0.7x the relay, each size).
2. latency: push-to-apply latency p50/p99 with 10 subscribers at a steady 100 and 1,000
   records/s: the plain relay, convsync on `MemoryStore` and on `SqliteStore` (FULL), and one
   measured fsync (issue 8's bars: memory p50 <= 1.3x and p99 <= 1.6x the relay; SQLite p50
   <= memory p50 + 1.5 fsyncs). `--profile` adds cProfile top entries of the hub and of the
   client process (the subscriber replicas) at 1,000 records/s.
3. durable: records/s of acked one-record pushes with SqliteStore (synchronous=FULL), 1 writer
   vs 20 writers on 20 conversations (bar: 20 writers >= 5x one), and appends per commit.
4. contention: records/s of acked one-record pushes, 1 writer vs 10 writers on ONE
   conversation, hubs with and without placing stale pushes (SPEC 2.4.6), on MemoryStore and
   SqliteStore (issue 8's bar: memory store, placing, 10 writers >= 0.8x one writer); the
   hub's rejects by reason and its placed pushes; every run checked for convergence.
5. memory: hub memory per loaded conversation vs its JSON size (bar: <= 3x), and the hub's RSS
   with 1,000 idle connections (bar: fits in 300 MB).
6. catchup: a fresh replica catching up on 5k..50k-message conversations (bar: time per
   message roughly flat: at 50k <= 1.5x at 5k; 50k must work).
7. compression: permessage-deflate on vs off, delivery rate and hub CPU per delivery
   (expected 2-4x the CPU per delivery; bar: <= 4x).

The code: one module per topic (`bench/_hub_fanout.py`, `_hub_latency.py`, `_hub_durable.py`,
`_hub_contention.py`, `_hub_memory.py`, `_hub_catchup.py`, `_hub_compression.py`), the shared
harness in `bench/_hub.py` (settings, server processes, clients, profiles, `Topic`) and
`bench/_report.py` (results and the report writer); this file holds the topic registry
(`TOPICS`), the command line and the section each topic writes.

`--baseline REV` (fanout and latency): also start hubs running the packages as they were at git
revision REV (`bench/_engine.py` `snapshot_at`; e.g. 2c86be2, the commit before the hub core
redesign), measure them interleaved with the current hubs (new, old, new, old...) by the same
client code in this process, and report new/old (issue 7: no worse than before).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

# First, before `bench._engine` (which then puts its code copy ahead of it): appended, an
# editable install of another checkout (the venv's) shadowed this one's `bench` package, so
# a run from a worktree measured, and wrote into, that other checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench._engine import CODE_VERSION, snapshot_at
from bench._hub import FULL, PROFILE_TOP, QUICK, MachineLoad, OldCode, Settings, Topic, log
from bench._hub_catchup import topic_catchup
from bench._hub_compression import topic_compression
from bench._hub_contention import topic_contention
from bench._hub_durable import topic_durable
from bench._hub_fanout import topic_fanout
from bench._hub_latency import topic_latency
from bench._hub_memory import topic_memory
from bench._hubproc import raise_fd_limit
from bench._report import (
    command_line,
    machine,
    now,
    write_section,
)

# ---------------------------------------------------------------------------- main

TOPICS: dict[str, Callable[[Settings, argparse.Namespace], Awaitable[Topic]]] = {
    "fanout": topic_fanout,
    "latency": topic_latency,
    "durable": topic_durable,
    "contention": topic_contention,
    "memory": topic_memory,
    "catchup": topic_catchup,
    "compression": topic_compression,
}


def section(topic: Topic, started: str, seconds: float, load: str, args: argparse.Namespace) -> str:
    results = topic.results
    if results.failed:
        verdict = "FAILED: " + "; ".join(results.failed)
    elif any(row.passed for row in results.rows):
        verdict = "all bars PASS"
    else:
        verdict = "no bar (figures reported)"
    old: OldCode | None = args.old
    head = [
        f"Command: `{command_line()}` (from the repository root)  ",
        f"Date: {started}; this topic took {seconds:.0f} s  ",
        f"Machine: {machine()}, shared with other jobs  ",
        f"Code: {CODE_VERSION}  ",
    ]
    if old is not None:
        head.append(f"Old code (`--baseline {old.rev}`): {old.version}  ")
    head.append(f"Machine load during this topic: {load}  ")
    if args.note:
        head.append(f"Note: {args.note}  ")
    head.append(f"Result: **{verdict}**")
    profiles = [
        f"cProfile of the {title} (top {PROFILE_TOP} by own time, then by cumulative time; "
        f"an extra run after the timed ones: cProfile slows what it profiles):\n\n"
        f"```\n{profile}\n```"
        for title, profile in topic.profiles
    ]
    return "\n".join(
        [
            *head,
            "",
            topic.intro,
            "",
            results.table(),
            "",
            "\n\n".join([*results.notes, *profiles]),
        ]
    )


async def amain(args: argparse.Namespace) -> int:
    settings = QUICK if args.quick else FULL
    raise_fd_limit()
    names = list(TOPICS) if args.topic == "all" else [args.topic]
    failed = False
    for name in names:
        log(f"... {name}")
        started = now()
        began = time.perf_counter()
        load = MachineLoad()
        topic = await TOPICS[name](settings, args)
        seconds = time.perf_counter() - began
        load_text = load.describe()
        print(f"\nmachine load: {load_text}")
        failed = failed or bool(topic.results.failed)
        print(f"\n## {topic.heading}\n")
        print(topic.results.table())
        for note in topic.results.notes:
            print("\n" + note)
        for title, profile in topic.profiles:
            print(f"\ncProfile of the {title}:\n{profile}")
        if args.quick or args.no_write:
            print("\n(not written to docs/benchmarks.md)")
        else:
            path = write_section(topic.heading, section(topic, started, seconds, load_text, args))
            print(f"\nwrote the {topic.heading!r} section of {path}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topic", choices=[*TOPICS, "all"])
    parser.add_argument("--quick", action="store_true", help="a smoke run (writes nothing)")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also a cProfile of the hub process (latency: and of this client process)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="fanout, latency: also measure hubs running the code of git revision REV (old vs "
        "new, interleaved)",
    )
    parser.add_argument("--note", default="", help="a line for the written sections' header")
    args = parser.parse_args(argv)
    if args.baseline and args.topic not in ("fanout", "latency", "all"):
        parser.error("--baseline applies to the fanout and latency topics")
    args.old = None
    if args.baseline:
        try:
            path, version = snapshot_at(args.baseline)
        except ValueError as exc:
            parser.error(str(exc))
        args.old = OldCode(args.baseline, path, version)
        log(f"old code: {version} in {path}")
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
