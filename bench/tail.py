"""`convsync tail`'s drawing cost at 50,000 entries, this tree against a baseline (issue 13).

Run from the repository root:

    .venv/bin/python bench/tail.py            # the full run; writes docs/benchmarks.md
    .venv/bin/python bench/tail.py --quick    # a smoke run at a small size; writes nothing

What it measures: the CPU time (`time.thread_time`, the loop's one thread; the cyclic
collector paused) `client.tail.tail` spends to draw, with stdout a terminal of 120 x 50
(`COLUMNS`/`LINES`): the first draw (from the call until the first frame is flushed), then per
change until the frame it causes is flushed: a new entry (an `Applied` event), a draft growing
by a few words (`DraftChanged`), and a turn record ended (an aside replaced, `Applied`). It
also times one change off a terminal (stdout a pipe: the lines for a new entry). Each change
is made before the clock starts, so only the drawing is billed. The replica is a stand-in
holding a real `Conversation` and an event queue (no hub, no socket: their costs are not
drawing). The conversation has a rig's shape: turns of a user request, 1-8 rounds of an
assistant reply with a tool call and its result, a closing answer, one `rig.turn` aside per
turn (about 4,600 asides at 50,000 entries).

Each repeat runs each side in a fresh process (`--child`), sides interleaved, their order
alternating: this tree (a copy taken when the run starts, `bench/_engine.py`) and the code of
`--baseline` (a git ref, exported with `git archive`; default: main before the terminal view
drew only what fits). A process reports its first draw and the median of its changes of each
kind; the table shows the median over repeats and the spread (min-max).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Terminal view: `convsync tail` at 50,000 entries (`bench/tail.py`)"
BASELINE = "7d1f875"  # main before `tail` drew only the lines that fit the screen
TERMINAL = {"COLUMNS": "120", "LINES": "50"}


@dataclass(frozen=True)
class Settings:
    entries: int
    repeats: int
    changes: int


FULL = Settings(entries=50_000, repeats=5, changes=9)
QUICK = Settings(entries=2_000, repeats=2, changes=3)


# ------------------------------------------------------------------ the child process


def _text(rng: random.Random, i: int, length: int) -> str:
    words = ("the", "agent", "read", "file", "parser", "token", "line", "test", "fixed", "loop")
    out = [f"#{i}"]
    size = len(out[0])
    while size < length:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:length]


def conversation_of(entries: int) -> Any:
    """A rig's conversation of about `entries` entries, a `rig.turn` aside per turn."""
    from sync import Aside, Assistant, Author, Conversation, Stop, Text, ToolCall, User
    from sync.messages import ToolResult

    rng = random.Random(13)
    conversation = Conversation()
    made = turns = 0
    while made < entries:
        after = conversation.id(len(conversation) - 1)
        start = conversation.push(User([Text(_text(rng, made, 200))]))
        turn = {"index": turns, "start": start, "end": None}
        aside = conversation.add_aside(Aside("rig.turn", after, Author.rig(), turn))
        made += 1
        for _ in range(rng.randint(1, 8)):
            call = f"call_{made}"
            conversation.push(
                Assistant(
                    [Text(_text(rng, made, 80)), ToolCall(call, "read_file", {"path": "a.py"})],
                    stop=Stop("tool_use"),
                )
            )
            conversation.push(User([ToolResult(call, "read_file", [Text(_text(rng, made, 600))])]))
            made += 2
        answer = conversation.push(Assistant([Text(_text(rng, made, 300))], stop=Stop("stop")))
        made += 1
        ended = {**turn, "end": {"how": "answered", "answer": answer}}
        conversation.replace_aside(aside, Aside("rig.turn", after, Author.rig(), ended))
        turns += 1
    conversation.take_unsaved()
    return conversation


class Out(io.StringIO):
    """A stdout that says whether it is a terminal and wakes a waiter when a frame (or a
    batch of lines) is flushed; it keeps nothing."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty
        self.frames = 0
        self.flushed: asyncio.Event = asyncio.Event()

    def isatty(self) -> bool:
        return self.tty

    def flush(self) -> None:
        # A frame holds the header (`... entries`); rich's mode switches and cursor codes
        # are flushed on their own and do not count.
        if "entries" in self.getvalue() or "#" in self.getvalue():
            self.frames += 1
            self.flushed.set()
        self.seek(0)
        self.truncate(0)

    async def next_frame(self) -> None:
        await self.flushed.wait()
        self.flushed.clear()


class StandIn:
    """What `tail` reads of a replica: the conversation, drafts, presence, events."""

    conversation_id = "bench"

    def __init__(self, conversation: Any) -> None:
        self.conversation = conversation
        self.drafts: dict[str, Any] = {}
        self.presence: dict[str, Any] = {}
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.session = SimpleNamespace(confirmed=self)

    @property
    def revision(self) -> int:
        return int(self.conversation.revision)

    async def events(self) -> Any:
        while True:
            yield await self.queue.get()

    def events_nowait(self) -> list[Any]:
        taken = []
        while not self.queue.empty():
            taken.append(self.queue.get_nowait())
        return taken


async def _measure(entries: int, changes: int) -> dict[str, Any]:
    from client.live import Draft, DraftChanged
    from client.session import Applied
    from client.tail import tail
    from sync import Aside, Author, Message

    conversation = conversation_of(entries)
    result: dict[str, Any] = {"entries": len(conversation), "asides": len(conversation.asides())}
    clock = time.thread_time

    # On a terminal.
    replica = StandIn(conversation)
    out = Out(tty=True)
    gc.collect()
    gc.disable()
    began = clock()
    task = asyncio.create_task(tail(replica, out, once=False, tty=True))  # type: ignore[arg-type]
    await out.next_frame()
    result["first_ms"] = (clock() - began) * 1e3

    async def timed(change: Any) -> float:
        began = clock()
        replica.queue.put_nowait(change)
        await out.next_frame()
        return (clock() - began) * 1e3

    entry_ms, draft_ms, aside_ms = [], [], []
    replica.drafts["d1"] = Draft("d1", "assistant", "worker", "worker", 0)
    for n in range(changes):
        conversation.push(Message.user(f"change {n}"))
        entry_ms.append(await timed(Applied(1, conversation.revision)))
        replica.drafts["d1"].parts["text"] = _text(random.Random(n), n, 40 * (n + 1))
        draft_ms.append(await timed(DraftChanged("d1")))
        id_, aside = conversation.asides()[-1 - n]
        conversation.replace_aside(id_, Aside(aside.kind, aside.after, Author.rig(), {"n": n}))
        aside_ms.append(await timed(Applied(1, conversation.revision)))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    result |= {"entry_ms": median(entry_ms), "draft_ms": median(draft_ms)}
    result["aside_ms"] = median(aside_ms)

    # Off a terminal: the lines for a new entry.
    replica = StandIn(conversation)
    out = Out(tty=False)
    task = asyncio.create_task(tail(replica, out, once=False, tty=False))  # type: ignore[arg-type]
    await out.next_frame()
    piped_ms = []
    for n in range(changes):
        conversation.push(Message.user(f"piped {n}"))
        began = clock()
        replica.queue.put_nowait(Applied(1, conversation.revision))
        await out.next_frame()
        piped_ms.append((clock() - began) * 1e3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    gc.enable()
    result["piped_ms"] = median(piped_ms)
    return result


def child(entries: int, changes: int) -> dict[str, Any]:
    return asyncio.run(_measure(entries, changes))


# ------------------------------------------------------------------ the parent process


def run_child(code: Path, settings: Settings) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVSYNC_")}
    env |= TERMINAL | {"PYTHONPATH": str(code), "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    command = [sys.executable, str(Path(__file__).resolve()), "--child"]
    command += [str(settings.entries), str(settings.changes)]
    result = subprocess.run(
        command,
        cwd=tempfile.gettempdir(),  # so no package in the cwd shadows PYTHONPATH
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    if result.returncode != 0:
        raise SystemExit(f"child under {code} failed:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]


ROWS = [
    ("first_ms", "first draw"),
    ("entry_ms", "redraw after a new entry"),
    ("draft_ms", "redraw after a draft grew"),
    ("aside_ms", "redraw after an aside changed"),
    ("piped_ms", "off a terminal: lines for a new entry"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run; writes nothing")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument("--baseline", default=BASELINE, help="git ref to compare with")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0

    sys.path.insert(0, str(ROOT))  # this tree's `bench`, not an installed checkout's
    from bench._engine import CODE, CODE_VERSION, snapshot_at
    from bench._report import command_line, machine, now, spread, write_section

    settings = QUICK if args.quick else FULL
    started, begin = now(), time.perf_counter()
    load_before = os.getloadavg()[0]
    old_code, old_version = snapshot_at(args.baseline)
    sides = {"before": old_code, "after": CODE}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for repeat in range(settings.repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for name in order:
            print(f"... repeat {repeat + 1}: {name}", file=sys.stderr, flush=True)
            runs[name].append(run_child(sides[name], settings))
    seconds = time.perf_counter() - begin
    load_after = os.getloadavg()[0]

    sample = runs["after"][0]
    lines = [
        "| CPU per draw (ms) | before: median | spread | after: median | spread | before / after |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in ROWS:
        old = [run[key] for run in runs["before"]]
        new = [run[key] for run in runs["after"]]
        ratio = median(old) / max(median(new), 1e-9)
        lines.append(
            f"| {label} | {median(old):.2f} | {spread(old, '{:.2f}')} | {median(new):.2f} | "
            f"{spread(new, '{:.2f}')} | {ratio:,.0f}x |"
        )
    table = "\n".join(lines)
    report = f"""\
Command: `{command_line()}` ({started}, {seconds:.0f} s; load average {load_before:.1f} before,
{load_after:.1f} after).
Machine: {machine()}.
Code: before = {old_version} (`--baseline {args.baseline}`), after = {CODE_VERSION}.

A conversation of {sample["entries"]:,} entries and {sample["asides"]:,} asides, stdout a
terminal of 120 x 50; CPU time of the drawing thread, the cyclic collector paused. Each of
{settings.repeats} repeats runs both sides in fresh processes, interleaved; a process reports
its first draw and the median of {settings.changes} changes of each kind; below, the median
over repeats and the spread (min-max).

{table}

Before, every redraw rendered the whole conversation into lines and kept the last 48; after,
`Bottom` describes only the lines that fit, working back from the end, and `rich`'s `Live`
draws them on the alternate screen. What is left in a redraw after: rich's layout of the 50
lines (about 2 ms of it), describing the 48 lines shown, and, when the conversation moved, a
copy of the aside list compared by identity; when the asides changed, one pass over them to
group them again (the third row). Off a terminal nothing is drawn: `Watcher` still compares
the whole entry list to print what changed, by identity now instead of through two copies of
each entry.
"""
    print(report)
    if not args.quick and not args.no_write:
        path = write_section(SECTION, report)
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
