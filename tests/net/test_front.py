"""The hub's HTTP/1.1 front door (`server.front`): routes with bodies and streamed answers,
keep-alive, the limits (body size, slow heads, idle connections, caps), shutdown."""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import h11
import pytest
from anyio.abc import ByteStream
from anyio.streams.tls import TLSStream
from certs import self_signed
from conftest import bound, hub_config
from websockets.asyncio.client import connect as ws_connect

from server import Hub
from server.front import FrontRequest, Reply, Stream
from server.store import MemoryStore
from sync.protocol import SUBPROTOCOL

SECRET_TEXT = "the-user-said-something-private"


class Client:
    """One TCP connection to the hub, spoken to with h11 (as a client)."""

    def __init__(self, stream: ByteStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    async def send(self, *events: h11.Event) -> None:
        for event in events:
            await self.stream.send(self.h11.send(event) or b"")

    async def request(
        self, method: str, target: str, body: bytes = b"", headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        sent = [("Host", "127.0.0.1"), *headers]
        if body or method == "POST":
            sent.append(("Content-Length", str(len(body))))
        await self.send(h11.Request(method=method, target=target, headers=sent))
        if body:
            await self.send(h11.Data(data=body))
        await self.send(h11.EndOfMessage())

    async def event(self) -> Any:
        """The next event from the hub (`h11.ConnectionClosed` once it closed)."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                data = b""
            self.h11.receive_data(data)

    async def response(self) -> tuple[h11.Response, bytes]:
        """A whole response: its head and body."""
        head = await self.event()
        assert isinstance(head, h11.Response), head
        body = b""
        while not isinstance(event := await self.event(), h11.EndOfMessage):
            assert isinstance(event, h11.Data), event
            body += event.data
        return head, body

    def next_cycle(self) -> None:
        self.h11.start_next_cycle()


_OPEN: list[Client] = []


async def client(hub: Hub) -> Client:
    """A new connection to `hub` (closed by `running`'s exit)."""
    opened = Client(await anyio.connect_tcp("127.0.0.1", hub.port))
    _OPEN.append(opened)
    return opened


def header(head: h11.Response, name: str) -> str | None:
    values = [v.decode() for n, v in head.headers if n == name.lower().encode()]
    return values[0] if values else None


class Echo:
    """An SSE echo route: `{"lines": [...]}` back as `data:` events, then (with `"hold"`)
    the stream waits until the peer goes; it records what it saw."""

    def __init__(self) -> None:
        self.closed = anyio.Event()
        self.bodies: list[bytes] = []
        self.remotes: list[str] = []

    async def __call__(self, request: FrontRequest) -> Reply | Stream:
        self.bodies.append(request.body)
        self.remotes.append(request.remote)
        if request.path == "/v1/echo/fail":
            raise RuntimeError(SECRET_TEXT)
        if request.method == "GET":
            return Reply.json(200, {"query": request.query})
        asked = request.json()
        return Stream(self._events(asked["lines"], bool(asked.get("hold"))))

    async def _events(self, lines: list[str], hold: bool) -> AsyncIterator[bytes]:
        try:
            for line in lines:
                yield f"data: {json.dumps(line)}\n\n".encode()
            if hold:
                await anyio.sleep_forever()
        finally:
            self.closed.set()


@contextlib.asynccontextmanager
async def running(echo: Echo, **config: object) -> AsyncIterator[Hub]:
    """A hub with `echo` at `/v1/echo`; the test's client connections closed after it."""
    hub = Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config(**config))
    hub.front.route("/v1/echo", echo)
    try:
        async with hub:
            yield hub
    finally:
        while _OPEN:
            await _OPEN.pop().stream.aclose()


async def test_a_route_reads_the_body_streams_and_the_connection_serves_again() -> None:
    """An SSE route answers a POST body chunk by chunk; the same connection then serves a
    route GET and the hub's own routes (kept alive, not reopened)."""
    echo = Echo()
    async with running(echo) as hub:
        with anyio.fail_after(bound(10)):
            c = await client(hub)
            await c.request("POST", "/v1/echo", json.dumps({"lines": ["a", "b c"]}).encode())
            head, body = await c.response()
            assert head.status_code == 200
            assert header(head, "content-type") == "text/event-stream"
            assert header(head, "transfer-encoding") == "chunked"
            assert body == b'data: "a"\n\ndata: "b c"\n\n'
            assert echo.bodies == [b'{"lines": ["a", "b c"]}']
            assert echo.remotes == ["127.0.0.1"]
            assert echo.closed.is_set()
            c.next_cycle()
            await c.request("GET", "/v1/echo/x?y=1")
            head, body = await c.response()
            assert (head.status_code, json.loads(body)) == (200, {"query": "y=1"})
            c.next_cycle()
            await c.request("GET", "/healthz")
            head, body = await c.response()
            assert (head.status_code, body) == (200, b"ok\n")
            c.next_cycle()
            await c.request("GET", "/v1/conversations/nope-1")
            head, body = await c.response()
            assert (head.status_code, body) == (404, b"no such conversation\n")
            assert header(head, "connection") is None  # kept alive
            await c.stream.aclose()


async def test_a_peer_that_goes_mid_stream_closes_the_iterator() -> None:
    """A client that hangs up while a stream waits closes the route's iterator (its
    `finally` runs)."""
    echo = Echo()
    async with running(echo) as hub:
        with anyio.fail_after(bound(10)):
            c = await client(hub)
            await c.request("POST", "/v1/echo", b'{"lines": ["first"], "hold": true}')
            head = await c.event()
            assert head.status_code == 200
            first = await c.event()
            assert first.data == b'data: "first"\n\n'
            assert not echo.closed.is_set()
            assert hub.metrics.http_connections == 1
            await c.stream.aclose()
            await echo.closed.wait()


async def test_a_body_over_max_body_gets_413_and_the_connection_closes() -> None:
    """A body over `max_body` is refused 413 whether its length is declared or chunked;
    the route never sees it; a body at the limit is read."""
    echo = Echo()
    async with running(echo, max_body=100) as hub:
        with anyio.fail_after(bound(10)):
            c = await client(hub)
            await c.request("POST", "/v1/echo", b"x" * 101)
            head, body = await c.response()
            assert (head.status_code, body) == (413, b"request body over 100 bytes\n")
            assert header(head, "connection") == "close"
            c = await client(hub)
            await c.send(
                h11.Request(
                    method="POST",
                    target="/v1/echo",
                    headers=[("Host", "127.0.0.1"), ("Transfer-Encoding", "chunked")],
                )
            )
            for _ in range(3):
                await c.send(h11.Data(data=b"y" * 40))
            head, body = await c.response()
            assert head.status_code == 413
            c = await client(hub)
            at_limit = json.dumps({"lines": ["z" * 80]}).encode()
            at_limit += b" " * (100 - len(at_limit))
            await c.request("POST", "/v1/echo", at_limit)
            head, _ = await c.response()
            assert head.status_code == 200
            assert echo.bodies == [at_limit]


async def test_a_slow_head_and_an_idle_connection_are_closed() -> None:
    """A head not in within `open_timeout` and a kept-alive connection idle past
    `keepalive_timeout` are both closed by the hub."""
    echo = Echo()
    async with running(echo, open_timeout=0.3, keepalive_timeout=0.3) as hub:
        with anyio.fail_after(bound(10)):
            c = await client(hub)
            await c.stream.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert type(await c.event()) is h11.ConnectionClosed
            c = await client(hub)
            await c.request("GET", "/healthz")
            head, _ = await c.response()
            assert head.status_code == 200
            c.next_cycle()
            assert type(await c.event()) is h11.ConnectionClosed  # idle: closed
            c = await client(hub)  # a slow head on a kept-alive connection too
            await c.request("GET", "/healthz")
            await c.response()
            await c.stream.send(b"GET /healthz HTTP/1.1\r\n")
            c.next_cycle()
            assert type(await c.event()) is h11.ConnectionClosed


async def test_a_failing_route_gets_500_and_the_log_names_no_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A route that raises gets a fixed 500 phrase; the log line names the route and the
    exception's type, never its message."""
    echo = Echo()
    caplog.set_level(logging.DEBUG)
    async with running(echo) as hub:
        with anyio.fail_after(bound(10)):
            c = await client(hub)
            await c.request("GET", "/v1/echo/fail")
            head, body = await c.response()
            assert (head.status_code, body) == (500, b"the hub failed on this request\n")
    assert "route /v1/echo failed: RuntimeError" in caplog.text
    assert SECRET_TEXT not in caplog.text


async def test_preflight_and_origins_follow_the_hub_rules() -> None:
    """A preflight from an allowed origin gets 204 with the methods and headers asked; a
    request from another origin gets 403 before the route; answers carry the origin."""
    echo = Echo()
    allowed = "https://app.example.com"
    async with running(echo, allow_origin=(allowed,)) as hub:
        with anyio.fail_after(bound(10)):
            c = await client(hub)
            asked = [
                ("Origin", allowed),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "content-type, Authorization"),
            ]
            await c.request("OPTIONS", "/v1/echo", headers=asked)
            head, _ = await c.response()
            assert head.status_code == 204
            assert header(head, "access-control-allow-origin") == allowed
            assert header(head, "access-control-allow-methods") == "GET, POST"
            assert header(head, "access-control-allow-headers") == "content-type, authorization"
            c.next_cycle()
            await c.request("GET", "/v1/echo", headers=[("Origin", allowed)])
            head, _ = await c.response()
            assert head.status_code == 200
            assert header(head, "access-control-allow-origin") == allowed
            c.next_cycle()
            await c.request("OPTIONS", "/v1/echo", headers=[("Origin", "https://evil.example")])
            head, body = await c.response()
            assert (head.status_code, body) == (403, b"origin not allowed\n")
            c.next_cycle()
            await c.request("DELETE", "/v1/echo")
            head, _ = await c.response()
            assert (head.status_code, header(head, "allow")) == (405, "GET, POST")
    assert len(echo.bodies) == 1  # only the GET reached the route


async def test_shutdown_ends_a_stream_with_its_last_chunk() -> None:
    """The hub shutting down closes a waiting stream's iterator and ends the body cleanly
    (the last chunk, then the connection closes)."""
    echo = Echo()
    async with running(echo) as hub:
        with anyio.fail_after(bound(10)):
            c = await client(hub)
            await c.request("POST", "/v1/echo", b'{"lines": ["one"], "hold": true}')
            assert (await c.event()).status_code == 200
            assert (await c.event()).data == b'data: "one"\n\n'
            await hub.aclose()
            assert echo.closed.is_set()
            assert type(await c.event()) is h11.EndOfMessage
            c.next_cycle()
            assert type(await c.event()) is h11.ConnectionClosed


async def test_websockets_still_open_on_the_same_port() -> None:
    """A websocket upgrade goes to websockets as before, next to keep-alive HTTP."""
    echo = Echo()
    async with running(echo) as hub:
        with anyio.fail_after(bound(10)):
            c = await client(hub)
            await c.request("GET", "/healthz")
            await c.response()
            async with ws_connect(
                f"{hub.url}/v1/conversations/front-1", subprotocols=[SUBPROTOCOL]
            ) as ws:
                await ws.send(json.dumps({"type": "ping"}))
                assert json.loads(await ws.recv())["type"] in ("error", "pong")
            c.next_cycle()
            await c.request("GET", "/healthz")
            head, _ = await c.response()
            assert head.status_code == 200


async def test_connections_over_the_caps_get_503_but_healthz_answers() -> None:
    """Open HTTP connections count per address and in `max_connections`: one more gets 503
    (`/healthz` is answered anyway), and once one closes a new one is served."""
    echo = Echo()
    async with running(echo, max_waiting_per_address=2) as hub:
        with anyio.fail_after(bound(10)):
            held = [await client(hub), await client(hub)]
            for c in held:
                await c.request("GET", "/v1/echo")
                assert (await c.response())[0].status_code == 200
            assert hub.metrics.http_connections == 2
            c = await client(hub)
            await c.request("GET", "/v1/echo")
            head, body = await c.response()
            assert (head.status_code, body) == (503, b"too many connections from this address\n")
            c = await client(hub)
            await c.request("GET", "/healthz")
            assert (await c.response())[0].status_code == 200
            await held[0].stream.aclose()
            for _ in range(200):  # the hub sees the close a moment later
                c = await client(hub)
                await c.request("GET", "/v1/echo")
                if (await c.response())[0].status_code == 200:
                    break
                await anyio.sleep(0.02)
            else:
                raise AssertionError("a closed connection was never given back")
    async with running(echo, max_connections=1) as hub:
        with anyio.fail_after(bound(10)):
            first = await client(hub)
            await first.request("GET", "/v1/echo")
            assert (await first.response())[0].status_code == 200
            c = await client(hub)
            await c.request("GET", "/v1/echo")
            head, body = await c.response()
            assert (head.status_code, body) == (503, b"too many connections\n")


async def test_pipelined_requests_are_answered_in_order_and_head_has_no_body() -> None:
    """Two requests sent at once are answered one after the other on the connection; a
    HEAD gets the GET's headers (its Content-Length) without the body, and the connection
    goes on."""
    echo = Echo()
    async with running(echo) as hub:
        with anyio.fail_after(bound(10)):
            c = await client(hub)
            host = [("Host", "127.0.0.1")]
            get = h11.Request(method="GET", target="/healthz", headers=host)
            head_only = h11.Request(method="HEAD", target="/v1/conversations/nope-2", headers=host)
            await c.stream.send(  # both at once: h11 (the client's) would wait for an answer
                b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                b"HEAD /v1/conversations/nope-2 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            )
            c.h11.send(get)  # the client's parser told what was sent, to read the answers
            c.h11.send(h11.EndOfMessage())
            head, body = await c.response()
            assert (head.status_code, body) == (200, b"ok\n")
            c.next_cycle()
            c.h11.send(head_only)
            c.h11.send(h11.EndOfMessage())
            head, body = await c.response()
            assert (head.status_code, body) == (404, b"")
            assert header(head, "content-length") == str(len(b"no such conversation\n"))
            c.next_cycle()  # and no stray body bytes after the HEAD's answer
            await c.request("GET", "/healthz")
            head, body = await c.response()
            assert (head.status_code, body) == (200, b"ok\n")


async def test_over_tls_a_stream_and_keep_alive_work_too(tmp_path: Path) -> None:
    """With `tls_cert`, plain HTTPS requests reach the front too: a stream, then another
    request on the same TLS connection."""
    cert, key = self_signed(tmp_path)
    echo = Echo()
    async with running(echo, tls_cert=cert, tls_key=key) as hub:
        with anyio.fail_after(bound(10)):
            context = ssl.create_default_context(cafile=cert)
            tcp = await anyio.connect_tcp("127.0.0.1", hub.port)
            c = Client(await TLSStream.wrap(tcp, hostname="127.0.0.1", ssl_context=context))
            _OPEN.append(c)
            await c.request("POST", "/v1/echo", b'{"lines": ["secure"]}')
            head, body = await c.response()
            assert (head.status_code, body) == (200, b'data: "secure"\n\n')
            c.next_cycle()
            await c.request("GET", "/healthz")
            head, body = await c.response()
            assert (head.status_code, body) == (200, b"ok\n")


async def test_a_body_slower_than_open_timeout_gets_408() -> None:
    """A body that does not arrive within `open_timeout` of its head gets 408 and the
    connection closes; the route never sees it."""
    echo = Echo()
    async with running(echo, open_timeout=0.3) as hub:
        with anyio.fail_after(bound(10)):
            c = await client(hub)
            head_sent = [("Host", "127.0.0.1"), ("Content-Length", "10")]
            await c.send(h11.Request(method="POST", target="/v1/echo", headers=head_sent))
            await c.send(h11.Data(data=b"abc"))
            head, body = await c.response()
            assert (head.status_code, body) == (408, b"request body too slow\n")
            assert header(head, "connection") == "close"
    assert echo.bodies == []


async def test_connections_arriving_while_the_hub_shuts_down_are_all_closed() -> None:
    """Sockets that connect while the hub shuts down (a browser's preconnect) are each closed
    by the hub: every one reads its end (asyncio's server, closed while an accepted socket
    waited for its transport, used to drop that socket unclosed, never answered)."""
    for _ in range(20):  # the window is hit in some rounds only: many rounds
        clients: list[anyio.abc.SocketStream] = []
        hub = Hub(MemoryStore(), port=0, config=hub_config())
        async with anyio.create_task_group() as group:
            async with hub:

                async def keep_connecting(
                    port: int = hub.port, made: list[anyio.abc.SocketStream] = clients
                ) -> None:
                    while True:
                        try:
                            made.append(await anyio.connect_tcp("127.0.0.1", port))
                        except OSError:
                            return

                group.start_soon(keep_connecting)
                await anyio.sleep(0.05)
            group.cancel_scope.cancel()
        assert clients
        for client in clients:
            with anyio.fail_after(bound(5)):  # a socket the hub dropped unclosed never ends
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    while await client.receive():
                        pass
            await client.aclose()
