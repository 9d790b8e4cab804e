"""The hub's web surface: the viewer's static files, the conversation list and its live feed.

How this works: `Web` answers plain HTTP requests the hub hands it (`respond`) and serves the
`/v1/summary` websocket (`serve_summary`). It owns no conversation state: a summary row is read
from a room, when its lock is free (so the row never shows a batch whose append is still under
way), loaded for the read if need be. The hub calls `touched(room)` after every join, push,
leave, rewrite and move of a room. The summary sockets showing the same window (the same
`prefix`, `order`, `after`, `limit` and the same `convs` of their grant) share one `_Window`: it
collects the rooms touched since its last diff and, `SUMMARY_INTERVAL` after the first, works
the diff out and encodes it once (its tick, run by one of its sockets' tasks), and writes that
frame itself to every socket of the window whose task is parked with everything sent; only a
socket with something else to do (behind, a new window asked for, its token to check, a full
buffer) is woken to send it (20 dashboards on one window cost one diff, one encoding, one timer
and 20 writes a tick, not 20 task wake-ups). So diffs are coalesced to at most one per
conversation per interval. A socket behind the window by more than the frames kept
(`KEPT_FRAMES`) gets a snapshot of the window instead. A room object keeps its last state
after it unloads, so a conversation touched and unloaded between two ticks is still reported.

Access: `grant_for(token)` decides which rows a reader may see: without auth every one; with
auth the conversations the token's grant allows (`read` needed), the token coming from the
list request's `Authorization: Bearer` header or the summary socket's `hello.token`. A bad
token is answered 401 (list) or `error unauthorized`, close 4001 (summary); one without `read`,
403 or `forbidden` (4003). The viewer's static files need no token: they hold no data.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import msgspec
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from sync.errors import close_code_of

from .auth import ANONYMOUS, AuthError, Grant, Key, bearer_token, verify
from .rows import Row, live_state, preview_of, row_of
from .session import CONVERSATION_PATH, is_conversation_id
from .subscriber import CLOSE_DEADLINE, DIRECT_WRITE, FRAMED_ONCE, cut_if_open, wire_bytes

if TYPE_CHECKING:
    from .hub import Hub
    from .room import Room

__all__ = [
    "CSP",
    "LIST_PATH",
    "SUMMARY_INTERVAL",
    "SUMMARY_PATH",
    "Web",
    "live_state",
    "preview_of",
]

log = logging.getLogger("convsync.web")

LIST_PATH: Final = "/v1/conversations"
SUMMARY_PATH: Final = "/v1/summary"
SUMMARY_INTERVAL: Final = 0.25  # seconds: at most one diff per conversation per interval
CSP: Final = "default-src 'self'; frame-ancestors 'none'"
ROW_CACHE: Final = 10_000  # rows kept built (and encoded) at most: about 10 MB
KEPT_FRAMES: Final = 1 << 20  # bytes of diffs a window keeps for its sockets behind it
DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000
ORDERS: Final = ("id", "updated")
LIST_PARAMS: Final = ("prefix", "order", "after", "limit")
_DIGITS: Final = re.compile(r"[0-9]{1,6}")  # plain ASCII digits: not "²" nor "٣"

STATIC_DIR: Final = Path(__file__).resolve().parent.parent / "client" / "web"
# The only files served, by URL path: nothing else of the folder is reachable.
STATIC: Final[dict[str, tuple[str, str]]] = {
    "/static/convsync.js": ("convsync.js", "text/javascript; charset=utf-8"),
    "/static/viewer.js": ("viewer.js", "text/javascript; charset=utf-8"),
    "/static/markdown.js": ("markdown.js", "text/javascript; charset=utf-8"),
    "/static/viewer.css": ("viewer.css", "text/css; charset=utf-8"),
    "/static/icon.svg": ("icon.svg", "image/svg+xml"),
    # The viewer's parts (`client/web/viewer/`, imported by viewer.js): each file by name.
    **{
        f"/static/viewer/{part.name}": (f"viewer/{part.name}", "text/javascript; charset=utf-8")
        for part in sorted((STATIC_DIR / "viewer").glob("*.js"))
    },
    # The modules `convsync.js` re-exports (`client/web/lib/`), each by its own path.
    **{
        f"/static/lib/{module.name}": (f"lib/{module.name}", "text/javascript; charset=utf-8")
        for module in sorted((STATIC_DIR / "lib").glob("*.js"))
    },
}
PAGE: Final = ("viewer.html", "text/html; charset=utf-8")
# The module each page of the viewer imports (viewer.js picks it by the path). The page is
# served with a `modulepreload` link for every module it will import, so the browser fetches
# them all at once instead of one level of imports after another (the list page does not need
# the replica, so it does not fetch it).
PAGE_MODULES: Final = {"conversation": "viewer/conversation.js", "list": "viewer/list.js"}
_IMPORT: Final = re.compile(r"""(?:\bfrom|\bimport)\s*(\(?)\s*['"](\.{1,2}/[^'"]+\.js)['"]""")

_JSON: Final = msgspec.json.Encoder()
Visible = Callable[[str], bool]


@dataclass(frozen=True)
class Page:
    """A window of the list: the conversations under `prefix`, by id after `after` (`order`
    "id") or the most recently updated (`order` "updated"), at most `limit` of them."""

    prefix: str = ""
    order: str = "id"
    after: str | None = None
    limit: int = DEFAULT_LIMIT

    def holds(self, conversation_id: str) -> bool:
        """Whether `conversation_id` is in the range the window is cut from."""
        return conversation_id.startswith(self.prefix) and (
            self.after is None or conversation_id > self.after
        )


def recency(row: Row) -> tuple[int, str]:
    """The sort key of `order: "updated"`: most recent first, then by id (never updated last)."""
    updated = row["updated"]
    return (-(updated if isinstance(updated, int) else -1), row["id"])


class Web:
    """The viewer pages, `GET /v1/conversations` and the `/v1/summary` socket of one hub."""

    def __init__(self, hub: Hub, static_dir: Path = STATIC_DIR) -> None:
        self._hub = hub
        self._static_dir = static_dir
        self._pages: dict[str, bytes] = {}  # the viewer's page for each of PAGE_MODULES
        # The windows the summary sockets show, by window and grant: one per distinct window.
        self._windows: dict[tuple[Page, tuple[str, ...]], _Window] = {}
        # Each conversation's row as last built, and its JSON, by id: built once per change
        # whatever the number of feeds showing it (20 dashboards built and encoded each row
        # 20 times). Dropped by `touched`, which follows every change of a room.
        self._rows: dict[str, tuple[Row, bytes]] = {}

    def touched(self, room: Room) -> None:
        """The hub changed `room` (or who is in it): summary sockets look at it next tick."""
        self._rows.pop(room.id, None)
        for window in self._windows.values():
            if window.page.holds(room.id):
                window.rooms[room.id] = room
                window.wake.set()

    def row(self, room: Room) -> Row:
        """The row of `room` (loaded, its lock free), from the cache when it did not change."""
        cached = self._rows.get(room.id)
        if cached is not None:
            return cached[0]
        row = row_of(room)
        if len(self._rows) >= ROW_CACHE:
            self._rows.clear()  # bounded: rebuilt from the rows asked for next
        self._rows[room.id] = (row, _JSON.encode(row))
        return row

    def encode(self, message: Row) -> bytes:
        """`message` as JSON (UTF-8), its `rows` from the cached JSON of each row still
        current. msgspec's encoder, not `json.dumps`: a row encodes in a 17th of the time."""
        rows: list[Row] = message["rows"]
        head = _JSON.encode({key: value for key, value in message.items() if key != "rows"})
        texts = []
        for row in rows:
            cached = self._rows.get(row["id"])
            texts.append(
                cached[1] if cached is not None and cached[0] is row else _JSON.encode(row)
            )
        return b"".join((head[:-1], b',"rows":[', b",".join(texts), b"]}"))

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
            return self._page("conversation" if path.startswith("/c/") else "list")
        static = STATIC.get(path)
        if static is not None:
            return self._file(*static)
        if path == LIST_PATH:
            if getattr(request, "method", "GET") not in ("GET", "HEAD"):
                body = json.dumps({"error": "method_not_allowed", "detail": "only GET"}).encode()
                response = _response(HTTPStatus.METHOD_NOT_ALLOWED, body, "application/json")
                response.headers["Allow"] = "GET"
                return response
            return await self._list(query, bearer_token(request.headers.get("Authorization")))
        return None

    def _page(self, which: str) -> Response:
        """The viewer's page, its head preloading the modules of page `which`."""
        body = self._pages.get(which)
        if body is None:
            try:
                html = (self._static_dir / PAGE[0]).read_text(encoding="utf-8")
            except OSError:
                return _response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
            shell = module_graph(self._static_dir, ["viewer.js"], dynamic=False)
            page = module_graph(self._static_dir, [PAGE_MODULES[which]])
            modules = shell + [name for name in page if name not in shell]
            links = "".join(
                f'    <link rel="modulepreload" href="/static/{name}" />\n' for name in modules
            )
            body = self._pages[which] = html.replace("  </head>", links + "  </head>", 1).encode()
        return _response(HTTPStatus.OK, body, PAGE[1])

    def _file(self, name: str, content_type: str) -> Response:
        try:
            body = (self._static_dir / name).read_bytes()
        except OSError:
            return _response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
        return _response(HTTPStatus.OK, body, content_type)

    async def _list(self, query: str, token: str | None = None) -> Response:
        try:
            params = urllib.parse.parse_qs(
                query, keep_blank_values=True, strict_parsing=bool(query), errors="strict"
            )
            unknown = sorted(set(params) - set(LIST_PARAMS))
            if unknown:
                known = ", ".join(LIST_PARAMS)
                raise ValueError(f"unknown parameter {', '.join(unknown)} (known: {known})")
            twice = sorted(name for name, values in params.items() if len(values) > 1)
            if twice:
                raise ValueError(f"{', '.join(twice)}: given more than once")
            page = page_of(
                _one(params, "prefix"),
                _one(params, "order"),
                _one(params, "after"),
                _one(params, "limit"),
                text=True,
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
        rows, more = await self.rows(page, visible)
        body = json.dumps({"conversations": rows, "more": more}, ensure_ascii=False).encode()
        return _response(HTTPStatus.OK, body, "application/json")

    async def rows(self, page: Page, visible: Visible) -> tuple[list[Row], bool]:
        """The rows of window `page` (in its order), and `more`: whether rows follow it."""
        if page.order == "id":
            ids, more = await self._ids(page, visible)
            return [row for row in [await self._row(i) for i in ids] if row is not None], more
        ids = [i for i in await self._all(page) if visible(i)]
        rows = [row for row in [await self._row(i) for i in ids] if row is not None]
        rows.sort(key=recency)
        return rows[: page.limit], len(rows) > page.limit

    async def _ids(self, page: Page, visible: Visible) -> tuple[list[str], bool]:
        """The ids of an `order: "id"` window, by range from the store (never a pattern
        match), and whether a next one follows."""
        ids: list[str] = []
        cursor = page.after
        while True:
            listed = await self._hub.store.list_conversations(
                page.prefix, after=cursor, limit=page.limit + 1
            )
            for conversation_id in listed:
                cursor = conversation_id
                if not visible(conversation_id):
                    continue
                if len(ids) == page.limit:
                    return ids, True
                ids.append(conversation_id)
            if len(listed) <= page.limit:
                return ids, False

    async def _all(self, page: Page) -> list[str]:
        """Every id under the window's prefix (`order: "updated"` ranks them all: the store
        keeps no index by activity)."""
        ids: list[str] = []
        while True:
            listed = await self._hub.store.list_conversations(
                page.prefix, after=ids[-1] if ids else None, limit=MAX_LIMIT
            )
            ids += listed
            if len(listed) < MAX_LIMIT:
                return ids

    async def _row(self, conversation_id: str) -> Row | None:
        """A conversation's row from its room (loaded for the read when it is not)."""
        room = await self._hub.room_for_read(conversation_id)
        if room is None:
            return None
        async with room.lock:
            return self.row(room)

    # ------------------------------------------------------------------ the summary socket

    async def refuse_summary(self, ws: ServerConnection, code: str, detail: str) -> None:
        """Send a summary socket `error {code, detail}` and close it."""
        await _close_with(ws, code, detail)

    async def serve_summary(
        self, ws: ServerConnection, said_hello: Callable[[], None] = lambda: None
    ) -> None:
        """`hello {token, prefix, order, after, limit, features}` → `summary {rows, more, order}`
        → `summary_diff {rows, left?, more?}` as the window changes, until the socket closes.
        Only rows of the window are ever sent: `rows` are rows that changed or entered it,
        `left` the ids that left it. `window {prefix, order, after, limit}` replaces the
        window (a new snapshot follows). A reconnecting reader sends `hello` again and gets a
        fresh snapshot, which replaces what it had. `said_hello` is called once a first
        frame came (the hub counts sockets waiting for one)."""
        try:
            with anyio.fail_after(5):
                data = await ws.recv()  # held to the first frame's cap by the hub's sockets
            said_hello()
            hello = json.loads(data)
            del data  # only what is needed is kept for the feed's life, not the frame
            if not isinstance(hello, dict) or hello.get("type") != "hello":
                kind = hello.get("type") if isinstance(hello, dict) else None
                got = f"a {kind!r} message" if isinstance(kind, str) else "no message type"
                raise ValueError(f"the first message must be a hello (got {got})")
            page = _page_in(hello)
        except TimeoutError:
            await _close_with(ws, "bad_message", "summary: no hello within 5 s")
            return
        except (ValueError, ConnectionClosed) as error:
            await _close_with(ws, "bad_message", f"summary: {error}")
            return
        features = hello.get("features")
        pings = isinstance(features, list) and "ping" in features
        token = hello.get("token")
        del hello
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
        watcher = _Touched(ws, feed, self)
        window: _Window | None = None
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._listen, ws, watcher, feed, group.cancel_scope)
                window, snapshot = await self._join(page, feed.grant, watcher)
                if pings:
                    snapshot["features"] = ["ping"]
                await ws.send(self.encode(snapshot), text=True)
                del snapshot
                while True:
                    if window.ticker is None:  # the window's ticking socket left: take it over
                        window.ticker = (watcher, anyio.CancelScope())
                        group.start_soon(window.tick, window.ticker[1])
                    # Asleep until the window has a diff, a window is asked for or the token's
                    # time is up: an idle feed costs no wake-up (1,500 polling feeds took 19% of
                    # a hub's CPU).
                    watcher.parked = True  # everything sent: the tick may write for it
                    try:
                        if feed.closes_at() == math.inf:  # no token to expire: no timer either
                            await watcher.wake.wait()
                        else:
                            with anyio.move_on_after(feed.closes_at() - time.time()):
                                await watcher.wake.wait()
                    finally:
                        watcher.parked = False
                    watcher.wake = anyio.Event()
                    if time.time() >= feed.closes_at():
                        await _close_with(ws, "unauthorized", "token expired")
                        return
                    if self._key_of(feed.grant) != feed.key:  # retired (or replaced) since
                        await _close_with(ws, "unauthorized", "the token's key was retired")
                        return
                    if feed.grant.convs != window.convs and not watcher.pages:
                        watcher.pages.append(window.page)  # refreshed, other convs: new rows
                    if watcher.pages:
                        page = watcher.pages.pop()
                        watcher.pages.clear()
                        self._leave(window, watcher)
                        window = None
                        window, snapshot = await self._join(page, feed.grant, watcher)
                        await ws.send(self.encode(snapshot), text=True)
                        del snapshot
                        continue
                    for data, wire in window.frames_for(watcher):
                        if wire is not None and _keeps_up(ws):
                            _write(ws, wire)  # framed once for all the window's sockets
                        else:
                            await ws.send(data, text=True)  # framed here; waits for the reader
        except* ConnectionClosed:
            pass  # the reader went (raised in the task group: wrapped in an ExceptionGroup)
        finally:
            if window is not None:
                self._leave(window, watcher)
            if feed.grant is not ANONYMOUS:
                self._hub.let_go_principal(feed.grant.sub)

    async def _join(self, page: Page, grant: Grant, watcher: _Touched) -> tuple[_Window, Row]:
        """Show `page` to `watcher`'s socket: the window of the same page and convs if one is
        shown (its rows as of its last diff), else a new one (read from the rooms); the
        window and the snapshot to send."""
        key = (page, grant.convs)
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window(self, page, grant.allows, grant.convs)
        window.watchers.add(watcher)  # before the snapshot: no change falls between the two
        try:
            async with window.lock:
                if window.primed:
                    snapshot = window.current()
                else:
                    snapshot = await window.snapshot()
                watcher.epoch = window.epoch
        except BaseException:
            self._leave(window, watcher)
            raise
        return window, snapshot

    def _leave(self, window: _Window, watcher: _Touched) -> None:
        """`watcher`'s socket no longer shows `window`; a window no socket shows goes. The
        window's tick, if this socket ran it, stops; another of its sockets takes it over."""
        window.watchers.discard(watcher)
        if window.ticker is not None and window.ticker[0] is watcher:
            window.ticker[1].cancel()
            window.ticker = None
            for other in window.watchers:
                other.wake.set()  # one of them starts ticking
        key = (window.page, window.convs)
        if not window.watchers and self._windows.get(key) is window:
            del self._windows[key]

    async def _listen(
        self, ws: ServerConnection, watcher: _Touched, feed: _Feed, scope: anyio.CancelScope
    ) -> None:
        """Answer what the reader sends after its hello (`ping` → `pong`: the keepalive of a
        reader that cannot send websocket pings, a browser; `window`: a new window, for the
        serving loop; `auth {token}`: the feed's token replaced, same `sub`, answered
        `auth_ok`, or `error unauthorized` and a close); refuse anything else, a second hello
        included; stop everything when the reader goes."""
        try:
            async for data in ws:
                try:
                    message = json.loads(data)
                except ValueError:
                    message = None
                del data
                kind = message.get("type") if isinstance(message, dict) else None
                if kind == "ping":
                    await ws.send('{"type":"pong"}')
                    continue
                if kind == "window":
                    try:
                        watcher.pages.append(_page_in(message))
                    except ValueError as error:
                        await _close_with(ws, "bad_message", f"summary: window: {error}")
                        return
                    watcher.wake.set()
                    continue
                if kind == "auth":
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
                    watcher.wake.set()  # the expiry moved: the serving loop sleeps anew
                    continue
                if kind == "hello":
                    detail = "summary: a second hello (one per socket; open a new socket)"
                elif isinstance(kind, str):
                    detail = f"summary: unknown message type {kind!r}"
                else:
                    detail = "summary: not a JSON object with a type"
                await _close_with(ws, "bad_message", detail)
                return
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
    """One summary socket's inbox: whether its window has a diff it did not send (`wake`),
    the windows its reader asked for, and the last diff of its window it sent (`epoch`).

    While its serving task is parked (`parked`: waiting, everything sent) the window's tick
    writes the next frame to its socket itself (`take`) instead of waking the task: 20
    dashboards on one window then cost one task wake-up a tick, not 21."""

    def __init__(
        self, ws: ServerConnection | None = None, feed: _Feed | None = None, web: Web | None = None
    ) -> None:
        self.pages: list[Page] = []
        self.wake = anyio.Event()  # set when its window has a diff or a window is asked for
        self.epoch = 0
        self.parked = False
        self._ws = ws
        self._feed = feed
        self._web = web

    def take(self, window: _Window, wire: bytes | None) -> bool:
        """Write `window`'s latest frame (`wire`, framed once) to the socket if nothing else
        is to be done for it (its task parked, just one frame behind, no window asked for, its
        token still good for this window, the socket keeping up); False: wake its task."""
        ws, feed, web = self._ws, self._feed, self._web
        if (
            wire is None
            or ws is None
            or feed is None
            or web is None
            or not self.parked
            or self.epoch != window.epoch - 1
            or self.pages
            or feed.grant.convs != window.convs
            or web._key_of(feed.grant) != feed.key
            or not _keeps_up(ws)
        ):
            return False
        closes_at = feed.closes_at()
        if closes_at != math.inf and time.time() >= closes_at:
            return False  # its task closes it
        _write(ws, wire)
        self.epoch = window.epoch
        return True


class _Window:
    """What one summary socket shows: the rows of one window, kept to the window.

    `order: "id"`: a row changes in place; a new conversation inside the window's id range
    (or a gone one) moves its edge, so the ids are read again from the store and the rows
    that enter and leave are sent. `order: "updated"`: only a touched room can change its
    rank, so the window is the best `limit` of its rows and the touched ones; a row whose
    activity went back (a rewrite) could let an untouched one in, so then it is ranked
    again from all the rows.

    Shared by the sockets showing the same window to the same `convs` (`watchers`): the
    rooms touched since the last diff are collected here; `tick` (run in the task group of one
    of the sockets, `ticker`) works the diff out and encodes it once an interval, keeps it
    (diff `epoch` by epoch, up to `KEPT_FRAMES` bytes) until every socket sent it, and wakes
    the sockets."""

    def __init__(self, web: Web, page: Page, visible: Visible, convs: tuple[str, ...]) -> None:
        self._web = web
        self.page = page
        self.convs = convs
        self._visible = visible
        self.known: dict[str, Row] = {}
        self.more = False
        self.rooms: dict[str, Room] = {}  # touched since the last diff, by conversation id
        self.watchers: set[_Touched] = set()
        self.wake = anyio.Event()  # set when a room is touched
        self.ticker: tuple[_Touched, anyio.CancelScope] | None = None  # whose task ticks
        self.lock = anyio.Lock()  # one snapshot or diff at a time
        self.primed = False  # `known` holds the window (its first snapshot was read)
        self.epoch = 0  # the diffs worked out so far
        # (epoch, the diff's JSON, the same framed for a socket without extension or None)
        # of the diffs not yet sent by every socket.
        self.frames: deque[tuple[int, bytes, bytes | None]] = deque()
        self._kept = 0  # bytes in `frames`

    async def snapshot(self) -> Row:
        rows, self.more = await self._web.rows(self.page, self._visible)
        self.known = {row["id"]: row for row in rows}
        self.primed = True
        return {"type": "summary", "order": self.page.order, "rows": rows, "more": self.more}

    def current(self) -> Row:
        """The window as of its last diff, as a snapshot (a socket joining or behind)."""
        rows = list(self.known.values())
        rows.sort(key=(lambda row: row["id"]) if self.page.order == "id" else recency)
        return {"type": "summary", "order": self.page.order, "rows": rows, "more": self.more}

    async def tick(self, scope: anyio.CancelScope) -> None:
        """Once an interval after a room is touched, the next diff (`step`), until `scope`
        is cancelled (its socket left the window)."""
        with scope:
            while True:
                await self.wake.wait()
                await anyio.sleep(SUMMARY_INTERVAL)  # coalesce: one diff per interval
                self.wake = anyio.Event()
                with anyio.CancelScope(shield=True):  # the touched rooms are taken: finish
                    await self.step()
                if self.rooms:
                    self.wake.set()  # a room under an append: look again next interval

    async def step(self) -> None:
        """Work out the diff of the rooms touched since the last; if it shows anything, keep
        it encoded as the next epoch and wake the window's sockets."""
        async with self.lock:
            diff = await self.diff()
            if diff is None:
                return
            data = self._web.encode(diff)
            wire = wire_bytes(data) if len(data) <= FRAMED_ONCE else None
            self.epoch += 1
            self.frames.append((self.epoch, data, wire))
            self._kept += len(data)
            for watcher in self.watchers:
                if not watcher.take(self, wire):
                    watcher.wake.set()
            sent = min((other.epoch for other in self.watchers), default=self.epoch)
            while self.frames and (
                self.frames[0][0] <= sent or (self._kept > KEPT_FRAMES and len(self.frames) > 1)
            ):
                self._kept -= len(self.frames.popleft()[1])

    def frames_for(self, watcher: _Touched) -> list[tuple[bytes, bytes | None]]:
        """The frames `watcher`'s socket sends now, each as JSON and framed (or None): the
        diffs since the last it sent, or a snapshot when it is behind the frames kept."""
        behind, watcher.epoch = watcher.epoch, self.epoch
        if behind == self.epoch:
            return []
        if not self.frames or self.frames[0][0] > behind + 1:
            return [(self._web.encode(self.current()), None)]  # behind what is kept
        return [(data, wire) for epoch, data, wire in self.frames if epoch > behind]

    async def diff(self) -> Row | None:
        """The `summary_diff` for the rooms touched since the last diff, or None."""
        page, known = self.page, self.known
        rooms, self.rooms = self.rooms, {}
        fresh: dict[str, Row] = {}
        again = False  # the window's members must be read again
        entering = False  # a row from outside may rank into an "updated" window
        by_id = page.order == "id"
        edge: str | None = None  # the last id of a full "id" window
        worst: tuple[int, str] | None = None  # the least recent row of a full "updated" one
        more = self.more
        for conversation_id, room in rooms.items():
            if not page.holds(conversation_id) or not self._visible(conversation_id):
                continue
            if room.lock.locked():
                self.rooms.setdefault(conversation_id, room)  # an append under way: next tick
                continue
            inside = conversation_id in known
            if not room.exists:
                again = again or inside
                continue
            row = self._web.row(room)
            if by_id:
                if inside:
                    fresh[conversation_id] = row
                    continue
                if len(known) == page.limit and edge is None:
                    edge = max(known)  # once per tick, not once per room
                if edge is None or conversation_id < edge:
                    again = True
                else:
                    more = True
                continue
            rank = recency(row)
            if inside:
                if rank > recency(known[conversation_id]):
                    again = True  # it went back: an untouched row may now rank above it
                fresh[conversation_id] = row
                continue
            if len(known) == page.limit and worst is None:
                worst = max(map(recency, known.values()))
            # Rows of the window only move up, so one that does not beat the window's least
            # recent row now stays out.
            if worst is None or rank < worst:
                entering = True
                fresh[conversation_id] = row
            else:
                more = True
        if again:
            rows, more = await self._web.rows(page, self._visible)
            members = {row["id"]: row for row in rows}
        elif entering:
            pool = {**known, **fresh}
            ranked = sorted(pool.values(), key=recency)
            members = {row["id"]: row for row in ranked[: page.limit]}
            more = more or len(pool) > page.limit
        else:  # the same members: only the touched rows can differ (no pass over the window)
            sent = [
                row for key, row in fresh.items() if known[key] is not row and known[key] != row
            ]
            known.update(fresh)
            members = known
        if members is not known:
            left = [key for key in known if key not in members]
            # A row unchanged since the last tick is the same object (the cache): no deep
            # compare.
            sent = []
            for conversation_id, row in members.items():
                before = known.get(conversation_id)
                if before is not row and before != row:
                    sent.append(row)
            self.known = members
        else:
            left = []
        message: Row = {"type": "summary_diff", "rows": sent}
        if left:
            message["left"] = left
        if more != self.more:
            message["more"] = self.more = more
        return message if sent or len(message) > 2 else None


def _keeps_up(ws: ServerConnection) -> bool:
    """Whether a frame framed once can go straight to `ws`'s transport: no extension (the
    bytes are the same for every socket), open, and few unsent bytes (below `DIRECT_WRITE`:
    else `send` waits for the reader)."""
    return (
        not ws.protocol.extensions
        and ws.protocol.state is State.OPEN
        and ws.transport.get_write_buffer_size() < DIRECT_WRITE
    )


def _write(ws: ServerConnection, wire: bytes) -> None:
    """Write a framed frame to `ws`'s transport, as the conversation sockets do (`Subscriber`)."""
    try:
        ws.transport.write(wire)
    except Exception:  # one bad socket stops no other
        log.warning("a summary frame could not be written; dropping the connection", exc_info=True)
        ws.transport.abort()


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


def _page_in(message: dict[str, Any]) -> Page:
    """The window of a `hello` or `window` message (JSON values); raises ValueError."""
    return page_of(
        message.get("prefix"), message.get("order"), message.get("after"), message.get("limit")
    )


def page_of(
    prefix: object, order: object, after: object, limit: object, *, text: bool = False
) -> Page:
    """Check a window's arguments: query text (`text`) or JSON values; raises ValueError
    naming what is wrong. A number in a query is plain ASCII digits; in JSON, a number."""
    if prefix is None:
        prefix = ""
    if not isinstance(prefix, str) or (prefix and not is_conversation_id(prefix)):
        raise ValueError("prefix: not the start of a conversation id")
    if order is None:
        order = "id"
    if order not in ORDERS:
        raise ValueError(f"order: 'id' or 'updated' (got {order!r})")
    if after is not None and (not isinstance(after, str) or not is_conversation_id(after)):
        raise ValueError("after: not a conversation id")
    if after is not None and order != "id":
        raise ValueError("after: pages by id only (order 'id'); 'updated' is the latest rows")
    if limit is None:
        limit = DEFAULT_LIMIT
    if text and isinstance(limit, str):
        if not _DIGITS.fullmatch(limit):
            raise ValueError(f"limit: a whole number in ASCII digits 0-9 (got {limit!r})")
        limit = int(limit)
    if isinstance(limit, str):
        raise ValueError(f"limit: a number, not a string (got {limit!r})")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit: 1 to {MAX_LIMIT} (got {limit!r})")
    return Page(prefix, order, after, limit)


def module_graph(static_dir: Path, entries: list[str], dynamic: bool = True) -> list[str]:
    """Every module that `entries` (paths under `static_dir`) import, themselves included, in
    the order first reached; only files the hub serves. `dynamic` False: the entries' own
    `import(...)` calls are not followed (the modules those reach still are)."""
    seen: list[str] = []
    todo = [(name, dynamic) for name in entries]
    while todo:
        name, follow = todo.pop(0)
        if name in seen or f"/static/{name}" not in STATIC:
            continue
        seen.append(name)
        try:
            source = (static_dir / name).read_text(encoding="utf-8")
        except OSError:
            continue
        folder = Path(name).parent
        for call, spec in _IMPORT.findall(source):
            if follow or not call:
                todo.append((os.path.normpath(folder / spec), True))
    return seen


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
