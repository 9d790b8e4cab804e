"""`Hub`: the websocket server that owns every conversation's log.

How this works: one `websockets` server on one port. Plain HTTP requests get `/healthz`,
`/metrics` and `GET /v1/conversations/{id}`; websocket upgrades on `/v1/conversations/{id}` get a
replica session. A connection reads frames one at a time: the pure `HubSession` decodes and
checks each (bad input: `error`, then close); a `hello` and every `push` go to the
conversation's `Room`, whose pure `RoomCore` holds every rule. Rooms load on first use and
unload when nobody has used them for `idle_unload` seconds. The server, the unloader and the
timer that wakes each room's core at its next deadline live in one anyio task group; each
connection's writer lives in a task group of that connection's handler, which ends with it. On
a store other hubs share (PostgreSQL), two more tasks keep loaded rooms up to the store: a
watcher on the store's notices and a periodic head check (see "other hubs" below).
unload when nobody has used them for `idle_unload` seconds. Every long-lived task (the server,
the unloader, each connection's writer) lives in one anyio task group.

Access control (SPEC 6): the session verifies tokens and keeps the per-socket deadlines and
rate limit, the core checks scopes; this shell only carries the handshake's `Authorization`
header to the session, sleeps until `session.next_deadline()`, counts sockets per address
and per principal (`limits.Caps`), and answers HTTP requests by the origin, host and token
rules. No token is ever logged: every refusal's detail is a fixed phrase, and the websockets
library's own logger (which logs headers and frames at DEBUG) is held at INFO.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import random
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import anyio
import msgspec
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.frames import Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State

from sync import Conversation
from sync.errors import ConvsyncError, ProtocolError, UsageError, sole_exception
from sync.ids import now_ms
from sync.protocol import (
    SUBPROTOCOL,
    Auth,
    DraftOp,
    Error,
    Hello,
    Ping,
    Pong,
    PushBatch,
    StatusUpdate,
    encode_message,
)

from .auth import ANONYMOUS, AuthError, Grant, KeyRing, bearer_token, verify
from .bus import Relay, open_bus
from .config import HubConfig
from .limits import Caps, host_allowed, is_loopback_bind, origin_allowed, own_origins
from .metrics import Metrics
from .room import Room, is_shared
from .session import Access, HubSession, Limits, conversation_id_of, is_conversation_id
from .store import LogStore, MemoryStore, StoreError
from .store.base import Deleted
from .subscriber import CLOSE_DEADLINE, Subscriber, cut_if_open
from .web import Web, is_summary_path, live_state

__all__ = ["Hub"]

log = logging.getLogger("convsync.hub")

MAX_QUEUE = 2
"""Messages websockets may read from a socket ahead of the hub (its `max_queue`; each up to
`max_size`, four times `max_frame`); past it, reading pauses until the hub takes one. Its
default, 16, let one socket make the hub hold 16 frames of 64 MiB while a room was busy."""
_PONG = encode_message(Pong())

RETAIN_PATH = "/v1/retain"
"""`GET` lists idle conversations (`?days=N`), `POST` deletes them (SPEC 15)."""

_IDLE_PAGE = 500
"""Conversations read per store call when looking for idle ones."""
_DELETE_CHUNK = 100
"""Deletes a retention sweep runs at once (SQLite commits those queued together in one
transaction, and rewrites its file once for them)."""


class _Stamp(msgspec.Struct):
    """The one field of a record retention reads (msgspec skips the rest unparsed)."""

    at: int | None = None


_decode_stamp = msgspec.json.Decoder(_Stamp).decode


def _not_allowed(connection: ServerConnection, allow: str) -> Response:
    response = connection.respond(405, f"method not allowed (allowed: {allow})\n")
    response.headers["Allow"] = allow
    return response


def _json_response(value: object) -> Response:
    body = json.dumps(value).encode()
    headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return Response(200, "OK", headers, body)


def _days(text: str) -> float | None:
    """`text` as a number of days, more than 0, or None."""
    try:
        days = float(text)
    except ValueError:
        return None
    return days if math.isfinite(days) and days > 0 else None


def _stamped_at(record: bytes | None) -> int | None:
    """When `record` was stamped (ms since the epoch), or None when it cannot say."""
    if record is None:
        return None
    try:
        return _decode_stamp(record).at
    except msgspec.DecodeError:
        return None


_DATA_OPCODES = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)
_SINGLE_HEADERS = ("Host", "Origin", "Authorization", "Upgrade")
"""Headers the hub reads that a request must not repeat (HTTP 400)."""
_ws_log = logging.getLogger("convsync.hub.websockets")
# websockets logs request headers and frames at DEBUG: they hold tokens. Never below INFO.
_ws_log.setLevel(logging.INFO)


class Hub:
    """The hub: serves replicas and the read-only HTTP surface on one port.

    Use as `async with Hub(store=..., host="127.0.0.1", port=0) as hub:`; the port is bound when
    the block starts (`hub.port`, `hub.url`). Leaving the block stops accepting connections,
    lets appends under way finish, closes every socket (1001), and closes the store if the hub
    opened it.

    Args:
        store: the log store; a `MemoryStore` when omitted.
        host: the address to bind.
        port: the port to bind; 0 picks a free one.
        config: every other setting (`HubConfig`).
        keys: the keys tokens are checked with; None serves without auth, which is refused
            on a non-loopback `host` unless `config.insecure`. Assign `hub.keys` to rotate.

    Raises:
        UsageError: a non-loopback bind without keys and without `insecure`, or TLS files
            that cannot be loaded.
    """

    def __init__(
        self,
        store: LogStore | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        config: HubConfig | None = None,
        keys: KeyRing | None = None,
    ) -> None:
        self.config = config or HubConfig()
        if keys is None and not is_loopback_bind(host) and not self.config.insecure:
            raise UsageError(
                "insecure_bind",
                f"refusing to serve {host} without auth: anyone who reaches it could read and "
                "rewrite every conversation; give an auth key (--auth-secret-file or "
                "--auth-public-key), bind 127.0.0.1, or pass --insecure",
            )
        self.keys = keys
        self._ssl = _ssl_context(self.config)
        self._own_origins: set[str] = set()
        self._public_host = (
            urlsplit(self.config.public_url).hostname if self.config.public_url else None
        )
        self._waiting = Caps(self.config.max_waiting_per_address)
        self._principals = Caps(self.config.max_per_principal)
        self._limits = Limits(
            hello_timeout=self.config.hello_timeout,
            first_frame=self.config.max_hello_frame,
            rate=self.config.rate,
            burst=self.config.rate_burst,
            flood_after=self.config.flood_after,
            expiry_grace=self.config.expiry_grace,
        )
        self.metrics = Metrics()
        self._store: LogStore = store if store is not None else MemoryStore()
        self._host = host
        self._port = port
        self._rooms: dict[str, Room] = {}
        self._loading: dict[str, asyncio.Task[Room]] = {}
        self._ticking: set[Room] = set()  # rooms with a tick under way
        self._awaiting: dict[str, int] = {}  # callers waiting for a room's load, by id
        self._server: Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._closing = False
        self._group: anyio.abc.TaskGroup | None = None
        self._following: dict[Room, bool] = {}  # room -> check again once this one ends
        self._deadline_moved = asyncio.Event()  # a room's next deadline may be sooner
        # What the room timer sleeps until (ms); 0 while it looks at the rooms, when every
        # deadline a room reports must make it look again; None: no deadline at all.
        self._tick_target: int | None = 0
        self._web = Web(self)
        self._relay: Relay | None = None  # the bus to other hubs, on a shared store

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        """The port bound."""
        assert self._server is not None, "the hub is not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        """`ws://host:port` (`wss://` with TLS), the base replicas connect to."""
        host = self._host if ":" not in self._host else f"[{self._host}]"
        scheme = "wss" if self._ssl is not None else "ws"
        return f"{scheme}://{host}:{self.port}"

    @property
    def auth(self) -> bool:
        """Whether this hub checks tokens."""
        return self.keys is not None

    def hold_principal(self, sub: str) -> bool:
        """Count one more socket of `sub` against `max_per_principal` (a summary feed); False
        when it holds that many already."""
        return self._principals.acquire(sub)

    def let_go_principal(self, sub: str) -> None:
        """A socket counted by `hold_principal` closed."""
        self._principals.release(sub)

    def _access(self) -> Access | None:
        keys = self.keys
        return None if keys is None else Access(keys, self.config.audience)

    @property
    def store(self) -> LogStore:
        return self._store

    async def __aenter__(self) -> Self:
        # The hub's tasks live in a task group inside one task of their own, so the hub can
        # be left from any task (a test fixture's teardown runs in another one).
        ready = asyncio.Event()
        self._task = asyncio.create_task(self._main(ready))
        waiter = asyncio.create_task(ready.wait())
        try:
            await asyncio.wait([self._task, waiter], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled while starting (Ctrl-C): stop what was started
            waiter.cancel()
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._task)
            raise
        waiter.cancel()
        if self._task.done():
            error = self._task.exception()
            if error is not None:
                raise sole_exception(error)  # what stopped it: a port in use, a bad store
        return self

    async def _main(self, ready: asyncio.Event) -> None:
        # The port is bound before the store is opened (and connections accepted only once it
        # is), so a hub that cannot serve (a port in use) leaves no store file behind. The
        # store is still closed last, after the server and the task group.
        async with contextlib.AsyncExitStack() as opened:
            async with (
                anyio.create_task_group() as group,
                serve(
                    self._connection,
                    self._host,
                    self._port,
                    subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                    process_request=self._http,
                    max_size=4 * self.config.max_frame,
                    # Messages websockets reads ahead of the hub (each up to `max_size`): the
                    # hub reads a socket's frames one by one, so a few are enough.
                    max_queue=MAX_QUEUE,
                    compression="deflate" if self.config.compression == "deflate" else None,
                    ping_interval=self.config.ping_interval,
                    create_connection=_Connection.with_first_frame(self.config.max_hello_frame),
                    ssl=self._ssl,
                    logger=_ws_log,
                    start_serving=False,
                ) as server,
            ):
                await opened.enter_async_context(self._store)
                await self._serve_until_stopped(server, group, ready)

    async def _serve_until_stopped(
        self, server: Server, group: anyio.abc.TaskGroup, ready: asyncio.Event
    ) -> None:
        """Start the hub's tasks on an open store, accept connections, serve until stopped."""
        self._server = server
        self._own_origins = own_origins(
            self.config.public_url, self.port, tls=self._ssl is not None
        )
        self._group = group
        group.start_soon(self._unload_idle)
        if is_shared(self._store):
            group.start_soon(self._watch_store)
            group.start_soon(self._check_heads)
            self._relay = Relay(open_bus(self.config, self._store), self.config, self._rooms)
            await group.start(self._relay.run)  # drafts and presence of other hubs
        group.start_soon(self._tick_rooms)
        if self.config.retain_days is not None or self.config.keep_tombstones_days is not None:
            group.start_soon(self._retain_forever)
        await server.start_serving()  # the store is open: take connections now
        ready.set()
        await self._stop.wait()
        await self._shutdown(server)
        group.cancel_scope.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop accepting, finish appends under way, close every socket, close the store."""
        self._stop.set()
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _shutdown(self, server: Server) -> None:
        # New handshakes get 503 from here on (`_http`). `server.close` acts only on its first
        # call, so it comes once, after the rooms: it closes every other socket too (a summary
        # feed, one before its hello, one whose room is still loading) with 1001. A socket
        # that does not close in time (a peer that stopped reading) is cut.
        self._closing = True
        for room in list(self._rooms.values()):
            await room.shut_down()  # an append under way finishes first
        server.close(close_connections=True, reason="shutting down")
        with anyio.move_on_after(CLOSE_DEADLINE):
            await server.wait_closed()
        for connection in list(server.all_connections):
            cut_if_open(connection)
        with anyio.move_on_after(CLOSE_DEADLINE):
            await server.wait_closed()

    async def serve_forever(self) -> None:
        """Serve until cancelled."""
        await anyio.sleep_forever()

    # ------------------------------------------------------------------ rooms

    async def _acquire(self, conversation_id: str) -> Room:
        room = self._rooms.get(conversation_id)
        if room is None:
            loading = self._loading.get(conversation_id)
            if loading is None:
                # A task of the hub's, not the caller's: a caller cancelled meanwhile (an HTTP
                # read past its handshake timeout) must not cancel the load for the others.
                loading = asyncio.get_running_loop().create_task(self._load(conversation_id))
                loading.add_done_callback(_retrieved)
                self._loading[conversation_id] = loading
            # Counted while it waits: the load wakes its callers one by one, and a read of a
            # conversation with no log must not unload the room before the others took it.
            self._awaiting[conversation_id] = self._awaiting.get(conversation_id, 0) + 1
            try:
                room = await asyncio.shield(loading)
            finally:
                left = self._awaiting.pop(conversation_id) - 1
                if left:
                    self._awaiting[conversation_id] = left
        room.users += 1
        return room

    async def _load(self, conversation_id: str) -> Room:
        try:
            room = Room(
                conversation_id,
                self._store,
                self.config,
                self.metrics,
                self._room_deadline,
                auth=self.auth,
            )
            await room.load()
            room.on_gone = self._room_gone
            if self._relay is not None:
                self._relay.attach(room)  # other hubs' drafts, before anyone joins
            self._rooms[conversation_id] = room
            self.metrics.conversations_loaded = len(self._rooms)
            return room
        finally:
            del self._loading[conversation_id]

    def _release(self, room: Room) -> None:
        room.users -= 1
        if room.users == 0:
            room.idle_since = time.monotonic()

    async def _unload_idle(self) -> None:
        period = max(0.05, min(self.config.idle_unload / 2, 5.0))
        while True:
            await anyio.sleep(period)
            now = time.monotonic()
            for conversation_id, room in list(self._rooms.items()):
                if now - room.idle_since >= self.config.idle_unload and self._may_unload(room):
                    del self._rooms[conversation_id]
            self.metrics.conversations_loaded = len(self._rooms)

    def _may_unload(self, room: Room) -> bool:
        """Whether nobody holds `room`, is about to (a caller still waiting for its load), or
        needs it now (an operation under way, open drafts, kept until they end)."""
        return (
            room.users == 0
            and not self._awaiting.get(room.id)
            and not room.lock.locked()
            and not room.core.drafts.drafts
        )

    def _room_deadline(self, deadline: int | None) -> None:
        """A room's next deadline after an operation: wake the room timer only when it is
        sooner than what the timer sleeps until (most pushes have none: no task switch)."""
        target = self._tick_target
        if deadline is not None and (target is None or deadline < target):
            self._deadline_moved.set()

    async def _tick_rooms(self) -> None:
        """Sleep until the soonest room deadline (draft coalescing and expiry, presence
        diffs), start a tick of each room that is due, repeat; a room whose deadline may
        have moved, or whose tick ended, wakes this early.

        Each tick is a task of its own: the timer never waits for a room. (It skipped a room
        whose lock was taken, but a lock just released to a waiting operation reads as free,
        and the timer then waited behind that operation's store call, and every other room's
        drafts and presence with it.)"""
        moved = self._deadline_moved
        while True:
            moved.clear()
            self._tick_target = 0
            soonest: int | None = None
            for room in list(self._rooms.values()):
                if room in self._ticking or room.lock.locked():
                    continue  # busy: the end of its tick or operation wakes us
                deadline = room.next_deadline()
                if deadline is not None and deadline <= now_ms():
                    assert self._group is not None
                    self._ticking.add(room)
                    self._group.start_soon(self._tick, room)
                    continue
                if deadline is not None:
                    soonest = deadline if soonest is None else min(soonest, deadline)
            self._tick_target = soonest
            if soonest is None:
                await moved.wait()
                continue
            with anyio.move_on_after(max(soonest - now_ms(), 0) / 1000):
                await moved.wait()

    async def _tick(self, room: Room) -> None:
        shown = live_state(room)
        try:
            await room.tick()
        except Exception:  # a bug of ours: log it; the timer keeps serving the others
            log.exception("tick of %s failed", room.id)
            return  # retried when the timer next wakes, not at once (no busy loop)
        finally:
            self._ticking.discard(room)
        if live_state(room) != shown:
            self._web.touched(room)  # it ended a draft or changed a status: a row shows them
        self._deadline_moved.set()  # its next deadline, in the timer's next pass

    async def rewrite(self, conversation_id: str, conversation: Conversation) -> None:
        """Rewrite the log of `conversation_id` under a fresh lineage, holding `conversation`
        (an import that replaces history, a compaction). Replicas are sent the new state,
        reread it, and replay their pending edits on it.

        Raises:
            LogMoved: another hub sharing the store appended since this hub last saw the log;
                nothing was rewritten (this hub's replicas now have those records).
        """
        room = await self._acquire(conversation_id)
        try:
            await room.rewrite(conversation)
            self._web.touched(room)
            if room.core.gone:
                raise Deleted(conversation_id, time.time())
        finally:
            self._release(room)

    async def log_moved(self, conversation_id: str) -> None:
        """Another hub sharing the store appended to `conversation_id`: bring this hub's room
        (when loaded) and its subscribers up to the store. Correctness never depends on this
        call: a push on a stale room finds the log moved and does the same."""
        room = self._rooms.get(conversation_id)
        if room is not None:
            await room.log_moved()
            self._web.touched(room)

    # ------------------------------------------------------------------ other hubs (SPEC 9)
    #
    # On a store other hubs append to (one with `watch()`: PostgreSQL), a loaded room learns
    # that its log moved in two ways: the store's notices (fast, may be lost) and a re-read
    # of its head every `head_check` seconds (the backstop). Both only schedule a catch-up;
    # each room has at most one under way, plus one more when asked again meanwhile, so a
    # burst of notices costs one read per room and a busy room never stalls the others.
    # Drafts and presence across hubs (SPEC 7 and 9) go over a bus, not the store's notices:
    # `server.bus.Relay`, started beside `_watch_store`, mirrors other hubs' drafts and
    # presence and shows them in loaded rooms (`Relay.attach` when a room loads).

    async def _watch_store(self) -> None:
        """Follow the store's notices; after a lost watch, re-check every loaded room (notices
        may have been missed) and watch again, with capped backoff and full jitter."""
        watch: Callable[[], AbstractAsyncContextManager[AsyncIterator[Any]]]
        watch = self._store.watch  # type: ignore[attr-defined]
        failures = 0
        while True:
            try:
                async with watch() as notices:
                    failures = 0
                    self._check_all()  # whatever moved while nobody listened
                    async for notice in notices:
                        self._heard(notice.conversation, notice.lineage, notice.revision)
                return  # the store closed
            except StoreError as exc:
                failures += 1
                log.warning("watching the store failed (%s); checking every room", exc)
            self._check_all()
            await anyio.sleep(random.uniform(0, min(5.0, 0.1 * 2 ** (failures - 1))))

    async def _check_heads(self) -> None:
        while True:
            await anyio.sleep(self.config.head_check)
            self._check_all()

    def _heard(self, conversation_id: str, lineage: int, revision: int) -> None:
        """A notice: the log is at (`lineage`, `revision`); catch up a room that lacks it."""
        room = self._rooms.get(conversation_id)
        if room is not None and (lineage != room.lineage or revision > room.revision):
            self._follow(room)

    def _check_all(self) -> None:
        for room in list(self._rooms.values()):
            self._follow(room)

    def _follow(self, room: Room) -> None:
        """Schedule a head check of `room` (at most one under way per room)."""
        if room in self._following:
            self._following[room] = True
            return
        if self._group is None or self._closing:
            return
        self._following[room] = False
        self._group.start_soon(self._catch_up, room)

    async def _catch_up(self, room: Room) -> None:
        try:
            while True:
                self._following[room] = False
                head = (room.lineage, room.revision)
                try:
                    await room.head_check()
                except Exception:  # a bug of ours: log it, the next check tries again
                    log.exception("checking the head of %s failed", room.id)
                if (room.lineage, room.revision) != head:
                    self._web.touched(room)  # another hub's records: summary rows follow
                if not self._following.get(room):
                    return
        finally:
            self._following.pop(room, None)

    async def room_for_read(self, conversation_id: str) -> Room | None:
        """The room of `conversation_id` for a read, loading it for the moment if needed;
        None when the conversation has no log."""
        try:
            room = await self._acquire(conversation_id)
        except Deleted:
            return None  # a deleted conversation reads as absent (SPEC 15)
        self._release(room)
        if room.exists:
            return room
        if self._may_unload(room) and self._rooms.get(room.id) is room:
            # Nothing to keep: a read of a name with no log must not hold a room for
            # `idle_unload` (reads of made-up names would pile rooms up).
            del self._rooms[room.id]
            self.metrics.conversations_loaded = len(self._rooms)
        return None

    # ------------------------------------------------------------------ deleting (SPEC 15)
    #
    # A delete goes through the conversation's room when one is loaded (or loading), under
    # its lock, so an append under way lands or fails before the log goes and every socket
    # is closed `deleted`; the store keeps a tombstone, which answers `Deleted` to every
    # later load, append and rewrite of the id, here and on every hub sharing the store.
    # Another hub's room learns it from the store's notice or its periodic head check (its
    # re-read finds the tombstone) and closes its sockets the same way (`RoomCore.deleted`).

    async def delete(self, conversation_id: str, now: float | None = None) -> bool:
        """Delete `conversation_id` (SPEC 15): its records, snapshot and marks leave the store,
        its sockets are closed `deleted` (4410, never retried), and it reads as absent from
        then on (HTTP, the list, the summary feed, a hello), here and on every hub sharing
        the store. `now` (epoch seconds) dates the tombstone.

        Returns:
            Whether there was a conversation to delete (False: no log, or deleted before).

        Raises:
            StoreError: the store failed; the conversation may or may not be deleted.
        """
        when = time.time() if now is None else now
        room = await self._room_if_loaded(conversation_id)
        if room is not None:
            deleted = await room.delete(when)
        else:
            deleted = await self._store.delete(conversation_id, when)
        # A load that began while the store deleted may have read the log before it went.
        late = await self._room_if_loaded(conversation_id)
        if late is not None and deleted:
            await late.forget()
        if deleted:
            log.info("deleted conversation %s", conversation_id)
        return deleted

    async def delete_all(self, ids: list[str], now: float | None = None) -> list[str]:
        """Delete each of `ids` (`delete`), up to `_DELETE_CHUNK` at once, so that a SQLite
        store commits (and scrubs the file for) many of them together; returns those that
        were there, in `ids`' order.

        Raises:
            StoreError: the store failed; the deletes not yet done were not tried.
        """
        when = time.time() if now is None else now
        found: set[str] = set()
        failures: list[StoreError] = []

        async def one(conversation_id: str) -> None:
            try:
                if await self.delete(conversation_id, when):
                    found.add(conversation_id)
            except StoreError as exc:
                failures.append(exc)

        for start in range(0, len(ids), _DELETE_CHUNK):
            async with anyio.create_task_group() as group:
                for conversation_id in ids[start : start + _DELETE_CHUNK]:
                    group.start_soon(one, conversation_id)
            if failures:
                raise failures[0]
        return [cid for cid in ids if cid in found]

    async def _room_if_loaded(self, conversation_id: str) -> Room | None:
        """The room of `conversation_id` if it is loaded, or once a load under way is done;
        None when there is none (a load that failed, a deleted log, counts as none)."""
        room = self._rooms.get(conversation_id)
        loading = self._loading.get(conversation_id)
        if room is None and loading is not None:
            with contextlib.suppress(Exception):
                room = await asyncio.shield(loading)
        return room if room is not None and not room.core.gone else None

    def _room_gone(self, room: Room) -> None:
        """`room`'s conversation was deleted (here or by another hub): unload it now."""
        if self._rooms.get(room.id) is room:
            del self._rooms[room.id]
            self.metrics.conversations_loaded = len(self._rooms)
        self._web.touched(room)  # summary feeds read it as gone

    async def idle_conversations(
        self, days: float, now: float | None = None, prefix: str = ""
    ) -> list[tuple[str, float]]:
        """The conversations no record was appended to for more than `days` days before `now`
        (epoch seconds), with when their last record was stamped (epoch seconds), by id.

        Idleness is the `at` of a conversation's last record (the hub stamps a record sent
        without one). A conversation with a socket open on this hub is not idle, nor one with
        no record to date it by."""
        when = time.time() if now is None else now
        before_ms = (when - days * 86400) * 1000
        idle: list[tuple[str, float]] = []
        after: str | None = None
        while True:
            page = await self._store.last_records(prefix, after=after, limit=_IDLE_PAGE)
            for conversation_id, last in page:
                at = _stamped_at(last)
                room = self._rooms.get(conversation_id)
                if at is None or at >= before_ms or (room is not None and room.core.subscribers):
                    continue
                idle.append((conversation_id, at / 1000))
            if len(page) < _IDLE_PAGE:
                return idle
            after = page[-1][0]

    async def retain(
        self, days: float, now: float | None = None, *, dry_run: bool = False
    ) -> list[str]:
        """Delete every conversation idle for more than `days` days (`idle_conversations`);
        with `dry_run`, change nothing. Returns the ids deleted (or that would be). Then
        drops tombstones older than `keep_tombstones_days`, when that is set."""
        when = time.time() if now is None else now
        ids = [cid for cid, _ in await self.idle_conversations(days, when)]
        if dry_run:
            return ids
        gone = await self.delete_all(ids, when)
        keep = self.config.keep_tombstones_days
        if keep is not None:
            await self._store.forget_deleted(when - keep * 86400)
        return gone

    async def _retain_forever(self) -> None:
        """`--retain DAYS` and `--keep-tombstones DAYS`: a sweep at start, then every
        `retain_every` seconds."""
        days, keep = self.config.retain_days, self.config.keep_tombstones_days
        while True:
            try:
                if days is not None:
                    gone = await self.retain(days)
                    if gone:
                        log.info("retention deleted %d idle conversation(s)", len(gone))
                elif keep is not None:
                    await self._store.forget_deleted(time.time() - keep * 86400)
            except StoreError as exc:
                log.warning("a retention sweep failed (%s); the next one tries again", exc)
            except Exception:  # a bug of ours: log it; the hub serves on, the next sweep runs
                log.exception("a retention sweep failed")
            await anyio.sleep(self.config.retain_every)

    # ------------------------------------------------------------------ HTTP

    async def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        headers = request.headers
        for name in _SINGLE_HEADERS:
            # Headers.get raises MultipleValuesError on a repeated header (a 500); which of
            # two Hosts or Origins a proxy checked is anyone's guess, so neither is taken.
            if len(headers.get_all(name)) > 1:
                return connection.respond(400, f"{name} given more than once\n")
        upgrade = headers.get("Upgrade", "").lower() == "websocket"
        if path == "/healthz" and not upgrade:
            return connection.respond(200, "ok\n")  # open: load balancers probe by address
        if not origin_allowed(headers.get("Origin"), self.config.allow_origin, self._own_origins):
            return connection.respond(403, "origin not allowed\n")
        if not host_allowed(headers.get("Host"), self._public_host, self.auth):
            return connection.respond(
                403, "host not allowed (use a loopback name or the public url)\n"
            )
        if upgrade:
            if self._closing:
                return connection.respond(503, "shutting down\n")
            if self.metrics.connections >= self.config.max_connections:
                return connection.respond(503, "too many connections\n")
            if self._waiting.count(_address(connection)) >= self._waiting.limit:
                return connection.respond(503, "too many sockets waiting for hello\n")
            return None  # the handshake goes on; bad ids and tokens are answered on the socket
        response = await self._web.respond(connection, request)  # the viewer and the list
        if response is not None:
            return response
        if path == "/metrics":
            wanted = self.config.metrics_token
            if wanted is not None:
                given = bearer_token(headers.get("Authorization")) or ""
                if not hmac.compare_digest(given.encode(), wanted.encode()):
                    return connection.respond(401, "metrics need the metrics token\n")
            response = connection.respond(200, self.metrics.render())
            response.headers["Content-Type"] = "text/plain; version=0.0.4"
            return response
        if path == RETAIN_PATH:
            return await self._retain_http(connection, request)
        conversation_id = conversation_id_of(path)
        if conversation_id is None:
            return connection.respond(404, "not found\n")
        if not is_conversation_id(conversation_id):
            return connection.respond(400, "bad conversation id\n")
        method = getattr(request, "method", "GET")
        if method == "DELETE":
            return await self._delete_http(connection, request, conversation_id)
        if method not in ("GET", "HEAD"):
            return _not_allowed(connection, "GET, HEAD, DELETE")
        keys = self.keys
        if keys is not None:
            token = bearer_token(headers.get("Authorization"))
            try:
                grant = verify(token, keys, now=time.time(), audience=self.config.audience)
                grant.require(conversation_id, "read")
            except AuthError as refused:
                status = 401 if refused.code == "unauthorized" else 403
                return connection.respond(status, f"{refused.code}: {refused.detail}\n")
        room = await self.room_for_read(conversation_id)
        if room is None:
            return connection.respond(404, "no such conversation\n")
        async with room.lock:
            body = room.snapshot_json()
        response_headers = Headers(
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        )
        return Response(200, "OK", response_headers, body)

    def _admin_grant(
        self, connection: ServerConnection, request: Request, conversation_id: str | None
    ) -> Grant | Response:
        """The grant of a request that needs `admin` (on `conversation_id`, when given), or
        the 401/403 answer. Without auth: `ANONYMOUS`, which may do anything."""
        keys = self.keys
        if keys is None:
            return ANONYMOUS
        token = bearer_token(request.headers.get("Authorization"))
        try:
            grant = verify(token, keys, now=time.time(), audience=self.config.audience)
            if conversation_id is not None:
                grant.require(conversation_id, "admin")
            elif not grant.can_admin:
                raise AuthError("forbidden", "token lacks the admin scope")
        except AuthError as refused:
            status = 401 if refused.code == "unauthorized" else 403
            return connection.respond(status, f"{refused.code}: {refused.detail}\n")
        return grant

    async def _delete_http(
        self, connection: ServerConnection, request: Request, conversation_id: str
    ) -> Response:
        """`DELETE /v1/conversations/{id}` (SPEC 15): 200 once deleted, 404 when there is no
        such conversation, 401/403 without a token holding `admin` on it."""
        grant = self._admin_grant(connection, request, conversation_id)
        if isinstance(grant, Response):
            return grant
        try:
            deleted = await self.delete(conversation_id)
        except StoreError as exc:
            log.warning("deleting %s failed: %s", conversation_id, exc)
            return connection.respond(503, "the store failed; try again\n")
        if not deleted:
            return connection.respond(404, "no such conversation\n")
        return _json_response({"deleted": conversation_id})

    async def _retain_http(self, connection: ServerConnection, request: Request) -> Response:
        """`GET /v1/retain?days=N` lists the conversations idle for more than N days (a dry
        run: nothing changes); `POST` deletes them. Needs `admin`; a token's `convs` limit
        both to the conversations it allows."""
        method = getattr(request, "method", "GET")
        if method not in ("GET", "HEAD", "POST"):
            return _not_allowed(connection, "GET, HEAD, POST")
        query = urllib.parse.parse_qs(urlsplit(request.path).query, keep_blank_values=True)
        given = query.get("days", [])
        days = _days(given[0]) if len(given) == 1 and set(query) == {"days"} else None
        if days is None:
            return connection.respond(400, "give days=N once (a number of days, more than 0)\n")
        grant = self._admin_grant(connection, request, None)
        if isinstance(grant, Response):
            return grant
        now = time.time()
        try:
            listed = await self.idle_conversations(days, now)
            idle = [(cid, at) for cid, at in listed if grant.allows(cid)]
            if method != "POST":
                return _json_response({"idle": [{"id": cid, "last": at} for cid, at in idle]})
            deleted = await self.delete_all([cid for cid, _ in idle], now)
        except StoreError as exc:
            log.warning("a retention request failed: %s", exc)
            return connection.respond(503, "the store failed; try again\n")
        return _json_response({"deleted": deleted})

    # ------------------------------------------------------------------ websockets

    async def _connection(self, ws: ServerConnection) -> None:
        if ws.request is not None and is_summary_path(ws.request.path):
            await self._summary(ws)
            return
        metrics = self.metrics
        metrics.connections += 1
        sub = Subscriber(ws, self.config.send_queue, metrics)
        held = _Held(_address(ws))
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(sub.run)
                try:
                    await self._serve(ws, sub, held)
                    if sub.closing:
                        await _drain(ws)
                finally:
                    sub.close(1000, "")  # the writer flushes what is queued, then closes
                    group.cancel_scope.deadline = anyio.current_time() + 10
        finally:
            metrics.connections -= 1
            self._let_go(held, sub)

    async def _summary(self, ws: ServerConnection) -> None:
        """A summary feed: counted in `connections` and, until its hello, in the sockets an
        address may have waiting, as a replica's socket is."""
        address = _address(ws)
        if not self._waiting.acquire(address):
            await self._web.refuse_summary(ws, "rate_limited", "too many sockets waiting for hello")
            return
        waiting = True

        def said_hello() -> None:
            nonlocal waiting
            if waiting:
                waiting = False
                self._waiting.release(address)

        self.metrics.connections += 1
        try:
            await self._web.serve_summary(ws, said_hello)
        finally:
            said_hello()
            self.metrics.connections -= 1
            asyncio.get_running_loop().call_later(CLOSE_DEADLINE, cut_if_open, ws)

    def _let_go(self, held: _Held, sub: Subscriber) -> None:
        if held.waiting:
            self._waiting.release(held.address)
            held.waiting = False
        if held.principal is not None:
            self._principals.release(held.principal)
            held.principal = None
        if held.room is not None:
            held.room.leave(sub)
            self._web.touched(held.room)
            self._release(held.room)
            held.room = None

    async def _serve(self, ws: ServerConnection, sub: Subscriber, held: _Held) -> None:
        """Read and handle frames until the socket closes, fails or passes its deadline."""
        conversation_id = conversation_id_of(ws.request.path if ws.request else "")
        if conversation_id is None or not is_conversation_id(conversation_id):
            self._fail(sub, ProtocolError("bad_conversation_id", "expected /v1/conversations/{id}"))
            return
        if not self._waiting.acquire(held.address):
            self._fail(sub, ProtocolError("rate_limited", "too many sockets waiting for hello"))
            return
        held.waiting = True
        header = ws.request.headers.get("Authorization") if ws.request else None
        session = HubSession(
            self.config.max_frame,
            access=self._access(),
            conversation_id=conversation_id,
            bearer=bearer_token(header),
            limits=self._limits,
            now=time.time(),
        )
        async with anyio.create_task_group() as group:
            group.start_soon(self._watch, session, sub, held.moved)
            await self._read(ws, sub, held, session, conversation_id)
            group.cancel_scope.cancel()

    async def _watch(self, session: HubSession, sub: Subscriber, moved: asyncio.Event) -> None:
        """Sleep until the session's deadline, or until `moved` says a hello or a refresh
        changed it; close the socket once it has passed (no hello in time, a token expired).
        A task of its own, so reading a frame arms no timer."""
        while not sub.closing:
            with anyio.move_on_after(max(0.0, session.next_deadline() - time.time())):
                await moved.wait()
                moved.clear()
                continue
            late = session.expired(time.time())
            if late is not None:
                self._fail(sub, late)  # the writer closes the socket; the reader then ends

    async def _read(
        self,
        ws: ServerConnection,
        sub: Subscriber,
        held: _Held,
        session: HubSession,
        conversation_id: str,
    ) -> None:
        while not sub.closing:
            try:
                data = await ws.recv(decode=False)
            except ConnectionClosed:
                break
            now = time.time()
            if sub.closing:  # the watchdog closed it meanwhile
                break
            try:
                message = session.receive(data, now)
                wait = session.throttle(message, now)
                if wait:  # over its budget: read this socket no faster than the budget
                    await anyio.sleep(wait)
                    if sub.closing:
                        break
                if type(message) is PushBatch:  # first, without the `match`
                    assert held.room is not None
                    await held.room.push(sub, message)
                    self._web.touched(held.room)
                    continue
                match message:
                    case Hello():
                        held.moved.set()
                        await self._join(session, message, sub, held, conversation_id, now)
                        assert held.room is not None
                        self._web.touched(held.room)
                    case Auth():
                        assert held.room is not None
                        # The keys of now, not of the connect: a retired key refreshes nothing.
                        session.access = self._access() or session.access
                        grant = session.refresh(message, now)
                        held.moved.set()
                        await held.room.regrant(sub, grant, now)
                    case DraftOp():
                        assert held.room is not None
                        await held.room.draft(sub, message)
                        self._web.touched(held.room)  # a row counts open drafts
                    case StatusUpdate():
                        assert held.room is not None
                        await held.room.status(sub, message)
                        self._web.touched(held.room)  # a row shows statuses
                    case Ping():
                        sub.send(_PONG)  # a frozen hub sends none: that is the point
            except (ProtocolError, AuthError, Deleted) as error:
                self._fail(sub, error)  # Deleted: a hello on a tombstone, `deleted` (4410)
                break
            except Exception:  # a bug of ours: this socket goes, the hub and the log stay
                log.exception("connection to %s failed", conversation_id)
                self._fail(sub, ProtocolError("internal", "the hub failed on this message"))
                break

    async def _join(
        self,
        session: HubSession,
        hello: Hello,
        sub: Subscriber,
        held: _Held,
        conversation_id: str,
        now: float,
    ) -> None:
        self._waiting.release(held.address)
        held.waiting = False
        grant = session.authorize(hello, now)
        if self.auth:
            if not self._principals.acquire(grant.sub):
                raise ProtocolError("rate_limited", "too many connections for this principal")
            held.principal = grant.sub
        held.room = await self._acquire(conversation_id)
        if self.auth:
            log.debug(  # %r: a sub or client id is never printed raw into a log line
                "%r joins %s as client %r (key %r)",
                grant.sub,
                conversation_id,
                hello.client,
                grant.kid,
            )
        await held.room.join(sub, hello, grant)

    def _fail(self, sub: Subscriber, error: ConvsyncError) -> None:
        # Details are short phrases of ours; an auth detail never quotes a token.
        log.info("closing a socket: %s: %s", error.reason, error.message)
        self.metrics.protocol_errors[error.reason] += 1
        sub.fail(error.reason, error.message)


class _Connection(ServerConnection):
    """A hub socket that stops reading a peer which does not read what it is sent.

    websockets answers every ping with a pong whatever the socket's backlog, and pings never
    reach `recv` (so no rate limit sees them): a peer that floods pings and reads nothing
    would grow the hub's write buffer without bound. While the transport's write buffer is
    above its high-water mark, reading pauses (TCP then pushes back on the peer); it resumes
    below the low-water mark, unless websockets' own flow control (too many frames not yet
    read by the hub) holds it paused.
    """

    first_frame: int | None = None
    """The first data frame's size limit (the hello's), set by `with_first_frame`."""

    @classmethod
    def with_first_frame(cls, limit: int) -> type[_Connection]:
        """This class, whose sockets read a first data frame of at most `limit` bytes."""
        return type("_HubConnection", (cls,), {"first_frame": limit})

    def __init__(self, protocol: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(protocol, *args, **kwargs)
        if self.first_frame is not None:
            self._hold_first_frame(protocol, self.first_frame)

    @staticmethod
    def _hold_first_frame(protocol: Any, limit: int) -> None:
        """Read the first data frame with the hello's limit and raise it to the socket's own
        (`max_size`) once that frame is in: websockets refuses a frame by the length in its
        header, so a 64 MiB "hello" is never buffered to be refused after (issue 27: 8
        sockets x 60 MiB peaked at 486 MiB). The limit rises in the protocol, before the next
        frame is parsed, so a push sent right behind the hello is read with the full limit.
        Over it, the peer gets `error too_big`, then close 1009, as the session would say."""
        full = protocol.max_message_size
        protocol.max_message_size = limit
        receive = protocol.recv_frame
        fail = protocol.fail

        def recv_frame(frame: Any) -> None:
            receive(frame)
            if frame.opcode in _DATA_OPCODES and frame.fin:
                protocol.max_message_size = full
                protocol.recv_frame = receive  # once is enough
                protocol.fail = fail

        def fail_too_big(code: int, reason: str = "") -> None:
            if code == 1009 and protocol.state is State.OPEN:
                detail = f"first frame over {limit} bytes"
                protocol.send_text(encode_message(Error("too_big", detail)))
            fail(code, reason)

        protocol.recv_frame = recv_frame
        protocol.fail = fail_too_big

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._writes_paused = False
        resume = self.recv_messages.resume

        def resume_unless_writes_paused() -> None:
            if not self._writes_paused:
                resume()

        self.recv_messages.resume = resume_unless_writes_paused

    def pause_writing(self) -> None:
        super().pause_writing()
        self._writes_paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._writes_paused = False
        if not self.recv_messages.paused:
            self.transport.resume_reading()


class _Held:
    """What one connection holds and gives back when it ends."""

    __slots__ = ("address", "moved", "principal", "room", "waiting")

    def __init__(self, address: str) -> None:
        self.address = address
        self.moved = asyncio.Event()  # the session's deadline may have changed
        self.waiting = False
        self.principal: str | None = None
        self.room: Room | None = None


async def _drain(ws: ServerConnection) -> None:
    """Read and drop what a peer we are closing still sends, for a moment: websockets stops
    reading a socket whose unread messages pile up, and then would not see the peer's close
    frame (a flood cut by the rate limit would hang in the close handshake)."""
    with anyio.move_on_after(2):
        try:
            while True:
                await ws.recv(decode=False)
        except ConnectionClosed:
            pass


def _retrieved(task: asyncio.Task[Room]) -> None:
    """Mark a room load's failure seen: its callers may all have gone (cancelled)."""
    if not task.cancelled():
        task.exception()


def _address(connection: ServerConnection) -> str:
    """The remote IP address of a connection (its port differs per socket)."""
    remote = connection.remote_address
    return str(remote[0]) if remote else "?"


def _ssl_context(config: HubConfig) -> ssl.SSLContext | None:
    """A server TLS context from `tls_cert`/`tls_key`, or None without them."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError("bad_setting", f"cannot load the TLS certificate or key: {exc}") from exc
    return context
