"""`bench/hub.py memory`: hub memory per loaded conversation and with 1,000 idle connections."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

# First, before `bench._engine` (which then puts its code copy ahead of it): appended, an
# editable install of another checkout (the venv's) shadowed this one's `bench` package, so
# a run from a worktree measured, and wrote into, that other checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.asyncio.client import ClientConnection

from bench._hub import MESSAGE_CHARS, Settings, Topic, bounded, open_raw, servers
from bench._hub_catchup import receive_catch_up
from bench._hubproc import records_for
from bench._report import (
    Row,
)
from server.config import HubConfig
from server.hub import Hub
from server.store import SqliteStore
from sync import Lineage, encode
from sync.protocol import (
    Hello,
    encode_message,
)


async def topic_memory(settings: Settings, args: argparse.Namespace) -> Topic:
    n, size = settings.memory_conversations, settings.memory_messages
    topic = Topic(
        "Hub: memory (`bench/hub.py memory`)",
        f"**Per conversation** (hub in this process): {n} conversations of {size} messages "
        f"(alternating user/assistant, {MESSAGE_CHARS} characters each, one push record per "
        "message) are written straight into a `SqliteStore` file; then, with `tracemalloc` "
        "tracing, the hub loads each one (`hub.room_for_read`: a `Room` folded from the "
        "store's records and kept loaded). Retained = tracemalloc's traced total after "
        "`gc.collect()` minus the total before loading. JSON size = the sum of "
        "`len(sync.encode(conversation))` (the state as `GET /v1/conversations/{id}` "
        "sends it), default `HubConfig` but for `idle_unload`. Informative: the same with "
        "`recent_records=0`, and the same load in a hub process of its own (RSS before and "
        "after: RSS includes allocator slack).\n\n"
        f"**Idle connections**: a hub (`MemoryStore`) in its own process holding "
        f"{settings.idle_conversations} conversations of 10 messages; this process opens "
        f"{settings.idle_connections:,} raw protocol connections spread evenly over them, "
        "each sends `hello` and reads its `welcome` and catch-up, then stays idle. The hub's "
        "`VmRSS` (`/proc/PID/status`) is read before the first connection and 2 s after the "
        "last. The open-files limit is raised to the hard limit in both processes.",
    )
    results = topic.results
    tmp = tempfile.TemporaryDirectory(prefix="convsync-bench-")
    path = f"{tmp.name}/memory.db"
    ids = [f"mem-{k}" for k in range(n)]

    # --- per conversation, tracemalloc, hub in this process
    json_total = 0
    async with SqliteStore(path, synchronous="OFF") as store:
        for conversation_id in ids:
            records = records_for(size, MESSAGE_CHARS)
            await store.append(conversation_id, Lineage.fresh(), 0, records)
            del records

    async def traced_load(recent_records: int) -> tuple[int, tracemalloc.Snapshot, int]:
        """(bytes retained by loading every conversation, the snapshot, their JSON size)."""
        config = HubConfig(idle_unload=3600, ping_interval=None, recent_records=recent_records)
        json_size = 0
        async with Hub(SqliteStore(path), host="127.0.0.1", port=0, config=config) as hub:
            await hub.room_for_read("warm-up")  # first-use allocations of the code paths
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for conversation_id in ids:
                await hub.room_for_read(conversation_id)
            gc.collect()
            retained = tracemalloc.get_traced_memory()[0] - before
            snapshot = tracemalloc.take_snapshot()
            tracemalloc.stop()
            for conversation_id in ids:
                room = await hub.room_for_read(conversation_id)
                assert room is not None and len(room.conversation) == size
                json_size += len(encode(room.conversation))
        gc.collect()
        return retained, snapshot, json_size

    default_recent = HubConfig().recent_records
    retained, snapshot, json_total = await traced_load(default_recent)
    retained_bare, _, _ = await traced_load(0)
    ratio = retained / json_total
    results.add(
        Row(
            f"retained by {n} loaded conversations (tracemalloc)",
            f"{retained / 2**20:.1f} MiB = {retained / n / 1024:.0f} KiB each",
        )
    )
    results.add(
        Row(
            f"their JSON size ({size} messages each)",
            f"{json_total / 2**20:.1f} MiB = {json_total / n / 1024:.0f} KiB each",
        )
    )
    results.add(Row("memory / JSON size", f"{ratio:.3f}", bar="<= 3", passed=ratio <= 3))
    results.add(
        Row(
            "memory / JSON size with `HubConfig(recent_records=0)` (informative: without the "
            f"tail of up to {default_recent:,} encoded records each room keeps for catch-up)",
            f"{retained_bare / json_total:.3f}",
        )
    )
    top = snapshot.statistics("lineno")[:8]
    topic.results.notes.append(
        "Retained memory by allocating line (tracemalloc, top 8): "
        + "; ".join(
            f"`{Path(stat.traceback[0].filename).name}:{stat.traceback[0].lineno}` "
            f"{stat.size / 2**20:.1f} MiB"
            for stat in top
        )
    )

    async with servers() as start:
        # --- the same load in a hub process of its own: RSS
        hub_proc = await start("hub", "--store", "sqlite", "--path", path, "--idle-unload", "3600")
        await hub_proc.ask("load", ids=["warm-up"])
        rss0 = (await hub_proc.ask("stats"))["rss_kb"]
        await hub_proc.ask("load", ids=ids)
        rss1 = (await hub_proc.ask("stats"))["rss_kb"]
        rss_ratio = (rss1 - rss0) * 1024 / json_total
        results.add(
            Row(
                f"hub process RSS growth loading the same {n} conversations (informative)",
                f"{(rss1 - rss0) / 1024:.1f} MiB = {rss_ratio:.2f}x their JSON size",
            )
        )
        await hub_proc.stop()

        # --- idle connections
        hub = await start("hub", "--store", "memory", "--idle-unload", "3600")
        conversations = [f"idle-{k}" for k in range(settings.idle_conversations)]
        for conversation_id in conversations:
            await hub.ask("seed", id=conversation_id, messages=10, chars=MESSAGE_CHARS)
        await hub.ask("load", ids=conversations)
        gc.collect()
        await asyncio.sleep(1)
        stats0 = await hub.ask("stats")
        conns: list[ClientConnection] = []
        try:
            for k in range(settings.idle_connections):
                conversation_id = conversations[k % len(conversations)]
                conn = await open_raw(hub.url, f"/v1/conversations/{conversation_id}", None)
                conns.append(conn)
                await conn.send(encode_message(Hello(f"idle-{k}", Lineage.EMPTY, 0)), text=True)
                await bounded(receive_catch_up(conn, 10), 30)
            await asyncio.sleep(2)
            stats1 = await hub.ask("stats")
            assert stats1["connections"] == settings.idle_connections, stats1
        finally:
            for conn in conns:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), 5)
    growth = stats1["rss_kb"] - stats0["rss_kb"]
    count = settings.idle_connections
    results.add(Row("hub RSS before the connections", f"{stats0['rss_kb'] / 1024:.1f} MiB"))
    results.add(
        Row(
            f"hub RSS growth with {count:,} idle connections",
            f"{growth / 1024:.1f} MiB = {growth / count:.1f} KiB per connection",
        )
    )
    total = stats1["rss_kb"] / 1024
    results.add(
        Row(
            f"hub RSS with {count:,} idle connections (total)",
            f"{total:.1f} MiB",
            bar="<= 300 MB (total RSS)",
            passed=stats1["rss_kb"] * 1024 <= 300e6,
        )
    )
    tmp.cleanup()
    return topic
