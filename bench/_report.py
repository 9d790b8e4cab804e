"""Shared helpers for the benchmarks: timing, the machine line, and `docs/benchmarks.md`.

Each benchmark owns one `## ...` section of `docs/benchmarks.md`. `write_section` replaces that
section when it is there (up to the next `## ` heading) and appends it otherwise, leaving the
intro and every other section as they are.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import platform
import random
import shlex
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "BENCHMARKS_MD",
    "INTRO",
    "command_line",
    "gc_paused",
    "machine",
    "median",
    "no_worse_row",
    "now",
    "publish",
    "ratio_row",
    "spread",
    "write_section",
]

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = ROOT / "docs" / "benchmarks.md"

INTRO = """\
# Benchmarks

Each section below is written by the script it names, from one full run of that script; rerun
the command shown to refresh it. How the figures are produced:

- The machine is a small shared box (2 cores, other jobs running), so absolute times are
  noisy. Every timing is repeated several times and the **median** is reported (the spread,
  min-max over the repeats, is shown next to it).
- Every bar that compares two figures (a ratio) compares figures measured **in the same run**,
  with their repeats interleaved, so drift on the machine hits both sides alike.
- Timing loops run with the garbage collector paused (after a `gc.collect()`), so a cyclic
  collection of unrelated objects is not billed to the operation measured; each script says
  where it does this.
- Old vs new code in one run: `bench/hub.py fanout --baseline REV` (and `latency`) also starts
  hubs running the packages as committed at git revision REV, and interleaves their runs with
  the current code's, so a change to the hub is judged against its predecessor on the same
  machine at the same moment.
"""


def now() -> str:
    """The current time, UTC, to the minute."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    """One line: cores, CPU, OS and Python version."""
    return (
        f"{os.cpu_count()} cores (nproc), {_cpu_model()}, {platform.system()} "
        f"{platform.machine()}, Python {platform.python_version()} "
        f"({platform.python_implementation()})"
    )


def command_line() -> str:
    """The command this process was started with, with the interpreter relative to the cwd."""
    python = sys.executable
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(python)
        if not relative.startswith(".."):
            python = relative
    return shlex.join([python, *sys.argv])


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Collect, then keep the cyclic garbage collector off for the block."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float], fmt: str = "{:.3g}") -> str:
    """`min-max` of the repeats, formatted."""
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}"


def write_section(heading: str, body: str, path: Path = BENCHMARKS_MD) -> Path:
    """Put `## {heading}` with `body` in `path`, replacing the section of that heading.

    `heading` is the text after `## `. The file is created with `INTRO` when missing.
    """
    title = f"## {heading}"
    section = f"{title}\n\n{body.strip()}\n"
    text = path.read_text(encoding="utf-8") if path.exists() else INTRO
    lines = text.splitlines(keepends=True)
    start = next((at for at, line in enumerate(lines) if line.rstrip() == title), None)
    if start is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        stop = next(
            (at for at in range(start + 1, len(lines)) if lines[at].startswith("## ")),
            len(lines),
        )
        before = "".join(lines[:start]).rstrip("\n")
        after = "".join(lines[stop:])
        text = (before + "\n\n" if before else "") + section + ("\n" + after if after else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def publish(
    section: str, doc: str, table: str, started: str, seconds: float, *, write: bool
) -> None:
    """Print a run's section (command, date, machine, the script docstring's description:
    what follows its title, usage line and commands, then `table`) and, when `write`, put it
    in `docs/benchmarks.md` under `section`."""
    body = (
        f"Command: `{command_line()}` (from the repository root)  \n"
        f"Date: {started}; the run took {seconds:.0f} s  \n"
        f"Machine: {machine()}, shared with other jobs  \n\n"
        + doc.split("\n\n", 3)[3].strip()
        + "\n\n"
        + table
    )
    print(body)
    if write:
        print(f"wrote {write_section(section, body)}")


# ------------------------------------------------------------------- shared by the benchmarks

WORDS = (
    "the agent read the file and found that the parser drops the last token when a line "
    "ends without a newline so it wrote a test that feeds such a line and then fixed the "
    "loop bound in the tokenizer before running the whole suite again to be sure nothing "
    "else depended on the old behaviour of the function that everyone calls read_all"
).split()


def text(i: int, length: int = 300) -> str:
    """A distinct string of exactly `length` characters (words of a small vocabulary), its own
    object: nothing is shared between messages."""
    rng = random.Random(i)
    words = [f"#{i}"]
    size = len(words[0])
    while size < length:
        word = rng.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:length]


@dataclass
class Row:
    """One line of a results table: a figure, and the bar it is held to (if any)."""

    name: str
    figure: str
    spread: str = ""
    bar: str = ""
    passed: bool | None = None

    @property
    def result(self) -> str:
        return "" if self.passed is None else ("PASS" if self.passed else "FAIL")


@dataclass
class Results:
    """The rows of one benchmark section, with the measurements whose bar failed."""

    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def add(self, row: Row, measurement: str = "") -> None:
        self.rows.append(row)
        if row.passed is False:
            self.failed.append(measurement or row.name)

    def table(self) -> str:
        header = ["Measurement", "Figure (median)", "Spread (min-max)", "Bar", "Result"]
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for row in self.rows:
            cells = [row.name, row.figure, row.spread, row.bar, row.result]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def no_worse_row(
    name: str, new: Sequence[float], old: Sequence[float], *, higher_is_better: bool
) -> Row:
    """Issue 7's bar for one figure: new / old, FAIL when new was worse in every repeat."""
    ratio = median(new) / median(old)
    pairs = [n / o for n, o in zip(new, old, strict=True)]
    if higher_is_better:
        worse, always_worse = ratio < 1, all(p < 1 for p in pairs)
    else:
        worse, always_worse = ratio > 1, all(p > 1 for p in pairs)
    figure = f"{ratio:.3f}"
    if always_worse:
        figure += " (worse in every repeat)"
    elif worse:
        figure += " (within noise)"
    return Row(
        name,
        figure,
        spread=spread(pairs, "{:.3f}"),
        bar=f"no worse: {'>=' if higher_is_better else '<='} 1 in some repeat (issue 7)",
        passed=not always_worse,
    )


def ratio_row(
    name: str, new: Sequence[float], base: Sequence[float], limit: float, bar: str
) -> Row:
    """new / base (ratio of the medians; spread: the per-repeat ratios) against `limit`."""
    ratio = median(new) / median(base)
    pairs = [n / b for n, b in zip(new, base, strict=True)]
    return Row(name, f"{ratio:.3f}", spread(pairs, "{:.3f}"), bar, ratio <= limit)
