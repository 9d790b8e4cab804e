"""Reading what a full-screen terminal program wrote: the frames of `convsync tail`'s view."""

from __future__ import annotations

import re

__all__ = ["frames", "last_frame", "plain"]

# CSI sequences (cursor moves, colours, modes) and the two-byte escapes rich may send.
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]|\x1b[=>78]")
_HOME = "\x1b[H"  # rich's alternate-screen view starts every frame here


def plain(text: str) -> str:
    """`text` without escape sequences, carriage returns dropped."""
    return _ESCAPES.sub("", text).replace("\r", "")


def frames(output: str) -> list[list[str]]:
    """Every frame drawn on the alternate screen, each as its lines without escapes and
    without the padding to the terminal's width."""
    return [[line.rstrip() for line in plain(part).split("\n")] for part in output.split(_HOME)[1:]]


def last_frame(output: str) -> list[str]:
    """The latest frame (its lines, trailing blank lines dropped)."""
    drawn = frames(output)
    assert drawn, "no frame drawn"
    lines = drawn[-1]
    while lines and not lines[-1]:
        lines.pop()
    return lines
