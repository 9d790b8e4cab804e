"""The hub's web surface: viewer files with their headers, the conversation list, the summary
socket."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
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


async def test_the_page_has_no_inline_script_or_style(hub: Hub) -> None:
    """The page loads its script and style from files, so the CSP lets them run."""
    _, _, body = await get(hub, "/")
    page = body.decode()
    assert '<script type="module" src="/static/viewer.js"></script>' in page
    assert "<style" not in page and " style=" not in page and "onload" not in page


async def test_only_listed_static_files_are_reachable(hub: Hub) -> None:
    """Paths outside the list of static files are not served (no folder walking)."""
    for path in ("/static/../server/web.py", "/static/test/module.test.mjs", "/static/"):
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
        hub._rooms.pop("brief.1")
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
