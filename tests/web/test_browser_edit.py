"""Editing in the viewer (SPEC §16), in headless Chromium against a real hub: two pages edit
one message or note at once; edits merge, a clash is shown with both versions and a choice."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import test_browser as shared
from test_browser import Pages, auth_hub, page_state, page_token, page_url, settled, until

from client import connect
from client.replica import Replica
from server import Hub
from sync import Aside, Author, Message, Text, encode

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The viewer tests' fixtures: one Chromium for this module, pages per test, a hub on port 0.
browser, pages, hub = shared.browser, shared.pages, shared.hub

FOX = "The quick brown fox jumps over the lazy dog."


class Gate:
    """Holds what the hub sends one page while shut, so that page's edit is made and sent
    without hearing of the other's; `open` delivers what it held, in order."""

    def __init__(self) -> None:
        self.shut = False
        self.held: list[tuple[Any, str | bytes]] = []

    def route(self, ws: Any) -> None:
        server = ws.connect_to_server()

        def from_hub(message: str | bytes) -> None:
            if self.shut:
                self.held.append((ws, message))
            else:
                ws.send(message)

        server.on_message(from_hub)

    def open(self) -> None:
        self.shut = False
        held, self.held = self.held, []
        for ws, message in held:
            ws.send(message)


async def open_gated(pages: Pages, url: str) -> tuple[Any, Gate]:
    """A page whose frames from the hub pass a `Gate` (Pages.open, with the route first)."""
    gate = Gate()
    ctx = await pages.browser.new_context()
    pages.contexts.append(ctx)
    page = await ctx.new_page()
    page.on("pageerror", lambda error: pages.errors.append(str(error)))
    await page.route_web_socket(lambda _: True, gate.route)
    await page.goto(url)
    return page, gate


def first_text(replica: Replica) -> str:
    [ref] = replica.conversation.entries()
    [part] = ref.message.content  # type: ignore[union-attr]
    assert isinstance(part, Text)
    return part.text


async def edit_entry(page: Any, entry_id: str, text: str, save: bool = True) -> None:
    """Open the editor on the entry, put `text` in it, and save (or leave it open)."""
    entry = page.locator(f'[data-entry-id="{entry_id}"]')
    await entry.locator("[data-action=edit]").click()
    await entry.locator("textarea[name=edit]").fill(text)
    if save:
        await entry.locator("[data-action=save-edit]").click()


async def shown(page: Any, entry_id: str, text: str) -> None:
    """Wait until the entry is drawn with exactly `text` (no editor open)."""
    await page.wait_for_function(
        '([id, text]) => { const e = document.querySelector(`[data-entry-id="${id}"] .text`);'
        " return e !== null && e.textContent === text; }",
        arg=[entry_id, text],
    )


@asynccontextmanager
async def fox(hub: Hub, conversation_id: str) -> AsyncIterator[tuple[Replica, str]]:
    """A Python replica that pushed FOX, and its entry's id."""
    async with connect(hub.url, conversation_id, client="py") as py:
        entry_id = py.conversation.push(Message.user(FOX))
        await py.flush()
        yield py, entry_id


async def test_two_pages_editing_one_message_at_once_both_show_the_merged_text(
    hub: Hub, pages: Pages
) -> None:
    """A changes "brown" and B "lazy" at once (B sends before it hears of A's): both pages and
    a Python replica end with both changes, no conflict shown."""
    async with fox(hub, "edit.merge") as (py, entry_id):
        a = await pages.open(page_url(hub, "/c/edit.merge"))
        b, gate = await open_gated(pages, page_url(hub, "/c/edit.merge"))
        for page in (a, b):
            await shown(page, entry_id, FOX)
        gate.shut = True
        await edit_entry(a, entry_id, FOX.replace("brown", "RED"))
        await until(py, lambda: "RED" in first_text(py))
        await edit_entry(b, entry_id, FOX.replace("lazy", "SLEEPY"))
        await b.wait_for_function("() => globalThis.convsyncView.replica.session.inflight")
        gate.open()
        merged = "The quick RED fox jumps over the SLEEPY dog."
        await until(py, lambda: first_text(py) == merged)
        for page in (a, b):
            await shown(page, entry_id, merged)
            await settled(page)
            assert await page.locator(".conflict").count() == 0
            assert await page_state(page) == json.loads(encode(py.conversation.state()))
        assert pages.errors == []


async def test_an_overlapping_edit_shows_both_versions_and_put_mine_back_lands_it(
    hub: Hub, pages: Pages
) -> None:
    """Both change "brown" at once: the page that lost sees a conflict with both versions, the
    other sees none, the log keeps the first; "Put mine back" makes the second the text."""
    async with fox(hub, "edit.clash") as (py, entry_id):
        a = await pages.open(page_url(hub, "/c/edit.clash"))
        b, gate = await open_gated(pages, page_url(hub, "/c/edit.clash"))
        for page in (a, b):
            await shown(page, entry_id, FOX)
        gate.shut = True
        red, blue = FOX.replace("brown", "RED"), FOX.replace("brown", "BLUE")
        await edit_entry(a, entry_id, red)
        await until(py, lambda: "RED" in first_text(py))
        await edit_entry(b, entry_id, blue)
        await b.wait_for_function("() => globalThis.convsyncView.replica.session.inflight")
        gate.open()
        conflict = b.locator(f'.conflict[data-conflict-for="{entry_id}"]')
        await conflict.wait_for()
        assert await conflict.locator(".theirs .version-text").text_content() == red
        assert await conflict.locator(".ours .version-text").text_content() == blue
        await shown(b, entry_id, red)  # the log's version stands
        await settled(b)
        assert first_text(py) == red
        assert await a.locator(".conflict").count() == 0
        await conflict.locator("[data-action=put-mine]").click()
        await until(py, lambda: first_text(py) == blue)
        for page in (a, b):
            await shown(page, entry_id, blue)
        assert await b.locator(".conflict").count() == 0
        assert pages.errors == []


async def test_a_note_edited_on_two_pages_merges_what_the_editor_heard_of_meanwhile(
    hub: Hub, pages: Pages
) -> None:
    """Both pages open the editor on one note; A saves; B is told the note changed under it
    and its save merges both edits (not A's undone)."""
    async with connect(hub.url, "edit.note", client="py") as py:
        note_id = py.conversation.add_aside(Aside.note("plan", FOX, None, Author.user()))
        await py.flush()
        a = await pages.open(page_url(hub, "/c/edit.note"))
        b = await pages.open(page_url(hub, "/c/edit.note"))
        notes = [page.locator(f'[data-note-id="{note_id}"]') for page in (a, b)]
        for note in notes:
            await note.locator(".text").wait_for()
            await note.locator("[data-action=edit]").click()
        await notes[0].locator("textarea[name=edit]").fill(FOX.replace("brown", "RED"))
        await notes[0].locator("[data-action=save-edit]").click()
        await notes[1].locator(".edit-hint:not([hidden])").wait_for()
        await notes[1].locator("textarea[name=edit]").fill(FOX.replace("lazy", "SLEEPY"))
        await notes[1].locator("[data-action=save-edit]").click()
        merged = "The quick RED fox jumps over the SLEEPY dog."

        def note_text() -> str:
            note = py.conversation.aside(note_id)
            assert note is not None
            return str(note.value["text"])

        await until(py, lambda: note_text() == merged)
        for note in notes:
            await note.locator(".text", has_text=merged).wait_for()
        assert await b.locator(".conflict").count() == 0
        assert pages.errors == []


async def test_an_edit_clashing_with_one_heard_meanwhile_keeps_the_log_on_request(
    hub: Hub, pages: Pages
) -> None:
    """B's editor was open while A changed the same word: B's save shows the clash and records
    nothing; "Keep the log's" leaves A's text and clears the conflict."""
    async with fox(hub, "edit.keep") as (py, entry_id):
        a = await pages.open(page_url(hub, "/c/edit.keep"))
        b = await pages.open(page_url(hub, "/c/edit.keep"))
        for page in (a, b):
            await shown(page, entry_id, FOX)
        red = FOX.replace("brown", "RED")
        await edit_entry(b, entry_id, FOX.replace("brown", "BLUE"), save=False)
        await edit_entry(a, entry_id, red)
        await until(py, lambda: first_text(py) == red)
        entry = b.locator(f'[data-entry-id="{entry_id}"]')
        await entry.locator(".edit-hint:not([hidden])").wait_for()
        await entry.locator("[data-action=save-edit]").click()
        conflict = b.locator(f'.conflict[data-conflict-for="{entry_id}"]')
        await conflict.wait_for()
        assert await conflict.locator(".theirs .version-text").text_content() == red
        revision = await b.evaluate("globalThis.convsyncView.replica.revision")
        assert await b.evaluate("globalThis.convsyncView.replica.pending") == 0
        await conflict.locator("[data-action=keep-theirs]").click()
        await conflict.wait_for(state="detached")
        await shown(b, entry_id, red)
        assert await b.evaluate("globalThis.convsyncView.replica.revision") == revision
        assert first_text(py) == red


async def test_a_read_only_token_gets_no_edit_control(pages: Pages) -> None:
    """A token without `write` sees messages and notes with no Edit button; with `write`,
    each has one."""
    async with auth_hub() as hub:
        async with connect(hub.url, "edit.ro", client="py", token=page_token("py")) as py:
            entry_id = py.conversation.push(Message.user("read me"))
            note_id = py.conversation.add_aside(Aside.note("n", "a note", None, Author.user()))
            await py.flush()
        reader = await pages.open(page_url(hub, f"/c/edit.ro#token={page_token('r', 'read')}"))
        writer = await pages.open(page_url(hub, f"/c/edit.ro#token={page_token('w')}"))
        for page in (reader, writer):
            await page.wait_for_selector("#app[data-connection-state=connected]")
            await page.wait_for_selector(f'[data-note-id="{note_id}"] .text')
            await page.wait_for_selector(f'[data-entry-id="{entry_id}"] .text')
        await writer.wait_for_selector(f'[data-entry-id="{entry_id}"] [data-action=edit]')
        await writer.wait_for_selector(f'[data-note-id="{note_id}"] [data-action=edit]')
        assert await reader.locator("[data-action=edit], textarea[name=edit]").count() == 0
