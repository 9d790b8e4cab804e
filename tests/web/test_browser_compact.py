"""The viewer shows a compaction's summary with its originals folded under it (SPEC §11),
in Chromium."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import bound
from test_browser import MARKUP, Pages, browser, hub, page_url, pages  # noqa: F401

from client import connect
from server import Hub
from sync import Message
from sync.compact import compact, uncompact

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the browser's loop (test_browser)


async def test_a_summary_shows_its_originals_folded_under_it(hub: Hub, pages: Pages) -> None:  # noqa: F811
    """A compaction lands: the summary is drawn with a closed fold naming how many messages
    it holds; opened, the originals read as they were (markup as text); uncompact puts them
    back in the log and the fold goes."""
    async with connect(hub.url, "compact.1", client="py") as py:
        py.conversation.extend(
            [Message.user("first question"), Message.assistant(MARKUP), Message.user("now")]
        )
        await py.flush()
        page = await pages.open(page_url(hub, "/c/compact.1"))
        await page.wait_for_selector(".entry .text >> text=now")
        spliced = compact(py.conversation, keep=1, summary=Message.user("summary of two"))
        assert spliced is not None
        await py.flush()
        summary = page.locator(f'[data-entry-id="{spliced.added[0]}"]')
        fold = summary.locator("details.compacted")
        await fold.wait_for(timeout=bound(10) * 1000)
        assert await fold.get_attribute("open") is None  # folded until asked
        assert await fold.locator("summary").text_content() == "2 earlier messages, compacted"
        assert not await fold.locator(".originals").is_visible()
        await fold.locator("summary").click()
        originals = fold.locator(".originals > li")
        texts: list[Any] = await originals.locator(".text").all_text_contents()
        assert texts == ["first question", MARKUP]
        assert await page.locator("#app img").count() == 0 and pages.dialogs == []
        # The originals are not entries of the log: nothing may act on them as one.
        assert await page.locator(".log > li").count() == 2
        assert await page.locator("[data-entry-id]").count() == 2
        assert await fold.locator("[data-original-id]").count() == 2
        [(aside_id, _)] = [(i, a) for i, a in py.conversation.asides() if a.kind == "rig.compacted"]
        uncompact(py.conversation, aside_id)
        await py.flush()
        await page.wait_for_function(
            "() => document.querySelectorAll('.log > li').length === 3"
            " && !document.querySelector('details.compacted')",
            timeout=bound(10) * 1000,
        )
