"""The chaos harness: hub processes, K replica processes, and nemeses, from a seed.

How a run goes: the hub starts in its own process; each replica process reaches it through its
own `FaultProxy` and makes random edits of every kind (but reset) from the seed. Meanwhile the
nemeses, drawn from the same seed, kill -9 and restart the hub, cut replica connections, delay
frames (which reorders traffic between replicas), duplicate pushes and drop acks. When every
replica has made its edits, the faults stop, the hub is brought up, every replica flushes, and
each waits until it has seen the hub's final revision and writes its value. The checker then
reads every history file, the hub's log (straight from the store) and its state.

With `kill_replicas`, every replica keeps an outbox (`connect(..., outbox=...)`, SPEC 14) and
the nemeses also kill -9 replica processes while they edit; each is started again at once on
its outbox and makes the rest of its edits (the history file says how many it made).

With `store="postgres"` and `hubs=N`, N hub processes share one PostgreSQL schema of the
seed's own; each replica reaches every hub through a proxy of its own and is given all N urls
(its own hub first, replicas spread over the hubs), so when the nemesis kills a hub its
replicas fail over to the next. The final revision is read from the database (a hub may lag
it by a notice), and the checker reads the log from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import urllib.error
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from checker import Report, check
from conftest import bound
from faultproxy import FaultProxy
from hubprocess import HubProcess

from server.store import LogStore, SqliteStore
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
    store: str = "sqlite"  # or "postgres"
    hubs: int = 1  # more than one only on "postgres"
    dsn: str | None = None  # the PostgreSQL server (store "postgres")
    kill_replicas: bool = False  # replicas keep outboxes, and are killed too


async def run(chaos: Chaos, run_dir: Path) -> Report:
    """Run one seed in `run_dir`; return the checker's report (with the faults injected)."""
    if chaos.store not in ("sqlite", "postgres"):
        raise ValueError(f"no chaos store {chaos.store!r}")
    if chaos.hubs < 1 or (chaos.hubs > 1 and chaos.store != "postgres"):
        raise ValueError("several hubs need the postgres store")
    rng = random.Random(chaos.seed)
    # Each seed's hubs listen on loopback addresses of their own: seeds run side by side, and
    # a killed hub's port may be taken by another seed's hub before it restarts; on its own
    # address nothing of another seed can answer in its place.
    low = f"{(chaos.seed // 250) % 250 + 1}.{chaos.seed % 250 + 2}"
    schema: str | None = None
    if chaos.store == "postgres":
        assert chaos.dsn is not None, "the postgres store needs a dsn"
        schema = f"chaos_{chaos.seed}_{uuid.uuid4().hex[:8]}"
        db: str | Path = f"{chaos.dsn}?schema={schema}"
    else:
        db = run_dir / "convsync.db"
    env = {"CONVSYNC_STRICT_PAIRING": "off"}
    hubs = [HubProcess(db, env=env, host=f"127.{k}.{low}") for k in range(chaos.hubs)]
    for hub in hubs:
        await anyio.to_thread.run_sync(hub.start)
    # routes[r][h]: replica r's relay to hub h.
    routes = [[FaultProxy(hub.url) for hub in hubs] for _ in range(chaos.replicas)]
    proxies = [proxy for route in routes for proxy in route]
    slots: list[Slot] = []
    try:
        for proxy in proxies:
            await proxy.__aenter__()
        for k, route in enumerate(routes):
            urls = [route[(k + h) % len(hubs)].url for h in range(len(hubs))]
            args = [",".join(urls), CONVERSATION, f"r{k}", str(chaos.seed * 1000 + k)]
            args += [str(chaos.ops), str(run_dir)]
            if chaos.kill_replicas:
                args.append(str(run_dir / f"r{k}.outbox"))
            slots.append(Slot(args))
        for slot in slots:
            await slot.start()
        calm = asyncio.Event()
        nemesis = asyncio.create_task(_nemeses(chaos, rng, hubs, routes, calm, slots))
        with anyio.fail_after(bound(120)):
            for slot in slots:
                await slot.edited.wait()
        calm.set()  # the fault under way finishes (a restart is never cut in two)
        with anyio.fail_after(bound(60)):
            await nemesis
        workers = [slot.process for slot in slots if slot.process is not None]
        for proxy in proxies:
            proxy.heal()
        for h, hub in enumerate(hubs):
            if not hub.running:
                await _restart(hub, [route[h] for route in routes])
        with anyio.fail_after(bound(120)):
            await _tell(workers, "settle", "flushed")
            if schema is None:
                revision = await anyio.to_thread.run_sync(_revision, hubs[0])
            else:
                log, _ = await _read_log(_postgres(chaos.dsn, schema))
                revision = len(log)
            await _tell(workers, f"final {revision}", "done")
            for worker in workers:
                await worker.wait()
        for hub in hubs:
            hub.stop()
        store = SqliteStore(hubs[0].path) if schema is None else _postgres(chaos.dsn, schema)
        log, hub_state = await _read_log(store)
        report = check(run_dir, log, hub_state)
        report.faults = list(chaos.faults)
        return report
    finally:
        for slot in slots:
            await slot.stop()
        for proxy in proxies:
            await proxy.__aexit__(None, None, None)
        for hub in hubs:
            hub.stop()
        if schema is not None:
            import pgserver

            assert chaos.dsn is not None
            await anyio.to_thread.run_sync(pgserver.drop_schema, chaos.dsn, schema)


class Slot:
    """One replica's worker process, started again on its outbox after each kill."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.process: asyncio.subprocess.Process | None = None
        self.edited = asyncio.Event()  # the worker made all its edits
        self.kills = 0
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        self._reader = asyncio.create_task(self._read_edited(self.process))

    async def _read_edited(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        line = (await process.stdout.readline()).decode()
        if line.startswith("edited"):
            self.edited.set()
        elif line:
            raise AssertionError(f"a worker said {line!r}, expected 'edited'")
        # Else it was killed before it was done: `kill` starts the next one.

    async def kill(self, pause: float) -> None:
        """kill -9 the worker (while it edits), then start it again after `pause` seconds."""
        process = self.process
        assert process is not None and self._reader is not None
        process.kill()
        await process.wait()
        await self._reader  # its first line was read, or it ended
        self.kills += 1
        await asyncio.sleep(pause)
        await self.start()

    async def stop(self) -> None:
        process = self.process
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


def _revision(hub: HubProcess) -> int:
    """The hub's revision of the chaos conversation; 0 when nothing ever landed (a seed whose
    every push was refused: the hub answers 404 for a conversation it does not hold)."""
    try:
        state = hub.state(CONVERSATION)
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise
        return 0
    return int(str(state["revision"]))


def _postgres(dsn: str | None, schema: str) -> LogStore:
    from server.store.postgres import PostgresStore

    assert dsn is not None
    return PostgresStore(dsn, schema=schema, notify=False)


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
    hubs: list[HubProcess],
    routes: list[list[FaultProxy]],
    calm: asyncio.Event,
    slots: list[Slot],
) -> None:
    """Inject a fault every 50-250 ms until `calm` is set; each one is recorded in
    `chaos.faults`. Returns between faults, never in the middle of one."""
    kinds = ["cut", "delay", "duplicate", "drop_ack"] + (["kill"] * 2 if chaos.kills else [])
    kinds += ["kill_replica"] * 2 if chaos.kill_replicas else []
    proxies = [proxy for route in routes for proxy in route]
    while not calm.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(calm.wait(), 0.05 + rng.random() * 0.2)
        if calm.is_set():
            return
        kind = rng.choice(kinds)
        proxy = rng.choice(proxies)
        editing = [slot for slot in slots if not slot.edited.is_set()]
        if chaos.kill_replicas and editing and "kill_replica" not in chaos.faults:
            kind = "kill_replica"  # the first fault: a quick run still kills a replica once
        if kind == "kill_replica" and not editing:
            continue  # every replica is done editing: the run is about to calm down
        chaos.faults.append(kind)
        match kind:
            case "kill_replica":
                await rng.choice(editing).kill(rng.random() * 0.2)
            case "kill":
                h = rng.randrange(len(hubs))
                hubs[h].kill()
                await asyncio.sleep(rng.random() * 0.2)
                await _restart(hubs[h], [route[h] for route in routes])
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


async def _read_log(store: LogStore) -> tuple[list[bytes], bytes]:
    """Every record of the chaos conversation and its state, read from the store itself."""
    async with store:
        loaded = await store.load(CONVERSATION)
        if loaded is None:
            return [], encode(Conversation())
        log = await store.read(CONVERSATION, loaded.lineage, 0)
        assert log is not None
    conversation = decode_state(loaded.snapshot) if loaded.snapshot else Conversation()
    for data in loaded.records:
        conversation.apply(decode_record(data))
    return log, encode(conversation)
