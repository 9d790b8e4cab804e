"""Tokens from the provider SDK's event to 10 UIs (issue 28): p99 against draft_interval.

Run from the repository root:

    .venv/bin/python bench/provider_ui.py            # the full run; writes docs/benchmarks.md
    .venv/bin/python bench/provider_ui.py --quick    # a smoke run; writes nothing

How it works, all through the public API: a hub runs in a process of its own (in-memory store,
`draft_interval` 50 ms, its default). The fake provider (`tests/support/fakeprovider.py`, HTTP on
127.0.0.1) streams an Anthropic Messages answer of 4-character text deltas at a paced rate
(one every 20 ms); the worker, a `Replica` with the same `draft_interval`, reads it with the
real `anthropic` SDK (`client.messages.stream(...)`, `base_url` the fake) and hands the
stream to `replica.answer(stream, format="anthropic")`. It notes the moment each text event
comes out of the SDK (the event's arrival in the worker). Ten UIs, `Replica`s in a process of
their own (UIs run elsewhere; the monotonic clock is the machine's, shared by both
processes), note the moment each event shows them more of the text (a draft change; for the
last tokens, the commit that ends the draft). A token's latency is from its event's arrival
to the first moment a UI shows all of it, for every token and every UI. Each repeat is one
answer in a new conversation; the figures are the median over the repeats of each repeat's
p50 and p99 (spread: min-max over the repeats). For scale, the same path with
`draft_interval` 0 (no coalescing) is shown too: what the processes and sockets cost.
Bar: p99 <= draft_interval + 10 ms at 10 UIs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench._support import use_test_helpers  # noqa: E402

use_test_helpers()  # tests/support (or tests): fleet, fakeprovider, ... by bare name

from _report import Results, Row, now, publish, spread  # noqa: E402
from fakeprovider import FakeProvider, anthropic_stream  # noqa: E402

from bench.drafts import HUB_SCRIPT, percentile  # noqa: E402
from client import connect  # noqa: E402
from sync import Message  # noqa: E402
from sync.providers import to_anthropic  # noqa: E402

SECTION = "LLM provider tokens to 10 UIs (`bench/provider_ui.py`)"

UI_SCRIPT = """
import asyncio, json, sys, time
from client import connect
from client.live import DraftChanged
from sync import Assistant

def shown(ui, event):
    # how much of the answer `ui` shows: its draft, or the message once committed
    if isinstance(event, DraftChanged):
        draft = ui.drafts.get(event.id)
        return 0 if draft is None else len(draft.text)
    messages = ui.conversation.messages()
    if messages and isinstance(messages[-1], Assistant):
        return sum(len(getattr(part, "text", "")) for part in messages[-1].content)
    return 0

async def watch(ui, seen):
    longest = 0
    async for event in ui.events():
        length = shown(ui, event)
        if length > longest:
            longest = length
            seen.append((longest, time.monotonic()))

async def main(url, conversation, uis):
    replicas = [connect(url, conversation, client=f"ui{n}") for n in range(uis)]
    seen = [[] for _ in replicas]
    for replica in replicas:
        await replica.__aenter__()
    for replica in replicas:
        await replica.flush()
    tasks = [asyncio.create_task(watch(r, s)) for r, s in zip(replicas, seen)]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for task in tasks:
        if task.done():
            task.result()  # a watcher that failed says why
        task.cancel()
    for replica in replicas:
        await replica.__aexit__(None, None, None)
    print(json.dumps(seen), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def _stamped(stream: Any, arrivals: list[tuple[int, float]]) -> Any:
    """The SDK's events, noting when each text delta came out of it and the text's length."""
    length = 0
    async for event in stream:
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            length += len(event.delta.text)
            arrivals.append((length, time.monotonic()))
        yield event


def _latencies(arrivals: list[tuple[int, float]], seen: list[list[list[float]]]) -> list[float]:
    """Per token and UI: from the event's arrival to the UI's first draft holding it (s)."""
    out: list[float] = []
    for samples in seen:
        at = 0
        for length, arrived in arrivals:
            while at < len(samples) and samples[at][0] < length:
                at += 1
            if at == len(samples):
                raise RuntimeError(f"a UI never showed the first {length} characters")
            out.append(samples[at][1] - arrived)
    return out


async def one_answer(
    hub_url: str, provider: FakeProvider, interval: float, uis: int, tokens: int, rate: float
) -> list[float]:
    """Stream one answer of `tokens` text deltas at `rate` per second; every latency (s)."""
    import anthropic

    conversation = f"provider-ui-{time.monotonic_ns()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    watchers = await asyncio.create_subprocess_exec(
        sys.executable, "-c", UI_SCRIPT, hub_url, conversation, str(uis),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
        limit=1 << 24,  # the samples come back as one JSON line
    )  # fmt: skip
    assert watchers.stdout is not None and watchers.stdin is not None
    try:
        async with connect(
            hub_url, conversation, client="worker", draft_interval=interval
        ) as worker:
            worker.conversation.push(Message.user("tell me a long story"))
            await asyncio.wait_for(worker.flush(), 30)
            ready = await asyncio.wait_for(watchers.stdout.readline(), 60)
            assert ready.strip() == b"ready", ready
            text = "".join(f"w{n:03d}" for n in range(tokens))  # 4-character deltas
            provider.script(anthropic_stream([{"type": "text", "text": text}], pause=1 / rate))
            llm = anthropic.AsyncAnthropic(base_url=provider.url, api_key="bench", max_retries=0)
            arrivals: list[tuple[int, float]] = []
            async with llm.messages.stream(
                model="claude-fake", max_tokens=4096, **to_anthropic(worker.conversation)
            ) as stream:
                reply = await worker.answer(_stamped(stream, arrivals), format="anthropic")
            await asyncio.wait_for(worker.flush(), 30)
            assert reply.content[-1].text == text  # type: ignore[union-attr]
            await llm.close()
        await asyncio.sleep(0.5)  # the last delta on its way to every UI
        watchers.stdin.write(b"done\n")
        await watchers.stdin.drain()
        seen = json.loads(await asyncio.wait_for(watchers.stdout.readline(), 60))
        return _latencies(arrivals, seen)
    finally:
        if watchers.returncode is None:
            watchers.kill()
        await watchers.wait()


async def _hub(interval: float) -> tuple[asyncio.subprocess.Process, str]:
    """A hub process with `draft_interval` `interval`, and its URL."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    hub = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HUB_SCRIPT, str(interval), stdout=asyncio.subprocess.PIPE, env=env
    )
    assert hub.stdout is not None
    port = int((await asyncio.wait_for(hub.stdout.readline(), 30)).decode())
    return hub, f"ws://127.0.0.1:{port}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--uis", type=int, default=10)
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.tokens = 2, 60
    started, clock = now(), time.monotonic()
    intervals = (0.05, 0.0)
    p50s: dict[float, list[float]] = {interval: [] for interval in intervals}
    p99s: dict[float, list[float]] = {interval: [] for interval in intervals}
    hubs = [await _hub(interval) for interval in intervals]
    try:
        with FakeProvider().running() as provider:
            for repeat in range(args.repeats):  # the two settings interleaved
                for interval, (_, url) in zip(intervals, hubs, strict=True):
                    latencies = await one_answer(
                        url, provider, interval, args.uis, args.tokens, args.rate
                    )
                    p50s[interval].append(percentile(latencies, 50) * 1000)
                    p99s[interval].append(percentile(latencies, 99) * 1000)
                    print(
                        f"repeat {repeat + 1}, draft_interval {interval * 1000:.0f} ms: "
                        f"{len(latencies)} token arrivals, p50 {p50s[interval][-1]:.1f} ms, "
                        f"p99 {p99s[interval][-1]:.1f} ms",
                        flush=True,
                    )
    finally:
        for hub, _ in hubs:
            hub.terminate()
            await hub.wait()
    results = Results()
    for interval in intervals:
        bar = interval * 1000 + 10
        setting = f"draft_interval {interval * 1000:.0f} ms"
        results.add(
            Row(
                f"event to UI, p50 ({args.uis} UIs, {setting})",
                f"{statistics.median(p50s[interval]):.1f} ms",
                spread(p50s[interval], "{:.1f}") + " ms",
            )
        )
        measured = statistics.median(p99s[interval])
        results.add(
            Row(
                f"event to UI, p99 ({args.uis} UIs, {setting})",
                f"{measured:.1f} ms",
                spread(p99s[interval], "{:.1f}") + " ms",
                f"<= draft_interval + 10 ms = {bar:.0f} ms" if interval else "(for scale)",
                measured <= bar if interval else None,
            ),
            "p99",
        )
    results.notes.append(
        f"{args.repeats} repeats per setting of {args.tokens} text deltas at {args.rate:.0f}/s "
        f"to {args.uis} UIs ({args.tokens * args.uis} token arrivals per repeat); load "
        f"average (1 min) at the end {os.getloadavg()[0]:.1f}."
    )
    table = results.table() + "\n\n" + "\n".join(f"- {note}" for note in results.notes)
    publish(SECTION, __doc__ or "", table, started, time.monotonic() - clock, write=not args.quick)
    if results.failed:
        sys.exit(f"bar failed: {', '.join(results.failed)}")


if __name__ == "__main__":
    asyncio.run(main())
