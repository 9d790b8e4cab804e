"""Durable logs of change records for the hub: the `LogStore` interface and its backends.

`open_store` picks a backend from a `--db` value. `PostgresStore` needs the optional
`asyncpg` package (`pip install 'convsync[postgres]'`); it is imported only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from sync.errors import UsageError

from .base import (
    ClientMark,
    Lease,
    LeaseChange,
    Loaded,
    LogMoved,
    LogStore,
    SeqTaken,
    StoreError,
)
from .memory import MemoryStore
from .sqlite import SqliteStore

if TYPE_CHECKING:
    from .postgres import PostgresStore

__all__ = [
    "ClientMark",
    "Lease",
    "LeaseChange",
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
    that server (nothing connects until the store is entered or first used); a `schema=NAME`
    query parameter keeps its tables in that schema (`PostgresStore(schema=...)`).

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
        dsn, schema = _split_schema(url_or_path)
        return _postgres_store()(dsn, schema=schema)
    raise UsageError("bad_store", f"no store for {scheme!r} urls")


def _split_schema(url: str) -> tuple[str, str | None]:
    """`url` without its `schema=` query parameter (ours, not the driver's), and its value."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == "schema"]
    if not schemas:
        return url, None
    rest = urlencode([(key, value) for key, value in query if key != "schema"])
    return urlunsplit(parts._replace(query=rest)), schemas[-1]
