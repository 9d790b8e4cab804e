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
import shlex
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "BENCHMARKS_MD",
    "INTRO",
    "command_line",
    "gc_paused",
    "machine",
    "median",
    "now",
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
