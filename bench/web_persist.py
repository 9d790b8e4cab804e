"""The browser outbox's cost per edit: `persist: 'indexeddb'` on and off, in headless Chromium.

Usage: python bench/web_persist.py [--edits N] [--repeats R] [--write]

One command: it needs Chromium (/usr/bin/chromium) and the Playwright package.

A page of an app served on loopback connects a JS replica to a hub (memory store) on loopback,
with and without `persist: 'indexeddb'` (runs interleaved, on fresh conversations), and makes
N edits one at a time: each a user message pushed, then `flush()` awaited (acknowledged). It
reports, per edit, the median time of the edit's call itself (what the app waits for: with an
outbox, noting the change; the write goes from a microtask) and the median time from the edit
to its ack (with an outbox: the record and then the batch with its seq committed to IndexedDB,
strict durability, before the push goes). Times are `performance.now()` in the page.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._report import median, now, publish, spread
from bench._support import use_test_helpers

use_test_helpers()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "web"))

from conftest import hub_config  # noqa: E402
from test_browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from test_browser_persist import AppFiles  # noqa: E402

from server import Hub, MemoryStore  # noqa: E402

EDITS = """async ([hub, id, persist, edits]) => {
  const cs = await import('/static/convsync.js');
  const options = persist ? { persist: 'indexeddb', outbox: id } : {};
  const r = cs.connect(hub, id, options);
  await r.ready;
  const call = [], acked = [];
  for (let n = 0; n < edits; n += 1) {
    const t0 = performance.now();
    r.conversation.push(cs.Message.user(`edit ${n}`));
    const t1 = performance.now();
    await r.flush();
    call.push(t1 - t0);
    acked.push(performance.now() - t0);
  }
  r.close();
  const med = (xs) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  return { call: med(call), acked: med(acked) };
}"""


async def main(edits: int, repeats: int, write: bool) -> None:
    from playwright.async_api import async_playwright

    started, t0 = now(), time.monotonic()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AppFiles)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    app = f"http://127.0.0.1:{server.server_address[1]}"
    config = hub_config(allow_origin=(app,))
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
            )
            page = await (await browser.new_context()).new_page()
            await page.goto(app + "/")
            for repeat in range(repeats):
                for persist in (False, True):
                    cid = f"bench.persist.{repeat}.{int(persist)}"
                    results[persist].append(
                        await page.evaluate(EDITS, [hub.url, cid, persist, edits])
                    )
            await browser.close()
    server.shutdown()
    load = Path("/proc/loadavg").read_text().split()[0]  # noqa: ASYNC240
    rows = []
    for key, label in (("call", "the edit's call"), ("acked", "edit to ack")):
        off = [r[key] for r in results[False]]
        on = [r[key] for r in results[True]]
        rows.append(
            f"| {label} | {median(off):.3f} ms ({spread(off)}) | {median(on):.3f} ms "
            f"({spread(on)}) | {median(on) - median(off):+.3f} ms |"
        )
    table = (
        f"{edits} edits one at a time, {repeats} interleaved repeats each way; load {load} "
        "(1-minute load average at the end).\n\n"
        "| per edit (median of the repeats' medians) | without persist | with persist | cost |\n"
        "|---|---|---|---|\n" + "\n".join(rows)
    )
    publish(
        "Browser outbox (persist: 'indexeddb') per edit, Chromium",
        __doc__ or "",
        table,
        started,
        time.monotonic() - t0,
        write=write,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--edits", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.edits, args.repeats, args.write))
