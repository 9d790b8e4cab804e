"""Text that grows by appends (a draft's parts), kept as chunks and joined when read."""

from __future__ import annotations

__all__ = ["joined"]


def joined(chunks_by_part: dict[str, list[str]], part: str) -> str:
    """The text of `part` so far: its chunks joined (and kept joined, so reading again is
    free); "" for a part with no text. Appends go to the end of the part's list."""
    chunks = chunks_by_part.get(part)
    if not chunks:
        return ""
    if len(chunks) > 1:
        chunks[:] = ["".join(chunks)]
    return chunks[0]
