"""The React example page of docs/react.md, as written there, in headless Chromium against a
real hub: the page's CDN addresses are answered with the React of client/web/node_modules
(its CommonJS files wrapped as ES modules here), so the test needs no network; the page and
client/web come from a static server of the test's own."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio
from conftest import bound, hub_config

from client import connect
from client.replica import Replica
from server import Hub, MemoryStore
from sync import Message

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "client" / "web"
MODULES = WEB / "node_modules"
CHROMIUM = os.environ.get("CONVSYNC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _why_not() -> str | None:
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM} (scripts/ensure-chromium installs Debian's)"
    if not (MODULES / "react-dom" / "package.json").exists():
        return "no React in client/web/node_modules (run scripts/ensure-npm)"
    return None


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    """One headless Chromium; fails instead of skipping when CONVSYNC_REQUIRE_BROWSER=1."""
    why = _why_not()
    if why is not None:
        if os.environ.get("CONVSYNC_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser tests required: {why}")
        pytest.skip(why)
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        await launched.close()


def example_page() -> str:
    """The page docs/react.md shows (its one html block)."""
    text = (ROOT / "docs" / "react.md").read_text()
    found: list[str] = re.findall(r"```html\n(.*?)```", text, re.S)
    assert len(found) == 1, "docs/react.md shows one page"
    return found[0]


def _cjs(path: Path) -> str:
    """A CommonJS file as a function of (module, exports, require, process)."""
    return f"(function (module, exports, require, process) {{\n{path.read_text()}\n}})"


_PROCESS = "const process = { env: { NODE_ENV: 'development' } };\n"
_LOAD = (
    "function load(fn, require) {\n"
    "  const module = { exports: {} };\n"
    "  fn(module, module.exports, require, process);\n"
    "  return module.exports;\n"
    "}\n"
)


def react_module() -> str:
    """React's development build as an ES module: its exports, named and default."""
    source = MODULES / "react" / "cjs" / "react.development.js"
    names = sorted(set(re.findall(r"^\s*exports\.(\w+)\s*=", source.read_text(), re.M)))
    return (
        _PROCESS
        + _LOAD
        + f"const React = load({_cjs(source)}, (name) => {{ throw new Error(name); }});\n"
        + "export default React;\n"
        + f"export const {{ {', '.join(names)} }} = React;\n"
    )


def react_dom_client_module(react_url: str) -> str:
    """`react-dom/client` as an ES module over the page's React (the same module instance)."""
    cjs = MODULES / "react-dom" / "cjs"
    scheduler = MODULES / "scheduler" / "cjs" / "scheduler.development.js"
    return (
        f"import React from {json.dumps(react_url)};\n"
        + _PROCESS
        + _LOAD
        + "const modules = { react: React };\n"
        + "const require = (name) => {\n"
        + "  if (!(name in modules)) throw new Error(`no module ${name}`);\n"
        + "  return modules[name];\n"
        + "};\n"
        + f"modules.scheduler = load({_cjs(scheduler)}, require);\n"
        + f"modules['react-dom'] = load({_cjs(cjs / 'react-dom.development.js')}, require);\n"
        + f"const client = load({_cjs(cjs / 'react-dom-client.development.js')}, require);\n"
        + "export default client;\n"
        + "export const { createRoot, hydrateRoot, version } = client;\n"
    )


class _Files(http.server.BaseHTTPRequestHandler):
    """The example page and the files of client/web it imports (GET only)."""

    page = ""

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/react-chat.html":
            body, kind = self.page.encode(), "text/html"
        else:
            file = (ROOT / path.lstrip("/")).resolve()
            if not (file.is_relative_to(WEB) and file.suffix == ".js" and file.is_file()):
                self.send_error(404)
                return
            body, kind = file.read_bytes(), "text/javascript"
        self.send_response(200)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet


@contextlib.contextmanager
def page_server() -> Iterator[str]:
    """A static server on 127.0.0.1, port 0, for the page (Chromium lets only a local page
    reach a loopback hub); yields its origin."""
    _Files.page = example_page()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def open_page(
    browser: Any, origin: str, hub: Hub, conversation: str
) -> tuple[Any, Any, list[str]]:
    """The example page from `origin`; its CDN modules answered by routes."""
    page_html = example_page()
    found = re.search(r'type="importmap">(.*?)</script>', page_html, re.S)
    assert found is not None, "the page has an import map"
    imports = json.loads(found[1])
    react_url = imports["imports"]["react"]
    bodies = {
        react_url: react_module(),
        imports["imports"]["react-dom/client"]: react_dom_client_module(react_url),
    }
    context = await browser.new_context()
    page = await context.new_page()
    page.set_default_timeout(bound(20) * 1000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    def console(message: Any) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("console", console)

    async def answer(route: Any) -> None:
        await route.fulfill(body=bodies[route.request.url], content_type="text/javascript")

    for url in bodies:
        await page.route(url, answer)
    hub_url = f"ws://127.0.0.1:{hub.port}"
    await page.goto(f"{origin}/react-chat.html?hub={hub_url}&id={conversation}")
    return context, page, errors


async def heard(replica: Replica, done: Callable[[], bool]) -> None:
    """Wait (bounded) until `done()` holds, woken by each of the replica's events."""
    with anyio.fail_after(bound(15)):
        if done():
            return
        async for _ in replica.events():
            if done():
                return


async def test_the_example_page_streams_a_draft_sends_and_opens_one_socket(browser: Any) -> None:
    """The docs' page under StrictMode opens one socket, shows a draft as it streams and then
    its entry, and what is typed in it lands in the log."""
    with page_server() as origin:
        await _drive(browser, origin)


async def _drive(browser: Any, origin: str) -> None:
    config = hub_config(allow_origin=(origin,))
    async with (
        Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub,
        connect(hub.url, "react-page", client="worker", kind="agent") as worker,
    ):
        worker.conversation.push(Message.user("Tell me a story."))
        await worker.flush()
        context, page, errors = await open_page(browser, origin, hub, "react-page")
        try:
            await page.wait_for_function(
                "document.querySelector('main p')?.textContent.startsWith('connected')"
            )
            await page.wait_for_function(
                "document.querySelector('ol')?.textContent.includes('Tell me a story.')"
            )
            # StrictMode mounted the chat twice: still one connection from the page.
            await heard(worker, lambda: any(c.startswith("web-") for c in worker.presence))
            pages = [p for c, p in worker.presence.items() if c.startswith("web-")]
            assert [len(p.connections) for p in pages] == [1]
            async with worker.draft() as draft:
                for word in ("Once ", "upon ", "a ", "time"):
                    draft.append(word)
                await page.wait_for_function(
                    "document.querySelector('li.draft')?.textContent.includes('Once upon a time')"
                )
                await draft.commit(Message.assistant(draft.text))
            await page.wait_for_function(
                "!document.querySelector('li.draft') && "
                "document.querySelector('li.assistant')?.textContent.includes('Once upon a time')"
            )
            await page.fill("input", "and then?")
            await page.click("button")
            await page.wait_for_function(
                "document.querySelector('li.user:last-of-type')?.textContent.includes('and then?')"
            )
            await heard(
                worker,
                lambda: any("and then?" in str(m) for m in worker.conversation.messages()),
            )
            assert errors == []
        finally:
            await context.close()
