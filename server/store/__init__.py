"""Durable logs of change records for the hub: the `LogStore` interface and its backends.

`open_store` picks a backend from a `--db` value.
"""

from __future__ import annotations

from sync.errors import UsageError

from .base import ClientMark, Loaded, LogMoved, LogStore, SeqTaken, StoreError
from .memory import MemoryStore
from .sqlite import SqliteStore

__all__ = [
    "ClientMark",
    "Loaded",
    "LogMoved",
    "LogStore",
    "MemoryStore",
    "SeqTaken",
    "SqliteStore",
    "StoreError",
    "open_store",
]


def open_store(url_or_path: str) -> LogStore:
    """Make the store a `--db` value names; use it as `async with open_store(db) as store`.

    `:memory:` (or `memory://`) gives a `MemoryStore`; `sqlite://PATH` or a plain path gives a
    `SqliteStore` on that file (`sqlite:///var/lib/convsync.db` is the absolute path
    `/var/lib/convsync.db`).

    Raises:
        UsageError: an empty value or a URL scheme with no backend here.
    """
    if url_or_path in (":memory:", "memory://"):
        return MemoryStore()
    scheme, sep, rest = url_or_path.partition("://")
    if not sep:
        return SqliteStore(url_or_path)
    if scheme == "sqlite":
        return SqliteStore(rest)
    raise UsageError("bad_store", f"no store for {scheme!r} urls")
