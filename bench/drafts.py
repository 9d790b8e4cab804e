"""Live drafts: one worker streams tokens to 1, 10 and 100 UIs (`docs/benchmarks.md`).

Run from the repository root:

    PYTHONPATH=. python bench/drafts.py [--tokens 2000] [--rate 50] [--tokens-100 500]

How it works: a hub runs in a process of its own (in-memory store) once with
`draft_interval=0.05` and once with `draft_interval=0`. In this process, a worker (a real
`Replica`, its own `draft_interval` the same as the hub's) appends one token every 1/rate
seconds to one draft, and N UIs (raw websockets: hello with the `drafts` feature, then they
only read) note when each token's last character reaches them. Reported per run:

- token-to-UI latency p50 / p99: from `d.append(token)` to the UI holding that token (worker
  and UIs share this process's clock);
- hub CPU per relayed delta: the hub process's user+system CPU over the run (from
  `/proc/<pid>/stat`) divided by the delta messages it sent (`/metrics`);
- bytes on the wire per token per UI (draft frames as received), against what sending the
  whole text so far with every token would have cost (the same message with the whole text).

The 100-UI runs stream fewer tokens (`--tokens-100`) to keep the whole run to a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))

import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from bench._report import command_line, machine, now, write_section
from client import connect
from sync.protocol import SUBPROTOCOL, DraftUpdate, encode_message

ROOT = Path(__file__).resolve().parent.parent

HUB_SCRIPT = """
import asyncio, sys
from server import Hub, HubConfig, MemoryStore

async def main(interval):
    config = HubConfig(ping_interval=None, draft_interval=interval, max_connections=100_000)
    async with Hub(MemoryStore(), port=0, config=config) as hub:
        print(hub.port, flush=True)
        await hub.serve_forever()

asyncio.run(main(float(sys.argv[1])))
"""

_TICKS = os.sysconf("SC_CLK_TCK")


def hub_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def deltas_relayed(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("convsync_draft_deltas_relayed_total "):
                return int(line.split()[1])
    raise RuntimeError("no draft delta counter in /metrics")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


@dataclass
class UI:
    ws: ClientConnection
    ends: list[int]  # the text length after each token
    appended: list[float]  # when each token was appended
    latencies: list[float] = field(default_factory=list)
    bytes: int = 0
    seen: int = 0  # tokens this UI holds

    async def read(self, total: int) -> None:
        decoder = msgspec.json.Decoder()
        while self.seen < total:
            frame = await self.ws.recv(decode=False)
            message = decoder.decode(frame)
            kind = message.get("type")
            if kind not in ("draft", "drafts"):
                continue
            self.bytes += len(frame)
            if kind != "draft" or message.get("op") != "append":
                continue
            end = message.get("offset", 0) + len(message.get("text", ""))
            arrived = time.perf_counter()
            while self.seen < total and self.ends[self.seen] <= end:
                self.latencies.append(arrived - self.appended[self.seen])
                self.seen += 1


async def open_ui(port: int, conversation_id: str, name: str) -> ClientConnection:
    ws = await ws_connect(
        f"ws://127.0.0.1:{port}/v1/conversations/{conversation_id}",
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        max_size=None,
    )
    hello = {"type": "hello", "client": name, "lineage": 0, "revision": 0, "features": ["drafts"]}
    await ws.send(json.dumps(hello))
    return ws


@dataclass
class Result:
    interval: float
    uis: int
    tokens: int
    p50: float
    p99: float
    cpu_per_delta: float
    deltas: int
    bytes_per_token: float
    whole_per_token: float


async def run(port: int, pid: int, interval: float, uis: int, tokens: int, rate: float) -> Result:
    conversation_id = f"drafts-{uis}-{interval}-{time.monotonic_ns()}"
    words = [f" w{(i * 7919) % 1000}" for i in range(tokens)]
    ends: list[int] = []
    length = 0
    for word in words:
        length += len(word)
        ends.append(length)
    appended = [0.0] * tokens
    async with connect(
        f"ws://127.0.0.1:{port}",
        conversation_id,
        client="worker",
        draft_interval=interval,
    ) as worker:
        sockets = [await open_ui(port, conversation_id, f"ui{n}") for n in range(uis)]
        views = [UI(ws, ends, appended) for ws in sockets]
        await asyncio.sleep(0.5)  # every UI welcomed and caught up
        cpu0, deltas0 = hub_cpu(pid), deltas_relayed(port)
        readers = [asyncio.create_task(view.read(tokens)) for view in views]
        draft = await worker.draft().open()
        start = time.perf_counter()
        for at, word in enumerate(words):
            delay = start + at / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            appended[at] = time.perf_counter()
            draft.append(word)
        await asyncio.wait_for(asyncio.gather(*readers), 30)
        cpu, deltas = hub_cpu(pid) - cpu0, deltas_relayed(port) - deltas0
        await draft.abort()
        for ws in sockets:
            await ws.close()
    latencies = [lat for view in views for lat in view.latencies]
    overhead = len(encode_message(DraftUpdate("msg_" + "0" * 32, "append", "text", 0, "")))
    whole = sum(overhead + len(str(end)) + end for end in ends)  # the whole text every token
    received = sum(view.bytes for view in views) / uis
    return Result(
        interval, uis, tokens, percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000,
        cpu / max(deltas, 1) * 1e6, deltas, received / tokens, whole / tokens,
    )  # fmt: skip


async def with_hub(interval: float, plan: list[tuple[int, int]], rate: float) -> list[Result]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HUB_SCRIPT, str(interval), stdout=asyncio.subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        port = int((await asyncio.wait_for(proc.stdout.readline(), 30)).decode())
        results = []
        for uis, tokens in plan:
            result = await run(port, proc.pid, interval, uis, tokens, rate)
            print(
                f"interval {interval * 1000:.0f} ms, {uis} UIs, {tokens} tokens: "
                f"p50 {result.p50:.1f} ms, p99 {result.p99:.1f} ms, "
                f"{result.cpu_per_delta:.0f} µs CPU/delta, "
                f"{result.bytes_per_token:.1f} B/token vs {result.whole_per_token:.0f}",
                flush=True,
            )
            results.append(result)
        return results
    finally:
        proc.terminate()
        await proc.wait()


def report(results: list[Result], rate: float) -> str:
    rows = [
        "| draft_interval | UIs | tokens | latency p50 | latency p99 | hub CPU per delta "
        "| deltas sent | bytes/token/UI | whole text each time | fewer bytes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.interval * 1000:.0f} ms{' (default)' if r.interval == 0 else ''} | "
            f"{r.uis} | {r.tokens} | {r.p50:.1f} ms | "
            f"{r.p99:.1f} ms | {r.cpu_per_delta:.0f} µs | {r.deltas} | "
            f"{r.bytes_per_token:.1f} B | {r.whole_per_token:.0f} B | "
            f"{r.whole_per_token / r.bytes_per_token:.0f}x |"
        )
    ten = next(r for r in results if r.uis == 10 and r.interval > 0)
    big = max((r for r in results if r.interval > 0), key=lambda r: r.tokens)
    latency_ok = ten.p99 <= ten.interval * 1000 + 10
    bytes_ratio = big.whole_per_token / big.bytes_per_token
    return "\n".join(
        [
            f"Run {now()} on {machine()}; load average at the end "
            f"{os.getloadavg()[0]:.1f} (other jobs share the 2 cores).",
            "",
            f"Command: `{command_line()}`",
            "",
            f"One worker (a `Replica`) appends one token every {1000 / rate:.0f} ms to one "
            "draft; the UIs are raw websockets that only read. The hub runs in its own process "
            "(in-memory store); the worker's replica coalesces with the same `draft_interval` "
            "as the hub (at 0, both defaults, it sends each append at once within the hub's "
            "draft budget and the hub relays each delta at once). Latency runs from `d.append` "
            "to the UI holding the token's last character. The 100-UI rows stream fewer "
            "tokens to keep the run short.",
            "",
            *rows,
            "",
            f"- Bar: p99 ≤ draft_interval + 10 ms at 10 UIs: {ten.p99:.1f} ms ≤ "
            f"{ten.interval * 1000 + 10:.0f} ms: **{'met' if latency_ok else 'missed'}**.",
            f"- Bar: ≥ 20x fewer bytes than the whole text each time at {big.tokens} tokens: "
            f"{bytes_ratio:.0f}x: **{'met' if bytes_ratio >= 20 else 'missed'}**.",
            "- With `draft_interval` 0 every token is its own delta: the lowest latency, and "
            "the most deltas (hub CPU and frames grow with tokens x UIs).",
        ]
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--tokens-100", type=int, default=500)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    plan = [(1, args.tokens), (10, args.tokens), (100, args.tokens_100)]
    results = []
    for interval in (0.05, 0.0):
        results += await with_hub(interval, plan, args.rate)
    body = report(results, args.rate)
    print(body)
    if not args.no_write:
        write_section("Live drafts (`bench/drafts.py`)", body)


if __name__ == "__main__":
    asyncio.run(main())
