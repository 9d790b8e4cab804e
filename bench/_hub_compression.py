"""`bench/hub.py compression`: permessage-deflate on vs off."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# First, before `bench._engine` (which then puts its code copy ahead of it): appended, an
# editable install of another checkout (the venv's) shadowed this one's `bench` package, so
# a run from a worktree measured, and wrote into, that other checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench._hub import Settings, Topic, log, payload_messages, profiled, rate, rates, servers
from bench._hub_fanout import Run, run_convsync
from bench._report import (
    Row,
    median,
    spread,
)


async def topic_compression(settings: Settings, args: argparse.Namespace) -> Topic:
    readers = settings.compression_readers
    topic = Topic(
        "Hub: compression (`bench/hub.py compression`)",
        f"The fan-out run (writer `Replica` pushing {settings.fanout_records:,} ~300-byte "
        f"records at once, {readers} reader `Replica`s, all in this process; hub on "
        "`MemoryStore` in its own process) against two hubs: one with "
        '`HubConfig(compression=None)` (the default) and one with `compression="deflate"`; '
        'the replicas use the same setting (`Replica(..., compression="deflate")`). Hub CPU '
        "per delivery = CPU seconds of the hub process during the run (user + system, "
        "`getrusage` in that process) / records delivered. Runs interleaved, median of "
        f"{settings.repeats}. The messages are words of a small vocabulary, so they compress "
        "well (as chat text does). Issue 3 sets no bar here, only an expectation (2-4x the "
        "hub CPU per delivery on loopback); permessage-deflate compresses every frame once "
        "per connection (each keeps its own compression context), so its cost per delivery "
        "is about fixed while the uncompressed cost per delivery is whatever the hub's send "
        "path costs: the ratio grows as that path gets cheaper.",
    )
    results = topic.results
    messages = payload_messages(settings.fanout_records)
    samples: dict[str, list[Run]] = {"off": [], "deflate": []}
    async with servers() as start:
        hubs = {
            "off": await start("hub", "--store", "memory"),
            "deflate": await start("hub", "--store", "memory", "--compression", "deflate"),
        }
        for repeat in range(settings.repeats):
            for setting, hub in hubs.items():
                compression = None if setting == "off" else "deflate"
                run = await run_convsync(hub, readers, messages, compression=compression)
                samples[setting].append(run)
                log(
                    f"compression {setting:<7} #{repeat}: {run.rate:,.0f} records/s, "
                    f"hub {run.hub_cpu / run.delivered * 1e6:.2f} µs/delivery"
                )
        if args.profile:
            hub = hubs["deflate"]
            topic.profiles.append(
                (
                    "hub process, deflate fan-out",
                    await profiled(
                        hub, lambda: run_convsync(hub, readers, messages, compression="deflate")
                    ),
                )
            )
    per_delivery = {}
    for setting, sample in samples.items():
        rates_ = [r.rate for r in sample]
        cpu = [r.hub_cpu / r.delivered * 1e6 for r in sample]
        per_delivery[setting] = median(cpu)
        results.add(
            Row(f"compression {setting}: delivery rate", rate(median(rates_)), spread=rates(rates_))
        )
        results.add(
            Row(
                f"compression {setting}: hub CPU per delivery",
                f"{median(cpu):.2f} µs",
                spread=spread(cpu, "{:.2f}") + " µs",
            )
        )
    ratio = per_delivery["deflate"] / per_delivery["off"]
    results.add(
        Row(
            "hub CPU per delivery, deflate / off",
            f"{ratio:.3f}"
            + ("" if 2 <= ratio <= 4 else f" ({'above' if ratio > 4 else 'below'} 2-4)"),
            bar="none: expected 2-4 (issue 3)",
        )
    )
    extra = per_delivery["deflate"] - per_delivery["off"]
    results.add(Row("hub CPU per delivery spent compressing (deflate - off)", f"{extra:.2f} µs"))
    off = median([r.rate for r in samples["off"]])
    on = median([r.rate for r in samples["deflate"]])
    results.add(Row("delivery rate, deflate / off", f"{on / off:.2f}"))
    return topic
