"""The viewer in headless Chromium: catch-up of a 10,000- and a 20,000-message conversation to
first paint.

Run from the repository root: `.venv/bin/python bench/viewer.py [--messages N ...] [--repeats N]
[--no-write]` (about a minute; needs Debian's Chromium at /usr/bin/chromium, `make browser`
installs it). It writes the section "Viewer catch-up in Chromium" of docs/benchmarks.md unless
`--no-write`.

A hub (in this process, on a SQLite file in a temporary folder) holds one conversation per size
(10,000 and 20,000 messages by default) of ~300 characters each, alternating user and
assistant, pushed by a Python replica.
Each repeat opens `/c/{id}` in a fresh browser context (nothing cached) and measures, inside the
page, from the start of the navigation (`performance.timeOrigin`) to the first animation frame
after the element of the conversation's last entry is in the document: that covers loading the
page and `convsync.js`, the websocket handshake, the hub's catch-up (records or a state, as the
hub picks), the JS fold and drawing the last entries. The page's own clock also notes when the
websocket opened, so the time from the socket to the paint is shown apart.
The bar (issue 32): the median at 20,000 messages at most 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._report import Results, Row, command_line, machine, median, now, text, write_section
from bench._report import spread as spread_of
from client import connect
from server import Hub, HubConfig, SqliteStore
from sync import Message

SIZES = (10_000, 20_000)
REPEATS = 7
BAR = 0.5
BAR_SIZE = 20_000
HEADING = "Viewer catch-up in Chromium (`bench/viewer.py`)"
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Injected before the page's scripts: note when the socket opens and when the last entry is
# first painted (the frame after it is in the document).
PROBE = """
(() => {
  const Socket = window.WebSocket;
  window.WebSocket = class extends Socket {
    constructor(...args) {
      super(...args);
      this.addEventListener('open', () => { window.__socketOpen ??= performance.now(); });
    }
  };
  const watch = () => {
    const last = window.__lastId;
    const observer = new MutationObserver(() => {
      if (document.querySelector(`[data-entry-id="${last}"]`)) {
        observer.disconnect();
        requestAnimationFrame(() => { window.__painted = performance.now(); });
      }
    });
    observer.observe(document, { childList: true, subtree: true });
  };
  document.addEventListener('DOMContentLoaded', watch);
})();
"""


async def fill(url: str, conversation_id: str, messages: int) -> str:
    async with connect(url, conversation_id, client="bench") as py:
        for start in range(0, messages, 1000):
            py.conversation.extend(
                Message.user(text(i)) if i % 2 == 0 else Message.assistant(text(i))
                for i in range(start, min(start + 1000, messages))
            )
            await py.flush()
        last = py.conversation.entries()[-1].id
        assert last is not None
        return last


async def load(browser: Any, url: str, last: str) -> tuple[float, float, int]:
    """One page load in a fresh context: seconds to the paint, from the socket, entries drawn."""
    context = await browser.new_context()
    page = await context.new_page()
    await page.add_init_script(f"window.__lastId = {last!r};\n{PROBE}")
    await page.goto(url)
    await page.wait_for_function("() => window.__painted !== undefined", timeout=60000)
    painted, opened = await page.evaluate("() => [window.__painted, window.__socketOpen]")
    drawn = await page.locator(".log [data-entry-id]").count()
    await context.close()
    return painted / 1000, (painted - opened) / 1000, drawn


async def run(args: argparse.Namespace) -> None:
    from playwright.async_api import async_playwright

    began = time.perf_counter()
    sizes: list[int] = args.messages
    total: dict[int, list[float]] = {n: [] for n in sizes}
    socket: dict[int, list[float]] = {n: [] for n in sizes}
    drawn: dict[int, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(str(Path(tmp) / "bench.db"))
        config = HubConfig(ping_interval=None)
        async with Hub(store, host="127.0.0.1", port=0, config=config) as hub:
            lasts = {}
            for n in sizes:
                print(f"filling {n:,} messages...", flush=True)
                lasts[n] = await fill(hub.url, f"bench.viewer.{n}", n)
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                version = browser.version
                for repeat in range(args.repeats + 1):  # the first warms the hub's rooms up
                    # The sizes alternate, their order reversed every other repeat.
                    for n in sizes if repeat % 2 == 0 else sizes[::-1]:
                        url = f"http://127.0.0.1:{hub.port}/c/bench.viewer.{n}"
                        painted, from_socket, drawn[n] = await load(browser, url, lasts[n])
                        if repeat > 0:
                            total[n].append(painted)
                            socket[n].append(from_socket)
                            print(f"  {n:,} messages: {painted:.3f} s", flush=True)
                await browser.close()
    results = Results()
    passed = True
    for n in sizes:
        figure = median(total[n])
        bar = n == BAR_SIZE
        ok = figure <= BAR
        passed = passed and (ok or not bar)
        results.add(
            Row(
                f"navigation start to first paint of the last entry ({n:,} messages)",
                f"{figure:.3f} s",
                spread_of(total[n], "{:.3f} s"),
                f"<= {BAR} s" if bar else "",
                ok if bar else None,
            )
        )
        results.add(
            Row(
                f"of which: socket open to that paint ({n:,} messages: handshake, catch-up, "
                "fold, draw)",
                f"{median(socket[n]):.3f} s",
                spread_of(socket[n], "{:.3f} s"),
            )
        )
        results.add(
            Row(f"entries in the page at first paint ({n:,}; the rest on scroll)", str(drawn[n]))
        )
    head = "  \n".join(
        [
            f"Command: `{command_line()}` (from the repository root)",
            f"Date: {now()}; the run took {time.perf_counter() - began:.0f} s",
            f"Machine: {machine()}, Chromium {version} (headless), shared with other jobs",
            f"Result: **{'all bars PASS' if passed else 'a bar FAILED'}**",
        ]
    )
    how = (__doc__ or "").split("A hub (in this process", 1)[1].split("The bar", 1)[0]
    body = "\n\n".join(
        [
            head,
            "A hub (in this process" + how.strip(),
            f"Each figure is the median of {args.repeats} page loads per size (after one "
            "warm-up load of each), the sizes interleaved. The JS fold's own bar (at least as "
            "fast as the Python fold on 100,000 records) is measured by `bench/js_fold.py`, in "
            "its section above.",
            results.table(),
        ]
    )
    if not args.no_write:
        write_section(HEADING, body)
    print(body)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--messages", type=int, nargs="+", default=list(SIZES), help="conversation sizes"
    )
    parser.add_argument("--repeats", type=int, default=REPEATS, help="page loads per size")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parsed = parser.parse_args()
    if any(n < 1 for n in parsed.messages) or parsed.repeats < 1:
        parser.error("--messages and --repeats must be at least 1")
    asyncio.run(run(parsed))
