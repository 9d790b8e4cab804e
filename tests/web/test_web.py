"""The hub's web surface: viewer files with their headers, the conversation list, the summary
socket."""

from __future__ import annotations

import json
import posixpath
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import bound
from websockets.asyncio.client import connect as ws_connect

from client import connect
from server import Hub
from server.web import CSP, preview_of
from sync import Message
from sync.protocol import SUBPROTOCOL

WINDOW_ACTIVITY_SECONDS = 30.0  # how long the prefix is busy under a window of 5 (issue 34)


async def get(hub: Hub, path: str) -> tuple[int, dict[str, str], bytes]:
    """GET `path` from the hub (in a thread: urllib blocks)."""

    def fetch() -> tuple[int, dict[str, str], bytes]:
        url = f"http://127.0.0.1:{hub.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=bound(10)) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    return await anyio.to_thread.run_sync(fetch)


async def fill(hub: Hub, conversation_id: str, *texts: str) -> None:
    """Push `texts` as user messages to `conversation_id` and wait for the acks."""
    async with connect(f"ws://127.0.0.1:{hub.port}", conversation_id, client="filler") as py:
        for text in texts:
            py.conversation.push(Message.user(text))
        with anyio.fail_after(bound(10)):
            await py.flush()


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/", "text/html; charset=utf-8"),
        ("/c/demo.1", "text/html; charset=utf-8"),
        ("/static/viewer.js", "text/javascript; charset=utf-8"),
        ("/static/convsync.js", "text/javascript; charset=utf-8"),
        ("/static/markdown.js", "text/javascript; charset=utf-8"),
        ("/static/viewer.css", "text/css; charset=utf-8"),
    ],
)
async def test_viewer_files_are_served_with_their_type_and_the_csp(
    hub: Hub, path: str, content_type: str
) -> None:
    """Each viewer file comes with its content type, the CSP of SPEC 8 and nosniff."""
    status, headers, body = await get(hub, path)
    assert status == 200 and body
    assert headers["Content-Type"] == content_type
    assert headers["Content-Security-Policy"] == CSP
    assert headers["X-Content-Type-Options"] == "nosniff"


WEB_DIR = Path(__file__).resolve().parents[2] / "client" / "web"
IMPORT = re.compile(
    r"""^(?:import|export)\s+(?:\*(?:\s+as\s+\w+)?|\{[^}]*\}|\w+)\s+from\s+'([^']+)';""", re.M
)


def module_graph() -> dict[str, str]:
    """Every module the page's `convsync.js` loads, by URL path, with its file's text: the
    imports followed from `/static/convsync.js` as a browser resolves them."""
    seen: dict[str, str] = {}
    todo = ["/static/convsync.js"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        text = (WEB_DIR / path.removeprefix("/static/")).read_text()
        seen[path] = text
        base = path.rsplit("/", 1)[0]
        for specifier in IMPORT.findall(text):
            assert specifier.startswith("./"), f"{path} imports {specifier}: not a sibling file"
            todo.append(posixpath.normpath(f"{base}/{specifier}"))
    return seen


def test_the_module_graph_is_every_lib_module() -> None:
    """`convsync.js` reaches every module of `client/web/lib/` (none is left unserved by a
    missing import, and no file there is dead)."""
    graph = module_graph()
    lib = {f"/static/lib/{p.name}" for p in (WEB_DIR / "lib").glob("*.js")}
    assert len(lib) >= 10 and set(graph) == lib | {"/static/convsync.js"}


async def test_every_module_convsync_js_imports_is_served(hub: Hub) -> None:
    """Each module of `convsync.js`'s import graph is served as the file, with the JavaScript
    type, the CSP and nosniff: a browser loads the whole replica from the hub."""
    for path, text in module_graph().items():
        status, headers, body = await get(hub, path)
        assert status == 200, path
        assert body == text.encode(), path
        assert headers["Content-Type"] == "text/javascript; charset=utf-8", path
        assert headers["Content-Security-Policy"] == CSP, path
        assert headers["X-Content-Type-Options"] == "nosniff", path


async def test_every_module_the_page_imports_is_served(hub: Hub) -> None:
    """The page's script and every module it imports, followed import by import (the
    viewer's parts, the replica's), is served as JavaScript: a split file the hub forgot to
    list would leave the page blank."""
    seen: set[str] = set()
    todo = ["/static/viewer.js"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        status, headers, body = await get(hub, path)
        assert status == 200, path
        assert headers["Content-Type"] == "text/javascript; charset=utf-8", path
        text = body.decode()
        found = re.findall(r"^(?:import|export)\b[^;]*?from '([^']+)'", text, re.M)
        for target in found + re.findall(r"\bimport\('([^']+)'\)", text):
            assert target.startswith("."), f"{path} imports {target}: not a relative module"
            todo.append(posixpath.normpath(posixpath.join(posixpath.dirname(path), target)))
    assert "/static/viewer/conversation.js" in seen and "/static/convsync.js" in seen


def page_graph(start: str, dynamic: bool = True) -> set[str]:
    """The modules a page that loads `start` can load, by URL path: static imports and
    `import('...')` (unless not `dynamic`) followed as a browser resolves them."""
    graph: set[str] = set()
    todo = [start]
    while todo:
        path = todo.pop()
        if path in graph:
            continue
        graph.add(path)
        text = (WEB_DIR / path.removeprefix("/static/")).read_text()
        found = re.findall(r"^(?:import|export)\b[^;]*?from '([^']+)'", text, re.M)
        if dynamic:
            found += re.findall(r"\bimport\('([^']+)'\)", text)
        for target in found:
            todo.append(posixpath.normpath(posixpath.join(posixpath.dirname(path), target)))
    return graph


def test_the_list_page_loads_the_summary_feed_not_the_replica() -> None:
    """The list page's modules are the summary feed's few, not the replica's: its first
    paint waits for every module it imports (each a request to the hub)."""
    graph = page_graph("/static/viewer/list.js")
    assert "/static/lib/summary.js" in graph
    assert not graph & {
        "/static/convsync.js",
        "/static/lib/session.js",
        "/static/lib/conversation.js",
    }
    assert len(graph) <= len(page_graph("/static/viewer/conversation.js")) // 2


async def test_each_page_preloads_the_modules_it_will_import_and_no_others(hub: Hub) -> None:
    """The page's head lists a `modulepreload` for every module its view imports, so the
    browser fetches them at once rather than one level of imports after the other (a
    conversation's first paint waited for nine such levels); the list page preloads its
    view's modules, not the replica's."""

    async def preloads(path: str) -> set[str]:
        _, _, body = await get(hub, path)
        return set(re.findall(r'<link rel="modulepreload" href="([^"]+)" />', body.decode()))

    shell = page_graph("/static/viewer.js", dynamic=False)
    assert {"/static/viewer/token.js", "/static/lib/early.js"} <= shell
    conversation = page_graph("/static/viewer/conversation.js")
    listing = page_graph("/static/viewer/list.js")
    assert await preloads("/c/demo.1") == shell | conversation
    assert await preloads("/") == shell | listing
    assert "/static/convsync.js" not in await preloads("/")


async def test_the_page_has_no_inline_script_or_style(hub: Hub) -> None:
    """The page loads its script and style from files, so the CSP lets them run."""
    _, _, body = await get(hub, "/")
    page = body.decode()
    assert '<script type="module" src="/static/viewer.js"></script>' in page
    assert "<style" not in page and " style=" not in page and "onload" not in page


async def test_only_listed_static_files_are_reachable(hub: Hub) -> None:
    """Paths outside the list of static files are not served (no folder walking)."""
    for path in (
        "/static/../server/web.py",
        "/static/test/module.test.mjs",
        "/static/",
        "/static/lib/",
        "/static/lib/../viewer.html",
        "/static/lib/nothing.js",
    ):
        status, _, _ = await get(hub, path)
        assert status == 404, path


async def test_list_gives_rows_by_id_range_paged(hub: Hub) -> None:
    """`GET /v1/conversations` lists rows in id order, filtered by prefix, paged by after."""
    await fill(hub, "team.a", "hello a")
    await fill(hub, "team.b", "one", "two <b>")
    await fill(hub, "teams", "not in the team. prefix")
    await fill(hub, "other", "x")
    status, headers, body = await get(hub, "/v1/conversations?prefix=team.&limit=1")
    assert status == 200 and headers["Content-Type"] == "application/json"
    page = json.loads(body)
    assert [row["id"] for row in page["conversations"]] == ["team.a"] and page["more"] is True
    _, _, body = await get(hub, "/v1/conversations?prefix=team.&after=team.a")
    page = json.loads(body)
    assert page["more"] is False
    [row] = page["conversations"]
    assert row["id"] == "team.b" and row["revision"] == 2 and row["entries"] == 2
    assert row["last"]["role"] == "user" and row["last"]["text"] == "two <b>"
    assert isinstance(row["updated"], int) and row["online"] == []
    _, _, body = await get(hub, "/v1/conversations")
    assert [row["id"] for row in json.loads(body)["conversations"]] == [
        "other",
        "team.a",
        "team.b",
        "teams",
    ]


@pytest.mark.parametrize(
    "query", ["limit=0", "limit=x", "limit=5000", "prefix=a%20b", "after=%00", "limit=-1"]
)
async def test_list_refuses_bad_arguments(hub: Hub, query: str) -> None:
    """A bad prefix, after or limit is answered 400 with a reason."""
    status, _, body = await get(hub, f"/v1/conversations?{query}")
    assert status == 400 and json.loads(body)["error"] == "bad_request"


def test_preview_says_what_non_text_parts_are() -> None:
    """A row's preview shows text, and names calls and results instead of dumping them."""
    assert preview_of(Message.user("hi")) == ("user", "hi")
    assert preview_of(Message.system("be brief")) == ("system", "be brief")
    role, text = preview_of(Message.user("x" * 500))
    assert role == "user" and len(text) == 160 and text.endswith("…")


async def summary(hub: Hub, **hello: Any) -> Any:
    """A summary socket, hello sent."""
    ws = await ws_connect(f"ws://127.0.0.1:{hub.port}/v1/summary", subprotocols=[SUBPROTOCOL])
    await ws.send(json.dumps({"type": "hello", "token": None, **hello}))
    return ws


async def test_summary_sends_a_snapshot_then_coalesced_diffs(hub: Hub) -> None:
    """The summary socket sends the rows, then one diff row per changed conversation, with who
    is online; a conversation created later appears."""
    await fill(hub, "s.1", "first")
    ws = await summary(hub, prefix="s.")
    with anyio.fail_after(bound(10)):
        snapshot = json.loads(await ws.recv())
        assert snapshot["type"] == "summary" and snapshot["more"] is False
        assert [(r["id"], r["revision"]) for r in snapshot["rows"]] == [("s.1", 1)]
        async with connect(f"ws://127.0.0.1:{hub.port}", "s.2", client="watcher") as py:
            for n in range(20):  # a burst: coalesced into few diffs
                py.conversation.push(Message.user(f"burst {n}"))
            await py.flush()
            rows: dict[str, Any] = {}
            diffs = 0
            while rows.get("s.2", {}).get("revision") != 20:
                diff = json.loads(await ws.recv())
                assert diff["type"] == "summary_diff"
                diffs += 1
                rows.update({row["id"]: row for row in diff["rows"]})
            assert diffs <= 3
            assert rows["s.2"]["online"] == ["watcher"]
            assert rows["s.2"]["last"]["text"] == "burst 19"
        while rows["s.2"]["online"]:
            diff = json.loads(await ws.recv())
            rows.update({row["id"]: row for row in diff["rows"]})
    await ws.close()


async def test_summary_hides_conversations_out_of_range(hub: Hub) -> None:
    """Rows outside the hello's prefix never reach the reader."""
    ws = await summary(hub, prefix="mine.")
    with anyio.fail_after(bound(10)):
        assert json.loads(await ws.recv())["rows"] == []
        await fill(hub, "yours.1", "secret")
        await fill(hub, "mine.1", "ok")
        diff = json.loads(await ws.recv())
        assert [row["id"] for row in diff["rows"]] == ["mine.1"]
    await ws.close()


async def test_summary_refuses_a_bad_hello(hub: Hub) -> None:
    """A hello with a bad prefix gets an error and a close, no rows."""
    ws = await ws_connect(f"ws://127.0.0.1:{hub.port}/v1/summary", subprotocols=[SUBPROTOCOL])
    await ws.send(json.dumps({"type": "hello", "prefix": "no spaces"}))
    with anyio.fail_after(bound(10)):
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and error["code"] == "bad_message"
        await ws.wait_closed()
    assert ws.close_code == 1008


async def test_summary_reports_a_conversation_that_changed_and_unloaded_between_ticks(
    hub: Hub,
) -> None:
    """A conversation created, left and unloaded before the feed's next tick still reaches
    the reader, with nobody online."""
    ws = await summary(hub)
    with anyio.fail_after(bound(10)):
        assert json.loads(await ws.recv())["rows"] == []
        await fill(hub, "brief.1", "in and out")
        # Unload it at once, as the idle unloader would (before the feed's next tick).
        hub._rooms.loaded.pop("brief.1")
        row: dict[str, Any] = {}
        while row.get("online", ["?"]) != []:  # earlier diffs may show the filler online
            diff = json.loads(await ws.recv())
            [row] = diff["rows"]
        assert (row["id"], row["revision"]) == ("brief.1", 1)
    await ws.close()


async def test_summary_answers_pings_and_refuses_a_second_hello(hub: Hub) -> None:
    """A reader listing `ping` sees it in the snapshot and each `ping` gets a `pong` (the
    feed's keepalive); a second hello is refused by name, not ignored."""
    ws = await summary(hub, features=["ping"])
    with anyio.fail_after(bound(10)):
        assert json.loads(await ws.recv())["features"] == ["ping"]
        for _ in range(2):
            await ws.send('{"type":"ping"}')
            assert json.loads(await ws.recv()) == {"type": "pong"}
        await ws.send(json.dumps({"type": "hello", "token": None}))
        error = json.loads(await ws.recv())
        assert error["code"] == "bad_message" and "second hello" in error["detail"]
        await ws.wait_closed()
    assert ws.close_code == 1008
    ws = await summary(hub)  # not listed: not offered
    with anyio.fail_after(bound(10)):
        assert "features" not in json.loads(await ws.recv())
    await ws.close()


async def test_summary_without_a_hello_is_told_what_came_instead(hub: Hub) -> None:
    ws = await ws_connect(f"ws://127.0.0.1:{hub.port}/v1/summary", subprotocols=[SUBPROTOCOL])
    await ws.send('{"type":"ping"}')
    with anyio.fail_after(bound(10)):
        error = json.loads(await ws.recv())
        assert error["code"] == "bad_message"
        said = "summary: the first message must be a hello (got a 'ping' message)"
        assert error["detail"] == said
        await ws.wait_closed()


# ---------------------------------------------------------------------- windows (SPEC §17)


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("limit=%D9%A3", "limit: a whole number in ASCII digits 0-9 (got '٣')"),
        ("limit=%C2%B2", "limit: a whole number in ASCII digits 0-9 (got '²')"),
        ("limit=", "limit: a whole number in ASCII digits"),
        ("limit=1e3", "limit: a whole number in ASCII digits"),
        ("sort=id&offset=3", "unknown parameter offset, sort (known: prefix, order, after, limit)"),
        ("page=2", "unknown parameter page"),
        ("limit=1&limit=2", "limit: given more than once"),
        ("order=newest", "order: 'id' or 'updated' (got 'newest')"),
        ("order=updated&after=a", "after: pages by id only"),
    ],
)
async def test_list_names_what_is_wrong(hub: Hub, query: str, says: str) -> None:
    status, _, body = await get(hub, f"/v1/conversations?{query}")
    assert status == 400
    answer = json.loads(body)
    assert answer["error"] == "bad_request" and answer["detail"].startswith(says), answer


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_list_answers_other_methods_405(hub: Hub, method: str) -> None:
    await fill(hub, "m.1", "not for a POST")

    def send() -> tuple[int, str | None, bytes]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{hub.port}/v1/conversations", method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=bound(10)) as response:
                return response.status, response.headers.get("Allow"), response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers.get("Allow"), error.read()

    status, allow, body = await anyio.to_thread.run_sync(send)
    assert (status, allow) == (405, "GET")
    assert b"m.1" not in body


@pytest.mark.parametrize(
    ("hello", "says"),
    [
        ({"limit": "5"}, "limit: a number, not a string (got '5')"),
        ({"limit": True}, "limit: 1 to 1000 (got True)"),
        ({"order": "recent"}, "order: 'id' or 'updated' (got 'recent')"),
    ],
)
async def test_summary_hello_is_strict(hub: Hub, hello: dict[str, Any], says: str) -> None:
    ws = await summary(hub, **hello)
    with anyio.fail_after(bound(10)):
        error = json.loads(await ws.recv())
        assert error["code"] == "bad_message" and error["detail"] == f"summary: {says}"
        await ws.wait_closed()


async def test_list_pages_by_updated(hub: Hub) -> None:
    for n in range(4):
        await fill(hub, f"u.{n}", f"message {n}")
    await fill(hub, "u.0", "again")  # u.0 is now the latest
    _, _, body = await get(hub, "/v1/conversations?prefix=u.&order=updated&limit=2")
    page = json.loads(body)
    assert [row["id"] for row in page["conversations"]] == ["u.0", "u.3"] and page["more"]


class Watched:
    """What a summary reader holds: the rows of its window, checked against it on every
    message."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.more = False
        self.entered: list[str] = []
        self.left: list[str] = []

    def take(self, message: dict[str, Any]) -> None:
        if message["type"] == "summary":
            self.rows = {row["id"]: row for row in message["rows"]}
            self.more = message["more"]
            return
        assert message["type"] == "summary_diff", message
        for row in message["rows"]:
            if row["id"] not in self.rows:
                self.entered.append(row["id"])
            self.rows[row["id"]] = row
        for conversation_id in message.get("left", []):
            self.left.append(conversation_id)
            del self.rows[conversation_id]
        self.more = message.get("more", self.more)


async def test_an_id_window_sends_no_row_outside_it_under_activity(hub: Hub) -> None:
    """A window of 5 by id, with every conversation of the prefix busy for
    `WINDOW_ACTIVITY_SECONDS`: no row of the rest is ever sent and the window is always the
    first five ids; a conversation created inside the window halfway enters it and the last
    one leaves (and is sent no more); one created past it only says `more`."""
    ids = [f"w.{n:02}" for n in range(12)]
    for conversation_id in ids:
        await fill(hub, conversation_id, "start")
    ws = await summary(hub, prefix="w.", limit=5)
    seen = Watched()
    sent: set[str] = set()
    after_leaving: set[str] = set()  # rows sent once w.04 left
    arrived, last_word = anyio.Event(), anyio.Event()
    url = f"ws://127.0.0.1:{hub.port}"
    before, entered = set(ids[:5]), {"w.00", "w.01", "w.01a", "w.02", "w.03"}
    pushes: dict[str, int] = {}
    end = anyio.current_time() + WINDOW_ACTIVITY_SECONDS

    async def busy(conversation_id: str) -> None:
        async with connect(url, conversation_id, client=f"busy-{conversation_id}") as py:
            while anyio.current_time() < end:
                py.conversation.push(Message.user(f"busy {pushes.get(conversation_id, 0)}"))
                await py.flush()
                pushes[conversation_id] = pushes.get(conversation_id, 0) + 1
                await anyio.sleep(0.25)

    async def newcomers() -> None:
        await anyio.sleep(WINDOW_ACTIVITY_SECONDS / 2)
        await fill(hub, "w.01a", "new, inside the window")
        await fill(hub, "w.99", "new, past the window")

    async def read() -> None:
        while True:
            message = json.loads(await ws.recv())
            seen.take(message)
            sent.update(row["id"] for row in message["rows"])
            if seen.left:
                after_leaving.update(row["id"] for row in message["rows"])
            if "w.01a" in seen.rows:
                arrived.set()
            if seen.rows["w.00"]["last"]["text"] == "the last word":
                last_word.set()
            assert set(seen.rows) in (before, entered), sorted(seen.rows)

    with anyio.fail_after(bound(WINDOW_ACTIVITY_SECONDS + 30)):
        seen.take(json.loads(await ws.recv()))
        assert set(seen.rows) == before and seen.more is True
        async with anyio.create_task_group() as group:
            group.start_soon(read)
            async with anyio.create_task_group() as writers:
                writers.start_soon(newcomers)
                for conversation_id in ids:
                    writers.start_soon(busy, conversation_id)
            await arrived.wait()
            await fill(hub, "w.00", "the last word")
            await last_word.wait()
            group.cancel_scope.cancel()
    assert sent <= {*ids[:5], "w.01a"}, sorted(sent - {*ids[:5], "w.01a"})
    assert "w.04" not in after_leaving
    assert set(seen.rows) == entered and seen.more is True
    assert seen.left == ["w.04"] and seen.entered == ["w.01a"]
    assert all(seen.rows[i]["revision"] == 1 + pushes[i] for i in ["w.01", "w.02", "w.03"])
    assert min(pushes.values()) >= WINDOW_ACTIVITY_SECONDS  # busy all along: 4 pushes a second
    await ws.close()


async def test_an_updated_window_holds_the_latest_rows_as_they_move(hub: Hub) -> None:
    """`order: "updated"`, limit 3: the three latest; a push to an old one brings it in and
    the oldest of the window leaves; rows outside are never sent."""
    for n in range(6):
        await fill(hub, f"r.{n}", f"message {n}")
    ws = await summary(hub, prefix="r.", order="updated", limit=3)
    seen = Watched()
    with anyio.fail_after(bound(20)):
        snapshot = json.loads(await ws.recv())
        assert snapshot["order"] == "updated"
        assert [row["id"] for row in snapshot["rows"]] == ["r.5", "r.4", "r.3"]
        seen.take(snapshot)
        await fill(hub, "r.0", "back to the top")
        while "r.0" not in seen.rows:
            message = json.loads(await ws.recv())
            assert all(row["id"] in {"r.5", "r.4", "r.3", "r.0"} for row in message["rows"])
            seen.take(message)
        assert seen.left == ["r.3"] and set(seen.rows) == {"r.0", "r.5", "r.4"}
        await fill(hub, "r.4", "again")
        await fill(hub, "r.1", "and one more")
        while "r.1" not in seen.rows:
            message = json.loads(await ws.recv())
            assert all(row["id"] in {"r.5", "r.4", "r.0", "r.1"} for row in message["rows"])
            seen.take(message)
        assert seen.left == ["r.3", "r.5"] and set(seen.rows) == {"r.0", "r.4", "r.1"}
    await ws.close()


async def test_a_new_window_on_the_same_socket(hub: Hub) -> None:
    for n in range(4):
        await fill(hub, f"nw.{n}", "x")
    ws = await summary(hub, prefix="nw.", limit=2)
    with anyio.fail_after(bound(10)):
        assert [r["id"] for r in json.loads(await ws.recv())["rows"]] == ["nw.0", "nw.1"]
        await ws.send(json.dumps({"type": "window", "prefix": "nw.", "after": "nw.1"}))
        second = json.loads(await ws.recv())
        assert second["type"] == "summary"
        assert [r["id"] for r in second["rows"]] == ["nw.2", "nw.3"]
        await fill(hub, "nw.0", "outside the new window")
        await fill(hub, "nw.3", "inside")
        diff = json.loads(await ws.recv())
        assert [r["id"] for r in diff["rows"]] == ["nw.3"]
        await ws.send(json.dumps({"type": "window", "limit": "2"}))
        error = json.loads(await ws.recv())
        assert error["detail"] == "summary: window: limit: a number, not a string (got '2')"


# ---------------------------------------------------------------------- watching (SPEC §17)


async def test_a_watcher_never_appears_in_online_nor_in_presence(hub: Hub) -> None:
    """`presence=False` watches: the watcher reads and writes, the hub counts it, but no
    summary row's `online` and no one's presence ever lists it."""
    url = f"ws://127.0.0.1:{hub.port}"
    ws = await summary(hub, prefix="watched.")
    onlines: list[list[str]] = []
    with anyio.fail_after(bound(20)):
        assert json.loads(await ws.recv())["rows"] == []
        async with connect(url, "watched.1", client="agent") as agent:
            async with connect(url, "watched.1", client="dashboard", presence=False) as watcher:
                assert hub.metrics.watchers == 1
                watcher.conversation.push(Message.user("from a watcher"))
                await watcher.flush()
                agent.conversation.push(Message.user("from the agent"))
                await agent.flush()
                while True:
                    diff = json.loads(await ws.recv())
                    onlines += [row["online"] for row in diff["rows"]]
                    if diff["rows"][-1]["revision"] == 2:
                        break
                await anyio.sleep(0.3)  # presence diffs are throttled: let them land
                assert "dashboard" not in agent.presence and "agent" in agent.presence
                assert "dashboard" not in watcher.presence
        _, _, body = await get(hub, "/v1/conversations?prefix=watched.")
        assert json.loads(body)["conversations"][0]["online"] == []
    assert onlines and all(online == ["agent"] for online in onlines), onlines
    assert hub.metrics.watchers == 0
    await ws.close()


async def test_a_row_says_drafts_statuses_and_the_turn(hub: Hub) -> None:
    """What an operator needs without opening the conversation: open drafts and who makes
    them, presence statuses, and the last turn's state (running, then how it ended)."""
    from sync import TurnEnd

    url = f"ws://127.0.0.1:{hub.port}"
    ws = await summary(hub, prefix="dash.")
    latest: dict[str, Any] = {}

    async def until_row(check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        while not (latest and check(latest)):
            message = json.loads(await ws.recv())
            for row in message["rows"]:
                latest.update(row)
        return latest

    with anyio.fail_after(bound(20)):
        await ws.recv()
        async with connect(url, "dash.1", client="agent", kind="agent") as agent:
            agent.conversation.push(Message.user("do it"))
            agent.conversation.open_turn()
            await agent.flush()
            row = await until_row(lambda r: r["turn"] is not None)
            assert row["turn"] == {"index": 0, "state": "running", "owner": "rig"}
            assert row["drafts"] == {"open": 0, "producers": []}
            await agent.set_status("thinking")
            await until_row(lambda r: r["status"] == {"agent": "thinking"})
            async with agent.draft():
                row = await until_row(lambda r: r["drafts"]["open"] == 1)
                assert row["drafts"]["producers"] == ["agent"]
            await agent.set_status(None)
            agent.conversation.push(Message.assistant("done"))
            agent.conversation.end_turn(TurnEnd.answered(agent.conversation.id(1)))
            await agent.flush()
            row = await until_row(lambda r: r["turn"]["state"] == "answered")
            assert row["drafts"]["open"] == 0 and row["turn"]["index"] == 0
    await ws.close()
    status, _, body = await get(hub, "/v1/conversations?prefix=dash.")
    assert status == 200
    [listed] = json.loads(body)["conversations"]
    assert listed["turn"] == {"index": 0, "state": "answered", "owner": "rig"}
    assert listed["status"] == {} and listed["online"] == []
