"""The memory and CPU a hub holds under the attacks of issue 27, against its idle figures.

    .venv/bin/python bench/attacks.py [--rev REV] [--quick] [--check] [--only caps,...]
                                      [--feeds 500] [--seconds 10]

`make attack` runs it with `--check` (exit 1 when a row fails); the test suite runs `--quick
--check` (`tests/net/test_attacks.py`: the same attacks, smaller, in about 15 s).

Starts a hub (memory store, no auth, default settings, `ping_interval` off) in a process of its
own on 127.0.0.1 port 0, from the working tree or, with `--rev`, from the packages as committed
at git revision REV (`git archive`), and measures its RSS (`VmRSS`, sampled every 20 ms, the
peak kept) and CPU seconds (`/proc/PID/stat` user + system):

- `idle`: after start and one conversation written.
- `drafts, big names`: 2 clients each sending 25 one-character appends whose tool name is
  4 MiB (the attack took a hub from 45 to 858 MiB with 200 of them).
- `drafts, big authors`: 4 clients x 8 drafts opened with a 7 MiB `author.name`.
- `summary hellos`: 8 summary sockets each sending a 60 MiB hello.
- `drafts, at the caps`: 8 clients x 8 drafts filled to `draft_max_bytes` in 64 KiB appends
  (the producers subscribe to drafts and never read: their client library queues what
  comes), then a UI joins (its `drafts` snapshot: the largest frame it gets is reported).
- `idle feeds`: `--feeds` summary feeds open and idle for `--seconds`: the hub's CPU seconds.

Each row's bar is twice the idle RSS plus the caps the attack can fill (`Outcome.caps`), and
each attack must meet what the hub promises (the refusal, the frame size, no CPU). Every
socket is on loopback, every wait bounded; the script prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect as ws_connect

ROOT = Path(__file__).resolve().parent.parent
SUBPROTOCOL = "convsync.v1"

HUB = textwrap.dedent(
    """
    import asyncio, faulthandler, os, signal
    from server import Hub, HubConfig, MemoryStore

    faulthandler.register(signal.SIGUSR1)  # where a stuck hub is: kill -USR1 PID

    async def main():
        config = HubConfig.from_env(ping_interval=None)
        async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub:
            print(hub.port, os.getpid(), flush=True)
            await hub.serve_forever()

    asyncio.run(main())
    """
)


class Probe:
    """The hub process's RSS (peak since `reset`) and CPU seconds."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = False
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def reset(self) -> None:
        self.peak = self.rss()

    def _sample(self) -> None:
        while not self._stop:
            try:
                self.peak = max(self.peak, self.rss())
            except OSError:
                return
            time.sleep(0.02)


def _mib(n: int, digits: int = 0) -> str:
    return f"{n / (1 << 20):.{digits}f} MiB"


async def _socket(port: int, path: str, max_queue: int | None = 16) -> Any:
    return await ws_connect(
        f"ws://127.0.0.1:{port}{path}",
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        ping_interval=None,
        max_size=None,
        max_queue=max_queue,
        close_timeout=1,
        open_timeout=10,
    )


async def _hello(port: int, client: str, max_queue: int | None = 16) -> Any:
    ws = await _socket(port, "/v1/conversations/attack", max_queue)
    hello = {"type": "hello", "client": client, "lineage": 0, "revision": 0}
    await ws.send(json.dumps({**hello, "features": ["drafts", "presence"]}))
    async with asyncio.timeout(10):
        while json.loads(await ws.recv())["type"] != "welcome":
            pass
    return ws


async def _send_all(ws: Any, frames: list[str]) -> str:
    """Send frames until the hub closes the socket; how it ended."""
    try:
        async with asyncio.timeout(30):
            for frame in frames:
                await ws.send(frame)
            await asyncio.sleep(0.5)
            await ws.ping()
        return "left open"
    except TimeoutError:
        return "stalled"
    except Exception as error:  # closed by the hub: what we measure
        rcvd = ws.protocol.close_rcvd
        return f"closed {rcvd.code}" if rcvd is not None else type(error).__name__
    finally:
        ws.transport.abort()


async def _send_and_read_ends(ws: Any, frames: list[str], count: int) -> tuple[str, list[Any]]:
    """Send frames, then read `count` `draft_end` answers (bounded); how it ended, and them."""
    ends: list[Any] = []
    try:
        async with asyncio.timeout(30):
            for frame in frames:
                await ws.send(frame)
            while len(ends) < count:
                message = json.loads(await ws.recv())
                if message["type"] == "draft_end":
                    ends.append(message)
            await ws.ping()
        return "left open", ends
    except TimeoutError:
        return "stalled", ends
    except Exception as error:  # closed by the hub
        rcvd = ws.protocol.close_rcvd
        return (f"closed {rcvd.code}" if rcvd is not None else type(error).__name__), ends
    finally:
        ws.transport.abort()


def _id(n: int) -> str:
    return f"msg_0190a5b2c3d47e0f8a1b{n:012x}"


@dataclass(frozen=True)
class Scale:
    """How hard each attack pushes (`FULL`, the figures of docs/security.md; `QUICK`, the form
    the test suite runs: same attacks, smaller, under a minute)."""

    name_mib: int = 4
    name_appends: int = 25
    author_mib: int = 7
    author_clients: int = 4
    author_drafts: int = 8
    hello_mib: int = 60
    hello_sockets: int = 8
    cap_clients: int = 8
    cap_drafts: int = 8
    feeds: int = 500
    seconds: float = 10.0


FULL = Scale()
QUICK = Scale(
    name_mib=2, name_appends=5, author_mib=2, author_clients=2, author_drafts=4, hello_mib=16,
    hello_sockets=4, cap_clients=4, cap_drafts=4, feeds=50, seconds=2.0,
)  # fmt: skip

DRAFT_MAX = 512 << 10  # draft_max_bytes, the default the hub runs with
FRAME_FILL = 1 << 20  # the largest `drafts` frame a joining UI may get (sync.frames)


@dataclass
class Outcome:
    """What an attack met: in words, whether it is what the hub promises, and the bytes of
    caps it may fill (its row's bar is twice the idle RSS plus these)."""

    said: str
    ok: bool
    caps: int = 0


def _endings(endings: list[str], expected: set[str]) -> Outcome:
    seen = set(endings)
    return Outcome(", ".join(sorted(seen)), seen <= expected)


async def big_names(port: int, scale: Scale) -> Outcome:
    """A tool name of `name_mib` MiB on each append: refused `bad_message`, closed 1008."""
    name = "n" * (scale.name_mib << 20)
    endings = []
    for client in range(2):
        ws = await _hello(port, f"names{client}")
        d = _id(client)
        frames = [json.dumps({"type": "draft", "id": d, "op": "open"})]
        for n in range(scale.name_appends):
            frames.append(
                json.dumps(
                    {"type": "draft", "id": d, "op": "append", "part": f"call:{n}",
                     "offset": 0, "text": "x", "name": name}
                )
            )  # fmt: skip
        endings.append(await _send_all(ws, frames))
    return _endings(endings, {"closed 1008"})


async def big_authors(port: int, scale: Scale) -> Outcome:
    """Drafts opened with an author name over `draft_max_bytes`: each `open` refused, the
    socket left open; at most what the drafts may hold is held."""
    author = {"kind": "agent", "name": "a" * (scale.author_mib << 20)}
    endings = []
    refused = 0
    for client in range(scale.author_clients):
        ws = await _hello(port, f"authors{client}")
        ids = [_id(100 + client * 8 + n) for n in range(scale.author_drafts)]
        frames = [
            json.dumps({"type": "draft", "id": d, "op": "open", "author": author}) for d in ids
        ]
        ending, ends = await _send_and_read_ends(ws, frames, len(ids))
        endings.append(ending)
        refused += sum(1 for end in ends if end.get("status") == "refused")
    outcome = _endings(endings, {"left open"})
    total = scale.author_clients * scale.author_drafts
    outcome.said += f"; {refused} of {total} opens refused"
    outcome.ok = outcome.ok and refused == total
    outcome.caps = total * DRAFT_MAX
    return outcome


async def at_the_caps(port: int, scale: Scale) -> Outcome:
    """Drafts filled to `draft_max_bytes`, then a UI joins: it gets every draft in frames of
    at most 1 MiB (streamed one at a time)."""
    chunk = "y" * (64 << 10)
    sockets = []
    for client in range(scale.cap_clients):
        # The producers' library takes in whatever comes (the application never reads it):
        # a socket that stops reading has its own reads paused by the hub, which would stall
        # the attack instead of filling the caps.
        ws = await _hello(port, f"caps{client}", max_queue=None)
        sockets.append(ws)
        for n in range(scale.cap_drafts):
            d = _id(1000 + client * 8 + n)
            await ws.send(json.dumps({"type": "draft", "id": d, "op": "open"}))
            for k in range(DRAFT_MAX // len(chunk)):
                append = {"type": "draft", "id": d, "op": "append", "offset": k * len(chunk)}
                await ws.send(json.dumps({**append, "text": chunk}))
                await asyncio.sleep(0.005)
    await asyncio.sleep(1)
    ours = {_id(1000 + client * 8 + n) for client in range(scale.cap_clients) for n in range(8)}
    ui = await _hello(port, "ui")
    largest = drafts = 0
    try:
        async with asyncio.timeout(30):
            while True:
                frame = await ui.recv()
                largest = max(largest, len(frame))
                message = json.loads(frame)
                if message["type"] == "drafts":  # (drafts of the attacks before may linger)
                    drafts += sum(1 for info in message["drafts"] if info["id"] in ours)
                    if not message.get("more"):
                        break
    except TimeoutError:
        pass
    for ws in [*sockets, ui]:
        await ws.close()
    total = scale.cap_clients * scale.cap_drafts
    said = (
        f"{drafts} of {total} drafts to a joining UI, largest frame {largest / (1 << 20):.2f} MiB"
    )
    return Outcome(said, drafts == total and largest <= FRAME_FILL, total * DRAFT_MAX)


async def summary_hellos(port: int, scale: Scale) -> Outcome:
    """Summary sockets each sending a hello of `hello_mib` MiB: refused by the frame's
    header (1009), or closed for want of a hello in time (1008), never buffered."""
    pad = "p" * (scale.hello_mib << 20)
    sockets = [await _socket(port, "/v1/summary") for _ in range(scale.hello_sockets)]
    hello = json.dumps({"type": "hello", "pad": pad})
    endings = await asyncio.gather(*(_send_all(ws, [hello]) for ws in sockets))
    return _endings(list(endings), {"closed 1009", "closed 1008"})


async def idle_feeds(port: int, probe: Probe, scale: Scale) -> Outcome:
    """`feeds` summary feeds idle for `seconds`: the hub spends (almost) no CPU on them."""
    sockets = []
    for _ in range(scale.feeds):
        ws = await _socket(port, "/v1/summary")
        await ws.send(json.dumps({"type": "hello"}))
        async with asyncio.timeout(10):
            await ws.recv()
        sockets.append(ws)
    await asyncio.sleep(1)
    before = probe.cpu()
    await asyncio.sleep(scale.seconds)
    used = probe.cpu() - before
    for ws in sockets:
        await ws.close()
    share = used / scale.seconds
    said = f"{used:.2f} CPU s in {scale.seconds:g} s ({100 * share:.1f}% of a core)"
    return Outcome(said, share < 0.05)


ATTACKS = {
    "names": ("drafts, big names", big_names),
    "authors": ("drafts, big authors", big_authors),
    "hellos": ("summary hellos", summary_hellos),
    "caps": ("drafts, at the caps", at_the_caps),
}

Row = tuple[str, str, str, str]


async def run(port: int, probe: Probe, scale: Scale, only: list[str]) -> list[Row]:
    """Each attack in turn; a row for each: its name, the hub's RSS, what it met, the
    verdict (`PASS`: the outcome promised, and a peak within 2 x idle + the caps it fills)."""
    ws = await _hello(port, "seed")
    await ws.close()
    await asyncio.sleep(1)
    idle = probe.rss()
    rows: list[Row] = [("idle", _mib(idle), "", "")]
    for key, (name, attack) in ATTACKS.items():
        if only and key not in only:
            continue
        probe.reset()
        outcome = await attack(port, scale)
        await asyncio.sleep(0.5)
        bar = 2 * idle + outcome.caps
        verdict = "PASS" if outcome.ok and probe.peak <= bar else "FAIL"
        memory = f"peak {_mib(probe.peak)}, after {_mib(probe.rss())} (bar {_mib(bar)})"
        rows.append((name, memory, outcome.said, verdict))
        print(rows[-1], file=sys.stderr, flush=True)
    if not only or "feeds" in only:
        outcome = await idle_feeds(port, probe, scale)
        rows.append(
            ("idle feeds", _mib(probe.rss()), outcome.said, "PASS" if outcome.ok else "FAIL")
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", help="run the hub from this git revision's packages")
    parser.add_argument("--feeds", type=int, default=None, help="idle feeds (500; quick 50)")
    parser.add_argument("--seconds", type=float, default=None, help="of idle feeds (10; quick 2)")
    parser.add_argument(
        "--quick", action="store_true", help="the small form the test suite runs (under a minute)"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a row fails its outcome or its bar"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated attacks to run (names, authors, hellos, caps, feeds; default all)",
    )
    args = parser.parse_args()
    only = [key for key in args.only.split(",") if key]
    scale = QUICK if args.quick else FULL
    if args.feeds is not None:
        scale = replace(scale, feeds=args.feeds)
    if args.seconds is not None:
        scale = replace(scale, seconds=args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        code = ROOT
        if args.rev:
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.rev, "server", "sync"],
                check=True, capture_output=True,
            ).stdout  # fmt: skip
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            code = Path(tmp)
        env = dict(os.environ, PYTHONPATH=str(code))
        hub = subprocess.Popen(
            [sys.executable, "-c", HUB], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp
        )
        try:
            assert hub.stdout is not None
            port, pid = map(int, hub.stdout.readline().split())
            probe = Probe(pid)
            rows = asyncio.run(asyncio.wait_for(run(port, probe, scale, only), 600))
        finally:
            hub.terminate()
            hub.wait(10)
    print(f"code: {args.rev or 'working tree'}{' (quick)' if args.quick else ''}\n")
    print("| attack | hub RSS | outcome | result |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.check and any(row[3] == "FAIL" for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
