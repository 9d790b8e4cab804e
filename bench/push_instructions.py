"""Instructions per push in the hub's room (callgrind): immune to a shared machine's noise.

    .venv/bin/python bench/push_instructions.py --baseline 19a832e [--pushes 2000]

For this tree's packages and (with `--baseline REV`) REV's, runs a child process under
`valgrind --tool=callgrind` that builds a `Room` on `MemoryStore` with the default `HubConfig`,
joins a writer and 10 subscribers (fakes: a send counts, nothing is written), lands 200 user
messages of 120 characters, then counts the instructions of `--pushes` more one-record pushes,
each decoded from its push frame and handed to `Room.push` (the core's checks, the store's
append, the ack and the broadcast): instrumentation is switched on around those pushes only
(`callgrind_control -i`). Prints instructions per push and new / old. Needs valgrind; not
part of `make bench` (it writes nothing). Issue 24's hunt for the hot path's regression.
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

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sync", "server", "client")
WARM = 200


def child(code: str, pushes: int) -> None:
    """The measured process: the engine from `code` only."""
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
        for i in range(WARM + pushes):
            source.push(Message.user((f"message {i} " * 40)[:120]))
        frames = [
            b'{"type":"push","seq":%d,"lineage":%%d,"revision":%d,"records":[%s]}'
            % (i + 1, i, encode(record))
            for i, record in enumerate(source.take_unsaved())
        ]

        async def push(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                lineage = room.core.lineage if i else Lineage.EMPTY
                await room.push(writer, decode_client_message(frames[i] % lineage))  # type: ignore[arg-type]

        await push(0, WARM)
        control = ["callgrind_control", "-i"]
        # Blocking on purpose: nothing else may run while instrumentation switches.
        subprocess.run([*control, "on", str(os.getpid())], check=True, capture_output=True)  # noqa: ASYNC221
        await push(WARM, WARM + pushes)
        subprocess.run([*control, "off", str(os.getpid())], check=True, capture_output=True)  # noqa: ASYNC221
        assert room.core.revision == WARM + pushes and subs[0].sent >= pushes

    asyncio.run(run())


def instructions(code: Path, pushes: int) -> int:
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
    parser.add_argument("--pushes", type=int, default=2000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.pushes)
        return 0
    with tempfile.TemporaryDirectory() as new_dir, tempfile.TemporaryDirectory() as old_dir:
        new = instructions(export(None, Path(new_dir)), args.pushes)
        print(f"this tree: {new:,} instructions per push ({args.pushes:,} pushes)")
        if args.baseline:
            old = instructions(export(args.baseline, Path(old_dir)), args.pushes)
            print(f"git {args.baseline}: {old:,} instructions per push; new / old {new / old:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
