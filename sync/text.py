"""Text that grows by appends (a draft's parts), kept as chunks and joined when read."""

from __future__ import annotations

import unicodedata

__all__ = ["has_control", "joined"]

_CONTROL_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp"))


def has_control(text: str) -> bool:
    """Whether `text` holds a control, format, line or paragraph separator character (Unicode
    categories Cc, Cf, Zl, Zp: U+0085, U+2028, U+202E, ...), any of which can split or
    disguise a log line or a rendered name. Where the docs promise "no control characters",
    this is the check."""
    if text.isascii():
        return any(c < " " or c == "\x7f" for c in text)
    return any(unicodedata.category(c) in _CONTROL_CATEGORIES for c in text)


def joined(chunks_by_part: dict[str, list[str]], part: str) -> str:
    """The text of `part` so far: its chunks joined (and kept joined, so reading again is
    free); "" for a part with no text. Appends go to the end of the part's list."""
    chunks = chunks_by_part.get(part)
    if not chunks:
        return ""
    if len(chunks) > 1:
        chunks[:] = ["".join(chunks)]
    return chunks[0]
