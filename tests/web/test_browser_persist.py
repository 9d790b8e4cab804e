"""The browser outbox (`persist: 'indexeddb'`, SPEC §14) in headless Chromium against a real
hub that goes down and comes back on a SQLite store: an edit made with the hub down survives a
reload, or every tab closing, and lands exactly once."""

from __future__ import annotations

import http.server
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import test_browser as shared
from conftest import bound, hub_config
from test_browser import texts, until

from client import connect
from server import Hub, SqliteStore

pytestmark = pytest.mark.asyncio(loop_scope="module")

browser = shared.browser

WEB = Path(__file__).resolve().parents[2] / "client" / "web"
BLANK = b"<!doctype html><title>app</title>"


class AppFiles(http.server.SimpleHTTPRequestHandler):
    """The app: a blank page at `/`, client/web's files under `/static/`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, directory=str(WEB), **kwargs)

    def translate_path(self, path: str) -> str:
        return super().translate_path(path.removeprefix("/static"))

    def do_GET(self) -> None:
        if self.path in ("/", "/index.html"):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(BLANK)))
            self.end_headers()
            self.wfile.write(BLANK)
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet


@pytest.fixture(scope="module")
def app() -> Iterator[str]:
    """The app's origin, a static server of its own on 127.0.0.1 port 0: the page loads while
    the hub is down (and, on loopback, may open sockets to the hub on loopback)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AppFiles)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


OPEN = """async ([hub, id, options]) => {
  const cs = await import('/static/convsync.js');
  globalThis.cs = cs;
  const r = cs.connect(hub, id, { persist: 'indexeddb', backoff: 50, maxBackoff: 250, ...options });
  globalThis.r = r;
  await r.loaded;
  return { pending: r.pending, client: r.client, texts: said(r) };
  function said(r) { return r.conversation.messages().map((m) => m.content[0].text); }
}"""


class Hubs:
    """A hub on one SQLite file that can go down and come back on the same port."""

    def __init__(self, path: Path, app: str) -> None:
        self.path = path
        self.config = hub_config(allow_origin=(app.rstrip("/"),))  # the app's origin
        self.port = 0
        self.stack: AsyncExitStack | None = None
        self.hub: Hub | None = None

    async def up(self) -> Hub:
        stack = AsyncExitStack()
        hub = await stack.enter_async_context(
            Hub(SqliteStore(self.path), host="127.0.0.1", port=self.port, config=self.config)
        )
        self.port = hub.port  # port 0 the first time; the same port when it comes back
        self.stack, self.hub = stack, hub
        return hub

    async def taken_down(self) -> None:
        """Up once (for a port of its own), then down: `up` brings it back on that port."""
        await self.up()
        port = self.port
        await self.down()
        self.port = port

    async def down(self) -> None:
        if self.stack is not None:
            await self.stack.aclose()
        self.stack = self.hub = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


@asynccontextmanager
async def hubs(tmp_path: Path, app: str) -> AsyncIterator[Hubs]:
    made = Hubs(tmp_path / "hub.db", app)
    try:
        yield made
    finally:
        await made.down()


async def app_context(browser: Any) -> Any:
    ctx = await browser.new_context()
    ctx.set_default_timeout(bound(15) * 1000)
    return ctx


async def app_page(ctx: Any, app: str, errors: list[str]) -> Any:
    page = await ctx.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(app)
    return page


async def run(page: Any, script: str, arg: Any = None, seconds: float = 15) -> Any:
    """`page.evaluate`, bounded (a promise the page never settles fails the test)."""
    with anyio.fail_after(bound(seconds)):
        return await page.evaluate(script, arg)


async def until_down(page: Any) -> None:
    """Wait until the page's replica knows the hub is gone."""
    await page.wait_for_function("() => globalThis.r.state !== 'connected'")


async def landed_once(hubs: Hubs, conversation_id: str, page: Any, text: str) -> list[str]:
    """Wait until the page's replica has flushed, then the log's texts (a Python replica's)."""
    async with connect(hubs.url, conversation_id, client="py") as py:
        await until(py, lambda: text in texts(py))
        with anyio.fail_after(bound(15)):
            await run(page, "() => globalThis.r.flush()")
        await py.flush()
        assert await run(page, "() => globalThis.r.pending") == 0
        return texts(py)


async def test_an_edit_made_with_the_hub_down_survives_a_reload_and_lands_once(
    browser: Any, app: str, tmp_path: Path
) -> None:
    """The hub goes down; the tab edits and is reloaded at once (the edit's call returned,
    nothing awaited); the reloaded tab holds the edit; the hub comes back: it lands once."""
    errors: list[str] = []
    async with hubs(tmp_path, app) as hub:
        await hub.up()
        async with connect(hub.url, "persist.reload", client="py") as py:
            py.conversation.push(shared.Message.user("first"))
            await py.flush()
        ctx = await app_context(browser)
        page = await app_page(ctx, app, errors)
        opened = await run(page, OPEN, [hub.url, "persist.reload", {}])
        await run(page, "() => globalThis.r.ready.then(() => true)")
        await page.wait_for_function("() => globalThis.r.revision === 1")
        await hub.down()
        await until_down(page)
        await run(page, "() => { globalThis.r.conversation.push(cs.Message.user('typed')); }")
        await page.reload()
        resumed = await run(page, OPEN, [hub.url, "persist.reload", {}])
        assert resumed == {"pending": 1, "client": opened["client"], "texts": ["first", "typed"]}
        await hub.up()
        assert await landed_once(hub, "persist.reload", page, "typed") == ["first", "typed"]
        await ctx.close()
    assert errors == []


async def test_pending_edits_go_after_every_tab_closed_and_one_reopened(
    browser: Any, app: str, tmp_path: Path
) -> None:
    """Two edits made with no hub; every tab closes; a new tab of the origin takes the outbox
    (its lock is free again) and, once a hub answers, both land once, in order."""
    errors: list[str] = []
    async with hubs(tmp_path, app) as hub:
        await hub.taken_down()
        ctx = await app_context(browser)
        page = await app_page(ctx, app, errors)
        await run(page, OPEN, [hub.url, "persist.closed", {}])
        await run(
            page,
            "() => { for (const t of ['one', 'two']) r.conversation.push(cs.Message.user(t)); }",
        )
        await run(page, "() => globalThis.r.saved()")
        await page.close()
        page = await app_page(ctx, app, errors)
        resumed = await run(page, OPEN, [hub.url, "persist.closed", {}])
        assert resumed["pending"] == 2 and resumed["texts"] == ["one", "two"]
        await hub.up()
        assert await landed_once(hub, "persist.closed", page, "two") == ["one", "two"]
        await ctx.close()
    assert errors == []


async def test_a_batch_whose_ack_was_lost_is_not_landed_twice_after_a_reload(
    browser: Any, app: str, tmp_path: Path
) -> None:
    """The hub appends the tab's push but its ack never reaches the tab, which is reloaded:
    the resumed batch, kept with its seq, is known to the hub and lands once."""
    errors: list[str] = []
    async with hubs(tmp_path, app) as hub:
        await hub.up()
        ctx = await app_context(browser)
        acks_lost = {"on": False}

        def route(ws: Any) -> None:
            server = ws.connect_to_server()
            server.on_message(
                lambda message: (
                    None if acks_lost["on"] and '"ack"' in str(message) else ws.send(message)
                )
            )

        await ctx.route_web_socket(lambda _: True, route)
        page = await app_page(ctx, app, errors)
        await run(page, OPEN, [hub.url, "persist.ack", {}])
        await run(page, "() => globalThis.r.ready.then(() => true)")
        acks_lost["on"] = True
        async with connect(hub.url, "persist.ack", client="py") as py:
            await run(page, "() => { r.conversation.push(cs.Message.user('once')); }")
            await until(py, lambda: "once" in texts(py))
            assert await run(page, "() => r.pending") == 1  # its ack was dropped
            await page.reload()
            acks_lost["on"] = False
            resumed = await run(page, OPEN, [hub.url, "persist.ack", {}])
            assert resumed["pending"] == 1
            with anyio.fail_after(bound(15)):
                await run(page, "() => r.flush()")
            await py.flush()
            assert texts(py) == ["once"]
            assert await run(page, "() => r.conversation.messages().length") == 1
        await ctx.close()
    assert errors == []
