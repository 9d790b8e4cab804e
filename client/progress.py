"""Progress of a long command (an import) on a terminal, or as plain lines anywhere else."""

from __future__ import annotations

import time
from typing import IO

import rich.console
import rich.progress
import rich.text

__all__ = ["Progress"]


class Progress:
    """A progress bar for a count of messages on `stream`.

    On a terminal it is `rich`'s bar (percent, count, rate, time left), redrawn in place and
    left complete on `close`. Anywhere else (`--progress` to a log or a pipe) it is a plain
    line, `import  38% 500/1300 messages 2,345/s`, at most once a second and once at the end,
    so a log gets lines rather than carriage returns.
    """

    def __init__(self, total: int, stream: IO[str], label: str = "import") -> None:
        self.total = total
        self.stream = stream
        self.label = label
        self.started = time.monotonic()
        self.done = 0
        self._printed: tuple[float, int] | None = None  # when, and at what count
        self._bar: rich.progress.Progress | None = None
        console = rich.console.Console(file=stream)
        if console.is_terminal and not console.is_dumb_terminal:
            self._bar = rich.progress.Progress(
                rich.progress.TextColumn(label),
                rich.progress.BarColumn(),
                rich.progress.TaskProgressColumn(),
                rich.progress.MofNCompleteColumn(),
                rich.progress.TextColumn("messages"),
                _Rate(),
                rich.progress.TimeRemainingColumn(),
                console=console,
            )
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()

    def line(self) -> str:
        """The plain line for the count so far."""
        fraction = self.done / self.total if self.total else 1.0
        rate = self.done / max(time.monotonic() - self.started, 1e-6)
        return f"{self.label} {fraction:4.0%} {self.done}/{self.total} messages {rate:,.0f}/s"

    def update(self, done: int) -> None:
        self.done = done
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
            return
        now = time.monotonic()
        if self._printed is None or now - self._printed[0] >= 1.0 or done >= self.total:
            self._print(now)

    def _print(self, now: float) -> None:
        self.stream.write(self.line() + "\n")
        self.stream.flush()
        self._printed = (now, self.done)

    def close(self) -> None:
        """Stop the bar (left drawn complete), or print the last count if not printed yet."""
        if self._bar is not None:
            self._bar.stop()
        elif self._printed is None or self._printed[1] != self.done:
            self._print(time.monotonic())


class _Rate(rich.progress.ProgressColumn):
    """Messages per second, once rich has an estimate."""

    def render(self, task: rich.progress.Task) -> rich.text.Text:
        speed = task.speed
        return rich.text.Text("" if speed is None else f"{speed:,.0f}/s")
