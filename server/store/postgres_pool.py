"""The PostgreSQL store's connections: the pool, one connection of its own, and their errors.

`Connections` makes the pool on first use (after the schema is made, on a connection of its
own), runs each piece of work on a pooled connection (`run`), and turns database failures
into `StoreError`: `unavailable` (naming `host:port`, never the password) when the server
cannot be reached or stops answering, `storage` otherwise. Every statement and every wait for
a pooled connection is bounded by `command_timeout`. `PostgresStore`, its notices and the bus
between hubs all reach the database through one `Connections`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeAlias, TypeVar

import asyncpg

from .base import StoreError, closed_error
from .postgres_dsn import describe_dsn
from .postgres_schema import create_schema

__all__ = ["CLOSE_ERRORS", "DB_ERRORS", "UNAVAILABLE", "Conn", "Connections"]

T = TypeVar("T")

# Errors that mean "the server is not there (now)", as opposed to "the server refused this".
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.InterfaceError,
)
DB_ERRORS: tuple[type[BaseException], ...] = (asyncpg.PostgresError, *UNAVAILABLE)
CLOSE_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, *DB_ERRORS)

Conn: TypeAlias = (
    "asyncpg.Connection[asyncpg.Record] | asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"
)


class Connections:
    """The database of one `PostgresStore`: its pool, made on first use, and fresh
    connections for listening (see the module docs).

    Attributes:
        where: `host:port/database`, for messages (never the user or password).
        command_timeout: seconds a statement, or the wait for a pooled connection, may take.
        pool: the pool once made, else None (again None once `close` has closed it).
        idle: set while no `run` is under way.
        made: the `create_once` tables known to exist.
        closed: the store closed; every later call raises `UsageError` (`closed`).
    """

    def __init__(
        self,
        dsn: str,
        schema: str | None,
        min_size: int,
        max_size: int,
        connect_timeout: float,
        command_timeout: float,
    ) -> None:
        self._dsn = dsn
        self.where = describe_dsn(dsn)
        self._schema = schema
        self._min_size = min_size
        self._max_size = max_size
        self._connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self._settings = {"application_name": "convsync"}
        if schema is not None:
            self._settings["search_path"] = schema
        self.pool: asyncpg.Pool[asyncpg.Record] | None = None
        self.opening = asyncio.Lock()
        self.closed = False
        self._busy = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._giving_back: set[asyncio.Task[None]] = set()  # see `pooled`
        self.made: set[str] = set()

    def check_open(self) -> None:
        if self.closed:
            raise closed_error()

    def unavailable(self, exc: BaseException) -> StoreError:
        detail = str(exc) or type(exc).__name__
        error = StoreError(f"postgresql at {self.where} is unavailable: {detail}", "unavailable")
        error.__cause__ = exc
        return error

    def translate(self, exc: BaseException) -> StoreError:
        if isinstance(exc, UNAVAILABLE):
            return self.unavailable(exc)
        error = StoreError(f"postgresql at {self.where} failed: {exc}")
        error.__cause__ = exc
        return error

    def _bad_url(self) -> StoreError:
        # Never chained: asyncpg's error may quote the URL, password and all.
        return StoreError(f"postgresql at {self.where}: asyncpg cannot read the URL")

    async def _reach(self, connect: Callable[[], Awaitable[T]]) -> T:
        """What `connect` makes (a connection, a pool), its failures as `StoreError`."""
        try:
            return await connect()
        except DB_ERRORS as exc:
            raise self.translate(exc) from exc
        except ValueError:
            pass
        raise self._bad_url()  # outside the `except`: no context that quotes the URL

    async def connect_one(self) -> asyncpg.Connection[asyncpg.Record]:
        return await self._reach(
            lambda: asyncpg.connect(
                self._dsn,
                timeout=self._connect_timeout,
                command_timeout=self.command_timeout,
                server_settings=self._settings,
            )
        )

    @contextlib.asynccontextmanager
    async def pooled(self, pool: asyncpg.Pool[asyncpg.Record]) -> AsyncIterator[Conn]:
        """A connection of `pool` for the block (waited for within the command timeout), given
        back to the pool at its end.

        asyncpg's own `acquire()` block gives the connection back (a reset, bounded by the
        timeout) in a task of its own, shielded so a cancellation cannot strand it. Cancelled
        meanwhile (`close` gives up on a notifier stuck on a dead path), the block ends but that
        task goes on, and when the reset then times out nobody ever reads its `TimeoutError`:
        asyncio logs "Task exception was never retrieved" when the task is freed, from inside
        whatever runs then (docs/design.md, "The suite passes every time"). Here the giving back
        is a task of this store's: awaited when the block is not cancelled (a failure raises as
        before), else left to finish and its outcome read by `_gave_back`. A reset that fails
        has asyncpg cut the connection; the pool makes a new one, and the block's work was done.
        """
        conn = await pool.acquire(timeout=self.command_timeout)
        try:
            yield conn
        finally:
            giving_back = asyncio.ensure_future(pool.release(conn))
            self._giving_back.add(giving_back)  # held until done: the loop keeps weak references
            giving_back.add_done_callback(self._gave_back)
            await asyncio.shield(giving_back)

    def _gave_back(self, task: asyncio.Task[None]) -> None:
        """Forget a finished `pooled` release, its outcome read (see `pooled`)."""
        self._giving_back.discard(task)
        if not task.cancelled():
            task.exception()  # read: the caller, if still there, got it from the shield

    async def close_conn(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        """Close `conn` politely within the command timeout, else cut it."""
        try:
            await conn.close(timeout=self.command_timeout)
        except DB_ERRORS:  # timed out, or broken already
            conn.terminate()
        except BaseException:  # cancelled: still not left open
            conn.terminate()
            raise

    async def open(self) -> asyncpg.Pool[asyncpg.Record]:
        if self.pool is not None:
            return self.pool
        async with self.opening:
            if self.pool is not None:
                return self.pool
            self.check_open()
            conn = await self.connect_one()
            try:
                await self._create_schema(conn)
            finally:
                await self.close_conn(conn)
            pool = await self._reach(
                lambda: asyncpg.create_pool(
                    self._dsn,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    timeout=self._connect_timeout,
                    command_timeout=self.command_timeout,
                    server_settings=self._settings,
                )
            )
            self.pool = pool  # `close` waits for `opening`, then closes it
            return pool

    async def _create_schema(self, conn: Conn) -> None:
        try:
            await create_schema(conn, self._schema, self.where)
        except DB_ERRORS as exc:
            raise self.translate(exc) from exc

    async def run(self, work: Callable[[Conn], Awaitable[T]]) -> T:
        """Run `work` on a pooled connection, translating database failures to `StoreError`."""
        self.check_open()
        self._busy += 1
        self.idle.clear()
        try:
            pool = await self.open()
            try:
                async with self.pooled(pool) as conn:
                    try:
                        return await work(conn)
                    except asyncpg.InterfaceError:
                        # The connection's state is not known (an operation interrupted or
                        # still in progress on it): the pool must not hand it out again, or
                        # the next call meets "cannot switch to state 12; another operation
                        # is in progress" (issue 27). A terminated connection is replaced.
                        # A timeout or a cancel needs none of this: asyncpg cancels the
                        # statement on the server (cutting the socket instead would let a
                        # write waiting on a lock land after its caller was told it failed).
                        conn.terminate()
                        raise
            except DB_ERRORS as exc:
                raise self.translate(exc) from exc
        finally:
            self._busy -= 1
            if not self._busy:
                self.idle.set()

    async def close_pool(self) -> None:
        """Close the pool within the command timeout, else cut its connections."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), self.command_timeout)
        except CLOSE_ERRORS:
            # A server that does not answer: its connections are cut instead. Not raised:
            # the store is closed all the same, and every later `close` returns.
            pool.terminate()
        except BaseException:
            pool.terminate()
            raise
