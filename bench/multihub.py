"""Several hubs on one PostgreSQL database (SPEC 9): appends, cross-hub latency, fan-out.

Run from the repository root: `PYTHONPATH=. .venv/bin/python bench/multihub.py` (a few
minutes). It finds PostgreSQL as the tests do (`CONVSYNC_TEST_PG`, else
`postgresql://postgres@127.0.0.1:5432/test`, else a throwaway cluster) and works in a schema
of its own, dropped at the end. Every hub runs in a process of its own; writers and readers
run in this process. The figures go to `docs/benchmarks.md`, section "Several hubs on
PostgreSQL (`bench/multihub.py`)".

What it measures:
- durable appends/s with 1 and 20 writers (each on a conversation of its own, one record per
  push, waiting for the ack) on one hub over PostgreSQL and over SQLite;
- latency from a push on hub A to its arrival at a reader on hub A (same hub) and on hub B
  (cross hub: append, commit, NOTIFY, B reads the records by revision, B forwards);
- fan-out: the time for one record to reach every one of N readers, all on hub A or half on
  each of two hubs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench._support import use_test_helpers  # noqa: E402

use_test_helpers()  # tests/support (or tests): fleet, fakeprovider, ... by bare name

from bench._report import machine, now, write_section  # noqa: E402
from client import Replica  # noqa: E402
from sync import Lineage, Message  # noqa: E402
from sync.protocol import SUBPROTOCOL, Hello, Records, decode_hub_message, encode_message  # noqa: E402

HUB = textwrap.dedent(
    """
    import asyncio, sys
    from server import Hub, HubConfig
    from server.store import open_store

    async def main(db):
        config = HubConfig.from_env(ping_interval=None, idle_unload=600.0)
        async with Hub(open_store(db), host="127.0.0.1", port=0, config=config) as hub:
            print(hub.port, flush=True)
            await hub.serve_forever()

    asyncio.run(main(sys.argv[1]))
    """
)


@contextlib.asynccontextmanager
async def hub_process(db: str) -> AsyncIterator[str]:
    """A hub in a process of its own on `db`; yields its url."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HUB,
        db,
        stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert process.stdout is not None
    try:
        line = await process.stdout.readline()
        yield f"ws://127.0.0.1:{int(line)}"
    finally:
        process.terminate()
        await process.wait()


class Arrivals:
    """When each revision reached each reader; `wait` until enough readers have one."""

    def __init__(self) -> None:
        self.at: dict[int, list[float]] = {}
        self._moved = asyncio.Event()

    def note(self, revision: int, at: float) -> None:
        self.at.setdefault(revision, []).append(at)
        self._moved.set()

    async def wait(self, revision: int, readers: int, seconds: float) -> None:
        """Until `readers` readers have `revision`, or `seconds` passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while len(self.at.get(revision, ())) < readers:
                    self._moved.clear()
                    await self._moved.wait()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# ---------------------------------------------------------------------- durable appends


async def durable(url: str, writers: int, seconds: float) -> float:
    """Acked records/s of `writers` replicas, each on its own conversation, one record per
    push, each waiting for its ack before the next."""
    tag = uuid.uuid4().hex[:8]
    async with contextlib.AsyncExitStack() as stack:
        replicas = [
            await stack.enter_async_context(Replica(url, f"dur-{tag}-{k}", client=f"w{k}"))
            for k in range(writers)
        ]
        counts = [0] * writers

        async def write(k: int, replica: Replica, deadline: float) -> None:
            while time.perf_counter() < deadline:
                replica.conversation.push(Message.user(f"durable append {counts[k]} " * 8))
                await replica.flush()
                counts[k] += 1

        started = time.perf_counter()
        await asyncio.gather(*(write(k, r, started + seconds) for k, r in enumerate(replicas)))
        elapsed = time.perf_counter() - started
    return sum(counts) / elapsed


# ---------------------------------------------------------------------- readers


async def raw_reader(url: str, conversation: str, client: str) -> ClientConnection:
    """A bare subscriber (no replica): a socket that said hello and got its welcome."""
    ws = await ws_connect(
        f"{url}/v1/conversations/{conversation}",
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        max_size=None,
        open_timeout=120,
        ping_interval=None,
    )
    await ws.send(encode_message(Hello(client, Lineage.EMPTY, 0, None)), text=True)
    decode_hub_message(await ws.recv(decode=False))  # the welcome
    return ws


async def note_arrivals(ws: ClientConnection, arrived: Arrivals) -> None:
    """Record when each revision reaches this reader (until the socket closes)."""
    with contextlib.suppress(Exception):
        while True:
            message = decode_hub_message(await ws.recv(decode=False))
            if isinstance(message, Records):
                at = time.perf_counter()
                for i in range(len(message.records)):
                    arrived.note(message.from_ + i + 1, at)


async def create(writer: Replica) -> None:
    """Give the conversation its log before readers join: a reader that joined a room with no
    log is sent the first record inside a `state` (the log's lineage is new to it), which the
    timing here, counting `records` frames, would miss."""
    writer.conversation.push(Message.user("the log starts"))
    await writer.flush()


async def latency(url_a: str, url_b: str, pushes: int, gap: float) -> dict[str, list[float]]:
    """Push `pushes` records one at a time on hub A; when each reached a reader on A and one
    on B (ms)."""
    conversation = f"lat-{uuid.uuid4().hex[:8]}"
    same, cross = Arrivals(), Arrivals()
    async with Replica(url_a, conversation, client="writer") as writer:
        await create(writer)
        ws_a = await raw_reader(url_a, conversation, "reader-a")
        ws_b = await raw_reader(url_b, conversation, "reader-b")
        tasks = [
            asyncio.create_task(note_arrivals(ws_a, same)),
            asyncio.create_task(note_arrivals(ws_b, cross)),
        ]
        sent: dict[int, float] = {}
        for n in range(2, pushes + 2):
            sent[n] = time.perf_counter()
            writer.conversation.push(Message.user(f"latency probe {n}"))
            await writer.flush()
            await asyncio.sleep(gap)
        await same.wait(pushes + 1, 1, 10)
        await cross.wait(pushes + 1, 1, 10)
        for ws in (ws_a, ws_b):
            await ws.close()
        for task in tasks:
            task.cancel()
    return {
        "same": [(same.at[n][0] - sent[n]) * 1000 for n in sent if n in same.at],
        "cross": [(cross.at[n][0] - sent[n]) * 1000 for n in sent if n in cross.at],
    }


async def fanout(urls: list[str], readers: int, pushes: int) -> list[float]:
    """Readers spread evenly over `urls`; the writer is on the first. For each of `pushes`
    records pushed one at a time: ms until the last reader had it."""
    conversation = f"fan-{uuid.uuid4().hex[:8]}"
    arrived = Arrivals()
    sockets: list[ClientConnection] = []
    async with Replica(urls[0], conversation, client="writer") as writer:
        await create(writer)
        for k in range(0, readers, 50):
            batch = [
                raw_reader(urls[j % len(urls)], conversation, f"r{j}")
                for j in range(k, min(k + 50, readers))
            ]
            sockets += await asyncio.gather(*batch)
        tasks = [asyncio.create_task(note_arrivals(ws, arrived)) for ws in sockets]
        times = []
        for n in range(2, pushes + 2):
            started = time.perf_counter()
            writer.conversation.push(Message.user(f"fan-out probe {n} " * 6))
            await arrived.wait(n, readers, 30)
            got = arrived.at.get(n, [])
            times.append((max(got) - started) * 1000 if len(got) == readers else float("inf"))
            await writer.flush()
        for ws in sockets:
            await ws.close()
        for task in tasks:
            task.cancel()
    return times


# ---------------------------------------------------------------------- the run


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per durable-append run")
    parser.add_argument("--readers", type=int, default=1000, help="fan-out readers")
    parser.add_argument("--pushes", type=int, default=300, help="latency probes")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    import pgserver

    found = pgserver.find_or_start()
    if isinstance(found, str):
        print(found, file=sys.stderr)
        return 2
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    pg = f"{found.dsn}?schema={schema}"
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    rows: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rates: dict[tuple[str, int], float] = {}
            for name, db in (("SQLite", str(Path(tmp) / "bench.db")), ("PostgreSQL", pg)):
                async with hub_process(db) as url:
                    await durable(url, 1, 1.0)  # warm up
                    for writers in (1, 20):
                        rates[name, writers] = await durable(url, writers, args.seconds)
                        print(name, writers, f"{rates[name, writers]:,.0f}/s", flush=True)
            async with hub_process(pg) as url_a, hub_process(pg) as url_b:
                lat = await latency(url_a, url_b, args.pushes, 0.01)
                print({k: (pct(v, 50), pct(v, 99)) for k, v in lat.items() if v}, flush=True)
                one = await fanout([url_a], args.readers, 20)
                print("fan-out one hub", pct(one, 50), pct(one, 99), flush=True)
                two = await fanout([url_a, url_b], args.readers, 20)
                print("fan-out two hubs", pct(two, 50), pct(two, 99), flush=True)
    finally:
        pgserver.drop_schema(found.dsn, schema)
        found.stop()
    seconds = time.monotonic() - started
    load_after = os.getloadavg()[0]
    for writers in (1, 20):
        rows.append(
            f"| durable appends, {writers} writer{'s' if writers > 1 else ''} "
            f"(acked records/s) | {rates['PostgreSQL', writers]:,.0f}/s "
            f"| {rates['SQLite', writers]:,.0f}/s |"
        )
    header = "  \n".join(
        [
            "Command: `PYTHONPATH=. .venv/bin/python bench/multihub.py` (from the repository root)",
            f"Date: {now()}; the run took {seconds:.0f} s",
            f"Machine: {machine()}, shared with other jobs; PostgreSQL on the same machine"
            " (fsync on)",
            f"Machine load: load average (1 min) {load_before:.1f} at the start,"
            f" {load_after:.1f} at the end",
        ]
    )
    body = f"""
{header}

Every hub runs in a process of its own; writers and readers run in the benchmark's process.
Durable appends: one hub; 1 or 20 writer replicas, each on a conversation of its own, push one
~300-byte record and wait for its ack, again and again, for {args.seconds:g} s.

| Durable appends | PostgreSQL | SQLite (synchronous=FULL, group commit) |
|---|---|---|
{chr(10).join(rows)}

Latency: a writer replica on hub A pushes {args.pushes} records, one at a time, 10 ms apart
({len(lat["same"])} and {len(lat["cross"])} arrived); the time from the push to the `records`
frame at a bare subscriber on hub A (same hub) and on hub B (cross hub: the append commits,
NOTIFY, hub B reads the records by revision and forwards them). Both hubs run on PostgreSQL.

| Push to arrival | p50 | p99 |
|---|---|---|
| same hub (A to A) | {pct(lat["same"], 50):.2f} ms | {pct(lat["same"], 99):.2f} ms |
| cross hub (A to B) | {pct(lat["cross"], 50):.2f} ms | {pct(lat["cross"], 99):.2f} ms |

Fan-out: {args.readers} bare subscribers of one conversation, all on hub A or half on each of
two hubs; the writer is on hub A and pushes 20 records one at a time; the time until the last
subscriber has each record. The subscribers all run in this one Python process, which is
most of the cost on this 2-core machine, so this shows the price of the second hop more
than the gain of a second hub's CPU.

| Fan-out to {args.readers} subscribers | p50 | p99 (of 20) |
|---|---|---|
| one hub | {pct(one, 50):.1f} ms | {pct(one, 99):.1f} ms |
| two hubs, half on each | {pct(two, 50):.1f} ms | {pct(two, 99):.1f} ms |
"""
    print(body)
    if not args.no_write:
        write_section("Several hubs on PostgreSQL (`bench/multihub.py`)", body)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
