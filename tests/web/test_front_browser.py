"""The viewer's files over the hub's keep-alive HTTP (`server.front`), seen by Chromium's own
network log: its ES modules share a few connections instead of one each (issue 34)."""

from __future__ import annotations

import os
import shutil
from typing import Any

import anyio
import pytest
from conftest import bound, hub_config

from server import Hub, MemoryStore

CHROMIUM = os.environ.get("CONVSYNC_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]


def _why_no_browser() -> str | None:
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM} (scripts/ensure-chromium installs Debian's)"
    return None


async def test_the_viewers_modules_reuse_connections() -> None:
    """Loading the conversation list, Chromium fetches the page and its modules over fewer
    connections than files (CDP `Network.responseReceived`: `connectionId`,
    `connectionReused`), at most its 6 per host."""
    why = _why_no_browser()
    if why is not None:
        if os.environ.get("CONVSYNC_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser tests required: {why}")
        pytest.skip(why)
    from playwright.async_api import async_playwright

    responses: list[dict[str, Any]] = []
    async with (
        Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub,
        async_playwright() as playwright,
    ):
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            context = await browser.new_context()
            page = await context.new_page()
            cdp = await context.new_cdp_session(page)
            await cdp.send("Network.enable")
            cdp.on("Network.responseReceived", lambda event: responses.append(event["response"]))
            base = f"http://127.0.0.1:{hub.port}/"
            with anyio.fail_after(bound(30)):
                await page.goto(base, wait_until="networkidle")
        finally:
            await browser.close()
    files = [r for r in responses if r["url"].startswith(base)]
    scripts = [r for r in files if r["mimeType"] == "text/javascript"]
    assert len(scripts) >= 3, [r["url"] for r in files]  # the page loads several modules
    assert all(r["status"] == 200 for r in files)
    connections = {r["connectionId"] for r in files}
    assert len(connections) <= 6
    assert len(connections) < len(files)
    assert any(r["connectionReused"] for r in files)
