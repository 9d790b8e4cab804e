"""One socket per browser (`shared: true`, SPEC 14) in headless Chromium against a real hub:
two pages of one context hold one websocket at the hub (its metrics say so), both live and
editing; closing the leader's page hands the socket over to the other without losing or
repeating an edit; a page opened later joins the same socket. (That a channel acts only with
its own token is the hub's part: tests/net/test_mux.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import test_browser as shared
from conftest import bound
from test_browser import texts, until
from test_browser_persist import app, app_context, app_page, hubs, run  # noqa: F401 (fixture)

from client import connect

pytestmark = pytest.mark.asyncio(loop_scope="module")

browser = shared.browser

OPEN = """async ([hub, id, options]) => {
  const cs = await import('/static/convsync.js');
  globalThis.cs = cs;
  const retry = { backoff: 50, maxBackoff: 250, keepalive: null }; // no ping hides a hand-over
  const r = cs.connect(hub, id, { shared: true, ...retry, ...options });
  globalThis.r = r;
  await r.ready;
  return r.client;
}"""
SAID = "() => globalThis.r.conversation.messages().map((m) => m.content[0].text)"
STANDING = """() => ({state: globalThis.r?.state, failure: globalThis.r?.failure,
  connects: globalThis.r?.connects, refused: String(globalThis.r?.refused)})"""


async def gauges(hub: Any, connections: int, channels: int) -> None:
    """Wait until the hub's metrics show `connections` websockets carrying `channels`."""
    with anyio.fail_after(bound(10)):
        while (hub.metrics.connections, hub.metrics.channels) != (connections, channels):  # noqa: ASYNC110
            await anyio.sleep(0.02)
    rendered = hub.metrics.render()
    assert f"convsync_connections {connections}\n" in rendered
    assert f"convsync_channels {channels}\n" in rendered


async def test_two_pages_share_one_socket_and_the_leader_hands_it_over(
    browser: Any,
    app: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    errors: list[str] = []
    async with hubs(tmp_path, app) as hub:
        running = await hub.up()
        ctx = await app_context(browser)
        first = await app_page(ctx, app, errors)
        second = await app_page(ctx, app, errors)
        clients = {await run(page, OPEN, [hub.url, "shared.tabs", {}]) for page in (first, second)}
        assert len(clients) == 2  # a session, and a client id, per tab
        await gauges(running, connections=1, channels=2)
        await run(first, "() => { r.conversation.push(cs.Message.user('from first')); }")
        await second.wait_for_function(f"() => ({SAID})().includes('from first')")
        await run(second, "() => { r.conversation.push(cs.Message.user('from second')); }")
        await first.wait_for_function(f"() => ({SAID})().includes('from second')")
        # The first page leads (it took the lock first). It closes while the second edits.
        await run(
            second,
            """async () => {
              for (let k = 0; k < 20; k += 1) {
                r.conversation.push(cs.Message.user(`s${k}`));
                await new Promise((done) => setTimeout(done, 10));
              }
            }""",
        )
        closing = first.close()
        await run(
            second,
            """async () => {
              for (let k = 20; k < 30; k += 1) {
                r.conversation.push(cs.Message.user(`s${k}`));
                await new Promise((done) => setTimeout(done, 10));
              }
              await r.flush();
            }""",
        )
        await closing
        await gauges(running, connections=1, channels=1)
        expected = ["from first", "from second", *(f"s{k}" for k in range(30))]
        async with connect(hub.url, "shared.tabs", client="py") as py:
            await until(py, lambda: len(texts(py)) >= len(expected))
            assert texts(py) == expected  # each edit once, in order
        third = await app_page(ctx, app, errors)
        try:
            await run(third, OPEN, [hub.url, "shared.tabs", {}])
        except TimeoutError:  # say where the third page's replica stands
            seen = await third.evaluate(STANDING)
            raise AssertionError(f"the third page never caught up: {seen}") from None
        await gauges(running, connections=1, channels=2)
        assert await run(third, SAID) == expected
        await ctx.close()
    assert errors == []


KEPT = """async ([hub, id]) => {
  const cs = await import('/static/convsync.js');
  globalThis.cs = cs;
  const retry = { backoff: 50, maxBackoff: 250, keepalive: null };
  const r = cs.connect(hub, id, { shared: true, persist: 'indexeddb', ...retry });
  globalThis.r = r;
  await r.loaded;
  return { outbox: r.keeper.outbox.name, pending: r.pending };
}"""


async def test_shared_tabs_keep_an_outbox_each_and_resume_them_after_every_tab_closed(
    browser: Any,
    app: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """With `persist` too, each tab is a replica with an outbox of its own (the first free of
    `name`, `name#2`, ...), never refused `outbox_in_use` for sharing: two tabs edit with the
    hub down, every tab closes, two tabs open again and take the outboxes, and once the hub
    answers both edits land, each once."""
    errors: list[str] = []
    async with hubs(tmp_path, app) as hub:
        await hub.taken_down()
        ctx = await app_context(browser)
        pages = [await app_page(ctx, app, errors) for _ in range(2)]
        opened = [await run(page, KEPT, [hub.url, "shared.kept"]) for page in pages]
        assert len({kept["outbox"] for kept in opened}) == 2  # one outbox each
        for page, text in zip(pages, ("one", "two"), strict=True):
            await run(page, f"() => {{ r.conversation.push(cs.Message.user('{text}')); }}")
            await run(page, "() => globalThis.r.saved()")
        for page in pages:
            await page.close()
        pages = [await app_page(ctx, app, errors) for _ in range(2)]
        reopened = [await run(page, KEPT, [hub.url, "shared.kept"]) for page in pages]
        assert {kept["outbox"] for kept in reopened} == {kept["outbox"] for kept in opened}
        assert [kept["pending"] for kept in reopened] == [1, 1]
        running = await hub.up()
        async with connect(hub.url, "shared.kept", client="py") as py:
            await until(py, lambda: len(texts(py)) >= 2)
            for page in pages:
                with anyio.fail_after(bound(15)):
                    await run(page, "() => globalThis.r.flush()")
            await py.flush()
            assert sorted(texts(py)) == ["one", "two"]  # each once
        await gauges(running, connections=1, channels=2)  # the two tabs, on one socket
        await ctx.close()
    assert errors == []
