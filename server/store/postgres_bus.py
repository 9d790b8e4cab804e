"""The bus of drafts and presence between hubs (SPEC 9, `server/bus.py`) on the store's own
PostgreSQL database, when no Redis is configured.

Messages are `NOTIFY`s on a channel of their own (the store's channel plus `:bus`), heard on
a listening connection of the store's `Notices`; heartbeats are rows of `convsync_hubs`, an
UNLOGGED table (heartbeats need no crash safety) made on first use, outside the versioned
schema: it holds nothing that outlives the hubs. Importing this needs no asyncpg: a hub
without PostgreSQL never makes one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from .base import StoreError
from .postgres_schema import HUBS_TABLE, create_once

if TYPE_CHECKING:
    from .postgres import PostgresStore
    from .postgres_pool import Conn

__all__ = ["NOTIFY_LIMIT", "PostgresBus"]

NOTIFY_LIMIT = 7900
"""Bytes per `NOTIFY` payload (PostgreSQL refuses 8000 and more)."""


class PostgresBus:
    """`NOTIFY` on the store's own database, heartbeats in a table of it (a `server.bus.Bus`).

    Attributes:
        channel: the bus's `NOTIFY` channel (the store's channel plus `:bus`).
    """

    limit = NOTIFY_LIMIT

    def __init__(self, store: PostgresStore) -> None:
        self._notices = store.notices
        self._pg = store.notices.pg
        self.channel = f"{store.channel}:bus"

    async def publish(self, payloads: list[bytes]) -> None:
        """`NOTIFY` each payload (each under 8000 bytes) on `channel`, in order.

        Raises:
            StoreError: the server cannot be reached or refused.
        """
        await self._notices.publish(self.channel, [payload.decode() for payload in payloads])

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[AsyncIterator[str]]:
        """Listen on `channel`: entering returns once `LISTEN` is in effect and gives an
        async iterator of payloads that raises `StoreError` when the connection is lost."""
        queue: asyncio.Queue[str | StoreError | None] = asyncio.Queue()

        async def payloads() -> AsyncIterator[str]:
            while True:
                item = await queue.get()
                if item is None:  # the store closed
                    return
                if isinstance(item, StoreError):
                    raise item
                yield item

        async with self._notices.listening(
            self.channel,
            queue.put_nowait,
            queue.put_nowait,
            functools.partial(queue.put_nowait, None),
            "bus",
        ):
            yield payloads()

    async def beat(self, hub: str, ttl: float) -> set[str]:
        """Record that hub `hub` lives for `ttl` more seconds (the database's clock); returns
        every hub whose heartbeat has not expired.

        Raises:
            StoreError: the server cannot be reached or refused.
        """

        async def work(conn: Conn) -> set[str]:
            await create_once(conn, self._pg.made, HUBS_TABLE)
            await conn.execute(
                "INSERT INTO convsync_hubs (hub, expires)"
                " VALUES ($1, now() + make_interval(secs => $2))"
                " ON CONFLICT (hub) DO UPDATE SET expires = EXCLUDED.expires",
                hub,
                ttl,
            )
            await conn.execute(
                "DELETE FROM convsync_hubs WHERE expires < now() - interval '1 hour'"
            )
            rows = await conn.fetch("SELECT hub FROM convsync_hubs WHERE expires > now()")
            return {row["hub"] for row in rows}

        return await self._pg.run(work)

    async def forget(self, hub: str) -> None:
        """Hub `hub` stops: remove its heartbeat, so others need not wait for it to expire."""

        async def work(conn: Conn) -> None:
            await conn.execute("DELETE FROM convsync_hubs WHERE hub = $1", hub)

        await self._pg.run(work)

    async def aclose(self) -> None:
        return None
