"""The hub core's own cost per push, old code vs new, without sockets or a store (issue 24).

    .venv/bin/python bench/core_push.py --baseline a31d725           # writes docs/benchmarks.md
    .venv/bin/python bench/core_push.py --baseline a31d725 --quick   # a smoke run; writes nothing

What it measures: `RoomCore.push` and `resume` (the append's outcome) for pushes of one user
message at the head from one of 3 subscribers (the hot path: ack, broadcast), and the same for a
resend answered with its stored ack (a push that waits on nothing); no snapshots (they are
rare and encode the whole conversation). Each side runs in a process
of its own started from the code copies of `bench/_engine.py` (`CODE` for this tree, and
`snapshot_at(REV)` for the baseline), so both import `server.core` by the same name. Both
processes stay up and time blocks of `--pushes` pushes in turn (new, old, old, new, ...), so a
change in the machine's load falls on both; the garbage collector is paused, and the time is
CPU time (`time.process_time`: on a shared machine wall time counts the waits for a core).
Reported: the median time per push of each side, and the ratio new / old (the median of the
neighbouring blocks' ratios) with its spread. The socket benchmarks (`bench/hub.py
latency/fanout --baseline`) measure the same code with everything around it; on a loaded
machine their noise hides a difference this size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._engine import CODE, CODE_VERSION, snapshot_at
from bench._report import command_line, machine, write_section

CHILD = r"""
import gc, json, sys, time
from server.core import CoreConfig, RoomCore
from sync import Conversation, Message
from sync.protocol import Hello, PushBatch

room = RoomCore("c", CoreConfig(max_frame=1 << 20, snapshot_every=10**9))  # no snapshots
room.load(None)
for conn in ("a", "b", "c"):
    room.join(conn, Hello(conn, room.lineage, room.revision))
maker = Conversation()
made = []

def record():
    if not made:
        for i in range(1000):
            maker.push(Message.user(f"message {i}"))
        made.extend(reversed(maker.take_unsaved()))
    return made.pop()

def pushes(count):
    push, resume, seq = room.push, room.resume, room.revision
    batches = [record() for _ in range(count)]
    began = time.process_time()
    for i, made in enumerate(batches, seq + 1):
        actions = push("a", PushBatch(i, room.lineage, room.revision, [made]), 0)
        call = actions[-1]
        resume(call.from_ + len(call.records))
    return time.process_time() - began

def resends(count):
    push = room.push
    batch = PushBatch(room.marks["a"].seq, room.lineage, room.revision, [record()])
    began = time.process_time()
    for _ in range(count):
        push("a", batch, 0)
    return time.process_time() - began

gc.collect()
gc.disable()
pushes(1000)  # warm-up
resends(1000)
for line in sys.stdin:
    kind, count = line.split()
    took = (pushes if kind == "push" else resends)(int(count))
    print(json.dumps({"us": took / int(count) * 1e6}), flush=True)
"""


class Side:
    """One code copy's process, timing blocks of pushes on request."""

    def __init__(self, code: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            cwd=code,
            env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def block(self, kind: str, count: int) -> float:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{kind} {count}\n")
        self.process.stdin.flush()
        return float(json.loads(self.process.stdout.readline())["us"])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="the git revision of the old code")
    parser.add_argument("--quick", action="store_true", help="a smoke run (writes nothing)")
    parser.add_argument("--no-write", action="store_true", help="do not write the figures")
    parser.add_argument("--repeats", type=int, default=41, help="blocks per side and path")
    parser.add_argument("--pushes", type=int, default=2_000, help="pushes per block")
    args = parser.parse_args()
    repeats, pushes = (4, 500) if args.quick else (args.repeats, args.pushes)
    old_code, old_version = snapshot_at(args.baseline)
    new_side, old_side = Side(CODE), Side(old_code)
    rows = []
    try:
        for kind, what, count in (
            ("push", "a push at the head, 3 subscribers", pushes),
            ("resend", "a resend (answered with its ack)", pushes * 4),
        ):
            new, old, ratios = [], [], []
            for repeat in range(repeats):
                order = [(new_side, new), (old_side, old)]
                for side, into in order if repeat % 2 == 0 else order[::-1]:
                    into.append(side.block(kind, count))
                ratios.append(new[-1] / old[-1])
            print(f"{kind}: new {new}, old {old}", file=sys.stderr, flush=True)
            rows.append(
                f"| {what}: µs per push, new / old | {statistics.median(new):.2f} / "
                f"{statistics.median(old):.2f} (new {min(new):.2f}-{max(new):.2f}, old "
                f"{min(old):.2f}-{max(old):.2f}) | {statistics.median(ratios):.3f} "
                f"({min(ratios):.3f}-{max(ratios):.3f}) | <= 1.05 | "
                f"{'PASS' if statistics.median(ratios) <= 1.05 else 'FAIL'} |"
            )
    finally:
        new_side.close()
        old_side.close()
    body = "\n".join(
        [
            f"`{command_line()}`: new {CODE_VERSION}, old {old_version}; {machine()}.",
            "",
            f"{repeats} blocks per side, alternating the two codes' processes block by block, "
            f"{pushes:,} pushes per block ({4 * pushes:,} resends) after 1,000 of warm-up, CPU "
            "time, garbage collector paused; no sockets, no store (the append's outcome is "
            "handed straight back). Figures: medians (min-max over blocks); the ratio is the "
            "median of each pair of neighbouring blocks' ratios.",
            "",
            "| Path | Median (spread) | new / old: median of the ratios (spread) | Bar | Result |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    print(body)
    if not (args.quick or args.no_write):
        write_section("Hub core: cost per push, old vs new code (`bench/core_push.py`)", body)


if __name__ == "__main__":
    main()
