"""The memory and CPU a hub holds under the attacks of issue 27, against its idle figures.

    .venv/bin/python bench/attacks.py [--rev REV] [--feeds 500] [--seconds 10] [--only caps,...]

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

Every socket is on loopback, every wait bounded; the script prints a Markdown table.
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


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


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


def _id(n: int) -> str:
    return f"msg_0190a5b2c3d47e0f8a1b{n:012x}"


async def big_names(port: int) -> str:
    name = "n" * (4 << 20)
    endings = []
    for client in range(2):
        ws = await _hello(port, f"names{client}")
        d = _id(client)
        frames = [json.dumps({"type": "draft", "id": d, "op": "open"})]
        for n in range(25):
            frames.append(
                json.dumps(
                    {"type": "draft", "id": d, "op": "append", "part": f"call:{n}",
                     "offset": 0, "text": "x", "name": name}
                )
            )  # fmt: skip
        endings.append(await _send_all(ws, frames))
    return ", ".join(sorted(set(endings)))


async def big_authors(port: int) -> str:
    author = {"kind": "agent", "name": "a" * (7 << 20)}
    endings = []
    for client in range(4):
        ws = await _hello(port, f"authors{client}")
        opens = [{"type": "draft", "id": _id(100 + client * 8 + n), "op": "open"} for n in range(8)]
        frames = [json.dumps({**op, "author": author}) for op in opens]
        endings.append(await _send_all(ws, frames))
    return ", ".join(sorted(set(endings)))


async def at_the_caps(port: int) -> str:
    chunk = "y" * (64 << 10)
    sockets = []
    for client in range(8):
        # The producers' library takes in whatever comes (the application never reads it):
        # a socket that stops reading has its own reads paused by the hub, which would stall
        # the attack instead of filling the caps.
        ws = await _hello(port, f"caps{client}", max_queue=None)
        sockets.append(ws)
        for n in range(8):
            d = _id(1000 + client * 8 + n)
            await ws.send(json.dumps({"type": "draft", "id": d, "op": "open"}))
            for k in range(8):
                append = {"type": "draft", "id": d, "op": "append", "offset": k * len(chunk)}
                await ws.send(json.dumps({**append, "text": chunk}))
                await asyncio.sleep(0.005)
    await asyncio.sleep(1)
    ui = await _hello(port, "ui")
    largest = 0
    try:
        async with asyncio.timeout(5):
            while True:
                frame = await ui.recv()
                largest = max(largest, len(frame))
    except TimeoutError:
        pass
    for ws in [*sockets, ui]:
        await ws.close()
    return f"largest frame to a joining UI: {largest / (1 << 20):.2f} MiB"


async def summary_hellos(port: int) -> str:
    pad = "p" * (60 << 20)
    sockets = [await _socket(port, "/v1/summary") for _ in range(8)]
    hello = json.dumps({"type": "hello", "pad": pad})
    endings = await asyncio.gather(*(_send_all(ws, [hello]) for ws in sockets))
    return ", ".join(sorted(set(endings)))


async def idle_feeds(port: int, probe: Probe, feeds: int, seconds: float) -> str:
    sockets = []
    for _ in range(feeds):
        ws = await _socket(port, "/v1/summary")
        await ws.send(json.dumps({"type": "hello"}))
        async with asyncio.timeout(10):
            await ws.recv()
        sockets.append(ws)
    await asyncio.sleep(1)
    before = probe.cpu()
    await asyncio.sleep(seconds)
    used = probe.cpu() - before
    for ws in sockets:
        await ws.close()
    return f"{used:.2f} CPU s in {seconds:.0f} s ({100 * used / seconds:.1f}% of a core)"


ATTACKS = {
    "names": ("drafts, big names", big_names),
    "authors": ("drafts, big authors", big_authors),
    "hellos": ("summary hellos", summary_hellos),
    "caps": ("drafts, at the caps", at_the_caps),
}


async def run(
    port: int, probe: Probe, feeds: int, seconds: float, only: list[str]
) -> list[tuple[str, str, str]]:
    ws = await _hello(port, "seed")
    await ws.close()
    await asyncio.sleep(1)
    idle = probe.rss()
    rows = [("idle", _mib(idle), "")]
    for key, (name, attack) in ATTACKS.items():
        if only and key not in only:
            continue
        probe.reset()
        outcome = await attack(port)
        await asyncio.sleep(0.5)
        rows.append((name, f"peak {_mib(probe.peak)}, after {_mib(probe.rss())}", outcome))
        print(rows[-1], file=sys.stderr, flush=True)
    if not only or "feeds" in only:
        feeding = await idle_feeds(port, probe, feeds, seconds)
        rows.append(("idle feeds", _mib(probe.rss()), feeding))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", help="run the hub from this git revision's packages")
    parser.add_argument("--feeds", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated attacks to run (names, authors, hellos, caps, feeds; default all)",
    )
    args = parser.parse_args()
    only = [key for key in args.only.split(",") if key]
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
            running = run(port, probe, args.feeds, args.seconds, only)
            rows = asyncio.run(asyncio.wait_for(running, 600))
        finally:
            hub.terminate()
            hub.wait(10)
    print(f"code: {args.rev or 'working tree'}\n")
    print("| attack | hub RSS | outcome |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
