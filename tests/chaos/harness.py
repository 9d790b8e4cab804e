"""The chaos harness: a hub process on SQLite, K replica processes, and nemeses, from a seed.

How a run goes: the hub starts in its own process; each replica process reaches it through its
own `FaultProxy` and makes random edits of every kind (but reset) from the seed. Meanwhile the
nemeses, drawn from the same seed, kill -9 and restart the hub, cut replica connections, delay
frames (which reorders traffic between replicas), duplicate pushes and drop acks. When every
replica has made its edits, the faults stop, the hub is brought up, every replica flushes, and
each waits until it has seen the hub's final revision and writes its value. The checker then
reads every history file, the hub's log (straight from the SQLite file) and its state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from checker import Report, check
from conftest import bound
from faultproxy import FaultProxy
from hubprocess import HubProcess

from server.store import SqliteStore
from sync import Conversation, decode_record, decode_state, encode

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "worker.py"
CONVERSATION = "chaos"


@dataclass
class Chaos:
    """One chaos run's settings; everything random comes from `seed`."""

    seed: int
    replicas: int = 3
    ops: int = 40
    kills: bool = True
    faults: list[str] = field(default_factory=list)


async def run(chaos: Chaos, run_dir: Path) -> Report:
    """Run one seed in `run_dir`; return the checker's report (with the faults injected)."""
    rng = random.Random(chaos.seed)
    # Each seed's hub listens on a loopback address of its own: seeds run side by side, and a
    # killed hub's port may be taken by another seed's hub before it restarts; on its own
    # address nothing of another seed can answer in its place.
    host = f"127.0.{(chaos.seed // 250) % 250 + 1}.{chaos.seed % 250 + 2}"
    hub = HubProcess(run_dir / "convsync.db", env={"CONVSYNC_STRICT_PAIRING": "off"}, host=host)
    await anyio.to_thread.run_sync(hub.start)
    proxies = [FaultProxy(hub.url) for _ in range(chaos.replicas)]
    workers: list[asyncio.subprocess.Process] = []
    try:
        for proxy in proxies:
            await proxy.__aenter__()
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
        for k, proxy in enumerate(proxies):
            workers.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(WORKER),
                    proxy.url,
                    CONVERSATION,
                    f"r{k}",
                    str(chaos.seed * 1000 + k),
                    str(chaos.ops),
                    str(run_dir),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    env=env,
                )
            )
        edited = asyncio.gather(*(_expect(worker, "edited") for worker in workers))
        calm = asyncio.Event()
        nemesis = asyncio.create_task(_nemeses(chaos, rng, hub, proxies, calm))
        with anyio.fail_after(bound(120)):
            await edited
        calm.set()  # the fault under way finishes (a restart is never cut in two)
        with anyio.fail_after(bound(60)):
            await nemesis
        for proxy in proxies:
            proxy.heal()
        if not hub.running:
            await _restart(hub, proxies)
        with anyio.fail_after(bound(120)):
            await _tell(workers, "settle", "flushed")
            state = await anyio.to_thread.run_sync(hub.state, CONVERSATION)
            await _tell(workers, f"final {state['revision']}", "done")
            for worker in workers:
                await worker.wait()
        hub.stop()
        log, hub_state = await _read_log(hub.path)
        report = check(run_dir, log, hub_state)
        report.faults = list(chaos.faults)
        return report
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
        for proxy in proxies:
            await proxy.__aexit__(None, None, None)
        hub.stop()


async def _expect(worker: asyncio.subprocess.Process, word: str) -> None:
    assert worker.stdout is not None
    line = (await worker.stdout.readline()).decode()
    if not line.startswith(word):
        raise AssertionError(f"a worker said {line!r}, expected {word!r}")


async def _tell(workers: list[asyncio.subprocess.Process], say: str, answer: str) -> None:
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write(f"{say}\n".encode())
        await worker.stdin.drain()
    await asyncio.gather(*(_expect(worker, answer) for worker in workers))


async def _nemeses(
    chaos: Chaos,
    rng: random.Random,
    hub: HubProcess,
    proxies: list[FaultProxy],
    calm: asyncio.Event,
) -> None:
    """Inject a fault every 50-250 ms until `calm` is set; each one is recorded in
    `chaos.faults`. Returns between faults, never in the middle of one."""
    kinds = ["cut", "delay", "duplicate", "drop_ack"] + (["kill"] * 2 if chaos.kills else [])
    while not calm.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(calm.wait(), 0.05 + rng.random() * 0.2)
        if calm.is_set():
            return
        kind = rng.choice(kinds)
        proxy = rng.choice(proxies)
        chaos.faults.append(kind)
        match kind:
            case "kill":
                hub.kill()
                await asyncio.sleep(rng.random() * 0.2)
                await _restart(hub, proxies)
            case "cut":
                proxy.cut()
            case "delay":
                proxy.delay = 0.002 + rng.random() * 0.03
                await asyncio.sleep(rng.random() * 0.3)
                proxy.delay = 0.0
            case "duplicate":
                proxy.duplicate_to_hub = lambda frame: b'"type":"push"' in frame
                await asyncio.sleep(rng.random() * 0.3)
                proxy.duplicate_to_hub = lambda frame: False
            case "drop_ack":
                proxy.drop_next(b'"type":"ack"')


async def _restart(hub: HubProcess, proxies: list[FaultProxy]) -> None:
    """Bring the hub back on its port; if another socket of this machine took the port
    meanwhile (seeds run side by side), on a new one, and point the relays there."""
    try:
        await anyio.to_thread.run_sync(hub.start)
    except AssertionError:
        hub.port = 0
        await anyio.to_thread.run_sync(hub.start)
        for proxy in proxies:
            proxy.upstream = hub.url


async def _read_log(path: Path) -> tuple[list[bytes], bytes]:
    """Every record of the chaos conversation and its state, read from the store itself."""
    async with SqliteStore(path) as store:
        loaded = await store.load(CONVERSATION)
        if loaded is None:
            return [], encode(Conversation())
        log = await store.read(CONVERSATION, loaded.lineage, 0)
        assert log is not None
    conversation = decode_state(loaded.snapshot) if loaded.snapshot else Conversation()
    for data in loaded.records:
        conversation.apply(decode_record(data))
    return log, encode(conversation)
