"""`Sockets`: the hub's listening socket and each replica's websocket.

How this works: `listen` binds one `websockets` server (plain HTTP requests go to
`server.http.Http` first) and reports the port; the hub opens its store and starts its other
services, then calls `accept`. A connection reads frames one at a time: the pure `HubSession`
decodes and checks each (bad input: `error`, then close); a `hello` and every `push` go to the
conversation's `Room` (acquired from `server.rooms.Rooms` at the hello), whose core holds every
rule. Each connection's writer (`Subscriber`) and its deadline watch live in task groups of that
connection's handler, which end with it. `/v1/summary` sockets go to `server.web.Web`.

Access control (SPEC 6): the session verifies tokens and keeps the per-socket deadlines and rate
limit, the core checks scopes; this shell only carries the handshake's `Authorization` header to
the session, sleeps until `session.next_deadline()`, and counts sockets per address and per
principal (`limits.Caps`). No token is ever logged: every refusal's detail is a fixed phrase,
and the websockets library's own logger (which logs headers and frames at DEBUG) is held at
INFO.

Async API: anyio (websockets' own calls aside: `recv`, the server's `start_serving`).
"""

from __future__ import annotations

import logging
import ssl
import time
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup, TaskStatus
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from sync.errors import ConvsyncError, ProtocolError, UsageError
from sync.protocol import (
    SUBPROTOCOL,
    Auth,
    DraftOp,
    Hello,
    Ping,
    Pong,
    PushBatch,
    StatusUpdate,
    encode_message,
)

from .auth import AuthError, bearer_token
from .config import HubConfig
from .connection import LET_GO, LET_GO_AFTER, let_go
from .front import Front
from .http import Http, remote_address
from .limits import Caps
from .mux import Channel, is_mux_path, serve_mux
from .room import Room
from .rooms import Rooms
from .session import Access, HubSession, Limits, conversation_id_of, is_conversation_id
from .store.base import Deleted
from .subscriber import CLOSE_DEADLINE, Subscriber, cut_if_open
from .web import Web, is_summary_path

if TYPE_CHECKING:
    from .hub import Hub

__all__ = ["MAX_QUEUE", "Sockets", "ssl_context"]

log = logging.getLogger("convsync.hub")

MAX_QUEUE = 2
"""Messages websockets may read from a socket ahead of the hub (its `max_queue`; each up to
`max_size`, four times `max_frame`); past it, reading pauses until the hub takes one. Its
default, 16, let one socket make the hub hold 16 frames of 64 MiB while a room was busy."""
_PONG = encode_message(Pong())

_ws_log = logging.getLogger("convsync.hub.websockets")
# websockets logs request headers and frames at DEBUG: they hold tokens. Never below INFO.
_ws_log.setLevel(logging.INFO)


class Sockets:
    """The websocket side of `hub`.

    Args:
        hub: the hub whose settings, keys and metrics apply.
        rooms: where a hello finds its conversation's room.
        web: the summary feeds, and what is told a room changed.
        http: the answers to plain requests and the checks of each handshake.
        front: the hub's own HTTP/1.1 on the same port (plain requests; upgrades go on here).
        waiting: sockets waiting for a hello, per address.
        principals: sockets per principal (with auth).
    """

    def __init__(
        self,
        hub: Hub,
        *,
        rooms: Rooms,
        web: Web,
        http: Http,
        front: Front,
        waiting: Caps,
        principals: Caps,
    ) -> None:
        self._hub = hub
        self._rooms = rooms
        self._web = web
        self._http = http
        self._front = front
        self._waiting = waiting
        self._principals = principals
        config = hub.config
        self._limits = Limits(
            hello_timeout=config.hello_timeout,
            first_frame=config.max_hello_frame,
            rate=config.rate,
            burst=config.rate_burst,
            flood_after=config.flood_after,
            expiry_grace=config.expiry_grace,
        )
        self.tls = ssl_context(config)
        self.server: Server | None = None
        """The websockets server, once `listen` bound it."""
        self._group: TaskGroup | None = None

    @property
    def port(self) -> int:
        """The port bound."""
        assert self.server is not None, "the hub is not started"
        return int(self.server.sockets[0].getsockname()[1])

    async def listen(
        self, host: str, port: int, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind `host`:`port` (0: a free one) and report the port bound; connections are
        taken only from `accept` on. Runs until cancelled (the hub closes the server first,
        `close`).

        Raises:
            OSError: the address cannot be bound (a port in use).
        """
        config = self._hub.config
        async with (
            anyio.create_task_group() as group,
            serve(
                self._connection,
                host,
                port,
                subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                process_request=self._http.respond,
                max_size=4 * config.max_frame,
                # Messages websockets reads ahead of the hub (each up to `max_size`): the hub
                # reads a socket's frames one by one, so a few are enough.
                max_queue=MAX_QUEUE,
                compression="deflate" if config.compression == "deflate" else None,
                ping_interval=config.ping_interval,
                # Plain requests are served by the front (keep-alive, bodies, streams).
                create_connection=self._front.connection_class(config.max_hello_frame),
                open_timeout=config.open_timeout,
                ssl=self.tls,
                logger=_ws_log,
                start_serving=False,
            ) as server,
        ):
            self.server = server
            self._group = group
            self._front.start(group)
            self._http.bound(self.port, tls=self.tls is not None)
            task_status.started(self.port)
            await anyio.sleep_forever()

    async def accept(self) -> None:
        """Take connections from now on."""
        assert self.server is not None, "the hub is not listening"
        await self.server.start_serving()

    async def close(self) -> None:
        """Close every socket with 1001 (`server.close` acts only on its first call: the
        hub calls this once, after its rooms shut down); a socket that does not close in
        time (a peer that stopped reading) is cut."""
        server = self.server
        assert server is not None, "the hub is not listening"
        await self._front.stop_accepting(server)
        await self._front.close()
        server.close(close_connections=True, reason="shutting down")
        with anyio.move_on_after(CLOSE_DEADLINE):
            await server.wait_closed()
        for connection in list(server.all_connections):
            cut_if_open(connection)
        with anyio.move_on_after(CLOSE_DEADLINE):
            await server.wait_closed()

    def hold_principal(self, sub: str) -> bool:
        """`Hub.hold_principal`."""
        return self._principals.acquire(sub)

    def let_go_principal(self, sub: str) -> None:
        """`Hub.let_go_principal`."""
        self._principals.release(sub)

    def _access(self) -> Access | None:
        keys = self._hub.keys
        return None if keys is None else Access(keys, self._hub.config.audience)

    def _cut_later(self, ws: ServerConnection) -> None:
        """Cut `ws` if it is still open `CLOSE_DEADLINE` seconds from now."""
        if self._group is not None:
            self._group.start_soon(_cut_after, ws, CLOSE_DEADLINE)

    async def _connection(self, ws: ServerConnection) -> None:
        if ws.request is not None and is_summary_path(ws.request.path):
            await self._summary(ws)
            return
        metrics = self._hub.metrics
        metrics.connections += 1
        try:
            if ws.request is not None and is_mux_path(ws.request.path):
                await self._shared(ws)
            else:
                await self._session(ws)
        finally:
            metrics.connections -= 1

    async def _shared(self, ws: ServerConnection) -> None:
        """A socket shared by several sessions (`server.mux`): each channel's session runs as
        a socket's does, in a task of this one's; counted in `channels`."""
        metrics = self._hub.metrics

        async def channel_session(channel: Channel) -> None:
            metrics.channels += 1
            try:
                await self._session(channel)  # type: ignore[arg-type]  # it quacks as one
            finally:
                metrics.channels -= 1
                await channel.close(1000, "")

        async with anyio.create_task_group() as group:
            await serve_mux(ws, channel_session, group.start_soon)
            group.cancel_scope.deadline = anyio.current_time() + 10

    async def _session(self, ws: ServerConnection) -> None:
        """One replica session over `ws` (its own socket, or a channel of a shared one)."""
        sub = Subscriber(ws, self._hub.config.send_queue, self._hub.metrics)
        held = _Held(remote_address(ws))
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
            self._let_go(held, sub)

    async def _summary(self, ws: ServerConnection) -> None:
        """A summary feed: counted in `connections` and, until its hello, in the sockets an
        address may have waiting, as a replica's socket is."""
        address = remote_address(ws)
        if not self._waiting.acquire(address):
            await self._web.refuse_summary(ws, "rate_limited", "too many sockets waiting for hello")
            return
        waiting = True

        def said_hello() -> None:
            nonlocal waiting
            if waiting:
                waiting = False
                self._waiting.release(address)

        self._hub.metrics.connections += 1
        try:
            await self._web.serve_summary(ws, said_hello)
        finally:
            said_hello()
            self._hub.metrics.connections -= 1
            self._cut_later(ws)

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
            self._rooms.release(held.room)
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
            self._hub.config.max_frame,
            access=self._access(),
            conversation_id=conversation_id,
            bearer=bearer_token(header),
            limits=self._limits,
            now=time.time(),
        )
        async with anyio.create_task_group() as group:
            group.start_soon(self._watch, session, sub, held)
            await self._read(ws, sub, held, session, conversation_id)
            group.cancel_scope.cancel()

    async def _watch(self, session: HubSession, sub: Subscriber, held: _Held) -> None:
        """Sleep until the session's deadline, or until `held.moved` says a hello or a refresh
        changed it; close the socket once it has passed (no hello in time, a token expired).
        A task of its own, so reading a frame arms no timer."""
        while not sub.closing:
            with anyio.move_on_after(max(0.0, session.next_deadline() - time.time())):
                await held.moved.wait()
                held.moved = anyio.Event()  # an anyio event is set once: a fresh one
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
        big = False  # the last data frame was over LET_GO bytes
        while not sub.closing:
            try:
                if not big:  # (no cancel scope per frame: this is every push's path)
                    data = await ws.recv(decode=False)
                else:
                    # After a large frame, which websockets' parser holds until the next one:
                    # a busy writer sends that soon; for one gone quiet, a pong replaces it.
                    big = False
                    with anyio.move_on_after(LET_GO_AFTER) as quiet:
                        data = await ws.recv(decode=False)
                    if quiet.cancelled_caught:
                        await let_go(ws)
                        continue
            except ConnectionClosed:
                break
            now = time.time()
            if sub.closing:  # the watchdog closed it meanwhile
                break
            try:
                message = session.receive(data, now)
                # Not held while this socket is idle: a writer's last push frame (up to a
                # MiB) stayed alive per connection until its next message (issue 32).
                big = len(data) > LET_GO  # websockets' parser holds it too (see above)
                data = b""
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
        if self._hub.auth:
            if not self._principals.acquire(grant.sub):
                raise ProtocolError("rate_limited", "too many connections for this principal")
            held.principal = grant.sub
        held.room = await self._rooms.acquire(conversation_id)
        if self._hub.auth:
            log.debug(  # %r: a sub or client id is never printed raw into a log line
                "%r joins %s as client %r (key %r)",
                grant.sub,
                conversation_id,
                hello.client,
                grant.kid,
            )
        await held.room.join(sub, hello, grant)

    def _fail(self, sub: Subscriber, error: ConvsyncError) -> None:
        # Details are short phrases of ours; an auth detail never quotes a token. A decoder's
        # words may quote the frame (an enum value, a type name): the peer gets them, the log
        # does not.
        detail = "(the frame's words, not logged)" if error.quotes_peer else error.message
        log.info("closing a socket: %s: %s", error.reason, detail)
        self._hub.metrics.protocol_errors[error.reason] += 1
        sub.fail(error.reason, error.message)


class _Held:
    """What one connection holds and gives back when it ends."""

    __slots__ = ("address", "moved", "principal", "room", "waiting")

    def __init__(self, address: str) -> None:
        self.address = address
        self.moved = anyio.Event()  # the session's deadline may have changed
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


async def _cut_after(ws: ServerConnection, delay: float) -> None:
    await anyio.sleep(delay)
    cut_if_open(ws)


def ssl_context(config: HubConfig) -> ssl.SSLContext | None:
    """A server TLS context from `tls_cert`/`tls_key`, or None without them.

    Raises:
        UsageError: the files cannot be loaded.
    """
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError("bad_setting", f"cannot load the TLS certificate or key: {exc}") from exc
    return context
