"""Instructions per push in the hub's room (callgrind): immune to a shared machine's noise.

    .venv/bin/python bench/push_instructions.py --baseline 19a832e [--pushes 2000] [--records 1]
    .venv/bin/python bench/push_instructions.py --hub --baseline 19a832e [--pushes 300]

For this tree's packages and (with `--baseline REV`) REV's, runs a child process under
`valgrind --tool=callgrind` that builds a `Room` on `MemoryStore` with the default `HubConfig`,
joins a writer and 10 subscribers (fakes: a send counts, nothing is written), lands 200 user
messages of 120 characters, then counts the instructions of `--pushes` more one-record pushes,
each decoded from its push frame and handed to `Room.push` (the core's checks, the store's
append, the ack and the broadcast): instrumentation is switched on around those pushes only
(`callgrind_control -i`). Prints instructions per push and new / old. `--records N`: pushes
of N records each (5 warm-up pushes), the per-record costs of a large batch (bench/hub.py
fanout's writer sends 1,000 per push). Needs valgrind; not
part of `make bench` (it writes nothing). Issue 24's hunt for the hot path's regression.

With `--hub`: the whole hub process instead (its websockets, sessions, decoding, the room):
a `Hub` on `MemoryStore` (default `HubConfig`, no keepalive pings) in a child process under
callgrind, one writer and 10 subscribers connected over websockets on 127.0.0.1 (plain
websocket clients in this process, not counted), 50 warm-up pushes, then `--pushes` (300
unless given) one-record pushes in lock-step: the next push goes once the writer has its ack
and every subscriber the records. Instructions of the hub process per push.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sync", "server", "client")
WARM = 200
HUB_WARM = 50


def child(code: str, pushes: int, records: int = 1) -> None:
    """The measured process: the engine from `code` only."""
    warm = WARM if records == 1 else 5  # the warm-up is records, not pushes, when they are large
    sys.path.insert(0, code)
    from server.config import HubConfig
    from server.metrics import Metrics
    from server.room import Room
    from server.store import MemoryStore
    from sync import Conversation, Lineage, Message, encode
    from sync.protocol import Hello, decode_client_message

    assert sys.modules["server.room"].__file__.startswith(code)  # type: ignore[union-attr]

    class Fake:
        def __init__(self) -> None:
            self.sent = 0

        def send(self, frame: bytes, catch_up: bool = False) -> None:
            self.sent += 1

        def fail(self, code: str, detail: str) -> None:
            raise RuntimeError(code)

        def send_draft(self, *args: object) -> None:
            pass

        def send_frames(self, frames: object) -> None:
            list(frames)  # type: ignore[call-overload]

    async def run() -> None:
        room = Room("c1", MemoryStore(), HubConfig(), Metrics())
        writer, subs = Fake(), [Fake() for _ in range(10)]
        await room.join(writer, Hello("writer", Lineage.EMPTY, 0))  # type: ignore[arg-type]
        for k, sub in enumerate(subs):
            await room.join(sub, Hello(f"sub-{k}", Lineage.EMPTY, 0))  # type: ignore[arg-type]
        source = Conversation()
        for i in range((warm + pushes) * records):
            source.push(Message.user((f"message {i} " * 40)[:120]))
        made = [encode(record) for record in source.take_unsaved()]
        frames = [
            b'{"type":"push","seq":%d,"lineage":%%d,"revision":%d,"records":[%s]}'
            % (i + 1, i * records, b",".join(made[i * records : (i + 1) * records]))
            for i in range(warm + pushes)
        ]

        async def push(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                lineage = room.core.lineage if i else Lineage.EMPTY
                await room.push(writer, decode_client_message(frames[i] % lineage))  # type: ignore[arg-type]

        await push(0, warm)
        control = ["callgrind_control", "-i"]
        # Blocking on purpose: nothing else may run while instrumentation switches.
        subprocess.run([*control, "on", str(os.getpid())], check=True, capture_output=True)  # noqa: ASYNC221
        await push(warm, warm + pushes)
        subprocess.run([*control, "off", str(os.getpid())], check=True, capture_output=True)  # noqa: ASYNC221
        assert room.core.revision == (warm + pushes) * records and subs[0].sent >= pushes

    asyncio.run(run())


def hub_child(code: str) -> None:
    """The measured hub process: a `Hub` from `code` on port 0; prints its port, serves until
    stdin closes."""
    sys.path.insert(0, code)
    import dataclasses
    import gc

    from server.config import HubConfig
    from server.hub import Hub
    from server.store import MemoryStore

    assert sys.modules["server.hub"].__file__.startswith(code)  # type: ignore[union-attr]

    async def serve() -> None:
        config = dataclasses.replace(HubConfig(), ping_interval=None)
        async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub:
            gc.freeze()  # as `convsync serve` does once its hub serves
            print(hub.port, os.getpid(), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(serve())


async def drive_hub(port: int, pid: int, pushes: int, records: int = 1, readers: int = 10) -> None:
    """Connect the writer and 10 subscribers, push in lock-step, instrumentation on around
    the counted pushes."""
    from websockets.asyncio.client import ClientConnection, connect

    from sync import Conversation, Lineage, Message, encode
    from sync.protocol import SUBPROTOCOL, Hello, encode_message

    async def session(client: str) -> tuple[ClientConnection, int]:
        ws = await connect(
            f"ws://127.0.0.1:{port}/v1/conversations/c1",
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            max_size=None,
            open_timeout=600,
            ping_interval=None,
        )
        await ws.send(encode_message(Hello(client, Lineage.EMPTY, 0)), text=True)
        welcome = msgspec.json.decode(await ws.recv(decode=False))
        assert welcome["type"] == "welcome", welcome
        return ws, welcome["lineage"]

    writer, lineage = await session("writer")  # the room's lineage, fresh: every push uses it
    subs = [(await session(f"sub-{k}"))[0] for k in range(readers)]
    warm = HUB_WARM if records == 1 else 5
    source = Conversation()
    for i in range((warm + pushes) * records):
        source.push(Message.user((f"message {i} " * 40)[:120]))
    made = [encode(record) for record in source.take_unsaved()]

    async def push(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            frame = b'{"type":"push","seq":%d,"lineage":%d,"revision":%d,"records":[%s]}' % (
                i + 1,
                lineage,
                i * records,
                b",".join(made[i * records : (i + 1) * records]),
            )
            await writer.send(frame, text=True)
            answer = msgspec.json.decode(await writer.recv(decode=False))
            assert answer["type"] == "ack", answer
            for sub in subs:
                got = msgspec.json.decode(await sub.recv(decode=False))
                assert got["type"] == "records", got

    await push(0, warm)
    control = ["callgrind_control", "-i"]
    # Blocking on purpose: nothing else may run in the hub while instrumentation switches.
    subprocess.run([*control, "on", str(pid)], check=True, capture_output=True)  # noqa: ASYNC221
    await push(warm, warm + pushes)
    subprocess.run([*control, "off", str(pid)], check=True, capture_output=True)  # noqa: ASYNC221
    for ws in [writer, *subs]:
        await ws.close()


def hub_instructions(code: Path, pushes: int, records: int = 1, readers: int = 10) -> int:
    """Instructions per push of a whole hub from `code` (a callgrind run of `hub_child`)."""
    with tempfile.TemporaryDirectory() as out:
        process = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out}/callgrind.out",
                sys.executable,
                __file__,
                "--hub-child",
                str(code),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdin is not None and process.stdout is not None
        try:
            port, pid = map(int, process.stdout.readline().split())
            asyncio.run(drive_hub(port, pid, pushes, records, readers))
        finally:
            _, stderr = process.communicate(timeout=1800)  # closes stdin: the hub stops
    found = re.search(r"I\s+refs:\s+([\d,]+)", stderr)
    assert found is not None, stderr[-2000:]
    return int(found.group(1).replace(",", "")) // pushes


def instructions(code: Path, pushes: int, records: int = 1) -> int:
    """Instructions per push of the engine in `code` (a callgrind run of `child`)."""
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out}/callgrind.out",
                sys.executable,
                __file__,
                "--child",
                str(code),
                "--pushes",
                str(pushes),
                "--records",
                str(records),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
        )
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    assert found is not None, done.stderr[-2000:]
    return int(found.group(1).replace(",", "")) // pushes


def export(rev: str | None, target: Path) -> Path:
    """`sync/`, `server/`, `client/` of git `rev` (None: the working tree) in `target`."""
    if rev is None:
        for package in PACKAGES:
            subprocess.run(["cp", "-r", str(ROOT / package), str(target)], check=True)
        return target
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, *PACKAGES],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="also measure the packages of this git revision")
    parser.add_argument("--pushes", type=int, help="pushes counted (2,000; with --hub 300)")
    parser.add_argument("--hub", action="store_true", help="count a whole hub process")
    parser.add_argument(
        "--records", type=int, default=1, help="records per push (1; 5 warm-up pushes if more)"
    )
    parser.add_argument("--readers", type=int, default=10, help="subscribers (10)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--hub-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hub_child:
        hub_child(args.hub_child)
        return 0
    pushes = args.pushes or (300 if args.hub else 2000)
    if args.child:
        child(args.child, pushes, args.records)
        return 0
    if not args.hub and args.readers != 10:
        parser.error("--readers is for a whole hub (--hub)")

    def count(code: Path) -> int:
        if args.hub:
            return hub_instructions(code, pushes, args.records, args.readers)
        return instructions(code, pushes, args.records)

    with tempfile.TemporaryDirectory() as new_dir, tempfile.TemporaryDirectory() as old_dir:
        new = count(export(None, Path(new_dir)))
        what = f"a whole hub, {args.readers} readers" if args.hub else "the room"
        what += f", {args.records:,} records per push"
        print(f"this tree: {new:,} instructions per push ({pushes:,} pushes, {what})")
        if args.baseline:
            old = count(export(args.baseline, Path(old_dir)))
            print(f"git {args.baseline}: {old:,} instructions per push; new / old {new / old:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
