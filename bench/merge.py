"""Benchmark of a merged edit (SPEC 16): what a rebase costs when two people edited one message.

Run from the repository root:

    .venv/bin/python bench/merge.py            # writes its section of docs/benchmarks.md
    .venv/bin/python bench/merge.py --quick    # fewer repeats; writes nothing

The workload: a conversation of 100 entries, one of them a 10,000-character user message in
the middle. Another replica changed a word near its start (that record is in the log); this
replica changed a word near its end, on the same base. Measured:

1. `sync.rebase.rebase` of the pending edit onto the log, with its base: the reread of the
   local value, the three-way merge of the message and the replay (bar: under 1 ms).
2. `sync.merge.merge_entry` of that message alone (informative).
3. The same rebase when both edits touch the same word: a `Conflict(edited)` (informative).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import (
    Results,
    Row,
    command_line,
    gc_paused,
    machine,
    median,
    now,
    spread,
    text,
    write_section,
)
from sync import Author, ChangeRecord, Conversation, Message
from sync.merge import merge_entry
from sync.rebase import rebase

SECTION = "Merged edits (`bench/merge.py`)"
ENTRIES = 100
MESSAGE_CHARS = 10_000
BAR_MS = 1.0


def workload(clash: bool) -> tuple[Conversation, Conversation, list[ChangeRecord]]:
    """The base, the log (another replica's edit applied) and this replica's pending edit."""
    maker = Conversation()
    maker.extend(
        [Message.user(text(i, MESSAGE_CHARS if i == ENTRIES // 2 else 300)) for i in range(ENTRIES)]
    )
    base = Conversation()
    for record in maker.take_unsaved():
        base.apply(record)
    at = ENTRIES // 2
    body = text(at, MESSAGE_CHARS)

    def edited(start: int, word: str) -> Conversation:
        replica = base.copy()
        changed = body[:start] + word + body[start + 5 :]
        replica.edit_each(
            Author.user(), lambda ref: Message.user(changed) if ref.index == at else None
        )
        return replica

    theirs = edited(1_000, "RED")
    onto = base.copy()
    for record in theirs.take_unsaved():
        onto.apply(record)
    mine = edited(1_001 if clash else 9_000, "SLEEPY")
    return base, onto, mine.take_unsaved()


def time_rebase(clash: bool, repeats: int) -> tuple[list[float], int]:
    """Milliseconds per rebase, one sample per repeat; and the conflicts of the last one."""
    base, onto, pending = workload(clash)
    samples: list[float] = []
    conflicts = 0
    for _ in range(repeats):
        local = base.copy()  # what the application holds: the base, its pending taken out
        with gc_paused():
            begin = time.perf_counter_ns()
            found = rebase(local, onto, pending, base)
            samples.append((time.perf_counter_ns() - begin) / 1e6)
        conflicts = len(found)
        assert local.unsaved() or found, "the rebase replayed nothing"
    return samples, conflicts


def time_merge_entry(repeats: int) -> list[float]:
    base, onto, pending = workload(False)
    at = ENTRIES // 2
    then, now_ = base.entry(at), onto.entry(at)
    mine = pending[0].change.entries[0]  # type: ignore[attr-defined]
    assert then is not None and now_ is not None
    samples = []
    for _ in range(repeats):
        with gc_paused():
            begin = time.perf_counter_ns()
            merged = merge_entry(then, now_, mine)
            samples.append((time.perf_counter_ns() - begin) / 1e6)
        assert merged is not None
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (writes nothing)")
    args = parser.parse_args(argv)
    repeats = 30 if args.quick else 300
    started = now()
    results = Results()
    merged, conflicts = time_rebase(False, repeats)
    assert conflicts == 0, "the merged edit conflicted"
    figure = median(merged)
    results.add(
        Row(
            f"rebase of a merged edit of a {MESSAGE_CHARS:,}-character message ({ENTRIES} entries)",
            f"{figure:.3f} ms",
            spread=spread(merged, "{:.3f}") + " ms",
            bar=f"< {BAR_MS:g} ms",
            passed=figure < BAR_MS,
        ),
        "merged rebase",
    )
    alone = time_merge_entry(repeats)
    results.add(
        Row(
            "merge_entry of that message alone",
            f"{median(alone):.3f} ms",
            spread=spread(alone, "{:.3f}") + " ms",
        )
    )
    clashed, conflicts = time_rebase(True, repeats)
    assert conflicts == 1, "the clashing edit did not conflict"
    results.add(
        Row(
            "rebase of a clashing edit of it (a Conflict(edited))",
            f"{median(clashed):.3f} ms",
            spread=spread(clashed, "{:.3f}") + " ms",
        )
    )
    print(results.table())
    if args.quick:
        print("\n(not written to docs/benchmarks.md)")
    else:
        verdict = "all bars PASS" if not results.failed else f"FAILED: {', '.join(results.failed)}"
        body = "\n".join(
            [
                f"Command: `{command_line()}` (from the repository root)  ",
                f"Date: {started}  ",
                f"Machine: {machine()}, shared with other jobs  ",
                f"Result: **{verdict}**",
                "",
                f"Median of {repeats} repeats (garbage collector paused in each), min-max "
                "spread beside it. Each rebase starts from a fresh copy of the base (not "
                "timed); the timing covers `rebase` whole: the reread of the local value from "
                "the log, the three-way merge of the message (diffs of 10,000 characters "
                "against each side, cut to the changed words by the common prefix and suffix) "
                "and the replay of the merged splice.",
                "",
                results.table(),
            ]
        )
        path = write_section(SECTION, body)
        print(f"\nwrote the {SECTION!r} section of {path}")
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
