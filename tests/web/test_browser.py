"""The viewer in headless Chromium (Debian's, driven by Playwright) against a real hub, with
Python replicas on the other side."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio
from conftest import bound, hub_config

from client import connect
from client.demo import SCRIPT
from client.replica import Replica
from server import Hub, MemoryStore, SqliteStore
from server.auth import Key, KeyRing, mint_token
from sync import (
    Assistant,
    Author,
    Entry,
    Message,
    Reasoning,
    Stop,
    Text,
    ToolCall,
    TurnEnd,
    encode,
)
from sync.approvals import Approval
from sync.ids import IdMinter
from sync.steer import QUEUED_KIND, STOP_KIND, finish_stopped

CHROMIUM = os.environ.get("CONVSYNC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = os.environ.get("CONVSYNC_SCREENSHOT")  # a path: the mirror test saves the page there

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _why_no_browser() -> str | None:
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM} (scripts/ensure-chromium installs Debian's)"
    return None


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    """One headless Chromium for the module; fails instead of skipping when
    CONVSYNC_REQUIRE_BROWSER=1."""
    why = _why_no_browser()
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


class Pages:
    """Pages of one test; records console errors and dialogs (a script that ran)."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.contexts: list[Any] = []

    async def open(self, url: str, **context: Any) -> Any:
        ctx = await self.browser.new_context(**context)
        self.contexts.append(ctx)
        page = await ctx.new_page()
        page.set_default_timeout(bound(15) * 1000)
        page.on(
            "console",
            lambda message: message.type == "error" and self.errors.append(message.text),
        )
        page.on("pageerror", lambda error: self.errors.append(str(error)))

        async def dialog(d: Any) -> None:
            self.dialogs.append(d.message)
            await d.dismiss()

        page.on("dialog", dialog)
        await page.goto(url)
        return page

    async def close(self) -> None:
        for ctx in self.contexts:
            await ctx.close()


@pytest_asyncio.fixture(loop_scope="module")
async def pages(browser: Any) -> AsyncIterator[Pages]:
    """Pages for one test, closed after it."""
    opened = Pages(browser)
    yield opened
    await opened.close()


@pytest_asyncio.fixture(loop_scope="module")
async def hub() -> AsyncIterator[Hub]:
    """A hub on 127.0.0.1, port 0."""
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as running:
        yield running


def page_url(hub: Hub, path: str) -> str:
    return f"http://127.0.0.1:{hub.port}{path}"


async def until(replica: Replica, done: Callable[[], bool], seconds: float = 15) -> None:
    """Wait (bounded) until `done()` holds for the replica's value, woken by each record."""
    with anyio.fail_after(bound(seconds)):
        while not done():
            await replica.wait_for(replica.session.confirmed.revision + 1)


async def page_state(page: Any) -> Any:
    """The page replica's value, as JSON."""
    text = await page.evaluate("JSON.stringify(globalThis.convsyncView.replica.conversation)")
    return json.loads(text)


async def settled(page: Any) -> None:
    """Wait until the page replica is connected with nothing pending."""
    await page.wait_for_function(
        "() => { const r = globalThis.convsyncView?.replica;"
        " return r && r.state === 'connected' && r.session.settled; }"
    )


def texts(replica: Replica) -> list[str]:
    out = []
    for message in replica.conversation.messages():
        for part in getattr(message, "content", []):
            if isinstance(part, Text):
                out.append(part.text)
    return out


async def play_demo(worker: Replica, turns: int) -> None:
    """The demo's agent: question, turn record, call, result, answer, turn end."""
    conversation = worker.conversation
    conversation.push(Message.system("You are a helpful assistant with three tools."))
    for turn in range(turns):
        question, tool, arguments, result, answer = SCRIPT[turn % len(SCRIPT)]
        conversation.push(Message.user(question))
        conversation.open_turn()
        call = ToolCall(f"call_{turn}_{tool}", tool, arguments)
        thought = Reasoning(f"The user wants {tool}; call it with {arguments}.")
        conversation.push(Assistant([thought, Text("Let me check."), call], stop=Stop("tool_use")))
        conversation.push(Message.tool_result(call.id, tool, result))
        answer_id = conversation.push(Message.assistant(answer, stop=Stop("stop")))
        conversation.end_turn(TurnEnd.answered(answer_id))
        await worker.flush()


async def test_page_mirrors_a_worker_live_with_calls_paired_with_results(
    hub: Hub, pages: Pages
) -> None:
    """Every entry a worker pushes appears in the page with its id and role; each tool call
    shows its result inside it; reasoning is folded; turns are marked."""
    page = await pages.open(page_url(hub, "/c/demo.mirror"))
    await page.wait_for_selector("#app[data-connection-state=connected]")
    async with connect(hub.url, "demo.mirror", client="demo-worker") as worker:
        with anyio.fail_after(bound(20)):
            await play_demo(worker, 3)
        entries = worker.conversation.entries()
        last = entries[-1].id
        await page.wait_for_selector(f'[data-entry-id="{last}"]')
        drawn = await page.eval_on_selector_all(
            "#app .log [data-entry-id]", "els => els.map(e => [e.dataset.entryId, e.dataset.role])"
        )
        assert drawn == [[ref.id, type(ref.message).__name__.lower()] for ref in entries]
        for turn in range(3):
            _, tool, _, result, _ = SCRIPT[turn]
            call = page.locator(f'[data-call-id="call_{turn}_{tool}"]')
            paired = call.locator(f'[data-result-for="call_{turn}_{tool}"]')
            assert await paired.text_content() == result
        reasoning = page.locator("details.reasoning").first
        assert await reasoning.get_attribute("open") is None
        assert await page.locator("[data-turn]").count() == 3
        # The worker starts answering a follow-up: its status and its draft show live.
        worker.conversation.push(Message.user("And what about tomorrow in Lisbon?"))
        await worker.flush()
        await worker.set_status("answering")
        async with worker.draft() as draft:
            draft.append("Tomorrow looks sunny too, around 20°C in the after")
            await page.wait_for_selector(f'[data-draft-id="{draft.id}"] [data-part=text]')
            await page.wait_for_selector('[data-presence-client="demo-worker"] .status')
            if SCREENSHOT:
                await page.set_viewport_size({"width": 900, "height": 1100})
                await page.wait_for_timeout(100)  # the page follows the bottom on its next frame
                await page.screenshot(path=SCREENSHOT)
            await draft.abort()
        await page.wait_for_selector("[data-draft-id]", state="detached")
    assert await page_state(page) == json.loads(encode(worker.conversation.state()))
    assert pages.errors == [] and pages.dialogs == []


async def test_a_message_typed_in_the_page_reaches_a_python_replica(hub: Hub, pages: Pages) -> None:
    """The composer pushes a user message; a Python replica receives it once."""
    async with connect(hub.url, "type.1", client="py") as py:
        py.conversation.push(Message.user("hello from python"))
        await py.flush()
        page = await pages.open(page_url(hub, "/c/type.1"))
        await page.wait_for_selector("[data-entry-id]")
        await page.fill("textarea[name=message]", "hello from the browser 👋")
        await page.click("button[data-action=send]")
        await until(py, lambda: "hello from the browser 👋" in texts(py))
        assert texts(py) == ["hello from python", "hello from the browser 👋"]
        assert await page.input_value("textarea[name=message]") == ""
        await settled(page)
        await page.wait_for_selector("[data-pending]", state="detached")


async def test_stop_lands_a_halt(hub: Hub, pages: Pages) -> None:
    """The Stop button pushes a `stopped` halt that a worker sees."""
    async with connect(hub.url, "stop.1", client="worker") as py:
        py.conversation.push(Message.user("run forever"))
        await py.flush()
        page = await pages.open(page_url(hub, "/c/stop.1"))
        await page.wait_for_selector("[data-entry-id]")
        await page.click("button[data-action=stop]")
        await until(py, lambda: py.conversation.halted() == "stopped")
        await page.wait_for_selector(".halt:not([hidden])")


async def test_the_page_reconnects_after_a_hub_restart_and_sends_a_pending_message_once(
    pages: Pages, tmp_path: Path
) -> None:
    """The hub goes away under the page; a message typed meanwhile waits (pending), and is
    sent exactly once when the hub is back; page and Python replica converge."""
    store = tmp_path / "hub.db"
    config = hub_config()
    async with Hub(SqliteStore(store), host="127.0.0.1", port=0, config=config) as first:
        port = first.port
        async with connect(first.url, "restart.1", client="py") as py:
            py.conversation.push(Message.user("before"))
            await py.flush()
        page = await pages.open(f"http://127.0.0.1:{port}/c/restart.1")
        await page.wait_for_selector("[data-entry-id]")
    await page.wait_for_selector("#app:not([data-connection-state=connected])")
    await page.fill("textarea[name=message]", "sent while the hub was down")
    await page.click("button[data-action=send]")
    await page.wait_for_selector(".pending:not([hidden])")
    assert await page.locator("[data-pending=true]").count() == 1
    async with Hub(SqliteStore(store), host="127.0.0.1", port=port, config=config) as second:
        await page.wait_for_selector("#app[data-connection-state=connected]")
        await settled(page)
        async with connect(second.url, "restart.1", client="py") as py:
            await until(py, lambda: len(py.conversation) == 2)
            assert texts(py) == ["before", "sent while the hub was down"]
            assert await page_state(page) == json.loads(encode(py.conversation.state()))
        room = await second.room_for_read("restart.1")
        assert room is not None and room.revision == 2


async def test_two_pages_and_a_python_replica_editing_at_once_converge(
    hub: Hub, pages: Pages
) -> None:
    """Two pages type while a Python replica pushes; all three end with the hub's value and
    every message exactly once."""
    first = await pages.open(page_url(hub, "/c/busy.1"))
    second = await pages.open(page_url(hub, "/c/busy.1"))
    for page in (first, second):
        await page.wait_for_selector("#app[data-connection-state=connected]")
    async with connect(hub.url, "busy.1", client="py") as py:

        async def type_in(page: Any, name: str) -> None:
            for n in range(6):
                await page.fill("textarea[name=message]", f"{name} {n}")
                await page.press("textarea[name=message]", "Enter")

        async with anyio.create_task_group() as group:
            group.start_soon(type_in, first, "first")
            group.start_soon(type_in, second, "second")
            for n in range(6):
                py.conversation.push(Message.user(f"py {n}"))
                await anyio.sleep(0.02)  # spread over the pages' typing
        await py.flush()
        await until(py, lambda: len(py.conversation) == 18, seconds=20)
        for page in (first, second):
            await settled(page)
            await page.wait_for_function(
                "n => globalThis.convsyncView.replica.revision >= n", arg=py.revision
            )
        expected = json.loads(encode(py.conversation.state()))
        assert await page_state(first) == expected
        assert await page_state(second) == expected
        got = sorted(texts(py))
        assert got == sorted(f"{who} {n}" for who in ("first", "second", "py") for n in range(6))
        for who in ("first", "second", "py"):  # each author's order kept
            mine = [t for t in texts(py) if t.startswith(who + " ")]
            assert mine == [f"{who} {n}" for n in range(6)]


async def test_an_address_with_a_bad_escape_shows_the_list_not_a_blank_page(
    hub: Hub, pages: Pages
) -> None:
    """`/c/%E0%A4%A` is no conversation id (a bad `%` escape): the page threw and stayed
    blank (review, stop 22); it shows the list of conversations."""
    page = await pages.open(page_url(hub, "/c/%E0%A4%A"))
    await page.wait_for_selector("ol.conversations", state="attached")
    assert pages.errors == []


async def test_the_list_shows_a_new_conversation_without_a_reload(hub: Hub, pages: Pages) -> None:
    """The list page follows /v1/summary: a conversation created later appears, and its row
    moves when it changes."""
    async with connect(hub.url, "list.old", client="py") as py:
        py.conversation.push(Message.user("old one"))
        await py.flush()
    page = await pages.open(page_url(hub, "/"))
    await page.wait_for_selector('[data-conversation-id="list.old"]')
    assert await page.locator('[data-conversation-id="list.new"]').count() == 0
    async with connect(hub.url, "list.new", client="newcomer") as py:
        py.conversation.push(Message.user("brand new"))
        await py.flush()
        row = page.locator('[data-conversation-id="list.new"]')
        await row.wait_for()
        assert "brand new" in (await row.locator(".preview").text_content() or "")
        await page.wait_for_selector('[data-conversation-id="list.new"] .online')
        py.conversation.push(Message.user("second"))
        await py.flush()
        await page.wait_for_selector('[data-conversation-id="list.new"][data-revision="2"]')
    await page.click('[data-conversation-id="list.new"] a')
    await page.wait_for_selector("[data-entry-id]")
    assert page.url.endswith("/c/list.new")


async def test_the_list_pages_sorts_searches_and_names_a_refused_prefix(
    hub: Hub, pages: Pages
) -> None:
    """The list page as a dashboard (SPEC 17): 50 rows a page by id with a next page, the
    latest activity first when sorted so, a search over the shown rows, a refused prefix
    named instead of "No conversations yet"."""
    for n in range(52):
        async with connect(hub.url, f"dash.{n:02}", client="py") as py:
            py.conversation.push(Message.user(f"text {n}"))
            await py.flush()
    page = await pages.open(page_url(hub, "/?prefix=dash."))
    rows = page.locator("[data-conversation-id]")
    await page.wait_for_selector('[data-conversation-id="dash.49"]')
    assert await rows.count() == 50
    assert await page.locator('[data-conversation-id="dash.50"]').count() == 0
    await page.click("button[data-action=next]")
    await page.wait_for_selector('[data-conversation-id="dash.51"]')
    await page.wait_for_selector('[data-conversation-id="dash.00"]', state="detached")
    assert await rows.count() == 2
    await page.click("button[data-action=previous]")
    await page.wait_for_selector('[data-conversation-id="dash.00"]')
    await page.mouse.move(0, 0)  # off the list: rows under the pointer hold their place
    await page.select_option("select[name=order]", "updated")
    # The latest first: wait for the order itself (the new window's rows may be drawn
    # before they are sorted on a loaded machine), bounded by the page's default timeout.
    await page.wait_for_function(
        "() => document.querySelector('[data-conversation-id]')?.dataset.conversationId"
        " === 'dash.51'"
    )
    assert await rows.first.get_attribute("data-conversation-id") == "dash.51"
    await page.fill("input[name=search]", "text 7")
    await page.wait_for_selector('[data-conversation-id="dash.51"]', state="detached")
    assert await rows.count() == 1  # "text 7" of the 50 latest: dash.07 only
    page = await pages.open(page_url(hub, "/?prefix=no%20spaces"))
    problem = page.locator(".problem")
    await problem.wait_for()
    assert "refused this list" in (await problem.text_content() or "")
    assert await page.locator(".empty:not(.problem)").is_hidden()
    assert pages.errors == []


MARKUP = "<img src=x onerror=alert(1)>"


async def test_markup_in_a_message_shows_as_text_and_runs_nothing(hub: Hub, pages: Pages) -> None:
    """A message that looks like HTML is shown as those characters; no element is made from
    it and no script runs (checked in a message, a tool call, a result and reasoning)."""
    async with connect(hub.url, "xss.1", client="py") as py:
        call = ToolCall("call_x", MARKUP, {"q": MARKUP})
        py.conversation.push(Message.user(MARKUP))
        py.conversation.push(Assistant([Reasoning(MARKUP), call], stop=Stop("tool_use")))
        py.conversation.push(Message.tool_result("call_x", MARKUP, MARKUP))
        await py.flush()
        page = await pages.open(page_url(hub, "/c/xss.1"))
        first = py.conversation.entries()[0].id
        await page.wait_for_selector('[data-result-for="call_x"]')
        text = await page.locator(f'[data-entry-id="{first}"] .text').text_content()
        assert text == MARKUP
        assert await page.locator('[data-result-for="call_x"]').text_content() == MARKUP
        assert await page.locator("#app img").count() == 0
        assert pages.dialogs == []


async def test_a_tool_result_edited_after_it_was_drawn_is_drawn_again(
    hub: Hub, pages: Pages
) -> None:
    """A plugin redacts a tool result the page already shows: the page shows the redacted
    text. The call's drawing was only redrawn when a result came or went, so the secret
    stayed on screen until a reload (review, stop 22)."""
    async with connect(hub.url, "redact.1", client="py") as py:
        py.conversation.push(Message.user("look up the key"))
        py.conversation.push(Assistant([ToolCall("call_1", "vault", {})], stop=Stop("tool_use")))
        py.conversation.push(Message.tool_result("call_1", "vault", "SECRET-KEY-123"))
        await py.flush()
        page = await pages.open(page_url(hub, "/c/redact.1"))
        result = page.locator('[data-result-for="call_1"]')
        await page.wait_for_selector('[data-result-for="call_1"]')
        assert await result.text_content() == "SECRET-KEY-123"
        redacted = Message.tool_result("call_1", "vault", "[redacted]")
        py.conversation.edit_each(
            Author.plugin("redactor"), lambda ref: redacted if ref.index == 2 else None
        )
        await py.flush()
        await page.wait_for_function(
            "() => document.querySelector('[data-result-for=\"call_1\"]')"
            "?.textContent === '[redacted]'",
            timeout=bound(10) * 1000,
        )


async def test_emoji_and_joined_sequences_render_intact(hub: Hub, pages: Pages) -> None:
    """Emoji, ZWJ families, flags, skin tones and combining marks arrive as the same code
    points, both ways."""
    text = "family 👩‍👩‍👧‍👦 flag 🇵🇹 thumbs 👍🏽 café e\u0301 𝄞"
    async with connect(hub.url, "emoji.1", client="py") as py:
        py.conversation.push(Message.user(text))
        await py.flush()
        page = await pages.open(page_url(hub, "/c/emoji.1"))
        first = py.conversation.entries()[0].id
        shown = await page.locator(f'[data-entry-id="{first}"] .text').text_content()
        assert shown == text
        await page.fill("textarea[name=message]", "back: " + text)
        await page.click("button[data-action=send]")
        await until(py, lambda: len(py.conversation) == 2)
        assert texts(py)[1] == "back: " + text


async def test_the_token_in_the_fragment_goes_in_hello_and_leaves_the_address_bar(
    hub: Hub, pages: Pages
) -> None:
    """`#token=...` is read, removed from the address bar and sent only in `hello`; the page
    runs under the hub's CSP with no violation."""
    sent: list[str] = []
    ctx = await pages.browser.new_context()
    pages.contexts.append(ctx)
    page = await ctx.new_page()
    page.on("websocket", lambda ws: ws.on("framesent", lambda data: sent.append(str(data))))
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    response = await page.goto(page_url(hub, "/c/token.1#token=s3cret.tok"))
    assert response is not None
    csp = response.headers["content-security-policy"]
    assert csp == "default-src 'self'; frame-ancestors 'none'"
    await page.wait_for_selector("#app[data-connection-state=connected]")
    assert page.url == page_url(hub, "/c/token.1")
    hellos = [json.loads(frame) for frame in sent if '"hello"' in frame]
    assert hellos and hellos[0]["token"] == "s3cret.tok"
    assert errors == []


async def test_a_long_conversation_draws_only_its_tail(hub: Hub, pages: Pages) -> None:
    """At 2,000 messages the page draws its last ones and adds earlier ones on demand."""
    async with connect(hub.url, "long.1", client="py") as py:
        py.conversation.extend(Message.user(f"message {n}") for n in range(2000))
        await py.flush()
        page = await pages.open(page_url(hub, "/c/long.1"))
        last = py.conversation.entries()[-1].id
        await page.wait_for_selector(f'[data-entry-id="{last}"]')
        drawn = await page.locator(".log [data-entry-id]").count()
        assert 0 < drawn < 400
        await page.click("button.more")
        assert await page.locator(".log [data-entry-id]").count() > drawn


async def test_the_page_opens_one_socket_before_its_replica_loads_and_uses_it(
    hub: Hub, pages: Pages
) -> None:
    """The conversation page opens its socket (hello sent) before the replica's modules load
    and the replica adopts it: one websocket for the page, the history drawn, and a message
    typed there lands on it."""
    async with connect(hub.url, "early.1", client="py") as py:
        py.conversation.extend(Message.user(f"message {n}") for n in range(300))
        await py.flush()
        ctx = await pages.browser.new_context()
        pages.contexts.append(ctx)
        page = await ctx.new_page()
        page.set_default_timeout(bound(15) * 1000)
        sockets: list[str] = []
        page.on("websocket", lambda ws: sockets.append(ws.url))
        page.on("pageerror", lambda error: pages.errors.append(str(error)))
        await page.goto(page_url(hub, "/c/early.1"))
        last = py.conversation.entries()[-1].id
        await page.wait_for_selector(f'[data-entry-id="{last}"]')
        await page.fill("textarea[name=message]", "typed on the early socket")
        await page.click("button[data-action=send]")
        await until(py, lambda: "typed on the early socket" in texts(py))
        await settled(page)
        assert sockets == [f"ws://127.0.0.1:{hub.port}/v1/conversations/early.1"]
        assert await page.evaluate("globalThis.convsyncView.replica.connects") == 1
        assert texts(py).count("typed on the early socket") == 1
        assert pages.errors == []


async def test_a_streamed_draft_grows_intact_and_is_replaced_by_one_message(
    hub: Hub, pages: Pages
) -> None:
    """Draft frames (SPEC 7) fed to the page's socket grow a draft element, emoji sequences
    split across appends by code-point offsets intact; the record with the draft's id replaces
    it with exactly one entry. (The hub does not send drafts yet: the frames are delivered to
    the page's socket handler, as the hub would.)"""
    draft_id = IdMinter().message_id()
    text = "Hi 👩‍👩‍👧‍👦 and 🇵🇹, thumbs 👍🏽!"
    points = list(text)
    async with connect(hub.url, "draft.1", client="agent") as py:
        py.conversation.push(Message.user("stream something"))
        await py.flush()
        page = await pages.open(page_url(hub, "/c/draft.1"))
        await page.wait_for_selector("[data-entry-id]")
        deliver = "frame => globalThis.convsyncView.replica.ws.onmessage({data: frame})"
        opened = {"id": draft_id, "role": "assistant", "client": "agent", "parts": {"text": ""}}
        await page.evaluate(deliver, json.dumps({"type": "drafts", "drafts": [opened]}))
        draft = page.locator(f'[data-draft-id="{draft_id}"] [data-part=text]')
        for start in range(0, len(points), 3):  # cuts inside the ZWJ family and the flag
            chunk = "".join(points[start : start + 3])
            frame = {"type": "draft", "id": draft_id, "op": "append", "part": "text"}
            frame |= {"offset": start, "text": chunk, "name": None}
            await page.evaluate(deliver, json.dumps(frame))
            await page.wait_for_function(
                "([id, n]) => globalThis.convsyncView.replica.drafts.get(id)?.lengths.text === n",
                arg=[draft_id, min(start + 3, len(points))],
            )
        await page.wait_for_function(
            "([id, t]) => document.querySelector(`[data-draft-id='${id}'] [data-part=text]`)"
            "?.textContent === t",
            arg=[draft_id, text],
        )
        assert await draft.text_content() == text
        py.conversation.push(Entry(Message.assistant(text, stop=Stop("stop")), id=draft_id))
        await py.flush()
        await page.wait_for_selector(f'[data-entry-id="{draft_id}"]')
        await page.wait_for_selector("[data-draft-id]", state="detached")
        assert await page.locator(f'[data-entry-id="{draft_id}"]').count() == 1
        shown = await page.locator(f'[data-entry-id="{draft_id}"] .text').text_content()
        assert shown == text


async def test_a_draft_from_a_python_worker_streams_into_the_page_with_presence(
    hub: Hub, pages: Pages
) -> None:
    """Against the hub's real drafts and presence: a worker's status shows in the page, its
    draft grows step by step with emoji sequences cut across appends kept intact, and the
    committed message replaces the draft with exactly one entry."""
    text = "Sure 👩‍👩‍👧‍👦 and 🇵🇹, 👍🏽 café e\u0301!"
    points = list(text)
    async with connect(hub.url, "stream.1", client="agent") as py:
        py.conversation.push(Message.user("stream an answer"))
        await py.flush()
        page = await pages.open(page_url(hub, "/c/stream.1"))
        await page.wait_for_selector("#app[data-connection-state=connected]")
        await py.set_status("thinking")
        await page.wait_for_selector('[data-presence-client="agent"] .status')
        status = page.locator('[data-presence-client="agent"] .status')
        assert await status.text_content() == "thinking"
        async with py.draft() as draft:
            for start in range(0, len(points), 3):  # cuts inside the family, flag and tone
                draft.append("".join(points[start : start + 3]))
                so_far = "".join(points[: start + 3])
                await page.wait_for_function(
                    "([id, t]) => document.querySelector("
                    "`[data-draft-id='${id}'] [data-part=text]`)?.textContent === t",
                    arg=[draft.id, so_far],
                )
            final_id = await draft.commit(Message.assistant(text, stop=Stop("stop")))
        await py.flush()
        await page.wait_for_selector(f'[data-entry-id="{final_id}"]')
        await page.wait_for_selector("[data-draft-id]", state="detached")
        assert final_id == draft.id
        assert await page.locator(f'[data-entry-id="{final_id}"]').count() == 1
        shown = await page.locator(f'[data-entry-id="{final_id}"] .text').text_content()
        assert shown == text
        assert await page_state(page) == json.loads(encode(py.conversation.state()))


async def test_a_status_the_worker_clears_leaves_the_page(hub: Hub, pages: Pages) -> None:
    """`set_status(None)` takes the worker's status out of the page (it used to stay)."""
    async with connect(hub.url, "status.1", client="agent") as py:
        py.conversation.push(Message.user("work on it"))
        await py.flush()
        page = await pages.open(page_url(hub, "/c/status.1"))
        await page.wait_for_selector("#app[data-connection-state=connected]")
        await py.set_status("generating")
        await page.wait_for_selector('[data-presence-client="agent"] .status')
        await py.set_status(None)
        await page.wait_for_selector('[data-presence-client="agent"] .status', state="detached")
        assert await page.locator('[data-presence-client="agent"]').count() == 1


SECRET = b"s3cret-for-browser-tests-0123456789"


def page_token(sub: str, scope: str = "read write presence", secret: bytes = SECRET) -> str:
    """A token for the auth hub of `auth_hub`."""
    return mint_token(secret, sub, scope.split(), ["*"], 300)


def auth_hub() -> Hub:
    """A hub that checks tokens signed with `SECRET` (use as `async with`)."""
    keys = KeyRing.of(Key.secret(SECRET))
    return Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config(), keys=keys)


async def test_a_second_tab_of_one_person_is_shown_as_that_person(pages: Pages) -> None:
    """With tokens, two tabs of one principal are one person in the list ("you" in both),
    beside another principal's replica."""
    async with auth_hub() as hub:
        alice, bob = page_token("alice"), page_token("bob")
        async with connect(hub.url, "tabs.1", client="bob-worker", token=bob) as py:
            py.conversation.push(Message.user("hello"))
            await py.flush()
            first = await pages.open(page_url(hub, f"/c/tabs.1#token={alice}"))
            second = await pages.open(page_url(hub, f"/c/tabs.1#token={alice}"))
            for page in (first, second):
                await page.wait_for_selector("#app[data-connection-state=connected]")
                await page.wait_for_function(
                    "() => document.querySelectorAll('.presence li').length === 2"
                    " && globalThis.convsyncView.replica.presence.size === 3"
                )
                who = await page.eval_on_selector_all(
                    ".presence li", "items => items.map(i => i.dataset.presenceWho).sort()"
                )
                assert who == ["principal:alice", "principal:bob"]
                mine = page.locator('[data-presence-who="principal:alice"]')
                assert (await mine.text_content() or "").startswith("you")


async def test_message_text_renders_safe_markdown(hub: Hub, pages: Pages) -> None:
    """Code, emphasis, lists and http(s) links render; a `<script>` stays text and runs
    nothing, a `javascript:` link is no link; every text block follows its text's direction."""
    text = (
        "**Done** with `make test`:\n- one\n- two\n"
        "<script>alert(1)</script> [bad](javascript:alert(2)) [docs](https://example.com/d)\n"
        "```\n<b>not bold</b>\n```\n\u05e9\u05dc\u05d5\u05dd"
    )
    async with connect(hub.url, "md.1", client="py") as py:
        entry_id = py.conversation.push(Message.assistant(text, stop=Stop("stop")))
        await py.flush()
        page = await pages.open(page_url(hub, "/c/md.1"))
        block = page.locator(f'[data-entry-id="{entry_id}"] .text')
        await block.wait_for()
        assert await block.get_attribute("dir") == "auto"
        assert await block.locator("strong").text_content() == "Done"
        assert await block.locator("code").first.text_content() == "make test"
        assert await block.locator("ul > li").all_text_contents() == ["one", "two"]
        assert await block.locator("pre").text_content() == "<b>not bold</b>"
        assert await block.locator("b, script").count() == 0
        links = block.locator("a")
        assert await links.count() == 1
        assert await links.get_attribute("href") == "https://example.com/d"
        assert "noopener" in (await links.get_attribute("rel") or "")
        shown = await block.text_content() or ""
        assert "<script>alert(1)</script>" in shown and "[bad](javascript:alert(2))" in shown
        assert pages.dialogs == []


async def test_a_read_only_token_gets_no_composer_and_no_stop(pages: Pages) -> None:
    """A token without `write` shows the conversation with no composer and no Stop (the hub
    would refuse both); a token with it gets them."""
    async with auth_hub() as hub:
        async with connect(hub.url, "ro.1", client="py", token=page_token("py")) as py:
            py.conversation.push(Message.user("read me"))
            await py.flush()
        reader = await pages.open(page_url(hub, f"/c/ro.1#token={page_token('r', 'read')}"))
        writer = await pages.open(page_url(hub, f"/c/ro.1#token={page_token('w')}"))
        for page in (reader, writer):
            await page.wait_for_selector("#app[data-connection-state=connected]")
            await page.wait_for_selector(".text")
        assert not await reader.locator("form.composer").is_visible()
        assert not await reader.locator("[data-action=stop]").is_visible()
        assert await writer.locator("form.composer").is_visible()
        assert await writer.locator("[data-action=stop]").is_visible()


async def test_a_refused_token_is_asked_for_again_and_a_new_one_in_the_address_is_used(
    pages: Pages,
) -> None:
    """A token the hub refuses shows the refusal and a field for a new one; a token pasted
    there, or put in the address (`#token=`, as a token service renewing it would), connects
    the same page without a reload."""
    async with auth_hub() as hub:
        async with connect(hub.url, "renew.1", client="py", token=page_token("py")) as py:
            py.conversation.push(Message.user("still here"))
            await py.flush()
        forged = page_token("eve", secret=b"not-the-hubs-secret-0123456789abcd")
        page = await pages.open(page_url(hub, f"/c/renew.1#token={forged}"))
        await page.wait_for_selector(".notice .token-prompt")
        assert "unauthorized" in (await page.locator(".notice").text_content() or "")
        await page.fill(".token-prompt input", page_token("alice"))
        await page.click(".token-prompt button")
        await page.wait_for_selector("#app[data-connection-state=connected]")
        await page.wait_for_selector(".text")
        second = await pages.open(page_url(hub, f"/c/renew.1#token={forged}"))
        await second.wait_for_selector(".notice .token-prompt")
        await second.evaluate("t => { location.hash = 'token=' + t; }", page_token("bob"))
        await second.wait_for_selector("#app[data-connection-state=connected]")
        assert second.url == page_url(hub, "/c/renew.1")  # the token left the address bar
        assert await second.locator(".text").first.text_content() == "still here"


# ---------------------------------------------------------------------- the dashboard (SPEC 17)

FLEET = 1000  # conversations under the prefix
ACTIVE = 50  # of them kept busy by agents


@pytest_asyncio.fixture(loop_scope="module")
async def fleet() -> AsyncIterator[tuple[Hub, list[str]]]:
    """A hub holding 1,000 conversations, 50 of them with an agent pushing every 0.5 s."""
    from fleet import active_ids, fleet_ids, keep_busy, seed_fleet

    config = hub_config(idle_unload=5.0)
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as running:
        ids = fleet_ids(FLEET)
        await seed_fleet(running.store, ids)
        busy = active_ids(ids, ACTIVE)
        done = anyio.Event()
        # A task of its own: a fixture's setup and teardown run in different tasks, so a
        # task group cannot span its `yield`.
        agents = asyncio.ensure_future(keep_busy(running.url, busy, 0.5, done))
        try:
            yield running, busy
        finally:
            done.set()
            with anyio.fail_after(bound(30)):
                await agents


async def place_of(page: Any, conversation_id: str) -> Any:
    """Where row `conversation_id` is drawn (x, y, width, height), read in one go."""
    return await page.evaluate(
        'id => { const r = document.querySelector(`[data-conversation-id="${id}"]`)'
        "?.getBoundingClientRect(); return r && [r.x, r.y, r.width, r.height]; }",
        conversation_id,
    )


async def row_ids(page: Any) -> list[str]:
    ids = await page.eval_on_selector_all(
        "[data-conversation-id]", "rows => rows.map(row => row.dataset.conversationId)"
    )
    return list(ids)


async def test_a_row_under_the_pointer_holds_its_place_while_others_change(
    fleet: tuple[Hub, list[str]], pages: Pages
) -> None:
    """Sorted by activity with 50 agents busy, the row under the pointer stays where it is
    for 2 s (the list's order is held while the pointer is on it) though others change and
    would reorder it; off the list, the order follows activity again."""
    hub, busy = fleet
    page = await pages.open(
        page_url(hub, "/?order=updated"), viewport={"width": 1280, "height": 900}
    )
    await page.wait_for_function(
        "() => document.querySelectorAll('[data-conversation-id]').length === 50"
    )
    await page.locator("[data-conversation-id]").nth(5).hover()
    held = (await row_ids(page))[5]
    box = await place_of(page, held)
    assert held in busy and box is not None
    before = dict(
        zip(
            await row_ids(page),
            await page.eval_on_selector_all(
                "[data-conversation-id]", "rows => rows.map(row => row.dataset.revision)"
            ),
            strict=True,
        )
    )
    reordered = False
    with anyio.fail_after(bound(10)):
        for _ in range(20):  # 2 s
            await anyio.sleep(0.1)
            now = await place_of(page, held)
            under = await page.evaluate(
                f"document.elementFromPoint({box[0] + 5}, {box[1] + box[3] / 2})"
                "?.closest('[data-conversation-id]')?.dataset.conversationId"
            )
            assert under == held and now == box, (under, now, box)
            order = await page.evaluate("globalThis.convsyncView.ordered().map(row => row.id)")
            reordered = reordered or order[5] != held
    after = dict(
        zip(
            await row_ids(page),
            await page.eval_on_selector_all(
                "[data-conversation-id]", "rows => rows.map(row => row.dataset.revision)"
            ),
            strict=True,
        )
    )
    changed = [i for i in before if i != held and after.get(i) != before[i]]
    assert len(changed) >= 10, changed  # others changed all along
    assert reordered, "the activity never would have moved the row: the test shows nothing"
    await page.mouse.move(1270, 890)  # off the list: the latest activity first again
    await page.wait_for_function(
        "() => { const v = globalThis.convsyncView; const drawn = [...document.querySelectorAll("
        "'[data-conversation-id]')].map(r => r.dataset.conversationId);"
        " return v.frozen === null && drawn.length === 50; }"
    )
    assert pages.errors == []


async def test_the_dashboard_pages_and_searches_a_thousand_conversations(
    fleet: tuple[Hub, list[str]], pages: Pages
) -> None:
    """With 1,000 conversations by id: 50 a page, Next and Previous move by pages; a search
    finds a conversation on no page shown (by id, and by what its last message says), and
    clearing it brings back the page it left."""
    hub, _ = fleet
    page = await pages.open(page_url(hub, "/"), viewport={"width": 1280, "height": 900})
    await page.mouse.move(1270, 890)
    await page.wait_for_selector('[data-conversation-id="fleet.0049"]')
    assert await row_ids(page) == [f"fleet.{n:04}" for n in range(50)]
    for first in (50, 100, 150):
        await page.click("button[data-action=next]")
        await page.wait_for_selector(f'[data-conversation-id="fleet.{first:04}"]')
        await page.wait_for_selector(
            f'[data-conversation-id="fleet.{first - 1:04}"]', state="detached"
        )
        assert await row_ids(page) == [f"fleet.{n:04}" for n in range(first, first + 50)]
    await page.click("button[data-action=previous]")
    await page.wait_for_selector('[data-conversation-id="fleet.0100"]')
    await page.wait_for_selector('[data-conversation-id="fleet.0150"]', state="detached")
    assert await row_ids(page) == [f"fleet.{n:04}" for n in range(100, 150)]
    await page.fill("input[name=search]", "fleet.0777")
    await page.wait_for_selector('[data-conversation-id="fleet.0777"]')
    assert await row_ids(page) == ["fleet.0777"]
    assert await page.locator("button[data-action=next]").is_hidden()
    await page.fill("input[name=search]", "topic 0913:")  # what its message says
    await page.wait_for_selector('[data-conversation-id="fleet.0913"]')
    assert await row_ids(page) == ["fleet.0913"]
    await page.fill("input[name=search]", "fleet.")  # every one: the first 50 shown
    await page.wait_for_selector(".matches:not([hidden])")
    assert "1000 conversations match" in (await page.locator(".matches").text_content() or "")
    assert len(await row_ids(page)) == 50
    await page.fill("input[name=search]", "")
    await page.wait_for_selector('[data-conversation-id="fleet.0149"]')
    assert await row_ids(page) == [f"fleet.{n:04}" for n in range(100, 150)]
    # The pointer coming over the list while the cleared search's window is on its way holds
    # nothing of the old window: its rows do not stay beside the new page's.
    await page.fill("input[name=search]", "fleet.")
    await page.wait_for_selector('[data-conversation-id="fleet.0000"]')
    await page.evaluate(
        """() => {
        const search = document.querySelector('input[name=search]');
        search.value = '';
        search.dispatchEvent(new Event('input'));
        document.querySelector('ol.conversations').dispatchEvent(new PointerEvent('pointerenter'));
        }"""
    )
    await page.wait_for_selector('[data-conversation-id="fleet.0149"]')
    await page.wait_for_selector('[data-conversation-id="fleet.0000"]', state="detached")
    assert await row_ids(page) == [f"fleet.{n:04}" for n in range(100, 150)]
    assert pages.errors == []


# ---------------------------------------------------------------------- steering (SPEC 10)


async def test_a_message_sent_while_a_tool_runs_is_shown_queued_then_lands_and_is_answered(
    hub: Hub, pages: Pages
) -> None:
    """The composer works mid-step: the message shows as queued until the tool's result
    lands, then lands after it and the worker answers it."""
    call = Assistant([Text("looking"), ToolCall("c1", "search", {"q": "x"})])
    async with connect(hub.url, "steer.1", client="worker") as worker:
        worker.conversation.push(Message.user("find x"))
        worker.open_turn()
        worker.conversation.push(call)
        await worker.flush()
        page = await pages.open(page_url(hub, "/c/steer.1"))
        await page.wait_for_selector("[data-entry-id]")
        assert await page.is_enabled("button[data-action=stop]")  # a turn runs
        await page.fill("textarea[name=message]", "also y")
        await page.click("button[data-action=send]")
        queued = await page.wait_for_selector("[data-queued-id]")
        assert await queued.inner_text() == "queued\nalso y\nunsend"
        await until(
            worker, lambda: any(a.kind == QUEUED_KIND for _, a in worker.conversation.asides())
        )
        worker.conversation.push(Message.tool_result("c1", "search", "found"))
        await worker.flush()  # the result lands, then the queued message
        assert texts(worker)[-1] == "also y" and worker.conversation.awaits_model()
        await page.wait_for_selector("[data-queued-id]", state="detached")
        answer_id = worker.conversation.push(Message.assistant("x found; y too"))
        worker.conversation.end_turn(TurnEnd.answered(answer_id))
        await worker.flush()
        await page.wait_for_function(
            "() => [...document.querySelectorAll('[data-entry-id]')].some("
            "e => e.textContent.includes('x found; y too'))"
        )
        assert not await page.is_enabled("button[data-action=stop]")  # nothing runs now


async def test_unsend_withdraws_a_queued_message_before_it_lands(hub: Hub, pages: Pages) -> None:
    """ "unsend" on a queued message takes it out of the queue: it never lands."""
    call = Assistant([ToolCall("c1", "search", {"q": "x"})])
    async with connect(hub.url, "steer.2", client="worker") as worker:
        worker.conversation.push(Message.user("find x"))
        worker.conversation.push(call)
        await worker.flush()
        page = await pages.open(page_url(hub, "/c/steer.2"))
        await page.wait_for_selector("[data-entry-id]")
        await page.fill("textarea[name=message]", "never mind")
        await page.click("button[data-action=send]")
        await until(
            worker, lambda: any(a.kind == QUEUED_KIND for _, a in worker.conversation.asides())
        )
        await page.click("[data-queued-id] button[data-action=unsend]")
        await until(
            worker, lambda: not any(a.kind == QUEUED_KIND for _, a in worker.conversation.asides())
        )
        await page.wait_for_selector("[data-queued-id]", state="detached")
        worker.conversation.push(Message.tool_result("c1", "search", "found"))
        await worker.flush()
        assert "never mind" not in texts(worker)


async def test_stop_while_a_turn_runs_puts_a_stop_request_the_worker_sees(
    hub: Hub, pages: Pages
) -> None:
    """Stop while the worker's tool runs asks the turn to stop (a `rig.stop` request, not a
    halt the running turn would never read); the page then disables Stop."""
    async with connect(hub.url, "steer.3", client="worker") as worker:
        worker.conversation.push(Message.user("find x"))
        worker.open_turn()
        worker.conversation.push(Assistant([ToolCall("c1", "search", {"q": "x"})]))
        await worker.flush()
        page = await pages.open(page_url(hub, "/c/steer.3"))
        await page.wait_for_selector("[data-entry-id]")
        with worker.cancel_on_stop() as scope:
            await page.click("button[data-action=stop]")
            await anyio.sleep(bound(15))  # the tool: only the stop ends it
        assert scope.cancelled_caught
        assert any(a.kind == STOP_KIND for _, a in worker.conversation.asides())
        await page.wait_for_selector("button[data-action=stop]:disabled")
        assert finish_stopped(worker.conversation)
        await worker.flush()
        await page.wait_for_selector(".halt:not([hidden])")


# ---------------------------------------------------------------------- approvals (SPEC 12)

CLICK_AT = """([at, action]) => new Promise((resolve) => setTimeout(() => {
  const button = document.querySelector(`[data-action=${action}]`);
  if (button) button.click();
  resolve(button !== null);
}, at - Date.now()))"""


async def approval_turn(worker: Replica, call: ToolCall | None) -> None:
    worker.conversation.push(Message.user("clean up"))
    worker.conversation.open_turn()
    content: list[Any] = [Text("may I?")] + ([call] if call is not None else [])
    worker.conversation.push(Assistant(content))
    await worker.flush()


async def open_connected(pages: Pages, url: str) -> Any:
    page = await pages.open(url)
    await page.wait_for_selector("#app[data-connection-state=connected]")
    return page


async def test_two_pages_click_approve_and_deny_at_once_one_decision_both_show_it(
    hub: Hub, pages: Pages
) -> None:
    """Both pages click at the same moment: the worker's `ask` returns one decision, and
    both pages (and the worker) show that same decision."""
    first = await open_connected(pages, page_url(hub, "/c/approve.race"))
    second = await open_connected(pages, page_url(hub, "/c/approve.race"))
    async with connect(hub.url, "approve.race", client="worker") as worker:
        await approval_turn(worker, ToolCall("c1", "delete", {"path": "build/"}))
        decisions: list[Approval] = []

        async def ask() -> None:
            decisions.append(await worker.ask(call="c1", prompt="delete build/?"))

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            for page in (first, second):
                await page.wait_for_selector("[data-approval-state=open] [data-action=approve]")
                assert "delete build/?" in await page.inner_text(".approval")
            # Both pages click at one wall-clock moment (one machine, one clock), well
            # inside a round trip to the hub: neither has seen the other's decision.
            at = await first.evaluate("Date.now() + 1000")
            clicked: list[bool] = []

            async def click(page: Any, action: str) -> None:
                clicked.append(await page.evaluate(CLICK_AT, [at, action]))

            async with anyio.create_task_group() as clicks:
                clicks.start_soon(click, first, "approve")
                clicks.start_soon(click, second, "deny")
            assert clicked == [True, True]
        (decision,) = decisions
        assert decision.state in ("approved", "denied")
        for page in (first, second):
            await page.wait_for_selector(f".approval[data-approval-state={decision.state}]")
            assert await page.locator("[data-action=approve]").count() == 0
            assert f"{decision.state} by anonymous" in await page.inner_text(".approval")
        assert [a.state for a in worker.approvals.values()] == [decision.state]
        # The loser's push reached the hub and was refused `decided`: a real race, lost.
        notices = [await page.inner_text(".notice") for page in (first, second)]
        rejected = hub.metrics.pushes_rejected["decided"]
        assert rejected == 1, (rejected, notices)
        assert sum("decided first" in notice for notice in notices) == 1, notices


async def test_a_question_is_answered_with_text_and_a_reason_is_shown_to_everyone(
    pages: Pages,
) -> None:
    """With tokens: an approve token answers; a read token sees the question and then the
    answer, who gave it and why, with no buttons; the worker's write token gets none either."""
    async with auth_hub() as hub:
        decider = await open_connected(
            pages, page_url(hub, f"/c/approve.q#token={page_token('alice', 'read approve')}")
        )
        reader = await open_connected(
            pages, page_url(hub, f"/c/approve.q#token={page_token('bob', 'read')}")
        )
        writer = await open_connected(
            pages, page_url(hub, f"/c/approve.q#token={page_token('carol')}")
        )
        token = page_token("worker")
        async with connect(hub.url, "approve.q", client="worker", token=token) as worker:
            await approval_turn(worker, None)
            answers: list[Approval] = []

            async def ask() -> None:
                ask = functools.partial(
                    worker.ask, key="account", prompt="which account?", schema={"type": "string"}
                )
                answers.append(await ask())

            async with anyio.create_task_group() as group:
                group.start_soon(ask)
                await decider.wait_for_selector("[data-approval-state=open] input[name=answer]")
                for page in (reader, writer):
                    await page.wait_for_selector("[data-approval-state=open]")
                    assert await page.locator(".approval button").count() == 0
                    assert "waiting for a person" in await page.inner_text(".approval")
                await decider.fill("input[name=answer]", "ops")
                await decider.fill("input[name=reason]", "the usual one")
                await decider.click("[data-action=approve]")
            assert answers[0].answer == "ops" and answers[0].decided_by == "alice"
            for page in (decider, reader, writer):
                await page.wait_for_selector("[data-approval-state=answered]")
                text = await page.inner_text(".approval")
                assert "answered by alice: ops (the usual one)" in text


async def test_a_question_with_choices_is_a_form_and_its_pick_is_the_answer(
    hub: Hub, pages: Pages
) -> None:
    """An `enum` question is drawn as a choice of its values; the value picked is the answer
    the worker's `ask` returns (a number stays a number)."""
    page = await open_connected(pages, page_url(hub, "/c/approve.form"))
    async with connect(hub.url, "approve.form", client="worker") as worker:
        await approval_turn(worker, None)
        answers: list[Approval] = []
        schema = {"enum": ["ops", 7, True]}

        async def ask() -> None:
            answers.append(await worker.ask(key="pick", prompt="which?", schema=schema))

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            await page.wait_for_selector("[data-approval-state=open] select[name=answer]")
            options = await page.locator("select[name=answer] option").all_inner_texts()
            assert options == ["ops", "7", "true"]
            await page.select_option("select[name=answer]", index=1)
            await page.click("[data-action=approve]")
        assert answers[0].state == "answered" and answers[0].answer == 7
        await page.wait_for_selector("[data-approval-state=answered]")
