"""`Http`: the hub's answers to plain HTTP requests, and its checks of every handshake.

How this works: websockets hands every request to `respond` before a websocket handshake
(`process_request`). A repeated header the hub reads is refused (400); `/healthz` answers
anyone; then the origin and host rules apply (SPEC 6). A websocket upgrade is let through
unless the hub is shutting down or full (503); bad ids and tokens are answered on the socket.
Plain requests go to the viewer and the conversation list first (`server.web.Web`), then
`/metrics`, `/v1/retain` and `/v1/conversations/{id}` (`GET`, `HEAD`, `DELETE`). No token is
ever logged: every refusal's detail is a fixed phrase.

Async API: none of its own (it only awaits the hub's calls: no tasks, events or timers here).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import time
import urllib.parse
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .auth import ANONYMOUS, AuthError, Grant, bearer_token, verify
from .limits import Caps, host_allowed, origin_allowed, own_origins
from .session import conversation_id_of, is_conversation_id
from .store import StoreError
from .web import Web

if TYPE_CHECKING:
    from .hub import Hub

__all__ = ["RETAIN_PATH", "Http", "remote_address"]

log = logging.getLogger("convsync.hub")

RETAIN_PATH = "/v1/retain"
"""`GET` lists idle conversations (`?days=N`), `POST` deletes them (SPEC 15)."""

_SINGLE_HEADERS = ("Host", "Origin", "Authorization", "Upgrade")
"""Headers the hub reads that a request must not repeat (HTTP 400)."""


class Http:
    """The HTTP routes of `hub`.

    Args:
        hub: the hub whose settings, keys, metrics and conversations are served.
        web: the viewer and the conversation list, asked first.
        waiting: the sockets each address has waiting for a hello (a handshake over the
            limit gets 503).
    """

    def __init__(self, hub: Hub, web: Web, waiting: Caps) -> None:
        self._hub = hub
        self._web = web
        self._waiting = waiting
        self._own_origins: set[str] = set()
        config = hub.config
        self._public_host = urlsplit(config.public_url).hostname if config.public_url else None

    def bound(self, port: int, *, tls: bool) -> None:
        """The hub listens on `port`: its own origins (allowed without `allow_origin`) follow."""
        self._own_origins = own_origins(self._hub.config.public_url, port, tls=tls)

    async def respond(self, connection: ServerConnection, request: Request) -> Response | None:
        """The answer to `request` (websockets' `process_request`); None lets a websocket
        handshake go on."""
        path = request.path.split("?", 1)[0]
        headers = request.headers
        repeated = _repeated(connection, headers)
        if repeated is not None:
            return repeated
        upgrade = headers.get("Upgrade", "").lower() == "websocket"
        if path == "/healthz" and not upgrade:
            return connection.respond(200, "ok\n")  # open: load balancers probe by address
        denied = self._origin_or_host(connection, headers)
        if denied is not None:
            return denied
        if upgrade:
            metrics = self._hub.metrics
            if self._hub.closing:
                return connection.respond(503, "shutting down\n")
            if metrics.connections + metrics.http_connections >= self._hub.config.max_connections:
                return connection.respond(503, "too many connections\n")
            if self._waiting.count(remote_address(connection)) >= self._waiting.limit:
                return connection.respond(503, "too many sockets waiting for hello\n")
            return None  # the handshake goes on; bad ids and tokens are answered on the socket
        response = await self._web.respond(connection, request)  # the viewer and the list
        if response is not None:
            return response
        if path == "/metrics":
            wanted = self._hub.config.metrics_token
            if wanted is not None:
                given = bearer_token(headers.get("Authorization")) or ""
                if not hmac.compare_digest(given.encode(), wanted.encode()):
                    return connection.respond(401, "metrics need the metrics token\n")
            response = connection.respond(200, self._hub.metrics.render())
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
        keys = self._hub.keys
        if keys is not None:
            token = bearer_token(headers.get("Authorization"))
            try:
                grant = verify(token, keys, now=time.time(), audience=self._hub.config.audience)
                grant.require(conversation_id, "read")
            except AuthError as refused:
                status = 401 if refused.code == "unauthorized" else 403
                return connection.respond(status, f"{refused.code}: {refused.detail}\n")
        room = await self._hub.room_for_read(conversation_id)
        if room is None:
            return connection.respond(404, "no such conversation\n")
        async with room.lock:
            body = room.snapshot_json()
        response_headers = Headers(
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        )
        return Response(200, "OK", response_headers, body)

    def refusal(self, connection: ServerConnection, request: Request) -> Response | None:
        """The 400 (a repeated header the hub reads) or 403 (the origin and host rules) every
        request gets before its route (`server.front`), or None."""
        return _repeated(connection, request.headers) or self._origin_or_host(
            connection, request.headers
        )

    def _origin_or_host(self, connection: ServerConnection, headers: Headers) -> Response | None:
        if not origin_allowed(
            headers.get("Origin"), self._hub.config.allow_origin, self._own_origins
        ):
            return connection.respond(403, "origin not allowed\n")
        if not host_allowed(headers.get("Host"), self._public_host, self._hub.auth):
            return connection.respond(
                403, "host not allowed (use a loopback name or the public url)\n"
            )
        return None

    def _admin_grant(
        self, connection: ServerConnection, request: Request, conversation_id: str | None
    ) -> Grant | Response:
        """The grant of a request that needs `admin` (on `conversation_id`, when given), or
        the 401/403 answer. Without auth: `ANONYMOUS`, which may do anything."""
        keys = self._hub.keys
        if keys is None:
            return ANONYMOUS
        token = bearer_token(request.headers.get("Authorization"))
        try:
            grant = verify(token, keys, now=time.time(), audience=self._hub.config.audience)
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
            deleted = await self._hub.delete(conversation_id)
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
            listed = await self._hub.idle_conversations(days, now)
            idle = [(cid, at) for cid, at in listed if grant.allows(cid)]
            if method != "POST":
                return _json_response({"idle": [{"id": cid, "last": at} for cid, at in idle]})
            deleted = await self._hub.delete_all([cid for cid, _ in idle], now)
        except StoreError as exc:
            log.warning("a retention request failed: %s", exc)
            return connection.respond(503, "the store failed; try again\n")
        return _json_response({"deleted": deleted})


def remote_address(connection: ServerConnection) -> str:
    """The remote IP address of a connection (its port differs per socket)."""
    remote = connection.remote_address
    return str(remote[0]) if remote else "?"


def _repeated(connection: ServerConnection, headers: Headers) -> Response | None:
    for name in _SINGLE_HEADERS:
        # Headers.get raises MultipleValuesError on a repeated header (a 500); which of
        # two Hosts or Origins a proxy checked is anyone's guess, so neither is taken.
        if len(headers.get_all(name)) > 1:
            return connection.respond(400, f"{name} given more than once\n")
    return None


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
