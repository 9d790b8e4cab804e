"""The PostgreSQL store's notices: telling other hubs that a log moved, and hearing them.

After a write commits (never inside its transaction) the store sends `NOTIFY` on its channel
(`convsync`, or `convsync:SCHEMA` with a schema) with a JSON payload
`{"conversation": ID, "lineage": L, "revision": R}`: the log's head after the write. Sends are
coalesced per conversation and lineage: while one batch is going out, later writes to a
conversation overwrite its pending notice, and the next batch carries only the latest. A
batch that fails is sent again after a pause (a notice too long for PostgreSQL is left out).
An append whose outcome is unknown (cancelled, or failed once COMMIT may have gone out) is
announced too: a notice is a hint, and a wrong one costs a read.

`async with store.watch() as notices:` opens a dedicated connection (not from the pool, and
not through a transaction-pooling proxy: LISTEN needs a session), returns once `LISTEN` is in
effect, and `async for notice in notices:` yields `Notice` values, coalesced per conversation
while the consumer is busy (per conversation and lineage: lineages have no order, so a late
notice of the old lineage never hides a rewrite's), so memory stays bounded by the number of
conversations moving. A watcher hears its own store's writes too. A notice is a hint, not the
record: read the log from the store by revision (`read` returning None means the lineage
changed: reload). If the listening connection drops, or stops answering (it is checked every
`_PING_EVERY` seconds), the iteration raises `StoreError` (`unavailable`) once and ends;
notices may have been missed, so re-read the heads you hold before watching again. When the
store closes, every watch ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Self

import asyncpg
import msgspec

from .base import StoreError
from .postgres_pool import DB_ERRORS, Conn, Connections

__all__ = ["Notice", "Notices", "Pending", "notify_all"]

_NOTIFY_BATCH = 500
_NOTIFY_MAX = 7999  # bytes: PostgreSQL refuses a longer NOTIFY payload
# How often a listening connection is checked (`SELECT 1`, within the command timeout): a
# path that died without a reset would otherwise leave a watch silent for good.
_PING_EVERY = 10.0


class Notice(msgspec.Struct, frozen=True):
    """A log moved: its head after a write another store (or this one) committed.

    Attributes:
        conversation: the conversation id.
        lineage: the log's lineage after the write.
        revision: the log's revision after the write.
    """

    conversation: str
    lineage: int
    revision: int


_encode_notice = msgspec.json.Encoder().encode
_decode_notice = msgspec.json.Decoder(Notice).decode


Pending = dict[tuple[str, int], Notice]
"""Notices waiting to be sent or taken: one per conversation and lineage."""


def _keep_newest(pending: Pending, notice: Notice) -> None:
    """Coalesce `notice` into `pending`: one per conversation and lineage, never stepped back.

    Writes (and the notices of different hubs) can finish out of order, so within a lineage
    the higher revision wins. Lineages have no order, so a notice of another lineage is kept
    beside the one there: a late notice of the old lineage must not hide a rewrite's.
    """
    key = (notice.conversation, notice.lineage)
    queued = pending.get(key)
    if queued is None or queued.revision < notice.revision:
        pending[key] = notice


class _Watcher:
    """One `watch`: notices heard on its connection, coalesced until the consumer takes them."""

    def __init__(self) -> None:
        self.pending: Pending = {}
        self.wake = asyncio.Event()
        self.error: StoreError | None = None
        self.ended = False

    def heard(self, payload: str) -> None:
        try:
            notice = _decode_notice(payload)
        except msgspec.DecodeError:
            return  # not ours (someone else NOTIFYing on the channel): ignore
        _keep_newest(self.pending, notice)
        self.wake.set()

    def fail(self, error: StoreError) -> None:
        if not self.ended:
            self.error = error
        self.wake.set()

    def end(self) -> None:
        self.ended = True
        self.wake.set()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Notice:
        while True:
            if self.pending:
                # Oldest conversation first; a conversation heard again while waiting keeps
                # its place and shows only its latest head (per lineage).
                key = next(iter(self.pending))
                return self.pending.pop(key)
            if self.error is not None:
                error, self.error = self.error, None
                self.ended = True  # raised once; then the iteration is over
                raise error
            if self.ended:
                raise StopAsyncIteration
            self.wake.clear()
            await self.wake.wait()


async def notify_all(conn: Conn, channel: str, payloads: list[str]) -> None:
    """`NOTIFY` each payload on `channel`, in order, in one round trip."""
    await conn.execute(
        "SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload", channel, payloads
    )


class Notices:
    """A `PostgresStore`'s notices (see the module docs): `moved` after each write, `watch`
    for the notices of every store on the same tables, `listening` for any channel (the bus
    between hubs listens through it too). `close` ends every watch and listener.

    Attributes:
        channel: the `NOTIFY` channel of these tables (`convsync` or `convsync:SCHEMA`).
    """

    def __init__(self, pg: Connections, channel: str, notify: bool) -> None:
        self.pg = pg
        self.channel = channel
        self._notify = notify
        self._to_notify: Pending = {}
        self._notifier: asyncio.Task[None] | None = None
        self._watchers: set[_Watcher] = set()
        # Every listening connection (`watch`, the bus's `listen`) and how to end its
        # iteration: `close` ends them all and closes their connections.
        self._listeners: dict[
            asyncpg.Connection[asyncpg.Record], tuple[Callable[[], None], asyncio.Task[None]]
        ] = {}

    def moved(self, conversation_id: str, lineage: int, revision: int) -> None:
        """Queue a notice for a committed write; keeps only the newest per conversation."""
        if not self._notify:
            return
        _keep_newest(self._to_notify, Notice(conversation_id, lineage, revision))
        if self._notifier is None or self._notifier.done():
            self._notifier = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        # One task sends at a time; what is queued meanwhile goes in its next batch. A batch
        # that fails goes back in the queue (unless newer notices replaced its own) and is
        # tried again after a pause, until the store closes: a lost notice only delays other
        # hubs until their periodic re-read, but a hub without one waits for that re-read.
        failures = 0
        while self._to_notify and self.pg.pool is not None:
            batch = list(self._to_notify.values())[:_NOTIFY_BATCH]
            for notice in batch:
                del self._to_notify[notice.conversation, notice.lineage]
            payloads = [_encode_notice(notice).decode() for notice in batch]
            # A payload PostgreSQL would refuse (an id of kilobytes) must not sink the batch.
            payloads = [payload for payload in payloads if len(payload.encode()) <= _NOTIFY_MAX]
            try:
                async with self.pg.pooled(self.pg.pool) as conn:
                    await notify_all(conn, self.channel, payloads)
                failures = 0
            except DB_ERRORS:
                if self.pg.closed:
                    return
                for notice in batch:
                    _keep_newest(self._to_notify, notice)
                failures += 1
                await asyncio.sleep(min(5.0, 0.1 * 2 ** (failures - 1)))

    async def publish(self, channel: str, payloads: list[str]) -> None:
        """`NOTIFY` each payload on `channel` now, in order (the bus's messages).

        Raises:
            StoreError: the server cannot be reached or refused.
        """
        await self.pg.run(lambda conn: notify_all(conn, channel, payloads))

    def watch(self) -> contextlib.AbstractAsyncContextManager[AsyncIterator[Notice]]:
        """Listen for logs that move; see the module docs.

        Returns:
            An async context manager; entering it returns once `LISTEN` is in effect and gives
            an async iterator of `Notice`s that ends when the block or the store closes.

        Raises:
            StoreError: on enter, the server cannot be reached; while iterating, the
                listening connection was lost (reason `unavailable`).
        """
        return self._watch()

    @contextlib.asynccontextmanager
    async def _watch(self) -> AsyncIterator[AsyncIterator[Notice]]:
        watcher = _Watcher()
        async with self.listening(
            self.channel, watcher.heard, watcher.fail, watcher.end, "listening"
        ):
            self._watchers.add(watcher)
            try:
                yield watcher
            finally:
                self._watchers.discard(watcher)
                watcher.end()

    @contextlib.asynccontextmanager
    async def listening(
        self,
        channel: str,
        heard: Callable[[str], None],
        lost: Callable[[StoreError], None],
        ended: Callable[[], None],
        what: str,
    ) -> AsyncIterator[None]:
        """A connection of its own with `LISTEN` on `channel` in effect while inside:
        `heard(payload)` for each notice, `lost(error)` once if the connection drops or stops
        answering (checked every `_PING_EVERY` seconds; `what` names it in the error),
        `ended()` when the store closes; closed on the way out.

        Raises:
            StoreError: on enter, the server cannot be reached or refused.
            UsageError: the store closed meanwhile (`closed`).
        """
        self.pg.check_open()
        await self.pg.open()
        conn = await self.pg.connect_one()
        gone = False

        def notice(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            heard(str(payload))

        def lose(cause: BaseException) -> None:
            nonlocal gone
            if not gone:
                gone = True
                lost(self.pg.unavailable(cause))

        def closed(_conn: object) -> None:
            lose(ConnectionError(f"the {what} connection closed"))

        try:
            conn.add_termination_listener(closed)
            await conn.add_listener(channel, notice)
            self.pg.check_open()  # `close` ran meanwhile: it could not end this one
        except DB_ERRORS as exc:
            await self.pg.close_conn(conn)
            raise self.pg.translate(exc) from exc
        except BaseException:
            await self.pg.close_conn(conn)
            raise

        async def ping() -> None:
            while True:
                await asyncio.sleep(_PING_EVERY)
                try:
                    await conn.execute("SELECT 1", timeout=self.pg.command_timeout)
                except DB_ERRORS as exc:
                    lose(exc)
                    conn.terminate()
                    return

        pinging = asyncio.get_running_loop().create_task(ping())
        self._listeners[conn] = (ended, pinging)
        try:
            yield
        finally:
            pinging.cancel()
            self._listeners.pop(conn, None)
            conn.remove_termination_listener(closed)
            await self.pg.close_conn(conn)

    async def close(self) -> None:
        """Let the notices queued go out (within the command timeout), then end every watch
        and listener and close their connections."""
        if self._notifier is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._notifier, self.pg.command_timeout)
        for watcher in list(self._watchers):
            watcher.end()
        for conn, (ended, pinging) in list(self._listeners.items()):
            ended()
            pinging.cancel()  # a ping under way would hold the close for its timeout
            await self.pg.close_conn(conn)
