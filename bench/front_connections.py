"""TCP connections Chromium opens to load the conversation list page (issue 34): a figure the
machine's load cannot move, read from Chromium's own network log (CDP
`Network.responseReceived`: each response's `connectionId` and `connectionReused`).

Usage: `.venv/bin/python bench/front_connections.py [--loads N]` from the repository root
(Debian's Chromium at /usr/bin/chromium). An in-memory hub in this process; each load is a
fresh browser context (nothing cached). Writes the section "Connections per page load".
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import anyio  # noqa: E402

from bench._report import command_line, machine, median, now, write_section  # noqa: E402
from server import Hub, HubConfig, MemoryStore  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
HEADING = "Connections per page load (`bench/front_connections.py`)"


async def loads(count: int) -> list[tuple[int, int, int]]:
    """(files, connections, responses on a reused connection) of `count` page loads."""
    from playwright.async_api import async_playwright

    seen: list[tuple[int, int, int]] = []
    config = HubConfig(ping_interval=None)
    async with (
        Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub,
        async_playwright() as playwright,
    ):
        base = f"http://127.0.0.1:{hub.port}/"
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for _ in range(count):
            context = await browser.new_context()
            page = await context.new_page()
            cdp = await context.new_cdp_session(page)
            await cdp.send("Network.enable")
            got: list[dict[str, object]] = []
            cdp.on("Network.responseReceived", lambda event, got=got: got.append(event["response"]))
            with anyio.fail_after(60):
                await page.goto(base, wait_until="networkidle")
            files = [r for r in got if str(r["url"]).startswith(base)]
            connections = len({r["connectionId"] for r in files})
            seen.append((len(files), connections, sum(bool(r["connectionReused"]) for r in files)))
            await context.close()
        await browser.close()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=5, help="page loads (fresh contexts)")
    args = parser.parse_args()
    seen = anyio.run(loads, args.loads)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    rows = "\n".join(f"| {n + 1} | {f} | {c} | {r} |" for n, (f, c, r) in enumerate(seen))
    body = (
        f"Command: `{command_line()}` (from the repository root)  \n"
        f"Date: {now()}; git {commit}  \n"
        f"Machine: {machine()}, shared with other jobs (a count: the load does not move it)\n\n"
        "The list page (`/`) loaded in a fresh context each time; files and TCP connections "
        "from Chromium's network log.\n\n"
        "| Load | Files from the hub | TCP connections | Responses on a reused connection |\n"
        "|---|---|---|---|\n"
        f"{rows}\n\n"
        f"Median connections per load: {median([c for _, c, _ in seen]):g} "
        f"(bar: fewer than the files, at most Chromium's 6 per host)\n"
    )
    write_section(HEADING, body)
    print(body)


if __name__ == "__main__":
    main()
