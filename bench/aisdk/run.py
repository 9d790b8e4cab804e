"""convsync's /v1/aisdk against the AI SDK's recommended resumable setup (issue 30).

Run from the repository root (`make bench-aisdk` installs the Node packages first, from
`bench/aisdk/package-lock.json`):

    .venv/bin/python bench/aisdk/run.py            # writes docs/benchmarks.md
    .venv/bin/python bench/aisdk/run.py --quick    # 200 tokens, 20 cuts, writes nothing

The anchor is the AI SDK docs' "Chatbot Resume Streams" recipe (`bench/aisdk/anchor.mjs`): a
UI message stream whose SSE copy goes to `resumable-stream` on this machine's Redis (keys
under a random prefix), an `activeStreamId` per chat, `GET /api/chat/{id}/stream` resuming
it, on Node's `http`. convsync is a hub in this process (in-memory store) with a Python
worker replica that streams the same tokens through a draft, both with their default settings
(each append sent at once within the hub's draft budget, each delta relayed at once) unless
`--draft-interval` (the worker's) or `--hub-draft-interval` set a fixed coalescing. Both
produce TOKENS tokens `t{i}:{epoch ms} `, one every DELAY ms. The clients are the AI SDK's
own `DefaultChatTransport` in Node (`bench/aisdk/clients.mjs`); the systems alternate.

1. **Latency**: a sender (POST) and 9 followers (the resume request, as a second tab does);
   each token's ms from its production to its arrival at each client, tokens produced
   before a client's stream opened left out (a replay, not latency); p50 and p99 over all.
2. **Resume**: 100 clients on one answer (the hub's per-address cap raised to 512 for it:
   they all come from 127.0.0.1), each cut at a random byte (1 to 40,000) of its
   resume stream with the TypeError a lost connection gives, then resumed by the resume
   request; a resumed answer is whole when every token is there once, in order.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import command_line, machine, median, now, write_section  # noqa: E402
from client import Replica, connect  # noqa: E402
from server import Hub, HubConfig, MemoryStore  # noqa: E402
from sync import Message, TurnEnd  # noqa: E402

SECTION = "The AI SDK's resumable setup against /v1/aisdk (`bench/aisdk`)"


async def _worker(replica: Replica, tokens: int, delay: float) -> None:
    """Answer each user message with `tokens` timestamped tokens, streamed as a draft."""
    while True:
        while not replica.conversation.awaits_model():
            async for _ in replica.events():
                break
        replica.open_turn()
        async with replica.draft() as d:
            for i in range(tokens):
                d.append(f"t{i}:{int(time.time() * 1000)} ")
                await anyio.sleep(delay)
            done = await d.commit(Message.assistant(d.text))
        replica.conversation.end_turn(TurnEnd.answered(done))
        await replica.flush()


async def main(args: argparse.Namespace) -> None:
    if not (HERE / "node_modules" / "resumable-stream").is_dir():
        raise SystemExit("no node_modules here: cd bench/aisdk && npm ci (or make bench-aisdk)")
    started, began = now(), time.monotonic()
    load_before = os.getloadavg()[0]
    anchor_env = dict(
        os.environ,
        TOKENS=str(args.tokens),
        DELAY=str(args.delay * 1000),
        KEY_PREFIX=f"convsync-bench-{uuid.uuid4().hex[:12]}",
        REDIS_URL=args.redis,
    )
    anchor = subprocess.Popen(  # noqa: ASYNC220 (started once, before any task runs)
        ["node", str(HERE / "anchor.mjs")], env=anchor_env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert anchor.stdout is not None
        port = int(anchor.stdout.readline())
        anchor_api = f"http://127.0.0.1:{port}/api/chat"
        results: dict[str, dict[str, list]] = {"anchor": {}, "convsync": {}}
        # The 100 cut clients all come from 127.0.0.1: more than the 64 sockets one address
        # may hold by default (`max_waiting_per_address`, a guard against one host's flood).
        config = HubConfig(ping_interval=None, max_waiting_per_address=512)
        if args.hub_draft_interval is not None:
            config = replace(config, draft_interval=args.hub_draft_interval)
        async with Hub(MemoryStore(), port=0, config=config) as hub:
            for r in range(args.repeats):
                order = ["anchor", "convsync"] if r % 2 == 0 else ["convsync", "anchor"]
                for system in order:
                    run = await _once(system, "latency", hub, anchor_api, args)
                    results[system].setdefault("latency", []).append(run)
            for system in ("convsync", "anchor"):
                results[system]["cuts"] = [await _once(system, "cuts", hub, anchor_api, args)]
    finally:
        anchor.terminate()
        anchor.wait(10)
    seconds = time.monotonic() - began
    body = _table(results, args, started, seconds, load_before, os.getloadavg()[0])
    print(body)
    if not args.quick:
        print(f"wrote {write_section(SECTION, body)}")


def _interval(seconds: float | None) -> str:
    return "the default (0: at once)" if seconds is None else f"{seconds} s"


async def _once(
    system: str, mode: str, hub: Hub, anchor_api: str, args: argparse.Namespace
) -> dict:
    """One client run on a fresh chat; for convsync, a worker replica answers it."""
    chat = f"bench-{uuid.uuid4().hex[:10]}"
    if system == "anchor":
        return await _run(anchor_api, chat, mode, args)
    api = f"http://127.0.0.1:{hub.port}/v1/aisdk"
    options = {} if args.draft_interval is None else {"draft_interval": args.draft_interval}
    async with connect(hub.url, chat, client="worker", **options) as w:
        async with anyio.create_task_group() as group:
            group.start_soon(_worker, w, args.tokens, args.delay)
            out = await _run(api, chat, mode, args)
            group.cancel_scope.cancel()
    return out


async def _run(api: str, chat: str, mode: str, args: argparse.Namespace) -> dict:
    env = dict(
        os.environ,
        API=api,
        CHAT=chat,
        MODE=mode,
        TOKENS=str(args.tokens),
        CUTS=str(args.cuts),
        SEED=str(args.seed),
    )
    with anyio.fail_after(600):
        done = await anyio.run_process(["node", str(HERE / "clients.mjs")], env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"clients failed: {done.stderr.decode()[-3000:]}")
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _table(
    results: dict, args: argparse.Namespace, started: str, seconds: float, l0: float, l1: float
) -> str:
    def med(system: str, key: str) -> float:
        return median([run[key] for run in results[system]["latency"]])

    def each(system: str, key: str) -> str:
        return ", ".join(str(run[key]) for run in results[system]["latency"])

    def row(label: str, anchor: object, ours: object) -> str:
        return f"| {label} | {anchor} | {ours} |"

    def lat(system: str, key: str) -> str:
        return f"{med(system, key):.0f} ({each(system, key)})"

    rows = [
        row("", "AI SDK + resumable-stream (Redis)", "convsync /v1/aisdk"),
        "|---|---|---|",
        row(
            "token latency p50, ms: median (each repeat)",
            lat("anchor", "p50"),
            lat("convsync", "p50"),
        ),
        row("token latency p99, ms", lat("anchor", "p99"), lat("convsync", "p99")),
        row("tokens timed per repeat", each("anchor", "tokens"), each("convsync", "tokens")),
    ]
    for key, label in (
        ("cuts", "clients cut mid-answer"),
        ("resumed", "of them resumed (not 204/422)"),
        ("whole", "resumed whole (every token once, in order)"),
        ("lost", "tokens lost"),
        ("duplicated", "tokens duplicated"),
    ):
        rows.append(
            row(label, results["anchor"]["cuts"][0][key], results["convsync"]["cuts"][0][key])
        )
    p99_ok = med("convsync", "p99") <= med("anchor", "p99")
    cut = results["convsync"]["cuts"][0]
    resume_ok = cut["lost"] == 0 and cut["duplicated"] == 0 and cut["whole"] == cut["cuts"]
    return (
        f"Command: `{command_line()}` (from the repository root)  \n"
        f"Date: {started}; the run took {seconds:.0f} s; git {_commit()}  \n"
        f"Machine: {machine()}, shared with other jobs; load average {l0:.1f} at the start, "
        f"{l1:.1f} at the end  \n"
        f"Tokens: {args.tokens}, one every {args.delay * 1000:.0f} ms; convsync's "
        f"`draft_interval`: worker {_interval(args.draft_interval)}, hub "
        f"{_interval(args.hub_draft_interval)}; repeats {args.repeats}, interleaved\n\n"
        + __doc__.split("\n\n", 3)[3].strip()
        + "\n\n"
        + "\n".join(rows)
        + "\n\n"
        + f"Bars: convsync's p99 <= the anchor's: {'PASS' if p99_ok else 'FAIL'}; "
        f"0 lost / 0 duplicated over the cuts: {'PASS' if resume_ok else 'FAIL'} (the anchor's "
        "figures are reported as measured).\n"
    )


def _commit() -> str:
    """The commit measured, and whether the engine had uncommitted changes."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
        dirty = git("diff", "--quiet", "HEAD", "--", "sync", "server", "client").returncode
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" + uncommitted changes to the engine" if dirty else "")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 tokens, 20 cuts, writes nothing")
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--delay", type=float, default=0.005, help="seconds between tokens")
    parser.add_argument("--cuts", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--draft-interval", type=float, help="the worker's fixed coalescing, seconds"
    )
    parser.add_argument(
        "--hub-draft-interval", type=float, help="the hub's fixed coalescing, seconds"
    )
    parser.add_argument(
        "--redis", default=os.environ.get("CONVSYNC_TEST_REDIS", "redis://127.0.0.1:6379")
    )
    parsed = parser.parse_args()
    if parsed.quick:
        parsed.tokens, parsed.cuts, parsed.repeats = 200, 20, 1
    anyio.run(main, parsed)
