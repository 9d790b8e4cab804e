"""Lineages: which saved log a conversation value continues."""

from __future__ import annotations

import os
from typing import Final

__all__ = ["Lineage"]


class Lineage:
    """Lineages are plain ints, kept JSON-safe (at most 2**53 - 1) for browser clients.

    `EMPTY` (0): begun here from nothing and never saved; it continues any empty log.
    `DETACHED` (2**53 - 1): read back from the serde form; it continues no log.
    `fresh()`: a random lineage strictly between the two, for a new or rewritten log.
    """

    EMPTY: Final = 0
    DETACHED: Final = 2**53 - 1

    @staticmethod
    def fresh() -> int:
        """A random lineage strictly between `EMPTY` and `DETACHED`."""
        while True:
            value = int.from_bytes(os.urandom(7), "big") & (2**53 - 1)
            if Lineage.EMPTY < value < Lineage.DETACHED:
                return value
