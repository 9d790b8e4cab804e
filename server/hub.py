"""`Hub`: the websocket server that owns every conversation's log.

How this works: one port serves replicas' websockets and the HTTP surface. The hub is the
wiring of its parts, one job each:

- `server.sockets.Sockets`: the listening socket and each replica's websocket (a frame at a
  time, through the pure `HubSession`, to the conversation's `Room`);
- `server.http.Http`: plain HTTP requests (health, metrics, the /v1 APIs; the viewer and the
  list through `server.web.Web`) and the checks of every handshake;
- `server.rooms.Rooms`: the rooms loaded, loading on first use, unloading idle ones;
- `server.timer.RoomTimer`: wakes each room's core at its next deadline;
- `server.follow.Follower` and `server.bus.Relay`: on a store other hubs share (PostgreSQL),
  keep loaded rooms up to the store, and show other hubs' drafts and presence;
- `server.leases.keep_turns`: renews turn leases and ends lapsed turns (SPEC 10);
- `server.retention.Retention`: deletes conversations, and idle ones on a schedule (SPEC 15).

Starting: the port is bound first (`Sockets.listen`, which reports the real port), then the
store is opened, then the services start, then connections are taken; so a hub that cannot serve
(a port in use) leaves no store file behind. Each service is started with `await
group.start(...)` in one task group, which runs in a task of its own (`server.background`) so
the hub can be left from any task. Stopping: new handshakes get 503, each room finishes the
append under way, every socket is closed (1001), the task group is cancelled, and the store is
closed last.

Async API: anyio (its own task is `server.background`'s, asyncio).
"""

from __future__ import annotations

import contextlib
import time
from types import TracebackType
from typing import Self

import anyio
from anyio.abc import TaskGroup, TaskStatus

from sync import Conversation
from sync.errors import UsageError

from .agui import mount as mount_agui
from .aisdk import PATH as AISDK_PATH
from .aisdk import AiSdk
from .auth import KeyRing
from .background import Background
from .bus import Relay, open_bus
from .config import HubConfig
from .follow import Follower
from .front import Front
from .http import Http
from .leases import keep_turns
from .limits import Caps, is_loopback_bind
from .metrics import Metrics
from .retention import Retention
from .room import Room, is_shared, keeps_leases
from .rooms import Rooms
from .sockets import Sockets
from .store import LogStore, MemoryStore
from .store.base import Deleted
from .timer import RoomTimer
from .web import Web

__all__ = ["Hub"]


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
        self.metrics = Metrics()
        self._store: LogStore = store if store is not None else MemoryStore()
        self._host = host
        self._port = port
        self._closing = False
        self._stop: anyio.Event | None = None  # made in `_run` (an anyio event needs a loop)
        self._stop_asked = False  # `aclose` came before `_run` made `_stop`
        self._background = Background()
        self._web = Web(self)
        touched = self._web.touched
        self._timer = RoomTimer(touched)
        self._rooms = Rooms(
            self._store,
            self.config,
            self.metrics,
            on_deadline=self._timer.deadline,
            touched=touched,
            auth=lambda: self.auth,
        )
        self._retention = Retention(self._rooms, self._store, self.config)
        waiting = Caps(self.config.max_waiting_per_address)
        self._http = Http(self, self._web, waiting)
        self.front = Front(self, self._http, waiting)
        """The plain HTTP of the hub's port: `front.route(prefix, route)` adds a route."""
        mount_agui(self)  # POST /v1/agui/{id} (SPEC 13)
        self._sockets = Sockets(
            self,
            rooms=self._rooms,
            web=self._web,
            http=self._http,
            front=self.front,
            waiting=waiting,
            principals=Caps(self.config.max_per_principal),
        )
        self.front.route(AISDK_PATH, AiSdk(self).route)  # the AI SDK's chat (SPEC 13)
        self._follower: Follower | None = None  # on a shared store
        self._relay: Relay | None = None  # the bus to other hubs, on a shared store

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        """The port bound."""
        return self._sockets.port

    @property
    def url(self) -> str:
        """`ws://host:port` (`wss://` with TLS), the base replicas connect to."""
        host = self._host if ":" not in self._host else f"[{self._host}]"
        scheme = "wss" if self._sockets.tls is not None else "ws"
        return f"{scheme}://{host}:{self.port}"

    @property
    def auth(self) -> bool:
        """Whether this hub checks tokens."""
        return self.keys is not None

    @property
    def closing(self) -> bool:
        """Whether the hub is shutting down (new handshakes get 503)."""
        return self._closing

    @property
    def store(self) -> LogStore:
        return self._store

    def hold_principal(self, sub: str) -> bool:
        """Count one more socket of `sub` against `max_per_principal` (a summary feed); False
        when it holds that many already."""
        return self._sockets.hold_principal(sub)

    def let_go_principal(self, sub: str) -> None:
        """A socket counted by `hold_principal` closed."""
        self._sockets.let_go_principal(sub)

    async def __aenter__(self) -> Self:
        await self._background.start(self._run)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop accepting, finish appends under way, close every socket, close the store."""
        self._stop_asked = True
        if self._stop is not None:
            self._stop.set()
        await self._background.wait()

    async def serve_forever(self) -> None:
        """Serve until cancelled."""
        await anyio.sleep_forever()

    async def _run(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """The hub as one service: started once it takes connections (the port bound
        reported), until `aclose`."""
        self._stop = anyio.Event()
        if self._stop_asked:
            self._stop.set()
        # The store is closed last, after the server and the task group.
        async with contextlib.AsyncExitStack() as opened:
            async with anyio.create_task_group() as group:
                port = await group.start(self._sockets.listen, self._host, self._port)
                await opened.enter_async_context(self._store)
                await self._start_services(group)
                await self._sockets.accept()  # the store is open: take connections now
                task_status.started(port)
                await self._stop.wait()
                await self._shutdown()
                group.cancel_scope.cancel()

    async def _start_services(self, group: TaskGroup) -> None:
        """Start the hub's services on an open store, before connections are taken."""
        group.start_soon(self._rooms.unload_idle)
        if is_shared(self._store):
            self._follower = Follower(
                self._store, self._rooms.loaded, self.config, self._web.touched
            )
            await group.start(self._follower.run)
            self._relay = Relay(open_bus(self.config, self._store), self.config, self._rooms.loaded)
            self._rooms.attach = self._relay.attach
            await group.start(self._relay.run)  # drafts and presence of other hubs
        await group.start(self._timer.run, self._rooms.loaded)
        if self.config.retain_days is not None or self.config.keep_tombstones_days is not None:
            group.start_soon(self._retention.run)
        if keeps_leases(self._store):
            group.start_soon(
                keep_turns, self._rooms, self._store, self.config, self._web.touched, self._closed
            )

    def _closed(self) -> bool:
        return self._closing

    async def _shutdown(self) -> None:
        # New handshakes get 503 from here on (`Http`). The sockets are closed once, after the
        # rooms: that closes every other socket too (a summary feed, one before its hello,
        # one whose room is still loading) with 1001.
        self._closing = True
        if self._follower is not None:
            self._follower.close()
        for room in list(self._rooms.loaded.values()):
            await room.shut_down()  # an append under way finishes first
        await self._sockets.close()

    # ------------------------------------------------------------------ conversations

    async def rewrite(self, conversation_id: str, conversation: Conversation) -> None:
        """Rewrite the log of `conversation_id` under a fresh lineage, holding `conversation`
        (an import that replaces history, a compaction). Replicas are sent the new state,
        reread it, and replay their pending edits on it.

        Raises:
            LogMoved: another hub sharing the store appended since this hub last saw the log;
                nothing was rewritten (this hub's replicas now have those records).
        """
        room = await self._rooms.acquire(conversation_id)
        try:
            await room.rewrite(conversation)
            self._web.touched(room)
            if room.core.gone:
                raise Deleted(conversation_id, time.time())
        finally:
            self._rooms.release(room)

    async def log_moved(self, conversation_id: str) -> None:
        """Another hub sharing the store appended to `conversation_id`: bring this hub's room
        (when loaded) and its subscribers up to the store. Correctness never depends on this
        call: a push on a stale room finds the log moved and does the same."""
        room = self._rooms.loaded.get(conversation_id)
        if room is not None:
            await room.log_moved()
            self._web.touched(room)

    async def room_for_read(self, conversation_id: str) -> Room | None:
        """The room of `conversation_id` for a read, loading it for the moment if needed;
        None when the conversation has no log."""
        return await self._rooms.for_read(conversation_id)

    # ------------------------------------------------------------------ deleting (SPEC 15)

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
        return await self._retention.delete(conversation_id, now)

    async def delete_all(self, ids: list[str], now: float | None = None) -> list[str]:
        """Delete each of `ids` (`delete`), up to 100 at once, so that a SQLite
        store commits (and scrubs the file for) many of them together; returns those that
        were there, in `ids`' order.

        Raises:
            StoreError: the store failed; the deletes not yet done were not tried.
        """
        return await self._retention.delete_all(ids, now)

    async def idle_conversations(
        self, days: float, now: float | None = None, prefix: str = ""
    ) -> list[tuple[str, float]]:
        """The conversations no record was appended to for more than `days` days before `now`
        (epoch seconds), with when their last record was stamped (epoch seconds), by id.

        Idleness is the `at` of a conversation's last record (the hub stamps a record sent
        without one). A conversation with a socket open on this hub is not idle, nor one with
        no record to date it by."""
        return await self._retention.idle_conversations(days, now, prefix)

    async def retain(
        self, days: float, now: float | None = None, *, dry_run: bool = False
    ) -> list[str]:
        """Delete every conversation idle for more than `days` days (`idle_conversations`);
        with `dry_run`, change nothing. Returns the ids deleted (or that would be). Then
        drops tombstones older than `keep_tombstones_days`, when that is set."""
        return await self._retention.retain(days, now, dry_run=dry_run)
