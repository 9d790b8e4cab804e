"""Durable throughput and the hub's CPU per record: SqliteStore vs MemoryStore (issue 8).

Run from the repository root:

    PYTHONPATH=. .venv/bin/python bench/durable_cpu.py                 # 5 interleaved repeats
    PYTHONPATH=. .venv/bin/python bench/durable_cpu.py --profile       # + cProfile of the hub
    PYTHONPATH=. .venv/bin/python bench/durable_cpu.py --variant old=/tmp/sqlite_old.py
    PYTHONPATH=. .venv/bin/python bench/durable_cpu.py --variant x=bench/variants/sqlite_inline.diff

A variant is another `server/store/sqlite.py`: a whole file, or a `.diff` (`bench/variants/`
keeps the ones measured in `docs/benchmarks.md`) applied to a copy of the store as of the
commit its `Base: <rev>` line names (the current store without one).

The load is `bench/hub.py durable`'s: 20 writer `Replica`s in this process, each on a
conversation of its own, each pushing one ~300-byte record and awaiting its ack, over and over,
for `--seconds`. Every hub runs in a process of its own: `bench/_hubproc.py`, started through
this file's `serve` mode, which adds a `threads` command (CPU seconds, system seconds and
context switches of each of the hub's threads, from `/proc/self/task`) and a cProfile timed by
each thread's own CPU clock (`time.thread_time`) of both the event loop's thread and the
SQLite store's thread (`_hubproc`'s profiler sees only the first, in wall time, which on a
shared machine mostly measures waiting). The hubs run side by side and the repeats are
interleaved (the order reverses every other repeat), so drift on the shared machine hits every
store alike; the bar's ratio is taken per repeat from neighbouring runs, and its median
reported. Hub CPU per record = the hub process's CPU seconds (user + system, all threads) over
a run / acked records.

Bar (issue 8): 20 writers on SQLite >= 0.7x the same on the memory store.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import importlib.util
import io
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))

BAR = 0.7
HERE = Path(__file__).resolve()


# ---------------------------------------------------------------------------- the hub side


def _thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by thread name, and the
    system part (`name:sys`) and context switches (`name:switches`) of each."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/status", encoding="ascii") as status:
                switches = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        except OSError:
            continue  # the thread ended meanwhile
        name = "loop" if int(tid) == os.getpid() else names.get(int(tid), "other")
        if name.startswith("asyncio_"):
            name = "executor"
        name = name.replace("convsync-sqlite-", "")
        for key, value in (
            (name, (int(fields[11]) + int(fields[12])) / tick),
            (f"{name}:sys", int(fields[12]) / tick),
            (f"{name}:switches", float(switches)),
        ):
            out[key] = out.get(key, 0.0) + value
    return out


def _top(prof: cProfile.Profile, top: int) -> str:
    buffer = io.StringIO()
    pstats.Stats(prof, stream=buffer).strip_dirs().sort_stats("tottime").print_stats(top)
    return buffer.getvalue()


def _handoff_store(memory_store: Any) -> Any:
    """A stand-in for `SqliteStore`: a `MemoryStore` whose appends are acknowledged through a
    thread the way the writer-thread `SqliteStore`'s were until stop 21 (`SimpleQueue.put`, a
    thread that takes every job queued, one `call_soon_threadsafe` per batch), with a 1 ms
    sleep in place of the commit. It measures what the hand-off alone costs the event loop."""
    import queue

    def resolve_all(batch: list[Any]) -> None:
        for _, future, result in batch:
            if not future.done():
                future.set_result(result)

    class HandoffStore(memory_store):  # type: ignore[misc, valid-type]
        def __init__(self, path: str = "", synchronous: str = "FULL") -> None:
            super().__init__()
            self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
            threading.Thread(target=self._main, name="handoff-writer", daemon=True).start()

        def _main(self) -> None:
            while True:
                batch = [self.jobs.get()]
                time.sleep(0.001)
                while True:
                    try:
                        batch.append(self.jobs.get_nowait())
                    except queue.Empty:
                        break
                batch[0][0].call_soon_threadsafe(resolve_all, batch)

        async def append(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().append(*args, **kwargs)
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self.jobs.put((loop, future, result))
            await future
            return result

    return HandoffStore


def serve(argv: list[str]) -> None:
    """`bench/_hubproc.py hub ...`, plus the `threads` and `cpu_profile_*` commands."""
    import bench._engine
    import bench._hubproc as hubproc  # first: it imports the run's copy of the engine

    sqlite_mod = importlib.import_module("server.store.sqlite")
    if "--handoff" in argv:
        argv.remove("--handoff")
        hubproc.SqliteStore = _handoff_store(hubproc.MemoryStore)  # type: ignore[misc]
    if "--variant-file" in argv:
        at = argv.index("--variant-file")
        # Copied into the run's engine copy, where the driver's check expects every engine
        # module of this process to come from.
        path = str(Path(bench._engine.CODE) / "server" / "store" / "_variant.py")
        shutil.copyfile(argv[at + 1], path)
        del argv[at : at + 2]
        spec = importlib.util.spec_from_file_location("server.store._variant", path)
        assert spec is not None and spec.loader is not None
        sqlite_mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = sqlite_mod
        spec.loader.exec_module(sqlite_mod)
        hubproc.SqliteStore = sqlite_mod.SqliteStore  # type: ignore[misc]

    profile: dict[str, Any] = {"on": None}
    writer = getattr(sqlite_mod, "_Writer", None)  # a variant may be built otherwise
    # What the store's thread does per batch: `_carry_out` (sync, and commit what the loop
    # did not) since stop 21, `_run_batch` (every commit) in the stores before it.
    hooked = "_carry_out" if hasattr(writer, "_carry_out") else "_run_batch"
    run_batch = getattr(writer, hooked, None)

    # Seconds the writer spent in its transactions, by the clock and on a core: the
    # difference is waiting (for the fsync, for the GIL, for a core).
    batches = {"batch_wall": 0.0, "batch_cpu": 0.0}

    def profiled_batch(self: Any, *args: Any) -> Any:
        prof = profile["on"]
        wall, cpu = time.perf_counter(), time.thread_time()
        if prof is not None:
            prof.enable()
        try:
            return run_batch(self, *args)
        finally:
            if prof is not None:
                prof.disable()
            batches["batch_wall"] += time.perf_counter() - wall
            batches["batch_cpu"] += time.thread_time() - cpu

    if writer is not None and run_batch is not None:
        setattr(writer, hooked, profiled_batch)

    # Since stop 21 the event loop runs a batch of appends itself (`_Committer._commit_here`:
    # BEGIN, the statements, COMMIT at NORMAL): its cost to the loop, by the clock and on a core.
    committer = getattr(sqlite_mod, "_Committer", None)
    commit_here = getattr(committer, "_commit_here", None)
    commits = {"commit_wall": 0.0, "commit_cpu": 0.0}

    def timed_commit(self: Any, *args: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return commit_here(self, *args)
        finally:
            commits["commit_wall"] += time.perf_counter() - wall
            commits["commit_cpu"] += time.thread_time() - cpu

    if committer is not None and commit_here is not None:
        committer._commit_here = timed_commit
    handle = hubproc.Control.handle

    async def handle_more(self: Any, command: dict[str, Any]) -> dict[str, Any]:
        match command["cmd"]:
            case "threads":
                cpu = _thread_cpu()
                # `disk:` is the store's thread's batches (before stop 21 `writer:`, the thread
                # that ran every statement); `loop:` the batches the event loop commits.
                label = "disk" if hooked == "_carry_out" else "writer"
                cpu.update((f"{label}:{key}", value) for key, value in batches.items())
                if commit_here is not None:
                    cpu.update((f"loop:{key}", value) for key, value in commits.items())
                return {"cpu": cpu}
            case "cpu_profile_start":
                # Timed by each thread's own CPU clock: on a shared machine a wall-clock
                # profile mostly shows the time a thread waited for a core or the GIL.
                profile["on"] = cProfile.Profile(time.thread_time)
                profile["loop"] = cProfile.Profile(time.thread_time)
                profile["loop"].enable()  # commands run on the event loop's thread
                return {}
            case "cpu_profile_stop":
                profile["loop"].disable()
                writer_prof, profile["on"] = profile["on"], None
                await asyncio.sleep(0.2)  # the batch under way finishes
                top = int(command.get("top", 25))
                return {
                    "loop": _top(profile["loop"], top),
                    "writer": _top(writer_prof, top) if writer_prof.getstats() else "",
                }
        result: dict[str, Any] = await handle(self, command)
        return result

    hubproc.Control.handle = handle_more  # type: ignore[method-assign]
    sys.argv = [hubproc.__file__ or "_hubproc.py", *argv]
    hubproc.main()


# ---------------------------------------------------------------------------- the driver


async def one_run(server: Any, writers: int, seconds: float) -> dict[str, Any]:
    """`bench/hub.py`'s durable load, with the hub's CPU split by thread."""
    from bench._hub import bounded, client_cpu, payload_messages
    from client.replica import Replica

    tag = uuid.uuid4().hex[:8]
    messages = payload_messages(64)
    async with contextlib.AsyncExitStack() as stack:
        replicas = [
            await stack.enter_async_context(
                Replica(server.url, f"dur-{tag}-{k}", client=f"writer-{k}")
            )
            for k in range(writers)
        ]
        counts = [0] * writers

        async def write(k: int, replica: Replica, deadline: float) -> float:
            push = replica.conversation.push
            while time.perf_counter() < deadline:
                push(messages[counts[k] % len(messages)])
                await replica.flush()
                counts[k] += 1
            return time.perf_counter()

        before, threads0 = await server.ask("stats"), await server.ask("threads")
        cpu0 = client_cpu()
        started = time.perf_counter()
        ends = await bounded(
            asyncio.gather(*(write(k, r, started + seconds) for k, r in enumerate(replicas)))
        )
        elapsed = max(ends) - started
        cpu1 = client_cpu()
        threads1, after = await server.ask("threads"), await server.ask("stats")
    records = sum(counts)
    commits = after["commits"] - before["commits"]
    appends = after["appends"] - before["appends"]
    by_thread = {
        name: (threads1["cpu"][name] - threads0["cpu"].get(name, 0.0)) / records
        for name in threads1["cpu"]
    }
    return {
        "rate": records / elapsed,
        "hub_cpu": (after["cpu"] - before["cpu"]) / records,
        "client_cpu": (cpu1 - cpu0) / records,
        "per_commit": appends / commits if commits else 0.0,
        "threads": by_thread,
    }


def _us(value: float) -> str:
    return f"{value * 1e6:.0f} µs"


def _per(name: str, value: float) -> str:
    """A per-record figure of `_thread_cpu`'s: context switches, or CPU time."""
    return f"{value:.2f}" if name.endswith(":switches") else _us(value)


def _patched(diff: str, into: str, label: str) -> str:
    """A copy of `server/store/sqlite.py` with `diff` applied (`git apply`), in `into`: the
    file as of the commit a `Base: <rev>` line of the diff's preamble names, else as it is."""
    root = Path(into) / f"variant-{label}"
    target = root / "server" / "store" / "sqlite.py"
    target.parent.mkdir(parents=True)
    repo = HERE.parent.parent
    base = re.search(r"^Base: (\w+)", Path(diff).read_text(encoding="utf-8"), re.MULTILINE)
    if base is None:
        shutil.copyfile(repo / "server" / "store" / "sqlite.py", target)
    else:
        shown = subprocess.run(
            ["git", "show", f"{base[1]}:server/store/sqlite.py"],
            capture_output=True,
            cwd=repo,
            check=True,
        )
        target.write_bytes(shown.stdout)
    done = subprocess.run(
        ["git", "apply", os.path.abspath(diff)],
        capture_output=True,
        text=True,
        cwd=root,
    )
    if done.returncode != 0:
        raise SystemExit(f"{diff} does not apply to server/store/sqlite.py: {done.stderr.strip()}")
    return str(target)


async def drive(args: argparse.Namespace) -> int:
    import bench._hub as hub_bench
    from bench._report import median, spread

    # The hubs are this file in `serve` mode (bench/_hubproc.py plus two commands).
    hub_bench.HUBPROC = HERE
    tmp = tempfile.TemporaryDirectory(prefix="convsync-durable-cpu-")
    kinds: dict[str, list[str]] = {
        "memory": ["serve", "hub", "--store", "memory"],
        "sqlite": ["serve", "hub", "--store", "sqlite", "--path", f"{tmp.name}/current.db"],
    }
    if args.handoff:
        kinds["handoff"] = [*kinds["sqlite"], "--handoff"]
    for label, path in args.variant:
        if path.endswith(".diff"):
            path = _patched(path, tmp.name, label)
        kinds[label] = [
            *("serve", "hub", "--store", "sqlite", "--path", f"{tmp.name}/{label}.db"),
            *("--variant-file", path),
        ]
    samples: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    fsync = hub_bench.fsync_ms(tmp.name)
    load = hub_bench.MachineLoad()
    async with hub_bench.servers() as start:
        hubs = {kind: await start(*argv) for kind, argv in kinds.items()}
        for hub in hubs.values():
            await one_run(hub, args.writers, 1.0)  # warm-up
        for repeat in range(args.repeats):
            order = list(kinds) if repeat % 2 == 0 else list(reversed(kinds))
            for kind in order:
                outcome = await one_run(hubs[kind], args.writers, args.seconds)
                samples[kind].append(outcome)
                threads = ", ".join(
                    f"{name} {_per(name, v)}" for name, v in sorted(outcome["threads"].items()) if v
                )
                print(
                    f"#{repeat} {kind:<8} {outcome['rate']:7,.0f} records/s, "
                    f"{outcome['per_commit']:5.2f} appends/commit, hub {_us(outcome['hub_cpu'])}"
                    f"/record ({threads}), client {_us(outcome['client_cpu'])}/record",
                    file=sys.stderr,
                    flush=True,
                )
        profiles: dict[str, str] = {}
        if args.profile:
            for kind in kinds:
                hub = hubs[kind]
                await hub.ask("cpu_profile_start")
                await one_run(hub, args.writers, args.seconds)
                answer = await hub.ask("cpu_profile_stop", top=args.top)
                profiles[f"{kind}: event-loop thread"] = answer["loop"]
                if answer["writer"]:
                    profiles[f"{kind}: SQLite store's thread"] = answer["writer"]
    tmp.cleanup()

    print(f"\n20 writers on 20 conversations, {args.seconds:g} s per run, {args.repeats} repeats")
    print(f"machine load: {load.describe()}; 4 KiB write + fsync: {fsync:.2f} ms\n")
    print(
        "| Store | Acked records/s | Spread | Hub CPU per record | by thread | Replicas' CPU "
        "per record | Appends per commit |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind, runs in samples.items():
        names = sorted({name for run in runs for name in run["threads"]})
        threads = ", ".join(
            f"{name} {_per(name, median([run['threads'].get(name, 0.0) for run in runs]))}"
            for name in names
            if median([run["threads"].get(name, 0.0) for run in runs]) >= 1e-6
        )
        rates = [run["rate"] for run in runs]
        print(
            f"| {kind} | {median(rates):,.0f}/s | {spread(rates, '{:,.0f}')}/s | "
            f"{_us(median([run['hub_cpu'] for run in runs]))} | {threads} | "
            f"{_us(median([run['client_cpu'] for run in runs]))} | "
            f"{median([run['per_commit'] for run in runs]):.2f} |"
        )
    failed = False
    memory = samples["memory"]
    print()
    for kind, runs in samples.items():
        if kind == "memory":
            continue
        ratios = [run["rate"] / mem["rate"] for run, mem in zip(runs, memory, strict=True)]
        cpu = median([run["hub_cpu"] for run in runs]) / median([m["hub_cpu"] for m in memory])
        ok = median(ratios) >= BAR
        failed = failed or (kind == "sqlite" and not ok)
        print(
            f"{kind} / memory, records/s: {median(ratios):.2f} (per repeat "
            f"{spread(ratios, '{:.2f}')}); bar >= {BAR}: {'PASS' if ok else 'FAIL'}; "
            f"hub CPU per record {cpu:.2f}x the memory store's"
        )
    for title, text in profiles.items():
        print(f"\ncProfile, {title} (by own time):\n{text}")
    return 1 if failed else 0


def main() -> int:
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="also cProfile each hub")
    parser.add_argument("--top", type=int, default=25, help="rows of each profile")
    parser.add_argument(
        "--variant", action="append", default=[], help="label=FILE: another sqlite.py"
    )
    parser.add_argument(
        "--handoff", action="store_true", help="add a hub on a memory store behind a thread hop"
    )
    args = parser.parse_args()
    variants = [variant.partition("=") for variant in args.variant]
    args.variant = [(label, os.path.abspath(path)) for label, _, path in variants]
    from bench._hubproc import raise_fd_limit

    raise_fd_limit()
    return asyncio.run(drive(args))


if __name__ == "__main__":
    sys.exit(main())
