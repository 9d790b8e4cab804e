"""`PostgresStore`: the `LogStore` that several hubs share (asyncpg, one PostgreSQL database).

How this works
--------------
- **Schema** (version 1, recorded in `convsync_meta`), created on first use inside one
  transaction under an advisory lock, so hubs starting together do not race:
  `conversations(id, lineage, revision)` is each log's *head row*;
  `records(conversation_id, revision, data)` keyed by both, so a tail is one index range;
  `snapshots(conversation_id, lineage, revision, data)`, the latest one per conversation;
  `clients(conversation_id, client, seq, ack_from, ack_revision)`. Ids use `COLLATE "C"`
  (code point order, the same as Python and SQLite). A database whose `convsync_meta` names a
  newer version is refused with `StoreError` (reason `schema`); nothing is changed.
- **Compare-and-append is decided by the head row**, in one statement (one round trip): the
  schema's `convsync_append` function upserts the client's mark only when its seq is new (else
  it raises `CV001`, read back as `SeqTaken`), then runs
  `UPDATE conversations SET revision = new WHERE id = .. AND lineage = .. AND revision = ..`.
  Two hubs racing at the same position both reach that row; PostgreSQL makes the second wait
  for the first to commit and then re-checks its `WHERE` against the new row, which no longer
  matches: it updates nothing and gets `LogMoved`. A log's first append inserts the head row
  with `ON CONFLICT DO NOTHING`, which decides a race to create it the same way. A refusal
  raises `CV002` (`LogMoved`, with the head's position), so the statement, and with it
  everything it wrote, rolls back. Otherwise the records go in with the head row.
- **Every other write is compare-and-set too.** `rewrite` locks the head row
  (`SELECT .. FOR UPDATE`) and checks `base`; `write_snapshot` writes only while the head is
  still at its lineage and never replaces a newer snapshot.
- **Reads** run in a read-only `REPEATABLE READ` transaction (`load`) or as one statement
  (`read`), so each sees one committed state.
- **Connections** come from an asyncpg pool made on first use (`min_size`..`max_size`). A
  server that cannot be reached gives `StoreError` with reason `unavailable`, naming
  `host:port` (never the password). Any other database failure is `StoreError` (`storage`)
  with the cause chained. The URL is checked when the store is made: one asyncpg would
  misread (a password holding `/`, `#`, `?` or `@` not percent-encoded, a port that is not a
  number, a `key=value` string) is refused with `UsageError` (`bad_dsn`), never repeated.
- **Nothing waits for good.** Each statement, and each wait for a pooled connection, gets
  `command_timeout` seconds (a lock another session never lets go, a network path that died
  without a reset), then fails with `StoreError` (`unavailable`); so do the steps of `close`,
  which then cuts the connections.

Hearing that another hub moved a log
------------------------------------
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

Cancelling a caller mid-write rolls the transaction back unless COMMIT was already sent; after
a `StoreError` the write may or may not have landed: reload to find out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Self, TypeAlias, TypeVar
from urllib.parse import SplitResult, urlsplit

import asyncpg
import msgspec

from sync.errors import UsageError

from .base import (
    NO_LINEAGE,
    TOMBSTONE,
    ClientMark,
    Counted,
    Deleted,
    Lease,
    LeaseChange,
    Loaded,
    LogMoved,
    SeqTaken,
    StoreError,
    check_append_args,
    check_base,
    check_delete_args,
    check_list_args,
    check_mark,
    check_new_lineage,
    check_read_args,
    check_records,
    check_rewrite,
    merge_lease,
    prefix_range,
)

__all__ = ["SCHEMA_VERSION", "Notice", "PostgresStore"]

T = TypeVar("T")

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE convsync_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE conversations (
    id TEXT COLLATE "C" PRIMARY KEY,
    lineage BIGINT NOT NULL,
    revision BIGINT NOT NULL
);
CREATE TABLE records (
    conversation_id TEXT COLLATE "C" NOT NULL,
    revision BIGINT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (conversation_id, revision)
);
CREATE TABLE snapshots (
    conversation_id TEXT COLLATE "C" PRIMARY KEY,
    lineage BIGINT NOT NULL,
    revision BIGINT NOT NULL,
    data BYTEA NOT NULL
);
CREATE TABLE clients (
    conversation_id TEXT COLLATE "C" NOT NULL,
    client TEXT NOT NULL,
    seq BIGINT NOT NULL,
    ack_from BIGINT NOT NULL,
    ack_revision BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, client)
);
CREATE FUNCTION convsync_append(
    p_id TEXT, p_lineage BIGINT, p_revision BIGINT, p_records BYTEA[],
    p_client TEXT, p_seq BIGINT, p_ack_from BIGINT, p_ack_revision BIGINT
) RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    new_revision BIGINT := p_revision + cardinality(p_records);
    held clients%ROWTYPE;
    head conversations%ROWTYPE;
BEGIN
    IF p_client IS NOT NULL THEN
        -- Checked first: a resend is answered with its ack even when the log moved since.
        INSERT INTO clients (conversation_id, client, seq, ack_from, ack_revision)
        VALUES (p_id, p_client, p_seq, p_ack_from, p_ack_revision)
        ON CONFLICT (conversation_id, client) DO UPDATE SET
            seq = excluded.seq, ack_from = excluded.ack_from, ack_revision = excluded.ack_revision
        WHERE excluded.seq > clients.seq;
        IF NOT FOUND THEN
            SELECT * INTO held FROM clients WHERE conversation_id = p_id AND client = p_client;
            RAISE EXCEPTION USING ERRCODE = 'CV001', MESSAGE = 'seq taken',
                DETAIL = held.seq || ' ' || held.ack_from || ' ' || held.ack_revision;
        END IF;
    END IF;
    -- The race is decided here: a second writer at this position waits for the first to
    -- commit, re-checks the WHERE against the committed row, and updates nothing.
    UPDATE conversations SET revision = new_revision
    WHERE id = p_id AND lineage = p_lineage AND revision = p_revision;
    IF NOT FOUND THEN
        IF p_revision = 0 THEN
            INSERT INTO conversations (id, lineage, revision)
            VALUES (p_id, p_lineage, new_revision) ON CONFLICT (id) DO NOTHING;
        END IF;
        IF p_revision <> 0 OR NOT FOUND THEN
            SELECT * INTO head FROM conversations WHERE id = p_id;
            RAISE EXCEPTION USING ERRCODE = 'CV002', MESSAGE = 'log moved',
                DETAIL = coalesce(head.lineage || ' ' || head.revision, 'none');
        END IF;
    END IF;
    INSERT INTO records (conversation_id, revision, data)
    SELECT p_id, p_revision + n, data FROM unnest(p_records) WITH ORDINALITY AS r(data, n);
    RETURN new_revision;
END
$$;
"""

# What `convsync_append` raises (the statement, and so everything it wrote, is rolled back).
_SEQ_TAKEN = "CV001"
_MOVED = "CV002"

# Any constant works; it only keeps two hubs from creating the schema at the same moment.
_SCHEMA_LOCK = 0x636F6E7673796E63  # "convsync"

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")

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

# Errors that mean "the server is not there (now)", as opposed to "the server refused this".
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.InterfaceError,
)
_DB_ERRORS: tuple[type[BaseException], ...] = (asyncpg.PostgresError, *_UNAVAILABLE)
_CLOSE_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, *_DB_ERRORS)

_Conn: TypeAlias = (
    "asyncpg.Connection[asyncpg.Record] | asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"
)


def describe_dsn(dsn: str) -> str:
    """`host:port/database` of a PostgreSQL URL, for messages (the first host of several);
    never the user or password, nor anything of a URL `check_dsn` would refuse."""
    parts = _split(dsn)
    if parts is None or _misquoted(dsn, parts) is not None:
        return "the configured server"
    first = parts.netloc.rpartition("@")[2].split(",")[0]
    host, port = _host_port(first)
    database = parts.path.lstrip("/")
    where = f"{host or 'localhost'}:{port or 5432}"
    return f"{where}/{database}" if database else where


def check_dsn(dsn: object) -> None:
    """Refuse what is not a `postgresql://` URL asyncpg reads as the user meant, without
    repeating it (it may hold a password).

    Raises:
        UsageError: `bad_dsn`, saying what is wrong.
    """
    if not isinstance(dsn, str):
        raise UsageError("bad_dsn", "the PostgreSQL URL must be a string")
    parts = _split(dsn)
    if parts is None:  # raised here, not in an `except`: the cause quotes the URL
        raise UsageError(
            "bad_dsn",
            "the PostgreSQL URL cannot be read (a password holding '/', '#', '?' or '@' must"
            " be percent-encoded)",
        )
    if parts.scheme not in ("postgresql", "postgres"):
        raise UsageError(
            "bad_dsn", "the PostgreSQL store takes a postgresql://user@host:port/database URL"
        )
    problem = _misquoted(dsn, parts)
    if problem is not None:
        raise UsageError("bad_dsn", problem)


_QUOTE_HINT = "a password holding '/', '#', '?' or '@' must be percent-encoded"


def _split(dsn: str) -> SplitResult | None:
    """`dsn` split, or None when it cannot be read (a port that is not a number, of any of
    its hosts: `host1:5432,host2:5433` names several)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return None
    for host in parts.netloc.rpartition("@")[2].split(","):
        _, port = _host_port(host)
        if port is not None and not port.isdigit():
            return None
    return parts


def _host_port(host: str) -> tuple[str, str | None]:
    """`host[:port]` (an IPv6 host in brackets) split."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else None
    name, colon, port = host.partition(":")
    return name, port if colon else None


def _misquoted(dsn: str, parts: SplitResult) -> str | None:
    """Why a URL's password looks cut by a character that should have been encoded: asyncpg
    splits at the first `@` where `urlsplit` takes the last, and `/`, `?` and `#` end the
    host part early, leaving the rest of the password in the path or the fragment."""
    if "@" in parts.netloc.rpartition("@")[0]:
        return f"the PostgreSQL URL holds '@' twice before its host: {_QUOTE_HINT}"
    if "@" in parts.path or "@" in parts.fragment:
        return f"the PostgreSQL URL has a '@' after its host part: {_QUOTE_HINT}"
    return None


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


class PostgresStore(Counted):
    """A `LogStore` in one PostgreSQL database, safe to share between any number of hubs.

    Args:
        dsn: a `postgresql://user[:password]@host[:port]/database` URL.
        schema: keep the tables in this schema (made when missing; lower-case letters, digits
            and `_`, at most 40) instead of the connection's default (`public`). Hubs that
            share a schema share the logs and the notification channel.
        min_size: connections the pool keeps open.
        max_size: connections the pool opens at most (concurrent writes beyond it wait).
        connect_timeout: seconds to wait for the server before `StoreError` (`unavailable`).
        command_timeout: seconds any one statement, or the wait for a pooled connection, may
            take before `StoreError` (`unavailable`): a lock another session never lets go,
            or a network path that died without a reset, fails the call instead of hanging
            it; also the bound on each step of `close`.
        notify: send `NOTIFY` after each write (see the module docs); off when no hub watches.

    Attributes:
        channel: the `NOTIFY` channel of these tables (`convsync` or `convsync:SCHEMA`).

    Raises:
        UsageError: a bad URL (`bad_dsn`, without repeating it), schema name or pool size,
            or a timeout that is not a positive number.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        command_timeout: float = 30.0,
        notify: bool = True,
    ) -> None:
        check_dsn(dsn)
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("command_timeout", command_timeout),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise UsageError("bad_timeout", f"{name} must be a number of seconds, more than 0")
        if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
            raise UsageError("bad_schema", f"schema name {schema!r} is not allowed")
        if not 0 <= min_size <= max_size or max_size < 1:
            raise UsageError("bad_pool", f"pool size {min_size}..{max_size} is not allowed")
        self._dsn = dsn
        self._where = describe_dsn(dsn)
        self._schema = schema
        self._min_size = min_size
        self._max_size = max_size
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._notify = notify
        self.channel = "convsync" if schema is None else f"convsync:{schema}"
        self._settings = {"application_name": "convsync"}
        if schema is not None:
            self._settings["search_path"] = schema
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self._closing: asyncio.Task[None] | None = None
        self._commits = 0
        self._appends = 0
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._to_notify: Pending = {}
        self._notifier: asyncio.Task[None] | None = None
        self._giving_back: set[asyncio.Task[None]] = set()  # see `_pooled`
        self._watchers: set[_Watcher] = set()
        # Every listening connection (`watch`, `bus_listen`) and how to end its iteration:
        # `close` ends them all and closes their connections.
        self._listeners: dict[
            asyncpg.Connection[asyncpg.Record], tuple[Callable[[], None], asyncio.Task[None]]
        ] = {}
        self._hubs_table = False  # `convsync_hubs` is known to exist (see `beat`)
        self._leases_table = False  # `convsync_leases` is known to exist (see `_leases`)

    # Connections and errors.

    def _unavailable(self, exc: BaseException) -> StoreError:
        detail = str(exc) or type(exc).__name__
        error = StoreError(f"postgresql at {self._where} is unavailable: {detail}", "unavailable")
        error.__cause__ = exc
        return error

    def _translate(self, exc: BaseException) -> StoreError:
        if isinstance(exc, _UNAVAILABLE):
            return self._unavailable(exc)
        error = StoreError(f"postgresql at {self._where} failed: {exc}")
        error.__cause__ = exc
        return error

    def _bad_url(self) -> StoreError:
        # Never chained: asyncpg's error may quote the URL, password and all.
        return StoreError(f"postgresql at {self._where}: asyncpg cannot read the URL")

    async def _connect_one(self) -> asyncpg.Connection[asyncpg.Record]:
        try:
            return await asyncpg.connect(
                self._dsn,
                timeout=self._connect_timeout,
                command_timeout=self._command_timeout,
                server_settings=self._settings,
            )
        except _DB_ERRORS as exc:
            raise self._translate(exc) from exc
        except ValueError:
            pass
        raise self._bad_url()  # outside the `except`: no context that quotes the URL

    @contextlib.asynccontextmanager
    async def _pooled(self, pool: asyncpg.Pool[asyncpg.Record]) -> AsyncIterator[_Conn]:
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
        conn = await pool.acquire(timeout=self._command_timeout)
        try:
            yield conn
        finally:
            giving_back = asyncio.ensure_future(pool.release(conn))
            self._giving_back.add(giving_back)  # held until done: the loop keeps weak references
            giving_back.add_done_callback(self._gave_back)
            await asyncio.shield(giving_back)

    def _gave_back(self, task: asyncio.Task[None]) -> None:
        """Forget a finished `_pooled` release, its outcome read (see `_pooled`)."""
        self._giving_back.discard(task)
        if not task.cancelled():
            task.exception()  # read: the caller, if still there, got it from the shield

    async def _close_conn(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        """Close `conn` politely within the command timeout, else cut it."""
        try:
            await conn.close(timeout=self._command_timeout)
        except _DB_ERRORS:  # timed out, or broken already
            conn.terminate()
        except BaseException:  # cancelled: still not left open
            conn.terminate()
            raise

    async def _open(self) -> asyncpg.Pool[asyncpg.Record]:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is not None:
                return self._pool
            self._check_open()
            conn = await self._connect_one()
            try:
                await self._create_schema(conn)
            finally:
                await self._close_conn(conn)
            try:
                pool = await asyncpg.create_pool(
                    self._dsn,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    timeout=self._connect_timeout,
                    command_timeout=self._command_timeout,
                    server_settings=self._settings,
                )
            except _DB_ERRORS as exc:
                raise self._translate(exc) from exc
            except ValueError:
                pool = None
            if pool is None:
                raise self._bad_url()  # outside the `except`: no context that quotes the URL
            self._pool = pool  # `close` waits for `_opening`, then closes it
            return pool

    async def _create_schema(self, conn: _Conn) -> None:
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
                if self._schema is not None:
                    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"')
                exists = await conn.fetchval("SELECT to_regclass('convsync_meta') IS NOT NULL")
                if not exists:
                    await conn.execute(_SCHEMA)
                    await conn.execute(
                        "INSERT INTO convsync_meta (key, value) VALUES ('schema_version', $1)",
                        str(SCHEMA_VERSION),
                    )
                    return
                found = await conn.fetchval(
                    "SELECT value FROM convsync_meta WHERE key = 'schema_version'"
                )
        except _DB_ERRORS as exc:
            raise self._translate(exc) from exc
        version = int(found) if found is not None and str(found).isdigit() else None
        if version != SCHEMA_VERSION:
            newer = version is not None and version > SCHEMA_VERSION
            raise StoreError(
                f"postgresql at {self._where} holds convsync schema version {found}; this code"
                f" knows version {SCHEMA_VERSION}" + (": upgrade convsync" if newer else ""),
                "schema",
            )

    async def _run(self, work: Callable[[_Conn], Awaitable[T]]) -> T:
        """Run `work` on a pooled connection, translating database failures to `StoreError`."""
        self._check_open()
        self._busy += 1
        self._idle.clear()
        try:
            pool = await self._open()
            try:
                async with self._pooled(pool) as conn:
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
            except _DB_ERRORS as exc:
                raise self._translate(exc) from exc
        finally:
            self._busy -= 1
            if not self._busy:
                self._idle.set()

    # Notifications.

    def _moved(self, conversation_id: str, lineage: int, revision: int) -> None:
        """Queue a notice for a committed write; keeps only the newest per conversation."""
        if not self._notify:
            return
        _keep_newest(self._to_notify, Notice(conversation_id, lineage, revision))
        if self._notifier is None or self._notifier.done():
            self._notifier = asyncio.get_running_loop().create_task(self._send_notices())

    async def _send_notices(self) -> None:
        # One task sends at a time; what is queued meanwhile goes in its next batch. A batch
        # that fails goes back in the queue (unless newer notices replaced its own) and is
        # tried again after a pause, until the store closes: a lost notice only delays other
        # hubs until their periodic re-read, but a hub without one waits for that re-read.
        failures = 0
        while self._to_notify and self._pool is not None:
            batch = list(self._to_notify.values())[:_NOTIFY_BATCH]
            for notice in batch:
                del self._to_notify[notice.conversation, notice.lineage]
            payloads = [_encode_notice(notice).decode() for notice in batch]
            # A payload PostgreSQL would refuse (an id of kilobytes) must not sink the batch.
            payloads = [payload for payload in payloads if len(payload.encode()) <= _NOTIFY_MAX]
            try:
                async with self._pooled(self._pool) as conn:
                    await conn.execute(
                        "SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload",
                        self.channel,
                        payloads,
                    )
                failures = 0
            except _DB_ERRORS:
                if self._closed:
                    return
                for notice in batch:
                    _keep_newest(self._to_notify, notice)
                failures += 1
                await asyncio.sleep(min(5.0, 0.1 * 2 ** (failures - 1)))

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
        async with self._listening(
            self.channel, watcher.heard, watcher.fail, watcher.end, "listening"
        ):
            self._watchers.add(watcher)
            try:
                yield watcher
            finally:
                self._watchers.discard(watcher)
                watcher.end()

    @contextlib.asynccontextmanager
    async def _listening(
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
        self._check_open()
        await self._open()
        conn = await self._connect_one()
        gone = False

        def notice(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            heard(str(payload))

        def lose(cause: BaseException) -> None:
            nonlocal gone
            if not gone:
                gone = True
                lost(self._unavailable(cause))

        def closed(_conn: object) -> None:
            lose(ConnectionError(f"the {what} connection closed"))

        try:
            conn.add_termination_listener(closed)
            await conn.add_listener(channel, notice)
            self._check_open()  # `close` ran meanwhile: it could not end this one
        except _DB_ERRORS as exc:
            await self._close_conn(conn)
            raise self._translate(exc) from exc
        except BaseException:
            await self._close_conn(conn)
            raise

        async def ping() -> None:
            while True:
                await asyncio.sleep(_PING_EVERY)
                try:
                    await conn.execute("SELECT 1", timeout=self._command_timeout)
                except _DB_ERRORS as exc:
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
            await self._close_conn(conn)

    # The bus of drafts and presence between hubs (SPEC 9, `server/bus.py`), when no Redis
    # is configured: NOTIFY on a channel of its own, and a heartbeat table. The table is
    # UNLOGGED (heartbeats need no crash safety) and made on first use, outside the versioned
    # schema: it holds nothing that outlives the hubs.

    @property
    def bus_channel(self) -> str:
        """The `NOTIFY` channel of the drafts-and-presence bus of these tables."""
        return f"{self.channel}:bus"

    async def bus_send(self, payloads: list[str]) -> None:
        """`NOTIFY` each payload (each under 8000 bytes) on `bus_channel`, in order.

        Raises:
            StoreError: the server cannot be reached or refused.
        """
        channel = self.bus_channel

        async def work(conn: _Conn) -> None:
            await conn.execute(
                "SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload",
                channel,
                payloads,
            )

        await self._run(work)

    @contextlib.asynccontextmanager
    async def bus_listen(self) -> AsyncIterator[AsyncIterator[str]]:
        """Listen on `bus_channel`: entering returns once `LISTEN` is in effect and gives an
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

        async with self._listening(
            self.bus_channel,
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

        async def work(conn: _Conn) -> set[str]:
            if not self._hubs_table:
                async with conn.transaction():  # two hubs creating it at once would clash
                    await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
                    await conn.execute(
                        "CREATE UNLOGGED TABLE IF NOT EXISTS convsync_hubs"
                        " (hub text PRIMARY KEY, expires timestamptz NOT NULL)"
                    )
                self._hubs_table = True
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

        return await self._run(work)

    async def forget_hub(self, hub: str) -> None:
        """Hub `hub` stops: remove its heartbeat, so others need not wait for it to expire."""

        async def work(conn: _Conn) -> None:
            await conn.execute("DELETE FROM convsync_hubs WHERE hub = $1", hub)

        await self._run(work)

    # Turn leases (SPEC 10): rows beside the log, one per open turn, hints only. The table
    # is made on first use, like `convsync_hubs`, so a schema of any version gains it.

    async def _leases(self, conn: _Conn) -> None:
        if not self._leases_table:
            async with conn.transaction():  # two hubs creating it at once would clash
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS convsync_leases (conversation_id text NOT NULL"
                    ' COLLATE "C", turn bigint NOT NULL, owner text NOT NULL,'
                    " expires bigint, stop_expires bigint, PRIMARY KEY (conversation_id, turn))"
                )
            self._leases_table = True

    async def put_lease(self, lease: Lease, *, replace: bool = True) -> None:
        """See `LogStore.put_lease`: the row is locked while it is merged."""

        async def work(conn: _Conn) -> None:
            await self._leases(conn)
            async with conn.transaction():
                await _put_lease_in(conn, lease, replace)

        await self._run(work)

    async def drop_lease(self, conversation_id: str, turn: int) -> None:
        """See `LogStore.drop_lease`."""

        async def work(conn: _Conn) -> None:
            await self._leases(conn)
            await conn.execute(
                "DELETE FROM convsync_leases WHERE conversation_id = $1 AND turn = $2",
                conversation_id,
                turn,
            )

        await self._run(work)

    async def leases_due(self, now: int, limit: int = 100) -> list[Lease]:
        """See `LogStore.leases_due`."""
        check_list_args(limit)

        async def work(conn: _Conn) -> list[Lease]:
            await self._leases(conn)
            rows = await conn.fetch(
                "SELECT conversation_id, turn, owner, expires, stop_expires FROM convsync_leases"
                " WHERE expires <= $1 OR stop_expires <= $1"
                " ORDER BY LEAST(expires, stop_expires) LIMIT $2",
                now,
                limit,
            )
            return [Lease(*row) for row in rows]

        return await self._run(work)

    # The `LogStore` methods.

    async def load(self, conversation_id: str) -> Loaded | None:
        """See `LogStore.load`."""

        async def work(conn: _Conn) -> Loaded | None:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                head = await conn.fetchrow(
                    "SELECT lineage, revision FROM conversations WHERE id = $1", conversation_id
                )
                if head is None:
                    return None
                lineage, revision = head["lineage"], head["revision"]
                if lineage == TOMBSTONE:
                    raise Deleted(conversation_id, revision)
                snapshot: bytes | None = None
                snapshot_revision = 0
                row = await conn.fetchrow(
                    "SELECT revision, data FROM snapshots"
                    " WHERE conversation_id = $1 AND lineage = $2",
                    conversation_id,
                    lineage,
                )
                if row is not None:
                    snapshot_revision, snapshot = row["revision"], row["data"]
                records = [
                    r["data"]
                    for r in await conn.fetch(
                        "SELECT data FROM records WHERE conversation_id = $1 AND revision > $2"
                        " ORDER BY revision",
                        conversation_id,
                        snapshot_revision,
                    )
                ]
                clients = {
                    r["client"]: ClientMark(r["seq"], r["ack_from"], r["ack_revision"])
                    for r in await conn.fetch(
                        "SELECT client, seq, ack_from, ack_revision FROM clients"
                        " WHERE conversation_id = $1",
                        conversation_id,
                    )
                }
            if len(records) != revision - snapshot_revision:
                raise StoreError(
                    f"{conversation_id!r} holds {len(records)} records after revision"
                    f" {snapshot_revision}, expected {revision - snapshot_revision}"
                )
            return Loaded(
                lineage=lineage,
                revision=revision,
                snapshot=snapshot,
                snapshot_revision=snapshot_revision,
                records=records,
                clients=clients,
            )

        return await self._run(work)

    async def append(
        self,
        conversation_id: str,
        lineage: int,
        revision: int,
        records: Sequence[bytes],
        client: str | None = None,
        mark: ClientMark | None = None,
        *,
        lease: LeaseChange | None = None,
    ) -> int:
        """See `LogStore.append`. With `lease`, the append and its lease writes run in one
        transaction (the lease's row locked while it is merged)."""
        self._check_open()
        frozen = list(check_append_args(lineage, revision, records, client, mark))

        async def work(conn: _Conn) -> int:
            if lease is None:
                return await compare_and_append(conn)
            await self._leases(conn)
            async with conn.transaction():
                result = await compare_and_append(conn)
                await _change_lease_in(conn, conversation_id, lease)
            return result

        async def compare_and_append(conn: _Conn) -> int:
            # One statement, one round trip: the function runs the whole compare-and-append
            # and raises (rolling all of it back) when the seq is taken or the log moved.
            try:
                result: int = await conn.fetchval(
                    "SELECT convsync_append($1, $2, $3, $4, $5, $6, $7, $8)",
                    conversation_id,
                    lineage,
                    revision,
                    frozen,
                    client,
                    None if mark is None else mark.seq,
                    None if mark is None else mark.ack_from,
                    None if mark is None else mark.ack_revision,
                )
            except asyncpg.PostgresError as exc:
                # The function only says where things are; the same checks as every other
                # store turn that into the error.
                if exc.sqlstate == _SEQ_TAKEN and client is not None and mark is not None:
                    seq, ack_from, ack_revision = map(int, str(exc.detail).split())
                    check_mark(
                        conversation_id, client, ClientMark(seq, ack_from, ack_revision), mark
                    )
                if exc.sqlstate == _MOVED:
                    head = str(exc.detail)
                    current = None if head == "none" else _pair(head)
                    check_base(conversation_id, current, lineage, revision)
                    # Only a log created by a racing write at exactly our position gets here:
                    # it was not there when we looked, so the log moved all the same.
                    raise LogMoved(conversation_id, *(current or (NO_LINEAGE, 0))) from None
                raise
            return result

        try:
            result = await self._run(work)
        except (LogMoved, SeqTaken, UsageError, Deleted):
            self._appends += 1
            raise
        except BaseException:
            # Cancelled, or failed after COMMIT may have gone out: the append may have landed,
            # so tell the other hubs to look (a notice is a hint; a wrong one costs a read).
            self._moved(conversation_id, lineage, revision + len(frozen))
            raise
        self._appends += 1
        self._commits += 1
        self._moved(conversation_id, lineage, result)
        return result

    async def read(
        self, conversation_id: str, lineage: int, from_revision: int, limit: int | None = None
    ) -> list[bytes] | None:
        """See `LogStore.read`."""
        self._check_open()
        check_read_args(from_revision, limit)

        async def work(conn: _Conn) -> list[bytes] | None:
            # One statement: the head and the records come from one snapshot of the database.
            rows = await conn.fetch(
                "SELECT c.lineage, c.revision AS head, r.revision, r.data"
                " FROM conversations c LEFT JOIN LATERAL ("
                "  SELECT revision, data FROM records"
                "  WHERE conversation_id = c.id AND revision > $2 ORDER BY revision LIMIT $3"
                " ) r ON true WHERE c.id = $1",
                conversation_id,
                from_revision,
                limit,
            )
            if not rows:
                return None
            head = rows[0]
            if head["lineage"] != lineage or from_revision > head["head"]:
                return None
            found = [(r["revision"], r["data"]) for r in rows if r["revision"] is not None]
            if from_revision < head["head"] and limit != 0:
                if not found or found[0][0] != from_revision + 1:
                    return None  # the first record asked for is no longer held
            return [data for _, data in found]

        return await self._run(work)

    async def write_snapshot(
        self, conversation_id: str, lineage: int, revision: int, state: bytes
    ) -> None:
        """See `LogStore.write_snapshot`."""
        self._check_open()
        check_records([state])

        async def work(conn: _Conn) -> bool:
            async with conn.transaction():
                # FOR SHARE: a rewrite cannot slip in between the check and the write.
                head = await conn.fetchrow(
                    "SELECT lineage, revision FROM conversations WHERE id = $1 FOR SHARE",
                    conversation_id,
                )
                if head is None or head["lineage"] != lineage:
                    return False
                if not 0 <= revision <= head["revision"]:
                    raise UsageError(
                        "bad_revision",
                        f"no revision {revision} in a log of {head['revision']} records",
                    )
                written = await conn.fetchval(
                    "INSERT INTO snapshots (conversation_id, lineage, revision, data)"
                    " VALUES ($1, $2, $3, $4) ON CONFLICT (conversation_id) DO UPDATE SET"
                    " lineage = excluded.lineage, revision = excluded.revision,"
                    " data = excluded.data WHERE snapshots.lineage <> excluded.lineage"
                    " OR snapshots.revision < excluded.revision RETURNING 1",
                    conversation_id,
                    lineage,
                    revision,
                    state,
                )
            return written is not None

        if await self._run(work):
            self._commits += 1

    async def rewrite(
        self,
        conversation_id: str,
        lineage: int,
        records: Sequence[bytes],
        *,
        base: tuple[int, int] | None = None,
    ) -> None:
        """See `LogStore.rewrite`."""
        self._check_open()
        frozen = list(check_records(records))
        check_new_lineage(lineage)

        async def work(conn: _Conn) -> None:
            async with conn.transaction():
                current = await _position_in(conn, conversation_id, lock=True)
                check_rewrite(conversation_id, current, lineage, base)
                if current is None:
                    created = await conn.fetchval(
                        "INSERT INTO conversations (id, lineage, revision) VALUES ($1, $2, $3)"
                        " ON CONFLICT (id) DO NOTHING RETURNING 1",
                        conversation_id,
                        lineage,
                        len(frozen),
                    )
                    if created is None:  # another hub created the log meanwhile: check again
                        current = await _position_in(conn, conversation_id, lock=True)
                        check_rewrite(conversation_id, current, lineage, base)
                if current is not None:
                    await conn.execute(
                        "UPDATE conversations SET lineage = $2, revision = $3 WHERE id = $1",
                        conversation_id,
                        lineage,
                        len(frozen),
                    )
                await conn.execute(
                    "DELETE FROM records WHERE conversation_id = $1", conversation_id
                )
                await conn.execute(
                    "DELETE FROM snapshots WHERE conversation_id = $1", conversation_id
                )
                await _insert_records(conn, conversation_id, 0, frozen)

        await self._run(work)
        self._commits += 1
        self._moved(conversation_id, lineage, len(frozen))

    async def list_conversations(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> list[str]:
        """See `LogStore.list_conversations`."""
        self._check_open()
        check_list_args(limit)
        low, high = prefix_range(prefix)

        async def work(conn: _Conn) -> list[str]:
            # A range over the primary key (COLLATE "C"), never LIKE; NULL bounds drop out.
            rows = await conn.fetch(
                "SELECT id FROM conversations WHERE id >= $1"
                " AND ($2::text IS NULL OR id < $2) AND ($3::text IS NULL OR id > $3)"
                " AND lineage <> $5 ORDER BY id LIMIT $4",
                low,
                high,
                after,
                limit,
                TOMBSTONE,
            )
            return [row["id"] for row in rows]

        return await self._run(work)

    async def client_mark(self, conversation_id: str, client: str) -> ClientMark | None:
        """See `LogStore.client_mark`."""

        async def work(conn: _Conn) -> ClientMark | None:
            # With the head row, in one statement: a hello on a deleted conversation is
            # refused by any hub at once, not only once its room has heard (SPEC 15).
            row = await conn.fetchrow(
                "SELECT c.lineage, c.revision, k.seq, k.ack_from, k.ack_revision"
                " FROM conversations c LEFT JOIN clients k"
                " ON k.conversation_id = c.id AND k.client = $2 WHERE c.id = $1",
                conversation_id,
                client,
            )
            if row is not None and row["lineage"] == TOMBSTONE:
                raise Deleted(conversation_id, row["revision"])
            if row is None or row["seq"] is None:
                return None
            return ClientMark(row["seq"], row["ack_from"], row["ack_revision"])

        return await self._run(work)

    # Deleting (SPEC 15): the head row becomes the tombstone (lineage `TOMBSTONE`, the time of
    # the delete in its revision column), so every compare-and-set on the id fails for good.

    async def delete(self, conversation_id: str, now: float) -> bool:
        """See `LogStore.delete`. The rows go at once; the space they held is PostgreSQL's
        (auto)vacuum's to reclaim, as for any deleted row."""
        self._check_open()
        check_delete_args(now)

        async def work(conn: _Conn) -> bool:
            await self._leases(conn)  # its turn leases go with it (the table may be new)
            async with conn.transaction():
                # Marks first, then the head row: the order an append takes its locks in
                # (`convsync_append` upserts the mark, then updates the head), so a delete
                # racing an append waits for it instead of deadlocking with it.
                await conn.execute(
                    "DELETE FROM clients WHERE conversation_id = $1", conversation_id
                )
                current = await _position_in(conn, conversation_id, lock=True)
                if current is None or current[0] == TOMBSTONE:
                    return False
                for table in ("records", "snapshots", "clients", "convsync_leases"):
                    await conn.execute(
                        f"DELETE FROM {table} WHERE conversation_id = $1", conversation_id
                    )
                await conn.execute(
                    "UPDATE conversations SET lineage = $2, revision = $3 WHERE id = $1",
                    conversation_id,
                    TOMBSTONE,
                    int(now),
                )
                return True

        deleted = await self._run(work)
        if deleted:
            self._commits += 1
            self._moved(conversation_id, TOMBSTONE, int(now))  # other hubs drop their rooms
        return deleted

    async def last_records(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> list[tuple[str, bytes | None]]:
        """See `LogStore.last_records`."""
        self._check_open()
        check_list_args(limit)
        low, high = prefix_range(prefix)

        async def work(conn: _Conn) -> list[tuple[str, bytes | None]]:
            rows = await conn.fetch(
                "SELECT c.id, r.data FROM conversations c LEFT JOIN records r"
                " ON r.conversation_id = c.id AND r.revision = c.revision WHERE c.id >= $1"
                " AND ($2::text IS NULL OR c.id < $2) AND ($3::text IS NULL OR c.id > $3)"
                " AND c.lineage <> $5 ORDER BY c.id LIMIT $4",
                low,
                high,
                after,
                limit,
                TOMBSTONE,
            )
            return [(row["id"], row["data"]) for row in rows]

        return await self._run(work)

    async def forget_deleted(self, before: float) -> int:
        """See `LogStore.forget_deleted`."""
        self._check_open()

        async def work(conn: _Conn) -> int:
            status = await conn.execute(
                "DELETE FROM conversations WHERE lineage = $1 AND revision < $2",
                TOMBSTONE,
                int(before),
            )
            return int(status.split()[-1])

        return await self._run(work)

    async def close(self) -> None:
        """Let writes already started finish, send their notices, end every watch and bus
        listener, close every connection. Idempotent: a second call returns when the first
        one's work is done. Cancelled, the work still goes on to the end; each step waits at
        most the command timeout (writes under way are bounded by it too), then connections
        are cut."""
        if self._closing is None:
            self._closed = True
            self._closing = asyncio.get_running_loop().create_task(self._shut_down())
        if not self._closing.done():  # (one finished on a loop since closed is not awaited)
            await asyncio.shield(self._closing)

    async def _shut_down(self) -> None:
        try:
            async with self._opening:
                pass  # an open under way finishes first; its pool is closed below
            await self._idle.wait()
            if self._notifier is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._notifier, self._command_timeout)
            for watcher in list(self._watchers):
                watcher.end()
            for conn, (ended, pinging) in list(self._listeners.items()):
                ended()
                pinging.cancel()  # a ping under way would hold the close for its timeout
                await self._close_conn(conn)
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                try:
                    await asyncio.wait_for(pool.close(), self._command_timeout)
                except _CLOSE_ERRORS:
                    # A server that does not answer: its connections are cut instead. Not
                    # raised: the store is closed all the same, and every later `close` returns.
                    pool.terminate()
                except BaseException:
                    pool.terminate()
                    raise

    async def __aenter__(self) -> Self:
        """Connect and make sure the schema is there.

        Raises:
            StoreError: the server cannot be reached (`unavailable`) or holds a schema this
                code cannot use (`schema`); the store is closed again.
        """
        self._check_open()
        try:
            await self._open()
            self._check_open()  # closed while it opened
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _pair(text: str) -> tuple[int, int]:
    first, second = text.split()
    return int(first), int(second)


async def _position_in(
    conn: _Conn, conversation_id: str, *, lock: bool = False
) -> tuple[int, int] | None:
    row = await conn.fetchrow(
        "SELECT lineage, revision FROM conversations WHERE id = $1"
        + (" FOR UPDATE" if lock else ""),
        conversation_id,
    )
    return None if row is None else (row["lineage"], row["revision"])


async def _mark_in(conn: _Conn, conversation_id: str, client: str) -> ClientMark | None:
    row = await conn.fetchrow(
        "SELECT seq, ack_from, ack_revision FROM clients WHERE conversation_id = $1"
        " AND client = $2",
        conversation_id,
        client,
    )
    return None if row is None else ClientMark(row["seq"], row["ack_from"], row["ack_revision"])


async def _insert_records(
    conn: _Conn, conversation_id: str, after: int, records: list[Any]
) -> None:
    if not records:
        return
    # One round trip for any number of records.
    await conn.execute(
        "INSERT INTO records (conversation_id, revision, data)"
        " SELECT $1, $2 + n, data FROM unnest($3::bytea[]) WITH ORDINALITY AS r(data, n)",
        conversation_id,
        after,
        records,
    )


async def _put_lease_in(conn: _Conn, lease: Lease, replace: bool) -> None:
    """Merge `lease` into the stored one (`merge_lease`), its row locked; in the caller's
    transaction."""
    row = await conn.fetchrow(
        "SELECT owner, expires, stop_expires FROM convsync_leases"
        " WHERE conversation_id = $1 AND turn = $2 FOR UPDATE",
        lease.conversation_id,
        lease.turn,
    )
    stored = None if row is None else Lease(lease.conversation_id, lease.turn, *row)
    kept = merge_lease(stored, lease, replace)
    if kept != stored:
        await conn.execute(
            "INSERT INTO convsync_leases (conversation_id, turn, owner, expires, stop_expires)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (conversation_id, turn)"
            " DO UPDATE SET owner = EXCLUDED.owner, expires = EXCLUDED.expires,"
            " stop_expires = EXCLUDED.stop_expires",
            kept.conversation_id,
            kept.turn,
            kept.owner,
            kept.expires,
            kept.stop_expires,
        )


async def _change_lease_in(conn: _Conn, conversation_id: str, change: LeaseChange) -> None:
    """Carry out `change` (an append's lease writes) in the caller's transaction."""
    if change.drop is not None:
        await conn.execute(
            "DELETE FROM convsync_leases WHERE conversation_id = $1 AND turn = $2",
            conversation_id,
            change.drop,
        )
    if change.put is not None:
        await _put_lease_in(conn, change.put, True)
