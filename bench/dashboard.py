"""Live dashboards (SPEC 17): the list page's first paint and staleness, and a hub's cost per
dashboard, with 1,000 conversations of which 50 are busy.

Usage: `.venv/bin/python bench/dashboard.py page [--soak SECONDS]` and
`.venv/bin/python bench/dashboard.py cpu [--store sqlite|memory] [--seconds S] [--repeats N]`,
from the repository root.

Commands: `page` (about 6 minutes with the default `--soak 300`; Debian's Chromium at
/usr/bin/chromium) writes the section "Dashboard page in Chromium"; `cpu` (about 4 minutes)
writes "Hub cost per dashboard" for the store it ran on.

The hub runs in a process of its own (`bench/_hubproc.py`; in memory for `page`, for `cpu` on
the store named, a SQLite file with `synchronous=FULL` by default), seeded with
1,000 conversations of one message each (`fleet.0000` ...). In this process, 50 agents (Python
replicas, one per conversation spread over the ids, `tests/support/fleet.py`) push one message a
second each, staggered, for the whole run.

`page`: each repeat opens the list page in a fresh browser context (nothing cached) and
measures, inside the page, from the start of the navigation (`performance.timeOrigin`) to the
first animation frame after its 50 rows are in the document: loading the page and
`convsync.js`, the summary socket's handshake and snapshot, drawing. Both orders are measured
(by id, the default page; by latest activity, which ranks all 1,000 rows). Then one page of
each order stays open for `--soak` seconds of activity; the agents stop, and once the hub has
been quiet for 3 s every row the page holds (`convsyncView.feed.rows`, all fields) and every
row drawn (id and revision, in order) is compared with `GET /v1/conversations` for the same
window.

`cpu`: the hub's CPU seconds (`getrusage` of its process) over `--seconds` of the agents'
activity, with no dashboard and with 20 dashboards, interleaved, `--repeats` times each. A
dashboard is a raw summary socket watching the 50 latest rows (`order: "updated"`, the window
every busy conversation is in; the list page by id sees only the few busy ones of its page);
it reads every frame and counts its bytes. Each measurement starts once every dashboard has its
snapshot, so it counts the diffs, not the snapshots.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench._support import use_test_helpers  # noqa: E402

use_test_helpers()  # tests/support (or tests): fleet, fakeprovider, ... by bare name

import anyio  # noqa: E402
from fleet import active_ids, fleet_ids, keep_busy  # noqa: E402
from websockets.asyncio.client import connect as ws_connect  # noqa: E402

from bench._engine import CODE, CODE_VERSION, snapshot_at  # noqa: E402
from bench._hub import ServerProcess  # noqa: E402
from bench._report import Results, Row, command_line, machine, median, now, write_section  # noqa: E402
from bench._report import spread as spread_of  # noqa: E402
from sync.protocol import SUBPROTOCOL  # noqa: E402

CONVERSATIONS = 1000
ACTIVE = 50
EVERY = 1.0  # seconds between two messages of one agent
DASHBOARDS = 20
PAINT_REPEATS = 7
PAINT_BAR = 0.5
CPU_BAR = 1.2
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
PAGE_HEADING = "Dashboard page in Chromium (`bench/dashboard.py page`)"
CPU_HEADING = "Hub cost per dashboard (`bench/dashboard.py cpu`)"
INSTRUCTIONS_HEADING = "Hub instructions per dashboard (`bench/dashboard.py instructions`)"

# Injected before the page's scripts: note the first paint after 50 rows are in the document,
# and on the way (`__phases`) when the page's scripts had run (DOMContentLoaded: module scripts
# run before it), the summary socket opened, its snapshot came and the rows were in.
PROBE = """
(() => {
  const phases = (window.__phases = {});
  const Socket = window.WebSocket;
  window.WebSocket = class extends Socket {
    constructor(...args) {
      super(...args);
      this.addEventListener('open', () => { phases.open ??= performance.now(); });
      this.addEventListener('message', () => { phases.snapshot ??= performance.now(); });
    }
  };
  const watch = () => {
    phases.scripts = performance.now();
    const observer = new MutationObserver(() => {
      if (document.querySelectorAll('[data-conversation-id]').length >= 50) {
        observer.disconnect();
        phases.rows = performance.now();
        requestAnimationFrame(() => { window.__painted = performance.now(); });
      }
    });
    observer.observe(document, { childList: true, subtree: true });
  };
  document.addEventListener('DOMContentLoaded', watch);
})();
"""
PHASES = (
    ("scripts", "the page and its scripts loaded and run (DOMContentLoaded)"),
    ("open", "the summary socket open"),
    ("snapshot", "its snapshot arrived"),
    ("rows", "50 rows in the document"),
)


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


async def fleet_hub(
    store: str = "memory",
    folder: str = "",
    *,
    conversations: int = CONVERSATIONS,
    code: Path = CODE,
    wrap: Sequence[str] = (),
) -> tuple[ServerProcess, list[str]]:
    """A hub process (on `store`: memory, or SQLite in `folder`; the engine in `code`, run
    under `wrap`) holding `conversations` conversations; the busy ones' ids."""
    where = (
        ["--store", "sqlite", "--path", str(Path(folder) / "hub.db")] if store == "sqlite" else []
    )
    hub = await ServerProcess.start("hub", *where, code=code, wrap=wrap)
    ids = fleet_ids(conversations)
    for conversation_id in ids:
        await hub.ask("seed", id=conversation_id, messages=1, chars=80)
    return hub, active_ids(ids, ACTIVE)


async def listed(port: int, query: str) -> list[dict[str, Any]]:
    def fetch() -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{port}/v1/conversations?{query}"
        with urllib.request.urlopen(url, timeout=30) as response:
            rows: list[dict[str, Any]] = json.loads(response.read())["conversations"]
            return rows

    return await anyio.to_thread.run_sync(fetch)


# ---------------------------------------------------------------------------- page


async def first_paints(
    browser: Any,
    url: str,
    phases: dict[str, list[float]] | None = None,
    repeats: int = PAINT_REPEATS,
) -> list[float]:
    """Seconds from navigation start to the first paint of 50 rows, per page load; with
    `phases`, each load's moments on the way (`PHASES`, seconds) are added to it."""
    seconds = []
    for repeat in range(repeats + 1):  # the first warms the hub's rooms up
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        page = await context.new_page()
        await page.add_init_script(PROBE)
        await page.goto(url)
        await page.wait_for_function("() => window.__painted !== undefined", timeout=60000)
        painted = await page.evaluate("() => window.__painted")
        moments = await page.evaluate("() => window.__phases")
        await context.close()
        if repeat > 0:
            seconds.append(painted / 1000)
            for name, _ in PHASES if phases is not None else ():
                phases.setdefault(name, []).append(moments[name] / 1000)
    return seconds


async def page_rows(page: Any) -> tuple[list[dict[str, Any]], list[list[str]]]:
    held = await page.evaluate("JSON.stringify([...globalThis.convsyncView.feed.rows.values()])")
    drawn = await page.eval_on_selector_all(
        "[data-conversation-id]",
        "rows => rows.map(row => [row.dataset.conversationId, row.dataset.revision])",
    )
    return json.loads(held), drawn


def compare(
    held: list[dict[str, Any]], drawn: list[list[str]], truth: list[dict[str, Any]], order: str
) -> tuple[int, int]:
    """(rows the page holds that differ from the hub's list, drawn rows out of place)."""
    by_id = {row["id"]: row for row in held}
    wrong = sum(by_id.get(row["id"]) != row for row in truth) + len(
        set(by_id) - {row["id"] for row in truth}
    )
    expected = [[row["id"], str(row["revision"])] for row in truth]
    if order == "id":
        expected.sort()
    misplaced = sum(a != b for a, b in zip(drawn, expected, strict=False)) + abs(
        len(drawn) - len(expected)
    )
    return wrong, misplaced


async def run_page(args: argparse.Namespace) -> int:
    from playwright.async_api import async_playwright

    began = time.perf_counter()
    hub, busy = await fleet_hub()
    done = anyio.Event()
    results = Results()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(keep_busy, hub.url, busy, EVERY, done)
            await anyio.sleep(3)  # every agent joined and pushing
            base = f"http://127.0.0.1:{hub.port}/"
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                version = browser.version
                paints = {}
                phases: dict[str, dict[str, list[float]]] = {"id": {}, "updated": {}}
                for order, query in (("id", ""), ("updated", "?order=updated")):
                    log(f"first paint, order {order}")
                    paints[order] = await first_paints(
                        browser, base + query, phases[order], args.repeats
                    )
                if args.paint_only:
                    done.set()
                    await browser.close()
                    return paint_section(args, paints, began, version, phases)
                log(f"soak: {args.soak} s of activity with a page of each order open")
                pages = {}
                for order, query in (("id", ""), ("updated", "?order=updated")):
                    context = await browser.new_context(viewport={"width": 1280, "height": 900})
                    pages[order] = await context.new_page()
                    await pages[order].goto(base + query)
                    await pages[order].mouse.move(1270, 890)  # off the list
                await anyio.sleep(args.soak)
                done.set()
                await anyio.sleep(3)  # the agents left; the last diffs went out
                checks = {}
                for order, page in pages.items():
                    truth = await listed(hub.port, f"order={order}&limit=50")
                    held, drawn = await page_rows(page)
                    checks[order] = (len(truth), *compare(held, drawn, truth, order))
                stats = await hub.ask("stats")
                await browser.close()
    finally:
        await hub.stop()
    for order, label in (("id", "by id (the default page)"), ("updated", "by latest activity")):
        figure = median(paints[order])
        results.add(
            Row(
                f"navigation start to first paint of 50 rows, {label}",
                f"{figure:.3f} s",
                spread_of(paints[order], "{:.3f} s"),
                f"<= {PAINT_BAR} s",
                figure <= PAINT_BAR,
            )
        )
    for order, (rows, wrong, misplaced) in checks.items():
        results.add(
            Row(
                f"after {args.soak:.0f} s of activity, page by {order}: rows differing from "
                f"`GET /v1/conversations` (of {rows}) / drawn rows out of place",
                f"{wrong} / {misplaced}",
                "",
                "0 / 0",
                wrong == 0 and misplaced == 0,
            )
        )
    results.add(Row("messages the agents pushed (acknowledged)", str(stats["pushes_accepted"])))
    head = "  \n".join(
        [
            f"Command: `{command_line()}` (from the repository root)",
            f"Date: {now()}; the run took {time.perf_counter() - began:.0f} s",
            f"Machine: {machine()}, Chromium {version} (headless), shared with other jobs",
            f"Result: **{'all bars PASS' if not results.failed else 'a bar FAILED'}**",
        ]
    )
    how = (__doc__ or "").split("The hub runs", 1)[1].split("`cpu`:", 1)[0]
    body = "\n\n".join(
        [
            head,
            "The hub runs " + how.strip(),
            f"First paints: the median of {args.repeats} page loads (after one warm-up load).",
            results.table(),
        ]
    )
    write_section(PAGE_HEADING, body)
    print(body)
    return 0 if not results.failed else 1


def paint_section(
    args: argparse.Namespace,
    paints: dict[str, list[float]],
    began: float,
    version: str,
    phases: dict[str, dict[str, list[float]]],
) -> int:
    """Write the first paints of a `--paint-only` run in their own section, with where the
    time went (`PHASES`: navigation start to each moment)."""
    results = Results()
    for order in ("id", "updated"):
        for name, label in PHASES:
            moments = phases[order][name]
            results.add(
                Row(
                    f"by {order}: navigation start to {label}",
                    f"{median(moments):.3f} s",
                    spread_of(moments, "{:.3f} s"),
                )
            )
        figure = median(paints[order])
        results.add(
            Row(
                f"navigation start to first paint of 50 rows, by {order}",
                f"{figure:.3f} s",
                spread_of(paints[order], "{:.3f} s"),
                f"<= {PAINT_BAR} s",
                figure <= PAINT_BAR,
            )
        )
    head = "  \n".join(
        [
            f"Command: `{command_line()}` (from the repository root)",
            f"Date: {now()}; the run took {time.perf_counter() - began:.0f} s",
            f"Machine: {machine()}, Chromium {version} (headless), shared with other jobs",
            f"Result: **{'all bars PASS' if not results.failed else 'a bar FAILED'}**",
        ]
    )
    body = "\n\n".join(
        [
            head,
            "As the first paints of the section above (same hub, fleet and agents), without the "
            f"soak; the median of {args.repeats} page loads after one warm-up load"
            ", and where the time went: navigation start to each moment on the way (the same "
            "loads; the socket's moments are those of the page's first WebSocket).",
            results.table(),
        ]
    )
    write_section(PAGE_HEADING.replace("page`)", "page --paint-only`)"), body)
    print(body)
    return 0 if not results.failed else 1


# ---------------------------------------------------------------------------- cpu


async def dashboard(url: str, ready: anyio.Event, counted: list[int], stop: anyio.Event) -> None:
    """A raw summary socket on the 50 latest rows; counts the bytes of every frame."""
    async with ws_connect(
        f"{url}/v1/summary", subprotocols=[SUBPROTOCOL], max_size=None, ping_interval=None
    ) as ws:
        hello = {"type": "hello", "token": None, "prefix": "", "order": "updated", "limit": 50}
        await ws.send(json.dumps(hello))
        snapshot = await ws.recv()
        assert json.loads(snapshot)["type"] == "summary"
        ready.set()
        with anyio.move_on_after(1e6) as scope:

            async def stopper() -> None:
                await stop.wait()
                scope.cancel()

            async with anyio.create_task_group() as group:
                group.start_soon(stopper)
                async for frame in ws:
                    counted[0] += len(frame)


async def measure(
    hub: ServerProcess,
    dashboards: int,
    seconds: float,
    profile: int = 0,
    meter: Callable[[], Awaitable[Callable[[], Awaitable[float]]]] | None = None,
) -> tuple[float, float, float]:
    """(the hub's CPU share over `seconds`, bytes/s per dashboard, messages the hub took a
    second: the same workload with and without dashboards) with `dashboards` open;
    with `profile`, the hub's cProfile of the measurement (its top `profile` functions) is
    printed on stderr (the profiler's own cost counts in that share). With `meter` (started
    at the measurement's start, its result awaited at its end), the first figure is what
    it counted a second instead of the CPU share."""
    stop = anyio.Event()
    counted = [0]
    async with anyio.create_task_group() as group:
        readies = [anyio.Event() for _ in range(dashboards)]
        for ready in readies:
            group.start_soon(dashboard, hub.url, ready, counted, stop)
        for ready in readies:
            await ready.wait()
        await anyio.sleep(1)  # past the snapshots
        counted[0] = 0
        if profile:
            await hub.ask("profile_start")
        counting = await meter() if meter is not None else None
        before = await hub.ask("stats")
        start = time.perf_counter()
        await anyio.sleep(seconds)
        after = await hub.ask("stats")
        cpu = after["cpu"] - before["cpu"] if counting is None else await counting()
        pushes = after["pushes_accepted"] - before["pushes_accepted"]
        if profile:
            tables = await hub.ask("profile_stop", top=profile)
            log(f"profile, {dashboards} dashboards: {tables['idle']}")
            print(tables["tottime"], tables["cumulative"], sep="\n\n", file=sys.stderr)
        elapsed = time.perf_counter() - start
        received = counted[0]
        stop.set()
    per_dashboard = received / elapsed / dashboards if dashboards else 0.0
    return cpu / elapsed, per_dashboard, pushes / elapsed


async def run_cpu(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="convsync-dashboard-")
    hub, busy = await fleet_hub(args.store, folder)
    done = anyio.Event()
    shares: dict[int, list[float]] = {0: [], DASHBOARDS: []}
    pushes: dict[int, list[float]] = {0: [], DASHBOARDS: []}
    rates: list[float] = []
    rss = 0
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(keep_busy, hub.url, busy, EVERY, done)
            await anyio.sleep(3)
            for repeat in range(args.repeats):
                for dashboards in (0, DASHBOARDS) if repeat % 2 == 0 else (DASHBOARDS, 0):
                    share, rate, pushed = await measure(hub, dashboards, args.seconds, args.profile)
                    shares[dashboards].append(share)
                    pushes[dashboards].append(pushed)
                    if dashboards:
                        rates.append(rate)
                    log(
                        f"{dashboards} dashboards: hub CPU {share:.1%}, {rate / 1000:.1f} KB/s "
                        f"each, {pushed:.1f} messages/s"
                    )
            rss = (await hub.ask("stats"))["rss_kb"]
            done.set()
    finally:
        await hub.stop()
        shutil.rmtree(folder, ignore_errors=True)
    results = Results()
    none, some = shares[0], shares[DASHBOARDS]
    results.add(Row("hub CPU, no dashboard", f"{median(none):.1%}", spread_of(none, "{:.1%}")))
    results.add(
        Row(f"hub CPU, {DASHBOARDS} dashboards", f"{median(some):.1%}", spread_of(some, "{:.1%}"))
    )
    ratio = median(some) / median(none)
    pairs = [s / n for s, n in zip(some, none, strict=True)]
    results.add(
        Row(
            f"hub CPU with {DASHBOARDS} dashboards / with none",
            f"{ratio:.3f}",
            spread_of(pairs, "{:.3f}"),
            f"<= {CPU_BAR}",
            ratio <= CPU_BAR,
        )
    )
    results.add(
        Row(
            "bytes received per dashboard",
            f"{median(rates) / 1000:.1f} KB/s",
            spread_of([r / 1000 for r in rates], "{:.1f} KB/s"),
        )
    )
    for count in (0, DASHBOARDS):
        results.add(
            Row(
                f"messages the agents pushed a second, {count or 'no'} dashboards",
                f"{median(pushes[count]):.1f}",
                spread_of(pushes[count], "{:.1f}"),
            )
        )
    results.add(Row("hub resident memory at the end", f"{rss / 1024:.0f} MB"))
    head = "  \n".join(
        [
            f"Command: `{command_line()}` (from the repository root)",
            f"Date: {now()}; the run took {time.perf_counter() - began:.0f} s",
            f"Machine: {machine()}, shared with other jobs",
            f"Result: **{'all bars PASS' if not results.failed else 'a bar FAILED'}**",
        ]
    )
    how = (__doc__ or "").split("The hub runs", 1)[1].split("`page`:", 1)[0]
    cpu_how = (__doc__ or "").split("`cpu`:", 1)[1]
    body = "\n\n".join(
        [
            head,
            "The hub runs " + how.strip(),
            "`cpu`: "
            + cpu_how.strip()
            .replace("--seconds", f"{args.seconds:.0f} s")
            .replace("`--repeats` times", f"{args.repeats} times"),
            results.table(),
        ]
    )
    if not args.profile:
        write_section(f"{CPU_HEADING}, {args.store} store", body)
    print(body)
    return 0 if not results.failed else 1


# ---------------------------------------------------------------------------- instructions


def callgrind_meter(
    pid: int, folder: Path
) -> Callable[[], Awaitable[Callable[[], Awaitable[float]]]]:
    """A `measure` meter: the hub's instructions (callgrind's `Ir`) from its start to its end
    (the counters zeroed, then dumped to a file of `folder` and read)."""

    def control(*what: str) -> None:
        subprocess.run(["callgrind_control", *what, str(pid)], check=True, capture_output=True)

    def dumped() -> float:
        dumps = set(folder.iterdir())
        control("--dump")
        (dump,) = set(folder.iterdir()) - dumps
        found = re.search(r"^summary:\s+(\d+)", dump.read_text(), re.MULTILINE)
        assert found is not None, dump
        dump.unlink()
        return float(found.group(1))

    async def start() -> Callable[[], Awaitable[float]]:
        await anyio.to_thread.run_sync(control, "--zero")

        async def end() -> float:
            return await anyio.to_thread.run_sync(dumped)

        return end

    return start


async def instructions_of(
    args: argparse.Namespace, code: Path, label: str
) -> dict[int, list[tuple[float, float]]]:
    """(instructions a second, instructions per push) of a hub running the engine in `code`
    under callgrind, with no dashboard and with 20, interleaved `--repeats` times."""
    folder = Path(tempfile.mkdtemp(prefix="convsync-dashboard-cg-"))
    wrap = ["valgrind", "-q", "--tool=callgrind", f"--callgrind-out-file={folder}/cg.out"]
    log(f"{label}: a hub under callgrind, {args.conversations} conversations")
    hub, busy = await fleet_hub(conversations=args.conversations, code=code, wrap=wrap)
    done = anyio.Event()
    figures: dict[int, list[tuple[float, float]]] = {0: [], DASHBOARDS: []}
    meter = callgrind_meter(hub.pid, folder)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(keep_busy, hub.url, busy, args.every, done)
            await anyio.sleep(args.every + 5)  # every agent joined and pushing
            for repeat in range(args.repeats):
                for dashboards in (0, DASHBOARDS) if repeat % 2 == 0 else (DASHBOARDS, 0):
                    rate, _, pushed = await measure(hub, dashboards, args.seconds, 0, meter)
                    figures[dashboards].append((rate, rate / pushed))
                    log(
                        f"{label}, {dashboards} dashboards: {rate / 1e6:.1f} M instructions/s, "
                        f"{rate / pushed / 1e6:.2f} M a push, {pushed:.1f} pushes/s"
                    )
            done.set()
    finally:
        await hub.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return figures


async def run_instructions(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    codes = [("new", CODE, CODE_VERSION)]
    if args.baseline:
        path, version = snapshot_at(args.baseline)
        codes.append(("old", path, version))
    results = Results()
    ratios: dict[str, float] = {}
    for label, code, version in codes:
        figures = await instructions_of(args, code, label)
        none = [per_push for _, per_push in figures[0]]
        some = [per_push for _, per_push in figures[DASHBOARDS]]
        ratio = ratios[label] = median(some) / median(none)
        pairs = [s / n for s, n in zip(some, none, strict=True)]
        for count, each in ((0, none), (DASHBOARDS, some)):
            results.add(
                Row(
                    f"{label} ({version}): hub instructions per push, "
                    f"{count or 'no'} dashboard{'s' if count else ''}",
                    f"{median(each) / 1e6:.3f} M",
                    spread_of([e / 1e6 for e in each], "{:.3f} M"),
                )
            )
        results.add(
            Row(
                f"{label}: with {DASHBOARDS} dashboards / with none",
                f"{ratio:.3f}",
                spread_of(pairs, "{:.3f}"),
            )
        )
    if "old" in ratios:
        results.add(
            Row(
                "the dashboards' share of the instructions, new / old",
                f"{(ratios['new'] - 1) / (ratios['old'] - 1):.3f}",
            )
        )
    head = "  \n".join(
        [
            f"Command: `{command_line()}` (from the repository root)",
            f"Date: {now()}; the run took {time.perf_counter() - began:.0f} s",
            f"Machine: {machine()}, shared with other jobs (instruction counts do not move "
            "with the load)",
        ]
    )
    how = (
        "As `cpu`, but the hub process runs under `valgrind --tool=callgrind` and the figure "
        "is its instructions (callgrind's `Ir`, counters zeroed at the start of a "
        f"measurement and dumped at its end) per message pushed, over {args.seconds:.0f} s "
        f"of activity, with no dashboard and with {DASHBOARDS}, interleaved, {args.repeats} "
        f"times each. The hub is about 50 times slower under callgrind, so the workload is "
        f"smaller: {args.conversations} conversations, {ACTIVE} agents pushing one message "
        f"every {args.every:g} s each ({ACTIVE / args.every:g} a second, a tick of the summary "
        f"windows sees about {ACTIVE / args.every / 4:g} changed rows where `cpu` has 12): the "
        "dashboards' fixed cost per tick weighs more here than there, and the ratio is not "
        "the bar's. It is the figure the load does not move: the dashboards' cost, old code "
        "and new."
    )
    body = "\n\n".join([head, how, results.table()])
    write_section(INSTRUCTIONS_HEADING, body)
    print(body)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="what", required=True)
    page = sub.add_parser("page", help="first paint and staleness in Chromium")
    page.add_argument("--soak", type=float, default=300.0, help="seconds of activity")
    page.add_argument(
        "--repeats", type=int, default=PAINT_REPEATS, help="page loads per order (after a warm-up)"
    )
    page.add_argument(
        "--paint-only",
        action="store_true",
        help="first paints only, in a section of their own (the soak's section stays)",
    )
    cpu = sub.add_parser("cpu", help="the hub's CPU per dashboard")
    cpu.add_argument("--seconds", type=float, default=20.0)
    cpu.add_argument("--repeats", type=int, default=5)
    cpu.add_argument(
        "--store",
        choices=["sqlite", "memory"],
        default="sqlite",
        help="the hub's store: a SQLite file (what `convsync serve` runs) or memory",
    )
    cpu.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="TOP",
        help="print the hub's cProfile of each measurement (its TOP functions) on stderr; "
        "the figures then include the profiler's cost: nothing is written",
    )
    counted = sub.add_parser(
        "instructions", help="the hub's instructions per push under callgrind, old and new"
    )
    counted.add_argument("--seconds", type=float, default=20.0)
    counted.add_argument("--repeats", type=int, default=3)
    counted.add_argument("--conversations", type=int, default=200)
    counted.add_argument(
        "--every", type=float, default=5.0, help="seconds between two messages of an agent"
    )
    counted.add_argument("--baseline", help="also measure the packages of this git revision")
    args = parser.parse_args()
    run = {"page": run_page, "cpu": run_cpu, "instructions": run_instructions}[args.what]
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
