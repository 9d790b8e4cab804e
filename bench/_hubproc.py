"""The server side of `bench/hub.py`: a hub or a baseline relay, each in a process of its own.

Started by `bench/hub.py` (never by hand) as

    python bench/_hubproc.py hub [--store memory|sqlite] [--path FILE] [--compression deflate]
                                 [--no-hub-rebase]
    python bench/_hubproc.py baseline [--mode broadcast|send] [--compression deflate]

Both bind 127.0.0.1 port 0, print one JSON line `{"port": ..., "pid": ...}` on stdout once
they serve, then answer JSON commands read one per line on stdin with one JSON line each:

- `{"cmd": "stats"}`: CPU seconds used so far (user + system, all threads, `getrusage`), RSS
  (`VmRSS`), the garbage collector's runs (count and seconds per generation, and the longest
  since the last `stats`), where the engine was imported from (`engine`, and `foreign`: any
  engine module not from the run's copy), and for the hub the store's `commits`/`appends`
  counters and the hub's metrics (with `rejected`: the rejected pushes by reason, and
  `pushes_placed`: stale pushes the hub placed, `null` for a hub too old to count them).
- `{"cmd": "seed", "id": ..., "messages": n, "chars": c, "per_record": k}` (hub): write a
  log of `n` messages (alternating user/assistant, `c` characters each) as push records of
  `k` entries (default 1; `at` stamped) straight into the store, in appends of 1,000 records.
- `{"cmd": "load", "ids": [...]}` (hub): load each conversation into the hub (as a read does:
  it stays loaded until `idle_unload`); the answer holds the seconds each took.
- `{"cmd": "profile_start"}` / `{"cmd": "profile_stop", "top": k}`: cProfile of the event
  loop's thread; the answer holds the top `k` functions by own time and by cumulative time.
- `{"cmd": "quit"}` (or stdin closed): stop serving and exit.

The engine code comes from `CONVSYNC_BENCH_CODE` (see `bench/_engine.py`), which the driver
sets per process: the run's copy of the working tree, or with `bench/hub.py --baseline REV` an
older revision's packages for the baseline hub. Only what that older code also has is called
here (`Hub(store, host=, port=, config=)`, `HubConfig`, `MemoryStore`, `SqliteStore(path,
synchronous=)`, `hub.metrics`, `hub.room_for_read`, the stores' `commits`/`appends`), so a hub
from before the core redesign (2c86be2) runs unchanged.

The workload helpers (`text`, `message`, `records_for`) live here too, so the driver and the
server build the same messages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import gc
import json
import os
import pstats
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))

import msgspec
from websockets.asyncio.server import ServerConnection, broadcast, serve
from websockets.exceptions import ConnectionClosed

import bench._engine  # first: the engine code of the run
from bench._report import text
from server.config import HubConfig
from server.hub import Hub
from server.store import LogStore, MemoryStore, SqliteStore
from sync import (
    Assistant,
    ChangeRecord,
    Conversation,
    Lineage,
    Message,
    Stop,
    Text,
    User,
    encode,
)

# ---------------------------------------------------------------------------- workload


def message(i: int, length: int, *, alternate: bool = True) -> User | Assistant:
    """Message `i`: the user's when `i` is even (or always, without `alternate`), else a reply."""
    if i % 2 == 0 or not alternate:
        return Message.user(text(i, length))
    return Assistant([Text(text(i, length))], stop=Stop("stop"))


def records_for(
    messages: int, chars: int, per_record: int = 1, at: int = 1_700_000_000_000
) -> list[bytes]:
    """Push records of `per_record` entries each holding `messages` messages, as the hub
    logs them (ids minted, `at` stamped)."""
    source = Conversation()
    for i in range(0, messages, per_record):
        if per_record == 1:
            source.push(message(i, chars))
        else:
            source.extend([message(k, chars) for k in range(i, min(messages, i + per_record))])
    return [encode(msgspec.structs.replace(r, at=at)) for r in source.take_unsaved()]


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard one; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_kb(pid: int | str = "self") -> int:
    """`VmRSS` of a process, in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class GcPauses:
    """Counts the cyclic garbage collector's runs in this process and how long they took
    (`gc.callbacks`), by generation: a full (generation 2) collection over a large heap
    stops the event loop."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        generation = info["generation"]
        took = time.perf_counter() - self._began
        self.count[generation] += 1
        self.seconds[generation] += took
        self.longest[generation] = max(self.longest[generation], took)

    def snapshot(self) -> dict[str, list[float]]:
        return {"count": list(self.count), "seconds": list(self.seconds)}

    def reset_longest(self) -> list[float]:
        longest, self.longest = self.longest, [0.0, 0.0, 0.0]
        return longest


GC_PAUSES = GcPauses()


# The event loop's own frames: waiting in epoll, and the calls every callback runs under. They
# top both orders without saying anything about the work, so the tables leave them out.
LOOP_PLUMBING = re.compile(
    r"\{method 'poll' of 'select\.epoll' objects\}|selectors\.py:\d+\(select\)"
    r"|base_events\.py:\d+\((_run_once|run_forever|run_until_complete)\)"
    r"|events\.py:\d+\(_run\)|\{method 'run' of '_contextvars\.Context' objects\}"
    r"|runners\.py:\d+\(run\)"
)


def function_name(key: tuple[str, int, str]) -> str:
    """`file:line(function)`, or `{method ...}` for a built-in, as `pstats` prints it."""
    filename, line, name = key
    if (filename, line) == ("~", 0):
        return "{" + name[1:-1] + "}" if name.startswith("<") and name.endswith(">") else name
    return f"{filename}:{line}({name})"


def profile_tables(profiler: cProfile.Profile, top: int) -> dict[str, str]:
    """The top `top` functions of a stopped profile by own time (`tottime`) and by cumulative
    time (`cumulative`), as tables (seconds; directories stripped) that leave out the event
    loop's plumbing (`LOOP_PLUMBING`); `idle` says how long the loop waited in epoll."""
    stats = pstats.Stats(profiler).strip_dirs()
    rows: list[tuple[float, float, str, str]] = []
    waited = 0.0
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for key, (primitive, calls, own, cumulative, _) in entries.items():
        name = function_name(key)
        if "select.epoll" in name:
            waited += own
        if not LOOP_PLUMBING.fullmatch(name):
            ncalls = str(calls) if calls == primitive else f"{calls}/{primitive}"
            rows.append((own, cumulative, ncalls, name))
    total: float = stats.total_tt  # type: ignore[attr-defined]
    out = {
        "idle": f"{total:.3f} s profiled, of which the event loop waited in epoll {waited:.3f} s "
        "(the loop's own frames are left out of the tables)"
    }
    for order, column in (("tottime", 0), ("cumulative", 1)):
        lines = [f"by {order}:", f"{'ncalls':>12} {'tottime':>8} {'cumtime':>8}  function"]
        ranked = sorted(rows, key=lambda row: row[column], reverse=True)
        for own, cumulative, ncalls, name in ranked[:top]:
            lines.append(f"{ncalls:>12} {own:8.3f} {cumulative:8.3f}  {name}")
        out[order] = "\n".join(lines)
    return out


# ---------------------------------------------------------------------------- control


class Control:
    """Answers the driver's commands; `quit` (or EOF) sets `done`."""

    def __init__(self, hub: Hub | None = None) -> None:
        self.hub = hub
        self.done = asyncio.Event()
        self._profiler: cProfile.Profile | None = None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while not self.done.is_set():
            line = await reader.readline()
            if not line:
                break
            command = json.loads(line)
            try:
                answer = await self.handle(command)
            except Exception as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(answer), flush=True)
        self.done.set()

    async def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        match command["cmd"]:
            case "stats":
                return self.stats()
            case "seed":
                assert self.hub is not None
                return await seed(self.hub.store, command)
            case "load":
                assert self.hub is not None
                seconds = []
                for conversation_id in command["ids"]:
                    began = time.perf_counter()
                    await self.hub.room_for_read(conversation_id)
                    seconds.append(time.perf_counter() - began)
                return {"seconds": seconds}
            case "profile_start":
                self._profiler = cProfile.Profile()
                self._profiler.enable()
                return {}
            case "profile_stop":
                assert self._profiler is not None
                self._profiler.disable()
                out = profile_tables(self._profiler, int(command.get("top", 25)))
                self._profiler = None
                return out
            case "quit":
                self.done.set()
                return {}
        return {"error": f"unknown command {command['cmd']!r}"}

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cpu": cpu_seconds(),
            "rss_kb": rss_kb(),
            "gc": GC_PAUSES.snapshot(),
            "gc_longest": GC_PAUSES.reset_longest(),
            "engine": str(sys.modules[Hub.__module__].__file__),
            "foreign": foreign_modules(),
        }
        if self.hub is not None:
            store: Any = self.hub.store
            metrics = self.hub.metrics
            out.update(
                commits=store.commits,
                appends=store.appends,
                records_appended=metrics.records_appended,
                pushes_accepted=metrics.pushes_accepted,
                pushes_rejected=sum(metrics.pushes_rejected.values()),
                rejected=dict(metrics.pushes_rejected),
                pushes_placed=getattr(metrics, "pushes_placed", None),
                send_queue_drops=metrics.send_queue_drops,
                connections=metrics.connections,
                conversations_loaded=metrics.conversations_loaded,
            )
        return out


def foreign_modules() -> list[str]:
    """Engine modules (`sync`, `server`, `client`) this process imported from anywhere but the
    run's copy (`CONVSYNC_BENCH_CODE`): the driver refuses a process where this is not empty."""
    code = str(bench._engine.CODE)
    return sorted(
        f"{name} ({module.__file__})"
        for name, module in list(sys.modules.items())
        if name.split(".")[0] in bench._engine.PACKAGES
        and not str(getattr(module, "__file__", None) or code).startswith(code)
    )


async def seed(store: LogStore, command: dict[str, Any]) -> dict[str, Any]:
    """Write a log straight into the store (see the module docstring)."""
    conversation_id = command["id"]
    records = records_for(command["messages"], command["chars"], command.get("per_record", 1))
    lineage = Lineage.fresh()
    revision = 0
    for start in range(0, len(records), 1000):
        chunk = records[start : start + 1000]
        await store.append(conversation_id, lineage, revision, chunk)
        revision += len(chunk)
    state = Conversation()
    for data in records:
        state.apply(msgspec.json.decode(data, type=ChangeRecord))
    return {"revision": revision, "state_bytes": len(encode(state))}


# ---------------------------------------------------------------------------- servers


async def run_hub(args: argparse.Namespace) -> None:
    store: LogStore
    if args.store == "sqlite":
        store = SqliteStore(args.path, synchronous=args.synchronous)
    else:
        store = MemoryStore()
    # No per-socket rate limit or waiting cap (SPEC 6): one pusher here sends thousands of
    # messages a second and many sockets open at once; these runs measure the engine. (Only
    # the fields this code's `HubConfig` has: a baseline hub may predate them.)
    # With --default-limits (the latency topic) the hub runs with the limits a user gets.
    lifted = {"rate": 1e9, "rate_burst": 1e9, "max_waiting_per_address": 1_000_000}
    if args.default_limits:
        lifted = {}
    known = {field.name for field in dataclasses.fields(HubConfig)}
    config = HubConfig(
        compression=args.compression, **{k: v for k, v in lifted.items() if k in known}
    )
    if args.idle_unload is not None:
        config = dataclasses.replace(config, idle_unload=args.idle_unload)
    if args.no_hub_rebase:  # every stale push rejected `behind`, as before SPEC 2.4.6
        config = dataclasses.replace(config, hub_rebase=False)
    async with Hub(store, host="127.0.0.1", port=0, config=config) as hub:
        control = Control(hub)
        gc.freeze()  # as `convsync serve` does once its hub serves
        print(json.dumps({"port": hub.port, "pid": os.getpid()}), flush=True)
        await control.serve()


async def run_baseline(args: argparse.Namespace) -> None:
    """A minimal relay: every frame a connection sends goes to every reader (path `/read`)."""
    readers: set[ServerConnection] = set()
    per_connection = args.mode == "send"

    async def handler(ws: ServerConnection) -> None:
        is_reader = ws.request is not None and ws.request.path == "/read"
        if is_reader:
            readers.add(ws)
        try:
            while True:
                data = await ws.recv(decode=False)
                if per_connection:
                    for reader in list(readers):
                        if reader is not ws:
                            with contextlib.suppress(ConnectionClosed):
                                await reader.send(data, text=True)
                else:
                    broadcast(readers, data, text=True)
        except ConnectionClosed:
            pass
        finally:
            readers.discard(ws)

    async with serve(
        handler,
        "127.0.0.1",
        0,
        compression="deflate" if args.compression == "deflate" else None,
        max_size=None,
    ) as server:
        control = Control()
        port = server.sockets[0].getsockname()[1]
        gc.freeze()  # as `convsync serve` does once its hub serves
        print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)
        await control.serve()


def main() -> None:
    parser = argparse.ArgumentParser(description="a server process for bench/hub.py")
    sub = parser.add_subparsers(dest="kind", required=True)
    hub = sub.add_parser("hub")
    hub.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    hub.add_argument("--path", default="")
    hub.add_argument("--synchronous", default="FULL")
    hub.add_argument("--compression", choices=["deflate"], default=None)
    hub.add_argument("--idle-unload", type=float, default=None)
    hub.add_argument("--no-hub-rebase", action="store_true", help="HubConfig(hub_rebase=False)")
    hub.add_argument(
        "--default-limits", action="store_true", help="the default rate limits, not lifted"
    )
    baseline = sub.add_parser("baseline")
    baseline.add_argument("--mode", choices=["broadcast", "send"], default="broadcast")
    baseline.add_argument("--compression", choices=["deflate"], default=None)
    args = parser.parse_args()
    raise_fd_limit()
    asyncio.run(run_hub(args) if args.kind == "hub" else run_baseline(args))


if __name__ == "__main__":
    main()
