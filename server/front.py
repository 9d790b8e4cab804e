"""`Front`: the hub's own HTTP/1.1 on its listening port (keep-alive, request bodies,
streamed responses), with websocket upgrades still handed to websockets untouched.

How this works: the hub's connection class (`Door`, a `HubConnection`) does not start
websockets' handler when a connection opens. It reads the first request head with h11; a
`Upgrade: websocket` request (or a head h11 cannot parse) is then handed to websockets as if
nothing had happened (its handler starts, and is fed the bytes read so far); any other
request switches the transport to `_Conn`, an asyncio protocol of ours driven by h11, which
serves requests one after another on the same connection until it is idle for
`keepalive_timeout` seconds, the peer closes, or the hub shuts down.

A request whose path has a route (`Front.route`, by path prefix) is answered by that route:
a `Reply` or a `Stream` (chunks written as they come, chunked encoding). Every other request
goes to `server.http.Http.respond` exactly as websockets' `process_request` did, with a
websockets `Request` and a stand-in for the bits of `ServerConnection` it uses.

Limits: a request head must arrive within `open_timeout` seconds (its body within as long
again), bodies are capped at `max_body` (413), an open HTTP connection counts in
`max_connections` (with the websockets) and in the sockets one address may hold
(`max_waiting_per_address`). Shutdown closes idle connections, ends streams with their last
chunk, and cuts what is still open after `CLOSE_DEADLINE`. A route that fails gets 500 and a
log line naming the route and the exception's type only (never its message: it may quote a
token or a message's text).

Async API: anyio in each connection's task (started in the listening socket's task group);
asyncio's synchronous protocol callbacks (`connection_made`, `data_received`, ...) only feed
bytes to h11 and set asyncio events, which the task awaits under anyio's timeouts.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast

import anyio
import h11
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from websockets.asyncio.server import Server, ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import SERVER, Request, Response

from .connection import HubConnection
from .limits import Caps
from .subscriber import CLOSE_DEADLINE

if TYPE_CHECKING:
    from .http import Http
    from .hub import Hub

__all__ = [
    "EVENT_STREAM",
    "Door",
    "Front",
    "FrontRequest",
    "Reply",
    "Route",
    "Stream",
]

log = logging.getLogger("convsync.hub")

MAX_HEAD = 16 * 1024
"""The largest request head, in bytes (h11's default); a larger one gets 431."""
SEND_DEADLINE = 30.0
"""Seconds a write may wait on a peer that does not read; then the connection is cut."""
_BACKLOG = 64 * 1024
"""Bytes a peer may send ahead of the request being answered before reading pauses."""

EVENT_STREAM: tuple[tuple[str, str], ...] = (
    ("Content-Type", "text/event-stream"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),  # a proxy in front (nginx) passes chunks on at once
)
"""The headers of a server-sent events stream (`Stream`'s default)."""

_FAILED = "the hub failed on this request\n"
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


# ---------------------------------------------------------------------- the route interface


@dataclass(frozen=True, slots=True)
class FrontRequest:
    """One HTTP request, body read in full.

    Attributes:
        method: `GET`, `POST`, `OPTIONS`, ... (upper case, as sent).
        target: the path and query as sent (`/v1/agui/c1?x=1`), not decoded.
        headers: the headers (case-insensitive; `get` raises `MultipleValuesError` on a
            repeated one, `get_all` lists them). Host, Origin, Authorization and Upgrade are
            never repeated here: the front answered 400.
        body: the body (at most `max_body` bytes; empty without one).
        remote: the peer's IP address.
    """

    method: str
    target: str
    headers: Headers
    body: bytes
    remote: str

    @property
    def path(self) -> str:
        """The target without its query."""
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> str:
        """The target's query (after `?`), or ``""``."""
        return self.target.partition("?")[2]

    def json(self) -> Any:
        """The body parsed as JSON.

        Raises:
            ValueError: the body is not UTF-8 JSON (`json.JSONDecodeError` is one).
        """
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole response. `Content-Length` is set by the front."""

    status: int
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b""

    @classmethod
    def text(cls, status: int, text: str) -> Reply:
        """A `text/plain` reply (say a fixed phrase: never echo a token or message text)."""
        return cls(status, (("Content-Type", "text/plain; charset=utf-8"),), text.encode())

    @classmethod
    def json(cls, status: int, value: object) -> Reply:
        """An `application/json` reply."""
        body = json.dumps(value, ensure_ascii=False).encode()
        return cls(status, (("Content-Type", "application/json"),), body)


@dataclass(frozen=True, slots=True)
class Stream:
    """A streamed response: `chunks` written as they come (HTTP/1.1 chunked encoding).

    `chunks` should be an async generator: when the peer goes away, or the hub shuts down,
    the front stops iterating and calls its `aclose()` (so a `finally:` in it runs, and an
    `await` it was blocked in raises `GeneratorExit`/cancellation). After a shutdown, or once
    the iterator is exhausted, the body ends cleanly (its last chunk); if the iterator raises,
    the connection is cut (the peer sees a body cut short) and the log names the route.
    Empty chunks are skipped.
    """

    chunks: AsyncIterator[bytes]
    status: int = 200
    headers: Sequence[tuple[str, str]] = EVENT_STREAM


Route = Callable[[FrontRequest], Awaitable[Reply | Stream]]
"""A route: takes a request, returns a `Reply` or a `Stream`. An exception gives 500."""


@dataclass(frozen=True, slots=True)
class _Entry:
    prefix: str
    route: Route
    methods: tuple[str, ...]
    cors: bool

    def matches(self, path: str) -> bool:
        if self.prefix.endswith("/"):
            return path.startswith(self.prefix)
        return path == self.prefix or path.startswith(self.prefix + "/")


# ---------------------------------------------------------------------- the front


class Front:
    """The hub's plain HTTP: the routes registered here, and `Http` for the rest.

    Args:
        hub: the hub whose settings and metrics apply (`closing`, the caps).
        http: the hub's other HTTP answers, and its origin and host rules.
        held: sockets per remote address (the hub's `max_waiting_per_address` caps): each
            open HTTP connection holds one.
    """

    def __init__(self, hub: Hub, http: Http, held: Caps) -> None:
        self._hub = hub
        self._http = http
        self._held = held
        self._routes: list[_Entry] = []
        self._handoff: MemoryObjectSendStream[tuple[_Conn, h11.Request]] | None = None
        self._doors: set[Door] = set()  # connections whose first head is not in yet
        self._conns: set[_Conn] = set()
        self._idle: anyio.Event | None = None  # set when `_conns` empties during `close`
        self.closing = False

    # -- the interface for routes

    def route(
        self,
        prefix: str,
        route: Route,
        *,
        methods: Sequence[str] = ("GET", "POST"),
        cors: bool = True,
    ) -> None:
        """Answer every request whose path is `prefix` or under it with `route`.

        A prefix ending in `/` matches the paths that start with it (`/v1/agui/`); one that
        does not matches itself and the paths under it (`/v1/aisdk`, `/v1/aisdk/c1/stream`).
        The longest matching prefix wins. Before the route is called the front checks what
        every request of the hub gets (a repeated Host/Origin/Authorization/Upgrade: 400; the
        Origin and Host rules: 403); a method not in `methods` gets 405 with `Allow`. With
        `cors`, a preflight (`OPTIONS` with `Access-Control-Request-Method`) from an allowed
        Origin is answered 204 here (the methods, the headers asked for, max-age 600), and
        every answer to a request with an Origin carries `Access-Control-Allow-Origin` (that
        origin), `Access-Control-Expose-Headers: *` and `Vary: Origin`.

        Raises:
            ValueError: `prefix` does not start with `/`, or has a route already.
        """
        if not prefix.startswith("/"):
            raise ValueError(f"a route's prefix starts with /: {prefix!r}")
        if any(entry.prefix == prefix for entry in self._routes):
            raise ValueError(f"{prefix!r} has a route already")
        entry = _Entry(prefix, route, tuple(m.upper() for m in methods), cors)
        self._routes.append(entry)
        self._routes.sort(key=lambda e: len(e.prefix), reverse=True)

    def connection_class(self, first_frame: int) -> type[ServerConnection]:
        """The connection class for websockets' `serve(create_connection=...)`: a
        `HubConnection` (first frame at most `first_frame` bytes) behind this front door."""
        return type("_Door", (Door,), {"front": self, "first_frame": first_frame})

    @property
    def open(self) -> int:
        """HTTP connections open now (in `max_connections`, with the websockets)."""
        return len(self._conns)

    # -- lifecycle

    def start(self, group: TaskGroup) -> None:
        """Serve connections in tasks of `group` (the listening socket's), from now on."""
        # asyncio's callbacks run outside any task, where anyio cannot start one: the door
        # hands each connection to a task of the group through this stream.
        send, receive = anyio.create_memory_object_stream[tuple[_Conn, h11.Request]](math.inf)
        self._handoff = send
        group.start_soon(self._serve_each, group, send, receive)

    async def _serve_each(
        self,
        group: TaskGroup,
        send: MemoryObjectSendStream[tuple[_Conn, h11.Request]],
        receive: MemoryObjectReceiveStream[tuple[_Conn, h11.Request]],
    ) -> None:
        async with send, receive:  # closed when the group ends
            try:
                async for conn, head in receive:
                    group.start_soon(conn.run, head)
            finally:
                self._handoff = None
                while True:  # handed over but never started: the group is ending
                    try:
                        conn, _ = receive.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                    conn.transport.abort()
                    self._gone(conn)

    async def stop_accepting(self, server: Server) -> None:
        """Take no more connections on `server` (the hub's websockets `Server`), then let
        those accepted already reach their protocol; call before `close`.

        asyncio's server, closed while a socket it accepted waits for its transport (one turn
        of the loop), drops that socket unclosed (`Server._attach` asserts): a browser's
        preconnect at shutdown left one open. So the listening sockets stop being read first,
        and two turns of the loop let what was accepted be made; `close` then cuts it."""
        loop = asyncio.get_running_loop()
        for sock in server.sockets:
            loop.remove_reader(sock.fileno())
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def close(self) -> None:
        """Stop serving: connections without a request head are cut, idle ones closed, a
        request being answered gets its answer (`Connection: close`), streams end with
        their last chunk; whatever is open after `CLOSE_DEADLINE` seconds is cut."""
        self.closing = True
        for door in list(self._doors):
            door.transport_abort()
        for conn in list(self._conns):
            conn.nudge()
        with anyio.move_on_after(CLOSE_DEADLINE):
            while self._conns:
                self._idle = anyio.Event()
                await self._idle.wait()
        for conn in list(self._conns):
            conn.transport.abort()

    # -- for `Door` and `_Conn`

    def _take(
        self, transport: asyncio.Transport, h11conn: h11.Connection, head: h11.Request
    ) -> None:
        if self._handoff is None:
            transport.abort()
            return
        conn = _Conn(self, transport, h11conn)
        transport.set_protocol(conn)
        self._conns.add(conn)
        self._hub.metrics.http_connections += 1
        self._handoff.send_nowait((conn, head))

    def _gone(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        self._hub.metrics.http_connections -= 1
        if not self._conns and self._idle is not None:
            self._idle.set()

    def _admit(self, address: str) -> str | None:
        """Hold a count for a new connection from `address`, or say why not (a 503)."""
        if self.closing or self._hub.closing:
            return "shutting down\n"
        metrics = self._hub.metrics
        if metrics.connections + metrics.http_connections > self._hub.config.max_connections:
            return "too many connections\n"  # (this one is counted already: >, not >=)
        if not self._held.acquire(address):
            return "too many connections from this address\n"
        return None

    def _release(self, address: str) -> None:
        self._held.release(address)

    def _entry(self, path: str) -> _Entry | None:
        for entry in self._routes:
            if entry.matches(path):
                return entry
        return None

    async def _answer(self, request: FrontRequest) -> Reply | Stream:
        """The answer to `request`: its route's, or `Http`'s."""
        ws_request = Request(request.target, request.headers, method=request.method)
        stand_in = cast(ServerConnection, _StandIn(request.remote))
        entry = self._entry(request.path)
        if entry is None:
            try:
                response = await self._http.respond(stand_in, ws_request)
            except Exception as exc:
                log.error("an HTTP request failed: %s", type(exc).__name__)
                return Reply.text(500, _FAILED)
            if response is None:  # an upgrade Http let through: not on this connection
                return Reply.text(400, "a websocket upgrade must open its own connection\n")
            return _reply_of(response)
        refused = self._http.refusal(stand_in, ws_request)
        if refused is not None:
            return _reply_of(refused)
        return await self._routed(entry, request)

    async def _routed(self, entry: _Entry, request: FrontRequest) -> Reply | Stream:
        origin = request.headers.get("Origin") if entry.cors else None
        asked = request.headers.get_all("Access-Control-Request-Method")
        if request.method == "OPTIONS" and origin is not None and asked:
            return _preflight(entry, origin, request.headers)
        if request.method not in entry.methods:
            allow = ", ".join(entry.methods)
            answer: Reply | Stream = Reply(
                405,
                (("Allow", allow), ("Content-Type", "text/plain; charset=utf-8")),
                f"method not allowed (allowed: {allow})\n".encode(),
            )
        else:
            try:
                answer = await entry.route(request)
            except Exception as exc:
                log.error("route %s failed: %s", entry.prefix, type(exc).__name__)
                answer = Reply.text(500, _FAILED)
        if origin is not None:
            extra = (
                ("Access-Control-Allow-Origin", origin),
                ("Access-Control-Expose-Headers", "*"),
                ("Vary", "Origin"),
            )
            if isinstance(answer, Stream):
                answer = Stream(answer.chunks, answer.status, (*answer.headers, *extra))
            else:
                answer = Reply(answer.status, (*answer.headers, *extra), answer.body)
        return answer


def _preflight(entry: _Entry, origin: str, headers: Headers) -> Reply:
    asked = ",".join(headers.get_all("Access-Control-Request-Headers"))
    names = [name.strip().lower() for name in asked.split(",") if name.strip()]
    if not all(_TOKEN.match(name) for name in names):
        return Reply.text(400, "bad Access-Control-Request-Headers\n")
    allowed = [
        ("Access-Control-Allow-Origin", origin),
        ("Access-Control-Allow-Methods", ", ".join(entry.methods)),
        ("Access-Control-Max-Age", "600"),
        ("Vary", "Origin"),
    ]
    if names:
        allowed.append(("Access-Control-Allow-Headers", ", ".join(names)))
    return Reply(204, tuple(allowed))


class _StandIn:
    """The bits of websockets' `ServerConnection` that `Http.respond` uses."""

    def __init__(self, address: str) -> None:
        self.remote_address = (address, 0)

    def respond(self, status: int, text: str) -> Response:
        code = HTTPStatus(status)
        body = text.encode()
        headers = Headers(
            [("Content-Length", str(len(body))), ("Content-Type", "text/plain; charset=utf-8")]
        )
        return Response(code.value, code.phrase, headers, body)


def _reply_of(response: Response) -> Reply:
    headers = tuple(
        (name, value)
        for name, value in response.headers.raw_items()
        if name.lower() not in ("connection", "content-length", "date", "server")
    )
    return Reply(response.status_code, headers, bytes(response.body or b""))


# ---------------------------------------------------------------------- the door


class Door(HubConnection):
    """A hub connection that reads the first request head before websockets sees it.

    A websocket upgrade (or a head h11 refuses: websockets answers it as before) goes on as
    a `HubConnection`; any other request moves the transport to the front's HTTP protocol.
    The head must come within `open_timeout` seconds, or the connection is cut.
    """

    front: Front
    """Set on the subclass `Front.connection_class` makes."""

    def __init__(self, protocol: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(protocol, *args, **kwargs)
        self._sniff: h11.Connection | None = h11.Connection(
            h11.SERVER, max_incomplete_event_size=MAX_HEAD
        )
        self._seen = bytearray()
        self._door: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._door = cast(asyncio.Transport, transport)
        if self.front.closing:  # accepted while the hub shuts down (a browser's preconnect)
            self._door.abort()
            return
        timeout = self.front._hub.config.open_timeout
        self._timer = asyncio.get_running_loop().call_later(timeout, self.transport_abort)
        self.front._doors.add(self)

    def transport_abort(self) -> None:
        """Cut the connection (no head in time, or the hub shutting down)."""
        if self._sniff is not None and self._door is not None:
            self._door.abort()

    def data_received(self, data: bytes) -> None:
        sniff = self._sniff
        if sniff is None:
            super().data_received(data)
            return
        self._seen += data
        sniff.receive_data(data)
        try:
            event = sniff.next_event()
        except h11.RemoteProtocolError:
            self._to_websockets()
            return
        if event is h11.NEED_DATA:
            return
        if isinstance(event, h11.Request) and not _is_upgrade(event):
            self._settle()
            assert self._door is not None
            self.front._take(self._door, sniff, event)
        else:
            self._to_websockets()

    def eof_received(self) -> None:
        if self._sniff is None:
            super().eof_received()
        # else no head came: returning None, asyncio closes the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._sniff is None:
            super().connection_lost(exc)
        else:
            self._settle()

    def _settle(self) -> None:
        self._sniff = None
        if self._timer is not None:
            self._timer.cancel()
        self.front._doors.discard(self)

    def _to_websockets(self) -> None:
        seen = bytes(self._seen)
        self._seen = bytearray()
        self._settle()
        assert self._door is not None
        super().connection_made(self._door)  # websockets' handler starts here
        super().data_received(seen)


def _is_upgrade(head: h11.Request) -> bool:
    upgrades = [value for name, value in head.headers if name == b"upgrade"]
    return len(upgrades) > 1 or (len(upgrades) == 1 and upgrades[0].lower() == b"websocket")


# ---------------------------------------------------------------------- one HTTP connection


class _Conn(asyncio.Protocol):
    """One HTTP connection after its first head: requests answered in turn (h11)."""

    def __init__(self, front: Front, transport: asyncio.Transport, parser: h11.Connection) -> None:
        self.front = front
        self.transport = transport
        self.parser = parser
        self.config = front._hub.config
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if peer else "?"
        self._tls = transport.get_extra_info("sslcontext") is not None
        # asyncio's events: asyncio's callbacks set them (anyio's need a task to be made in).
        self._wake = asyncio.Event()  # bytes came, or the peer or the front closed
        self._resumed = asyncio.Event()  # the transport's write buffer drained
        self._gone = asyncio.Event()  # the peer closed, or the front is closing
        self._write_paused = False
        self._read_paused = False
        self._waiting = False  # the task waits for bytes
        self._backlog = 0  # bytes come while the task did not wait for them
        self._eof = False
        self._lost = False

    # -- asyncio's callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        pass  # made by the door: `transport` is ours already

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.receive_data(data)
        except RuntimeError:  # after the peer's end: drop
            return
        if not self._waiting:
            self._backlog += len(data)
            if self._backlog > _BACKLOG and not self._read_paused:
                self._read_paused = True
                self.transport.pause_reading()
        self._wake.set()

    def eof_received(self) -> bool:
        self._eof = True
        self.parser.receive_data(b"")
        self._wake.set()
        self._gone.set()  # a peer that ends its side mid-stream is gone
        return not self._tls  # an answer under way may still be written (not over TLS)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._wake.set()
        self._gone.set()
        self._resumed.set()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._resumed.clear()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._resumed.set()

    def nudge(self) -> None:
        """The front is closing: wake a connection waiting for its next request."""
        self._wake.set()
        self._gone.set()

    # -- the connection's task

    async def run(self, head: h11.Request) -> None:
        refused = self.front._admit(self.address)
        try:
            if refused is not None:
                await self._refuse(head, refused)
                return
            try:
                event: h11.Request | None = head
                while event is not None and not self._lost:
                    if not await self._serve(event):
                        break
                    self.parser.start_next_cycle()
                    event = await self._next_head()
            finally:
                self.front._release(self.address)
        except Exception as exc:  # a bug of ours: this connection goes, the hub stays
            log.error("an HTTP connection failed: %s", type(exc).__name__)
        finally:
            if not self._lost:
                self.transport.close()
            self.front._gone(self)

    async def _refuse(self, head: h11.Request, why: str) -> None:
        """Answer the one request of a connection over a cap, then close (`/healthz` is
        answered anyway: load balancers probe a full hub too)."""
        if head.target.split(b"?", 1)[0] == b"/healthz":
            await self._send(Reply.text(200, "ok\n"), close=True)
        else:
            await self._send(Reply.text(503, why), close=True)

    async def _next_head(self) -> h11.Request | None:
        """The next request's head, or None: the peer closed, sent garbage (answered 400),
        was idle `keepalive_timeout` seconds, or was slower than `open_timeout` with it."""
        now = anyio.current_time()
        idle_until = now + self.config.keepalive_timeout
        head_until: float | None = now + self.config.open_timeout if self._pending() else None
        while True:
            try:
                event = self.parser.next_event()
            except h11.RemoteProtocolError as error:
                await self._bad(error)
                return None
            if isinstance(event, h11.Request):
                return event
            if event is not h11.NEED_DATA or self._eof or self._lost:
                return None
            if self.front.closing and head_until is None:
                return None
            if head_until is None and self._pending():
                head_until = anyio.current_time() + self.config.open_timeout
            if not await self._more(head_until if head_until is not None else idle_until):
                return None

    def _pending(self) -> bool:
        return bool(self.parser.trailing_data[0])

    async def _more(self, until: float) -> bool:
        """Wait for more bytes until `until` (anyio time); False on time out or close."""
        self._wake.clear()
        self._waiting = True
        self._backlog = 0
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        try:
            with anyio.move_on_after(until - anyio.current_time()):
                await self._wake.wait()
                return not self._lost
            return False
        finally:
            self._waiting = False

    async def _bad(self, error: h11.RemoteProtocolError) -> None:
        if self.parser.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            status = error.error_status_hint if 400 <= error.error_status_hint < 500 else 400
            await self._send(Reply.text(status, "bad request\n"), close=True)

    async def _serve(self, head: h11.Request) -> bool:
        """Read `head`'s body, answer it; whether the connection may serve another."""
        try:
            method = head.method.decode("ascii")
            target = head.target.decode("ascii")
        except UnicodeDecodeError:
            await self._send(Reply.text(400, "bad request\n"), close=True)
            return False
        headers = Headers(
            [(n.decode("latin-1"), v.decode("latin-1")) for n, v in head.headers.raw_items()]
        )
        body = await self._body(head)
        if not isinstance(body, bytes):
            if body is not None:
                await self._send(body, close=True)
            return False
        request = FrontRequest(method, target, headers, body, self.address)
        answer = await self.front._answer(request)
        if isinstance(answer, Stream):
            return await self._stream(answer)
        return await self._send(answer, head=method == "HEAD")

    async def _body(self, head: h11.Request) -> bytes | Reply | None:
        """`head`'s body, a 413/408/400 to answer, or None (the peer went)."""
        limit = self.config.max_body
        lengths = [v for n, v in head.headers if n == b"content-length"]
        if lengths and int(lengths[0]) > limit:
            return Reply.text(413, f"request body over {limit} bytes\n")
        if self.parser.they_are_waiting_for_100_continue:
            await self._write(h11.InformationalResponse(status_code=100, headers=[]))
        until = anyio.current_time() + self.config.open_timeout
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                event = self.parser.next_event()
            except h11.RemoteProtocolError:
                return Reply.text(400, "bad request body\n")
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > limit:
                    return Reply.text(413, f"request body over {limit} bytes\n")
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            elif event is h11.NEED_DATA and not self._eof and not self._lost:
                if not await self._more(until):
                    return None if self._lost else Reply.text(408, "request body too slow\n")
            else:
                return None

    def _head_of(
        self, status: int, headers: Sequence[tuple[str, str]], close: bool
    ) -> h11.Response:
        out = [(n, v) for n, v in headers if n.lower() not in ("connection", "date", "server")]
        out.append(("Date", email.utils.formatdate(usegmt=True)))
        out.append(("Server", SERVER))
        if close or self.front.closing:
            out.append(("Connection", "close"))
        return h11.Response(status_code=status, headers=out)

    async def _send(self, reply: Reply, *, head: bool = False, close: bool = False) -> bool:
        """Write `reply`; whether the connection may serve another request."""
        bodyless = reply.status in (204, 304) or reply.status < 200
        headers = [(n, v) for n, v in reply.headers if n.lower() != "content-length"]
        if not bodyless:
            headers.append(("Content-Length", str(len(reply.body))))
        await self._write(self._head_of(reply.status, headers, close))
        if reply.body and not (head or bodyless):
            await self._write(h11.Data(data=reply.body))
        await self._write(h11.EndOfMessage())
        return self._reusable()

    def _reusable(self) -> bool:
        return (
            not self._lost
            and not self.front.closing
            and self.parser.our_state is h11.DONE
            and self.parser.their_state is h11.DONE
        )

    async def _stream(self, stream: Stream) -> bool:
        """Write `stream` until its iterator ends, the peer goes or the hub closes."""
        headers = [(n, v) for n, v in stream.headers if n.lower() != "content-length"]
        await self._write(self._head_of(stream.status, headers, close=False))
        failed = False
        chunks = stream.chunks
        try:
            async with anyio.create_task_group() as group:

                async def until_gone() -> None:
                    await self._gone.wait()
                    group.cancel_scope.cancel()

                group.start_soon(until_gone)
                try:
                    async for chunk in chunks:
                        if chunk:
                            await self._write(h11.Data(data=chunk))
                except Exception as exc:
                    log.error("a stream failed: %s", type(exc).__name__)
                    failed = True
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                closer = getattr(chunks, "aclose", None)
                if closer is not None:
                    try:
                        await closer()
                    except Exception as exc:
                        log.error("closing a stream failed: %s", type(exc).__name__)
        if failed or self._lost or self._eof:
            self.transport.abort()
            return False
        await self._write(h11.EndOfMessage())
        return self._reusable()

    async def _write(self, event: h11.Event) -> None:
        """Frame `event` (h11) and write it, waiting while the peer does not read."""
        if self._lost:
            return
        data = self.parser.send(event)
        if data:
            self.transport.write(data)
        if self._write_paused:
            with anyio.move_on_after(SEND_DEADLINE):
                await self._resumed.wait()
            if self._write_paused and not self._lost:
                self.transport.abort()  # a peer that stopped reading
