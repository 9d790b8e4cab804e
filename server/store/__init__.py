"""Durable logs of change records for the hub: the `LogStore` interface and its backends.

`open_store` picks a backend from a `--db` value. `PostgresStore` needs the optional
`asyncpg` package (`pip install 'convsync[postgres]'`); it is imported only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sync.errors import UsageError

from .base import ClientMark, Loaded, LogMoved, LogStore, SeqTaken, StoreError
from .memory import MemoryStore
from .sqlite import SqliteStore

if TYPE_CHECKING:
    from .postgres import PostgresStore

__all__ = [
    "ClientMark",
    "Loaded",
    "LogMoved",
    "LogStore",
    "MemoryStore",
    "PostgresStore",
    "SeqTaken",
    "SqliteStore",
    "StoreError",
    "open_store",
]


def __getattr__(name: str) -> object:
    if name == "PostgresStore":
        return _postgres_store()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _postgres_store() -> type[PostgresStore]:
    try:
        from .postgres import PostgresStore
    except ModuleNotFoundError as exc:
        if exc.name != "asyncpg":
            raise
        raise UsageError(
            "bad_store", "postgresql needs asyncpg: pip install 'convsync[postgres]'"
        ) from exc
    return PostgresStore


def open_store(url_or_path: str) -> LogStore:
    """Make the store a `--db` value names; use it as `async with open_store(db) as store`.

    `:memory:` (or `memory://`) gives a `MemoryStore`; `sqlite://PATH` or a plain path gives a
    `SqliteStore` on that file (`sqlite:///var/lib/convsync.db` is the absolute path
    `/var/lib/convsync.db`); `postgresql://...` or `postgres://...` gives a `PostgresStore` on
    that server (nothing connects until the store is entered or first used).

    Raises:
        UsageError: an empty value, a URL scheme with no backend here, or a PostgreSQL URL
            without asyncpg installed.
    """
    if url_or_path in (":memory:", "memory://"):
        return MemoryStore()
    scheme, sep, rest = url_or_path.partition("://")
    if not sep:
        return SqliteStore(url_or_path)
    if scheme == "sqlite":
        return SqliteStore(rest)
    if scheme in ("postgresql", "postgres"):
        return _postgres_store()(url_or_path)
    raise UsageError("bad_store", f"no store for {scheme!r} urls")
