"""Load: one hub holding thousands of connections across hundreds of conversations.

    python bench/load.py                      # 2,000 connections, 200 conversations
    python bench/load.py --connections 200 --conversations 20 --no-write   # a smoke run

The hub runs in a process of its own (SQLite store on a temporary file). Replicas (real
`client.Replica`s) run in two client processes, which this script starts as
`python bench/load.py --client ...` and drives over stdin/stdout. Phases:

1. connect: every replica connects and catches up; hub memory (VmRSS) and CPU before/after.
2. deliver: in every conversation one replica pushes `--records` messages of ~300 characters,
   one at a time, acked each; every other replica waits until it holds them all. Reported:
   deliveries per second (records received by all replicas / elapsed) and hub CPU per delivery.
3. slow consumer: in one conversation one replica stops reading while another pushes 20 KB
   records; the others in that conversation must keep receiving, the stopped one is sent to
   resync (`lagging`), and once it reads again it catches up.

Figures go to the "Load" section of `docs/reliability.md` unless `--no-write`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402

from client import Replica  # noqa: E402
from sync import Message  # noqa: E402

HUB = """
import asyncio, os, sys
from server import Hub, HubConfig, SqliteStore

async def main(path):
    async with Hub(SqliteStore(path), host="127.0.0.1", port=0,
                   config=HubConfig(max_connections=100_000, rate=1e9, rate_burst=1e9,
                                    max_waiting_per_address=1_000_000)) as hub:
        print(hub.port, os.getpid(), flush=True)
        await hub.serve_forever()

asyncio.run(main(sys.argv[1]))
"""


def raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def proc_stats(pid: int) -> tuple[float, float]:
    """(RSS in MiB, CPU seconds) of process `pid`."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / ticks


# ---------------------------------------------------------------- the client processes


async def client_main(url: str, index: int, count: int, conversations: int) -> None:
    """Hold `count` replicas; obey the driver's commands, one JSON line each."""
    raise_fd_limit()
    replicas: list[Replica] = []
    async with contextlib.AsyncExitStack() as stack:

        async def open_one(k: int) -> None:
            number = index * count + k
            replica = Replica(
                url, f"load-{number % conversations}", client=f"p{index}-{k}", connect_timeout=120
            )
            replicas.append(await stack.enter_async_context(replica))

        for start in range(0, count, 50):
            async with anyio.create_task_group() as group:
                for k in range(start, min(count, start + 50)):
                    group.start_soon(open_one, k)
        reply({"connected": len(replicas)})
        while True:
            command = json.loads(await anyio.to_thread.run_sync(sys.stdin.readline) or "null")
            if command is None or command["cmd"] == "quit":
                break
            if command["cmd"] == "push":
                await push_all(replicas, command["records"], command["size"])
                reply({"pushed": True})
            elif command["cmd"] == "wait":
                started = time.monotonic()
                with anyio.fail_after(300):
                    for replica in replicas:
                        await replica.wait_for(command["revision"][replica.conversation_id])
                reply({"waited": time.monotonic() - started})
            elif command["cmd"] == "slow":
                reply(await slow_consumer(replicas, command))


async def push_all(replicas: list[Replica], records: int, size: int) -> None:
    """In each conversation, the first replica of this process (if it is the writer) pushes."""
    writers = [r for r in replicas if _first_of(r, replicas)]

    async def write(replica: Replica) -> None:
        for k in range(records):
            replica.conversation.push(Message.user(f"{k} " + "x" * size))
            await replica.flush()

    async with anyio.create_task_group() as group:
        for replica in writers:
            group.start_soon(write, replica)


def _first_of(replica: Replica, replicas: list[Replica]) -> bool:
    return next(r for r in replicas if r.conversation_id == replica.conversation_id) is replica


async def slow_consumer(replicas: list[Replica], command: dict[str, Any]) -> dict[str, Any]:
    """One replica of a conversation stops reading while another pushes big records."""
    group = [r for r in replicas if r.conversation_id == command["conversation"]]
    writer, sleepy, *others = group
    ws = sleepy._ws
    assert ws is not None
    ws.transport.pause_reading()
    started = time.monotonic()
    for k in range(command["records"]):
        writer.conversation.push(Message.user(f"big {k} " + "y" * 20_000))
        if k % 10 == 9:
            await writer.flush()
    await writer.flush()
    revision = writer.revision
    with anyio.fail_after(120):
        for replica in others:
            await replica.wait_for(revision)
    others_done = time.monotonic() - started
    ws.transport.resume_reading()
    with anyio.fail_after(120):
        await sleepy.wait_for(revision)
    return {
        "others_seconds": others_done,
        "slow_caught_up_seconds": time.monotonic() - started,
        "slow_connects": sleepy.connects,
        "equal": all(r.conversation == writer.conversation for r in group),
    }


def reply(value: dict[str, Any]) -> None:
    print(json.dumps(value), flush=True)


# ---------------------------------------------------------------- the driver


class Client:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def ask(self, command: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        if command is not None:
            self.process.stdin.write((json.dumps(command) + "\n").encode())
            await self.process.stdin.drain()
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError("a client process died")
        result: dict[str, Any] = json.loads(line)
        return result


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    raise_fd_limit()
    workdir = Path(tempfile.mkdtemp(prefix="convsync-load-"))
    hub = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HUB,
        str(workdir / "load.db"),
        stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert hub.stdout is not None
    port, pid = map(int, (await hub.stdout.readline()).split())
    url = f"ws://127.0.0.1:{port}"
    clients: list[Client] = []
    figures: dict[str, Any] = {}
    try:
        await asyncio.sleep(0.5)
        rss0, cpu0 = proc_stats(pid)
        per_process = args.connections // 2
        started = time.monotonic()
        for index in range(2):
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--client",
                url,
                str(index),
                str(per_process),
                str(args.conversations),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            clients.append(Client(process))
        connected = [await client.ask() for client in clients]
        figures["connect_seconds"] = time.monotonic() - started
        figures["connections"] = sum(c["connected"] for c in connected)
        await asyncio.sleep(1.0)
        rss1, cpu1 = proc_stats(pid)
        figures["hub_rss_idle_mib"] = rss1
        figures["hub_rss_base_mib"] = rss0
        figures["kib_per_connection"] = (rss1 - rss0) * 1024 / figures["connections"]
        figures["cpu_per_connect_ms"] = (cpu1 - cpu0) * 1000 / figures["connections"]

        # Deliver: process 0 holds the first replica of every conversation, so it writes.
        started = time.monotonic()
        await clients[0].ask({"cmd": "push", "records": args.records, "size": 300})
        revision = {f"load-{k}": args.records for k in range(args.conversations)}
        waits = await asyncio.gather(
            *(client.ask({"cmd": "wait", "revision": revision}) for client in clients)
        )
        elapsed = time.monotonic() - started
        rss2, cpu2 = proc_stats(pid)
        readers = figures["connections"] - args.conversations
        deliveries = readers * args.records
        figures["deliveries"] = deliveries
        figures["deliver_seconds"] = elapsed
        figures["deliveries_per_second"] = deliveries / elapsed
        figures["hub_cpu_per_delivery_us"] = (cpu2 - cpu1) * 1e6 / deliveries
        figures["hub_rss_after_delivery_mib"] = rss2
        figures["client_wait_seconds"] = statistics.median(w["waited"] for w in waits)

        slow = await clients[0].ask(
            {"cmd": "slow", "conversation": "load-0", "records": args.slow_records}
        )
        figures["slow"] = slow
        metrics = await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/metrics")
        figures["send_queue_drops"] = int(
            next(
                line.split()[-1]
                for line in metrics.splitlines()
                if line.startswith("convsync_send_queue_drops_total")
            )
        )
        return figures
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                await client.ask({"cmd": "quit"})
            with contextlib.suppress(ProcessLookupError):
                client.process.kill()
            await client.process.wait()
        hub.terminate()
        await hub.wait()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def write(figures: dict[str, Any], args: argparse.Namespace) -> None:
    from bench._report import machine, now

    slow = figures["slow"]
    command = "python bench/load.py " + " ".join(sys.argv[1:])
    rows = [
        (
            "connections held at once",
            f"{figures['connections']} across {args.conversations} conversations",
        ),
        ("time to connect and catch up all of them", f"{figures['connect_seconds']:.1f} s"),
        (
            "hub memory with them idle (VmRSS)",
            f"{figures['hub_rss_idle_mib']:.1f} MiB (base {figures['hub_rss_base_mib']:.1f} MiB)",
        ),
        ("hub memory per connection", f"{figures['kib_per_connection']:.1f} KiB"),
        ("hub CPU per connection (connect + catch-up)", f"{figures['cpu_per_connect_ms']:.2f} ms"),
        (
            f"deliveries ({args.records} records pushed per conversation, acked one by one)",
            f"{figures['deliveries']} in {figures['deliver_seconds']:.2f} s",
        ),
        ("delivery rate", f"{figures['deliveries_per_second']:,.0f} records/s received"),
        ("hub CPU per delivery", f"{figures['hub_cpu_per_delivery_us']:.0f} us"),
        (
            "slow consumer: the others in its conversation had every record after",
            f"{slow['others_seconds']:.2f} s",
        ),
        (
            "slow consumer: resynced (lagging close) and caught up after",
            f"{slow['slow_caught_up_seconds']:.2f} s, {slow['slow_connects']} connections, "
            f"all equal: {slow['equal']}",
        ),
        ("subscribers dropped for lagging (hub metric)", str(figures["send_queue_drops"])),
    ]
    body = (
        "## Load\n\n"
        f"Command: `{command.strip()}` ({now()}, {machine()}). One hub process (SQLite store);\n"
        "replicas are real `client.Replica`s in two client processes.\n\n"
        "| figure | value |\n|---|---|\n"
        + "".join(f"| {name} | {value} |\n" for name, value in rows)
    )
    path = ROOT / "docs" / "reliability.md"
    text = path.read_text() if path.exists() else "# Reliability\n\n"
    head, sep, rest = text.partition("## Load")
    tail = rest[rest.find("\n## ") + 1 :] if sep and "\n## " in rest else ""
    path.write_text(head.rstrip() + "\n\n" + body + ("\n" + tail if tail else ""))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        url, index, count, conversations = sys.argv[2:6]
        asyncio.run(client_main(url, int(index), int(count), int(conversations)))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--slow-records", type=int, default=1000, help="20 KB each")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(drive(args))
    print(json.dumps(figures, indent=2))
    if not args.no_write:
        write(figures, args)


if __name__ == "__main__":
    main()
