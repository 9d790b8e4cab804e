"""The hub's web surface: the viewer's static files, the conversation list and its live feed.

How this works: `Web` answers plain HTTP requests the hub hands it (`respond`) and serves the
`/v1/summary` websocket (`serve_summary`). It owns no conversation state: a summary row is read
from a room, when its lock is free (so the row never shows a batch whose append is still under
way), loaded for the read if need be. The hub calls `touched(room)` after every join, push,
leave, rewrite and move of a room; each summary socket collects the rooms touched since its last
tick and, every `SUMMARY_INTERVAL` seconds, sends the rows of those that changed, so diffs are
coalesced to at most one per conversation per interval. A room object keeps its last state after
it unloads, so a conversation touched and unloaded between two ticks is still reported.

Access: `grant_for(token)` decides which rows a reader may see: without auth every one; with
auth the conversations the token's grant allows (`read` needed), the token coming from the
list request's `Authorization: Bearer` header or the summary socket's `hello.token`. A bad
token is answered 401 (list) or `error unauthorized`, close 4001 (summary); one without `read`,
403 or `forbidden` (4003). The viewer's static files need no token: they hold no data.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from sync.errors import close_code_of
from sync.ids import is_message_id, made_ms
from sync.messages import (
    Assistant,
    Document,
    Image,
    Json,
    Reasoning,
    System,
    Text,
    ToolCall,
    ToolResult,
    User,
)

from .auth import ANONYMOUS, AuthError, Grant, Key, bearer_token, verify
from .session import CONVERSATION_PATH, is_conversation_id
from .subscriber import CLOSE_DEADLINE, cut_if_open

if TYPE_CHECKING:
    from .hub import Hub
    from .room import Room

__all__ = [
    "CSP",
    "LIST_PATH",
    "SUMMARY_INTERVAL",
    "SUMMARY_PATH",
    "Web",
    "preview_of",
]

log = logging.getLogger("convsync.web")

LIST_PATH: Final = "/v1/conversations"
SUMMARY_PATH: Final = "/v1/summary"
SUMMARY_INTERVAL: Final = 0.25  # seconds: at most one diff per conversation per interval
CSP: Final = "default-src 'self'; frame-ancestors 'none'"
PREVIEW_CHARS: Final = 160
DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000

STATIC_DIR: Final = Path(__file__).resolve().parent.parent / "client" / "web"
# The only files served, by URL path: nothing else of the folder is reachable.
STATIC: Final[dict[str, tuple[str, str]]] = {
    "/static/convsync.js": ("convsync.js", "text/javascript; charset=utf-8"),
    "/static/viewer.js": ("viewer.js", "text/javascript; charset=utf-8"),
    "/static/viewer.css": ("viewer.css", "text/css; charset=utf-8"),
    "/static/icon.svg": ("icon.svg", "image/svg+xml"),
}
PAGE: Final = ("viewer.html", "text/html; charset=utf-8")

Row = dict[str, Any]
Visible = Callable[[str], bool]


def preview_of(message: object) -> tuple[str, str]:
    """`(role, text)` of a message for a list row: its text, or what its parts are."""
    match message:
        case System(content=content):
            return "system", _cut(content)
        case User(content=parts) | Assistant(content=parts):
            role = "user" if isinstance(message, User) else "assistant"
            return role, _cut(" ".join(_part_text(part) for part in parts).strip())
    return "unknown", ""


def _part_text(part: object) -> str:
    match part:
        case Text(text=text):
            return text
        case ToolCall(name=name):
            return f"[call {name}]"
        case ToolResult(name=name, is_error=is_error):
            return f"[{'error from' if is_error else 'result of'} {name}]"
        case Reasoning():
            return ""
        case Image():
            return "[image]"
        case Document(name=name):
            return f"[document {name or ''}]".replace(" ]", "]")
        case Json():
            return "[json]"
    return ""


def _cut(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def row_of(room: Room) -> Row:
    """The summary row of a loaded room (read while its lock is free)."""
    conversation = room.conversation
    last: Row | None = None
    updated: int | None = None
    count = len(conversation)
    if count:
        entry = conversation.entry(count - 1)
        assert entry is not None
        role, text = preview_of(entry.message)
        last = {"id": entry.id, "role": role, "text": text}
        if entry.id is not None and is_message_id(entry.id):
            updated = made_ms(entry.id)
    clients = sorted(set(room.core.subscribers.values()))
    return {
        "id": room.id,
        "lineage": room.lineage,
        "revision": room.revision,
        "updated": updated,
        "entries": count,
        "halt": conversation.halted(),
        "last": last,
        "online": clients,
    }


def _in_range(conversation_id: str, prefix: str, after: str | None) -> bool:
    return conversation_id.startswith(prefix) and (after is None or conversation_id > after)


class Web:
    """The viewer pages, `GET /v1/conversations` and the `/v1/summary` socket of one hub."""

    def __init__(self, hub: Hub, static_dir: Path = STATIC_DIR) -> None:
        self._hub = hub
        self._static_dir = static_dir
        self._watchers: set[_Touched] = set()  # one per summary socket

    def touched(self, room: Room) -> None:
        """The hub changed `room` (or who is in it): summary sockets look at it next tick."""
        for watcher in self._watchers:
            watcher.rooms[room.id] = room
            watcher.wake.set()

    # ------------------------------------------------------------------ access (the auth hook)

    def grant_for(self, token: str | None) -> Visible:
        """Which conversations a reader holding `token` may see. Without auth: every one.

        Raises:
            AuthError: `unauthorized` for a missing or bad token, `forbidden` for one
                without `read`.
        """
        keys = self._hub.keys
        if keys is None:
            return lambda _conversation_id: True
        return self._reader_grant(token).allows

    def _reader_grant(self, token: str | None, sub: str | None = None) -> Grant:
        """The grant of a reader's token, checked with the keys of now (`read` needed; the
        same `sub` when it refreshes a feed's token)."""
        keys = self._hub.keys
        if keys is None:
            return ANONYMOUS
        grant = verify(token, keys, now=time.time(), audience=self._hub.config.audience)
        if sub is not None and grant.sub != sub:
            raise AuthError("unauthorized", "refreshed token is for another principal")
        if not grant.can_read:
            raise AuthError("forbidden", "token lacks the read scope")
        return grant

    def _key_of(self, grant: Grant) -> Key | None:
        """The key of the hub's ring of now that verifies `grant`'s tokens (None: none)."""
        keys = self._hub.keys
        return None if keys is None else keys.key_for(grant.kid)

    # ------------------------------------------------------------------ HTTP

    async def respond(self, connection: ServerConnection, request: Request) -> Response | None:
        """The response to a plain HTTP request this module serves, else None."""
        path, _, query = request.path.partition("?")
        if path == "/" or path.startswith("/c/"):
            return self._file(*PAGE)
        static = STATIC.get(path)
        if static is not None:
            return self._file(*static)
        if path == LIST_PATH:
            return await self._list(query, bearer_token(request.headers.get("Authorization")))
        return None

    def _file(self, name: str, content_type: str) -> Response:
        try:
            body = (self._static_dir / name).read_bytes()
        except OSError:
            return _response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
        return _response(HTTPStatus.OK, body, content_type)

    async def _list(self, query: str, token: str | None = None) -> Response:
        params = urllib.parse.parse_qs(query, keep_blank_values=True)
        try:
            prefix, after, limit = _page_args(
                _one(params, "prefix"), _one(params, "after"), _one(params, "limit")
            )
        except ValueError as error:
            body = json.dumps({"error": "bad_request", "detail": str(error)}).encode()
            return _response(HTTPStatus.BAD_REQUEST, body, "application/json")
        try:
            visible = self.grant_for(token)
        except AuthError as refused:
            status = HTTPStatus.UNAUTHORIZED if refused.code == "unauthorized" else 403
            body = json.dumps({"error": refused.code, "detail": refused.detail}).encode()
            return _response(HTTPStatus(status), body, "application/json")
        rows, more = await self.rows(prefix, after, limit, visible)
        body = json.dumps({"conversations": rows, "more": more}, ensure_ascii=False).encode()
        return _response(HTTPStatus.OK, body, "application/json")

    async def rows(
        self, prefix: str, after: str | None, limit: int, visible: Visible
    ) -> tuple[list[Row], bool]:
        """One page of rows: ids by range from the store (never a pattern match), each row
        from its room (loaded for the read when it is not); `more` when a next page exists."""
        rows: list[Row] = []
        cursor = after
        while len(rows) < limit:
            ids = await self._hub.store.list_conversations(prefix, after=cursor, limit=limit + 1)
            for conversation_id in ids:
                cursor = conversation_id
                if not visible(conversation_id):
                    continue
                if len(rows) == limit:
                    return rows, True
                room = await self._hub.room_for_read(conversation_id)
                if room is not None:
                    async with room.lock:
                        rows.append(row_of(room))
            if len(ids) <= limit:
                return rows, False
        return rows, True

    # ------------------------------------------------------------------ the summary socket

    async def refuse_summary(self, ws: ServerConnection, code: str, detail: str) -> None:
        """Send a summary socket `error {code, detail}` and close it."""
        await _close_with(ws, code, detail)

    async def serve_summary(
        self, ws: ServerConnection, said_hello: Callable[[], None] = lambda: None
    ) -> None:
        """`hello {token, prefix, after, limit}` → `summary {rows, more}` → `summary_diff
        {rows}` for rows that changed, until the socket closes. A reconnecting reader sends
        `hello` again and gets a fresh snapshot, which replaces what it had. `said_hello` is
        called once a first frame came (the hub counts sockets waiting for one)."""
        try:
            with anyio.fail_after(5):
                data = await ws.recv()  # held to the first frame's cap by the hub's sockets
            said_hello()
            hello = json.loads(data)
            del data  # only what is needed is kept for the feed's life, not the frame
            if not isinstance(hello, dict) or hello.get("type") != "hello":
                raise ValueError("expected a hello")
            prefix, after, limit = _page_args(
                hello.get("prefix"), hello.get("after"), hello.get("limit")
            )
            token = hello.get("token")
            del hello
        except (TimeoutError, ValueError, ConnectionClosed) as error:
            await _close_with(ws, "bad_message", f"summary: {error}")
            return
        try:
            grant = self._reader_grant(token if isinstance(token, str) else None)
            feed = _Feed(grant, self._key_of(grant), self._hub.config.expiry_grace)
        except AuthError as refused:
            await _close_with(ws, refused.code, refused.detail)
            return
        del token
        if feed.grant is not ANONYMOUS and not self._hub.hold_principal(feed.grant.sub):
            await _close_with(ws, "rate_limited", "too many connections for this principal")
            return
        watcher = _Touched()
        self._watchers.add(watcher)  # before the snapshot: no change falls between the two
        try:
            rows, more = await self.rows(prefix, after, limit, feed.visible)
            known = {row["id"]: row for row in rows}
            await ws.send(json.dumps({"type": "summary", "rows": rows, "more": more}))
            del rows
            async with anyio.create_task_group() as group:
                group.start_soon(self._read_feed, ws, feed, group.cancel_scope)
                while True:
                    # Asleep until a room is touched or the token's time is up: an idle feed
                    # costs no wake-up (1,500 polling feeds took 19% of a hub's CPU).
                    with anyio.move_on_after(feed.closes_at() - time.time()):
                        await watcher.wake.wait()
                    if time.time() >= feed.closes_at():
                        await _close_with(ws, "unauthorized", "token expired")
                        return
                    if self._key_of(feed.grant) != feed.key:  # retired (or replaced) since
                        await _close_with(ws, "unauthorized", "the token's key was retired")
                        return
                    await anyio.sleep(SUMMARY_INTERVAL)  # coalesce: one diff per interval
                    watcher.wake = anyio.Event()
                    changed = _changed(watcher, known, prefix, after, feed.visible)
                    if watcher.rooms:
                        watcher.wake.set()  # a room under an append: look again next interval
                    if changed:
                        await ws.send(json.dumps({"type": "summary_diff", "rows": changed}))
        except ConnectionClosed:
            return
        finally:
            self._watchers.discard(watcher)
            if feed.grant is not ANONYMOUS:
                self._hub.let_go_principal(feed.grant.sub)

    async def _read_feed(self, ws: ServerConnection, feed: _Feed, scope: anyio.CancelScope) -> None:
        """Read what a feed's reader sends: `auth {token}` replaces the feed's token (same
        `sub`, answered `auth_ok`, or `error unauthorized` and a close), anything else is
        ignored; stop everything when the reader goes."""
        try:
            async for data in ws:
                try:
                    message = json.loads(data)
                except ValueError:
                    continue
                del data
                if not isinstance(message, dict) or message.get("type") != "auth":
                    continue
                if self._hub.keys is None:
                    continue  # no tokens to refresh
                token = message.get("token")
                try:
                    grant = self._reader_grant(
                        token if isinstance(token, str) else None, feed.grant.sub
                    )
                except AuthError as refused:
                    await _close_with(ws, "unauthorized", refused.detail)
                    return
                feed.grant, feed.key = grant, self._key_of(grant)
                expires_in = grant.expires_in(time.time())
                await ws.send(json.dumps({"type": "auth_ok", "expires_in": expires_in}))
        except ConnectionClosed:
            pass  # closed by either side (a 4001 of ours too): the feed ends
        finally:
            scope.cancel()


class _Feed:
    """What a summary socket holds of its reader: the grant of its latest token."""

    def __init__(self, grant: Grant, key: Key | None, grace: float) -> None:
        self.grant = grant
        self.key = key  # the key that verified it: a feed is cut once the ring drops it
        self.grace = grace

    def visible(self, conversation_id: str) -> bool:
        return self.grant.allows(conversation_id)

    def closes_at(self) -> float:
        """When the feed is closed 4001 unless refreshed (`exp` plus the grace; `inf`
        without auth)."""
        return self.grant.exp + self.grace


class _Touched:
    """The rooms touched since a summary socket's last tick, by conversation id."""

    def __init__(self) -> None:
        self.rooms: dict[str, Room] = {}
        self.wake = anyio.Event()  # set when a room is touched


def _changed(
    watcher: _Touched, known: dict[str, Row], prefix: str, after: str | None, visible: Visible
) -> list[Row]:
    """The rows of the rooms touched since the last tick that differ from what was sent."""
    rooms, watcher.rooms = watcher.rooms, {}
    changed: list[Row] = []
    for conversation_id, room in rooms.items():
        if not _in_range(conversation_id, prefix, after) or not visible(conversation_id):
            continue
        if room.lock.locked():
            watcher.rooms.setdefault(conversation_id, room)  # an append under way: next tick
            continue
        if not room.exists:
            continue
        row = row_of(room)
        if known.get(conversation_id) != row:
            known[conversation_id] = row
            changed.append(row)
    return changed


async def _drain(ws: ServerConnection, scope: anyio.CancelScope) -> None:
    """Read (and ignore) what the reader sends; stop everything when it goes."""
    try:
        async for _ in ws:
            pass
    finally:
        scope.cancel()


async def _close_with(ws: ServerConnection, code: str, detail: str) -> None:
    """Send `error` and close; a peer that does not read gets its socket cut in time."""
    with anyio.move_on_after(CLOSE_DEADLINE):
        try:
            await ws.send(json.dumps({"type": "error", "code": code, "detail": detail}))
            await ws.close(close_code_of(code), code)
        except ConnectionClosed:
            pass
    cut_if_open(ws)


def _one(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return values[-1] if values else None


def _page_args(prefix: object, after: object, limit: object) -> tuple[str, str | None, int]:
    """Check `prefix`, `after` and `limit` (query text or JSON values); raises ValueError."""
    if prefix is None:
        prefix = ""
    if not isinstance(prefix, str) or (prefix and not is_conversation_id(prefix)):
        raise ValueError("prefix: not the start of a conversation id")
    if after is not None and (not isinstance(after, str) or not is_conversation_id(after)):
        raise ValueError("after: not a conversation id")
    if limit is None:
        limit = DEFAULT_LIMIT
    if isinstance(limit, str):
        if not limit.isdigit():
            raise ValueError("limit: not a whole number")
        limit = int(limit)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit: 1 to {MAX_LIMIT}")
    return prefix, after, limit


def _response(status: HTTPStatus, body: bytes, content_type: str) -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Content-Security-Policy", CSP),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            ("Cache-Control", "no-cache"),
        ]
    )
    return Response(status.value, status.phrase, headers, body)


def is_summary_path(path: str) -> bool:
    """Whether a websocket request's path is the summary feed's."""
    return path.split("?", 1)[0] == SUMMARY_PATH


assert not SUMMARY_PATH.startswith(CONVERSATION_PATH)  # the two sockets never share a path
