"""convsync against its nearest Python peer, pycrdt-websocket, on the same work (issue 3).

Run from the repository root, after `.venv/bin/pip install -e '.[bench]'`:

    .venv/bin/python bench/peer.py            # the full run; writes docs/benchmarks.md
    .venv/bin/python bench/peer.py --quick    # a smoke run at small sizes; writes nothing
    .venv/bin/python bench/peer.py --profile  # also cProfile convsync (hub and client side)
    .venv/bin/python bench/peer.py --profile-only catch-up   # only that cProfile

The workloads, each timed on every system in one run, repeats interleaved (the order of the
systems rotates from one repeat to the next), medians reported:

1. **Converge** (bar). One writer appends 2,000 chat messages (~300 characters of text each,
   with a role and an id), one operation per message in a loop, as an agent would; 10 readers
   in the same client process wait until each holds all 2,000. Timed from the first append
   until the last reader holds the last message. Bar: pycrdt-websocket time / convsync time
   >= 3.
2. **Converge, paced** (informative). The same, the writer awaiting `asyncio.sleep(0)` after
   each message (the event loop runs between messages, as in an agent awaiting between
   steps), so convsync's replica cannot gather a whole burst into a few pushes.
3. **Catch-up** (bar). A 10,000-message conversation is built (one writer, as above, plus one
   watching reader that waits for all of it: the build time is informative; the writer stays
   connected so the room stays loaded on both servers), then a fresh client connects; timed
   from the start of its connection until it holds all 10,000 messages. Bar: ratio >= 3.

Every server runs in a process of its own (this script with `--serve`, started afresh for
each repeat of each system, bound to 127.0.0.1 port 0; it prints the port it got and stops
when its stdin closes); writer and readers run in this process. Both sides use the same
websocket library (`websockets`), without compression, with the default 20 s keepalive pings.

- convsync: `server.hub.Hub(MemoryStore())` (and, informative, `SqliteStore` with its
  defaults: WAL, `synchronous=FULL`, group commit), `HubConfig(compression=None)`. The
  writer is a `Replica` calling `replica.conversation.push(Message.user(text))` once per
  message (the replica batches by itself); readers are `Replica`s awaiting
  `replica.wait_for(2000)`. Catch-up is `async with connect(...)` of a fresh replica (it
  returns once the first catch-up is applied; MessagePack state by default, and a second fresh
  replica with `state_format="json"` for the informative JSON row).
- pycrdt-websocket: `pycrdt.websocket.WebsocketServer` (its rooms sync one `pycrdt.Doc` per
  path) behind a `websockets` server; clients are `pycrdt.Doc`s synced by `pycrdt.Provider`
  (pycrdt-websocket >= 0.16 has no client provider of its own: the transport-agnostic
  `Provider` of pycrdt speaks the Yjs sync protocol over a `Channel`, here `WsChannel`, a
  small adapter around a `websockets` connection, as `pycrdt.websocket.websocket.
  HttpxWebsocket` is for httpx-ws). The conversation is a `pycrdt.Array` named `messages` of
  `pycrdt.Map`s `{"id", "role", "text"}`; the writer appends one `Map` per transaction. A
  client holds the messages once `len(array)` reaches the target, checked each time its
  provider has handled a message (see `WsChannel`).

`gc.collect()` runs in this process before each timed trial; the garbage collector stays on
during the trials (both processes), as in a deployment. When a bar fails (or with
`--profile`), the failing workloads run once more on convsync with `cProfile` over their timed
window, in the hub process (toggled by SIGUSR1/SIGUSR2) and in this one, and the top
functions are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import importlib.metadata
import io
import logging
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from bench._report import (
    Results,
    Row,
    command_line,
    machine,
    median,
    now,
    spread,
    text,
    write_section,
)

SECTION = "Against pycrdt-websocket (`bench/peer.py`)"
SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
HOST = "127.0.0.1"
BARS = {"converge": 10.0, "catch-up": 4.0}
"""pycrdt-websocket time / convsync time, at least (issue 32; issue 3 asked for 3x both)."""
WAIT = 180.0  # seconds any one wait may last before the run fails
SERVER_START = 60.0  # seconds a server process may take to print its port

# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    messages: int  # messages the writer appends in the converge workload
    readers: int  # readers waiting for them
    catch_up: int  # messages in the conversation a fresh client catches up on
    repeats: int  # repeats of every trial (the median is reported)


FULL = Settings(messages=2_000, readers=10, catch_up=10_000, repeats=5)
QUICK = Settings(messages=300, readers=3, catch_up=1_000, repeats=2)

CONVSYNC = "convsync (MemoryStore)"
CONVSYNC_SQLITE = "convsync (SqliteStore)"
PYCRDT = "pycrdt-websocket"


@dataclass(frozen=True)
class System:
    name: str
    serve: list[str]  # `--serve` arguments of its server process
    # (url, settings, texts, paced, probe) -> (seconds, websocket messages the writer sent)
    converge: Callable[..., Awaitable[tuple[float, int]]]
    catch_up: Callable[..., Awaitable[dict[str, float]]]  # (url, settings, texts, probe)


# ---------------------------------------------------------------------------- servers


async def _stdin_closed() -> None:
    """Return when the parent closes our stdin (its way of stopping this server)."""
    await anyio.to_thread.run_sync(sys.stdin.buffer.read)


@contextlib.contextmanager
def _signal_profiler(profile_out: str | None) -> Iterator[None]:
    """With `profile_out`, cProfile what runs between SIGUSR1 and SIGUSR2; dump it at exit."""
    if profile_out is None:
        yield
        return
    profiler = cProfile.Profile()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, profiler.enable)
    loop.add_signal_handler(signal.SIGUSR2, profiler.disable)
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(profile_out)


async def serve_convsync(db: str | None, profile_out: str | None) -> None:
    from server.config import HubConfig
    from server.hub import Hub
    from server.store import MemoryStore, SqliteStore

    store = MemoryStore() if db is None else SqliteStore(db)
    # No per-socket rate limit (SPEC 6): the runs push as fast as acks come back.
    config = HubConfig(compression=None, rate=1e9, rate_burst=1e9)
    async with Hub(store, host=HOST, port=0, config=config) as hub:
        with _signal_profiler(profile_out):
            print(f"PORT {hub.port}", flush=True)
            await _stdin_closed()


class WsChannel:
    """A `pycrdt.Channel` over a `websockets` connection (binary frames).

    `before_next`, when given, is called each time the provider asks for the next message,
    that is once it has handled the previous one: the cheapest place to see what a client
    holds (an `Array.observe` callback converts every event's delta to Python objects, which
    costs pycrdt several times more than applying the update)."""

    def __init__(
        self, ws: object, path: str, before_next: Callable[[], None] | None = None
    ) -> None:
        self._ws = ws
        self._path = path
        self._before_next = before_next

    @property
    def path(self) -> str:
        return self._path

    def __aiter__(self) -> WsChannel:
        return self

    async def __anext__(self) -> bytes:
        from websockets.exceptions import ConnectionClosed

        if self._before_next is not None:
            self._before_next()
        try:
            return await self.recv()
        except ConnectionClosed:
            raise StopAsyncIteration from None

    async def send(self, message: bytes) -> None:
        await self._ws.send(message)  # type: ignore[attr-defined]

    async def recv(self) -> bytes:
        data = await self._ws.recv(decode=False)  # type: ignore[attr-defined]
        return bytes(data)


async def serve_pycrdt(profile_out: str | None) -> None:
    from pycrdt.websocket import WebsocketServer
    from websockets.asyncio.server import ServerConnection, serve

    async with WebsocketServer() as yserver:

        async def handler(ws: ServerConnection) -> None:
            path = ws.request.path if ws.request is not None else "/"
            await yserver.serve(WsChannel(ws, path))

        async with serve(handler, HOST, 0, compression=None, max_size=None) as server:
            with _signal_profiler(profile_out):
                print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
                await _stdin_closed()


@dataclass(frozen=True)
class Running:
    url: str  # ws://127.0.0.1:PORT
    pid: int


@contextlib.asynccontextmanager
async def server_process(args: list[str]) -> AsyncIterator[Running]:
    """Start `peer.py --serve ARGS` in a process of its own; yield its url and pid; stop it
    (close its stdin, wait, kill after 15 s)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        "--serve",
        *args,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        # The repository first; a PYTHONPATH of the caller's (where pycrdt may be) after it.
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])
            ),
        },
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        with anyio.fail_after(SERVER_START):
            line = (await proc.stdout.readline()).decode().strip()
        if not line.startswith("PORT "):
            raise RuntimeError(f"server {args} did not start: {line!r}")
        yield Running(f"ws://{HOST}:{int(line.split()[1])}", proc.pid)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                assert proc.stdin is not None
                proc.stdin.close()
            try:
                with anyio.fail_after(15):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


# ---------------------------------------------------------------------------- probes


class Probe:
    """cProfiles one timed window (`phase`): this process directly, the server process by
    SIGUSR1/SIGUSR2 (it was started with `--profile-out`)."""

    def __init__(self, phase: str, server_pid: int) -> None:
        self.phase = phase
        self.server_pid = server_pid
        self.profiler = cProfile.Profile()

    async def start(self, phase: str) -> None:
        if phase == self.phase:
            os.kill(self.server_pid, signal.SIGUSR1)
            await asyncio.sleep(0.2)  # let the server's loop take the signal
            self.profiler.enable()

    def stop(self, phase: str) -> None:
        if phase == self.phase:
            self.profiler.disable()
            os.kill(self.server_pid, signal.SIGUSR2)


async def _start(probe: Probe | None, phase: str) -> None:
    if probe is not None:
        await probe.start(phase)


def _stop(probe: Probe | None, phase: str) -> None:
    if probe is not None:
        probe.stop(phase)


# ---------------------------------------------------------------------------- convsync


def _cid() -> str:
    return f"peer-{uuid.uuid4().hex[:12]}"


async def convsync_converge(
    url: str, settings: Settings, texts: list[str], paced: bool, probe: Probe | None = None
) -> tuple[float, int]:
    """Seconds from the writer's first push until every reader holds all the messages, and
    the pushes the writer sent. `paced`: the writer lets the event loop run after each
    message."""
    from client.replica import connect
    from sync import Message

    n = settings.messages
    cid = _cid()
    async with contextlib.AsyncExitStack() as stack:
        with anyio.fail_after(WAIT):
            readers = [
                await stack.enter_async_context(connect(url, cid, client=f"reader-{k}"))
                for k in range(settings.readers)
            ]
            writer = await stack.enter_async_context(connect(url, cid, client="writer"))
        conversation = writer.conversation
        user = Message.user
        gc.collect()
        await _start(probe, "converge-paced" if paced else "converge")
        begin = time.perf_counter()
        for item in texts[:n]:
            conversation.push(user(item))
            if paced:
                await asyncio.sleep(0)
        with anyio.fail_after(WAIT):
            await asyncio.gather(*(reader.wait_for(n) for reader in readers))
        elapsed = time.perf_counter() - begin
        _stop(probe, "converge-paced" if paced else "converge")
        for reader in readers:
            assert len(reader.conversation) == n, (len(reader.conversation), n)
        with anyio.fail_after(WAIT):
            await writer.flush()
        pushes = writer.session.seq
    return elapsed, pushes


async def convsync_catch_up(
    url: str, settings: Settings, texts: list[str], probe: Probe | None = None
) -> dict[str, float]:
    """Seconds by workload (`build`, `catch-up`, `catch-up-json`) on a conversation of
    `settings.catch_up` messages: a fresh replica asking for the state as MessagePack (the
    default) and one asking for JSON."""
    from client.replica import connect
    from sync import Message

    n = settings.catch_up
    cid = _cid()
    async with connect(url, cid, client="writer") as writer:
        async with connect(url, cid, client="watcher") as watcher:
            gc.collect()
            begin = time.perf_counter()
            conversation = writer.conversation
            for item in texts[:n]:
                conversation.push(Message.user(item))
            with anyio.fail_after(WAIT):
                await watcher.wait_for(n)
                await writer.flush()
            build = time.perf_counter() - begin
        figures = {"build": build}
        # The default (a MessagePack state) and, informative, a JSON state, in turn: which
        # goes first alternates from one trial to the next (issue 32).
        global _json_first
        _json_first = not _json_first
        formats = ["json", "msgpack"] if _json_first else ["msgpack", "json"]
        for state_format in formats:
            key = "catch-up" if state_format == "msgpack" else "catch-up-json"
            gc.collect()
            await _start(probe, key)
            begin = time.perf_counter()
            with anyio.fail_after(WAIT):
                async with connect(
                    url,
                    cid,
                    client=f"fresh-{state_format}",
                    connect_timeout=WAIT,
                    state_format=state_format,
                ) as fresh:
                    figures[key] = time.perf_counter() - begin
                    _stop(probe, key)
                    assert len(fresh.conversation) == n, (len(fresh.conversation), n)
    return figures


_json_first = False


# ---------------------------------------------------------------------------- pycrdt


class _YClient:
    """A `pycrdt.Doc` synced through `pycrdt.Provider` over a `websockets` connection; `done`
    is set once its `messages` array holds `target` items (checked after each message the
    provider handles)."""

    def __init__(self, target: int) -> None:
        from pycrdt import Array, Doc

        self.doc = Doc()
        self.messages = self.doc.get("messages", type=Array)
        self.target = target
        self.done = anyio.Event()

    def _check(self) -> None:
        if not self.done.is_set() and len(self.messages) >= self.target:
            self.done.set()

    async def enter(self, stack: contextlib.AsyncExitStack, url: str, path: str) -> None:
        from pycrdt import Provider
        from websockets.asyncio.client import connect as ws_connect

        # The provider's task group must not nest in a cancel scope of the caller's: the
        # waits are bounded here (the connection by its open timeout).
        ws = await stack.enter_async_context(
            ws_connect(url + path, compression=None, max_size=None, open_timeout=WAIT)
        )
        provider = Provider(self.doc, WsChannel(ws, path, self._check))
        await stack.enter_async_context(provider)
        with anyio.fail_after(WAIT):
            await provider.synced.wait()


def _y_message(item: str) -> object:
    from pycrdt import Map

    return Map({"id": f"msg_{uuid.uuid4().hex}", "role": "user", "text": item})


async def pycrdt_converge(
    url: str, settings: Settings, texts: list[str], paced: bool, probe: Probe | None = None
) -> tuple[float, int]:
    """Seconds from the writer's first append until every reader holds all the messages, and
    the updates the writer sent (one per transaction). `paced`: the writer lets the event
    loop run after each message."""
    n = settings.messages
    path = f"/{_cid()}"
    async with contextlib.AsyncExitStack() as stack:
        readers = [_YClient(n) for _ in range(settings.readers)]
        writer = _YClient(n)
        for client in [*readers, writer]:
            await client.enter(stack, url, path)
        doc, messages = writer.doc, writer.messages
        gc.collect()
        await _start(probe, "converge-paced" if paced else "converge")
        begin = time.perf_counter()
        for item in texts[:n]:
            with doc.transaction():
                messages.append(_y_message(item))
            if paced:
                await asyncio.sleep(0)
        with anyio.fail_after(WAIT):
            for reader in readers:
                await reader.done.wait()
        elapsed = time.perf_counter() - begin
        _stop(probe, "converge-paced" if paced else "converge")
        for reader in readers:
            assert len(reader.messages) == n, (len(reader.messages), n)
    return elapsed, n


async def pycrdt_catch_up(
    url: str, settings: Settings, texts: list[str], probe: Probe | None = None
) -> dict[str, float]:
    """(build seconds, catch-up seconds) on a room of `settings.catch_up` messages."""
    n = settings.catch_up
    path = f"/{_cid()}"
    async with contextlib.AsyncExitStack() as outer:
        writer = _YClient(n)
        await writer.enter(outer, url, path)
        async with contextlib.AsyncExitStack() as inner:
            watcher = _YClient(n)
            await watcher.enter(inner, url, path)
            doc, messages = writer.doc, writer.messages
            gc.collect()
            begin = time.perf_counter()
            for item in texts[:n]:
                with doc.transaction():
                    messages.append(_y_message(item))
            with anyio.fail_after(WAIT):
                await watcher.done.wait()
            build = time.perf_counter() - begin
        gc.collect()
        await _start(probe, "catch-up")
        begin = time.perf_counter()
        async with contextlib.AsyncExitStack() as inner:
            fresh = _YClient(n)
            await fresh.enter(inner, url, path)
            with anyio.fail_after(WAIT):
                await fresh.done.wait()
            elapsed = time.perf_counter() - begin
            _stop(probe, "catch-up")
            assert len(fresh.messages) == n, (len(fresh.messages), n)
    return {"build": build, "catch-up": elapsed}


# ---------------------------------------------------------------------------- the run


@dataclass
class Samples:
    """Seconds per repeat, by workload, then by system name."""

    by_workload: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    pushes: dict[str, list[int]] = field(default_factory=dict)  # convsync (MemoryStore)

    def add(self, workload: str, system: str, seconds: float) -> None:
        self.by_workload.setdefault(workload, {}).setdefault(system, []).append(seconds)


def systems(sqlite: bool) -> list[System]:
    found = [
        System(CONVSYNC, ["convsync"], convsync_converge, convsync_catch_up),
        System(PYCRDT, ["pycrdt"], pycrdt_converge, pycrdt_catch_up),
    ]
    if sqlite:
        found.append(System(CONVSYNC_SQLITE, ["convsync"], convsync_converge, convsync_catch_up))
    return found


async def trial(
    system: System,
    settings: Settings,
    texts: list[str],
    serve: list[str],
    probe_phase: str | None = None,
) -> tuple[dict[str, float], dict[str, int], Probe | None]:
    """One repeat of every workload on `system`, against a server started for it: seconds
    by workload, and the writer's websocket messages by converge workload."""
    async with server_process(serve) as server:
        probe = Probe(probe_phase, server.pid) if probe_phase else None
        figures: dict[str, float] = {}
        sent: dict[str, int] = {}
        for key, paced in (("converge", False), ("converge-paced", True)):
            figures[key], sent[key] = await system.converge(
                server.url, settings, texts, paced, probe
            )
        figures.update(await system.catch_up(server.url, settings, texts, probe))
    return figures, sent, probe


async def run(settings: Settings, sqlite: bool) -> Samples:
    texts = [text(i) for i in range(max(settings.messages, settings.catch_up))]
    samples = Samples()
    with tempfile.TemporaryDirectory(prefix="convsync-peer-") as db_dir:
        chosen = systems(sqlite)
        for repeat in range(settings.repeats):
            shift = repeat % len(chosen)
            for system in chosen[shift:] + chosen[:shift]:
                serve = list(system.serve)
                if system.name == CONVSYNC_SQLITE:
                    serve += ["--db", str(Path(db_dir) / f"hub-{repeat}.db")]
                figures, sent, _ = await trial(system, settings, texts, serve)
                for workload, seconds in figures.items():
                    samples.add(workload, system.name, seconds)
                if system.name == CONVSYNC:
                    for workload, count in sent.items():
                        samples.pushes.setdefault(workload, []).append(count)
                print(
                    f"... repeat {repeat + 1}/{settings.repeats} {system.name}: "
                    + ", ".join(f"{w} {s:.3f} s" for w, s in figures.items()),
                    file=sys.stderr,
                    flush=True,
                )
    return samples


# ---------------------------------------------------------------------------- profiles


def profile(
    settings: Settings, phases: list[str], system_name: str = CONVSYNC, top: int = 20
) -> str:
    """cProfile of the timed window of each of `phases`, in the server process and in this
    one (writer, readers, fresh client), on `system_name`'s servers."""
    system = next(s for s in systems(sqlite=False) if s.name == system_name)
    texts = [text(i) for i in range(max(settings.messages, settings.catch_up))]
    out = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="convsync-prof-") as tmp:
        for phase in phases:
            server_out = str(Path(tmp) / f"{phase}.prof")
            serve = [*system.serve, "--profile-out", server_out]
            figures, _, probe = anyio.run(trial, system, settings, texts, serve, phase)
            assert probe is not None
            out.write(f"\n##### {system.name}, {phase} ({figures[phase]:.3f} s under cProfile)\n")
            for title, stats in (
                ("server process", pstats.Stats(server_out, stream=out)),
                ("client process", pstats.Stats(probe.profiler, stream=out)),
            ):
                for order in ("tottime", "cumulative"):
                    out.write(f"\n=== {title}, top {top} by {order} ===\n")
                    stats.sort_stats(order).print_stats(top)
    # Paths relative to the repository (convsync) or to site-packages (the libraries).
    site = str(Path(anyio.__file__).resolve().parent.parent) + os.sep
    return out.getvalue().replace(site, "").replace(str(ROOT) + os.sep, "")


# ---------------------------------------------------------------------------- report


def versions() -> str:
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()
        commit = f"git {commit}{' + uncommitted changes' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        commit = "git commit unknown"
    return (
        f"convsync {version('convsync')} ({commit}), pycrdt-websocket "
        f"{version('pycrdt-websocket')} with pycrdt {version('pycrdt')}, websockets "
        f"{version('websockets')}, msgspec {version('msgspec')}, anyio {version('anyio')}"
    )


def workloads(settings: Settings) -> list[tuple[str, str, bool]]:
    """(key, description, barred) of every workload, in table order."""
    return [
        (
            "converge",
            f"converge: 1 writer appends {settings.messages:,} in a loop, "
            f"{settings.readers} readers hold all",
            True,
        ),
        (
            "converge-paced",
            "converge, paced (the writer yields to the event loop after each message)",
            False,
        ),
        (
            "build",
            f"build: 1 writer appends {settings.catch_up:,}, 1 reader holds all",
            False,
        ),
        ("catch-up", f"catch-up: a fresh client holds all {settings.catch_up:,}", True),
        (
            "catch-up-json",
            f'catch-up, the state as JSON (`state_format="json"`): a fresh client holds all '
            f"{settings.catch_up:,}",
            False,
        ),
    ]


def rows(samples: Samples, settings: Settings) -> tuple[list[Row], list[str]]:
    table: list[Row] = []
    failed: list[str] = []
    for key, what, barred in workloads(settings):
        by_system = samples.by_workload[key]
        for name, values in by_system.items():
            table.append(
                Row(f"{what}: {name}", f"{median(values):.3f} s", spread(values, "{:.3f}") + " s")
            )
        if key == "catch-up-json":
            for name in (CONVSYNC, CONVSYNC_SQLITE):
                if name in by_system:
                    json_over = median(by_system[name]) / median(
                        samples.by_workload["catch-up"][name]
                    )
                    table.append(
                        Row(
                            f"catch-up: JSON state time / MessagePack state time, {name}",
                            f"{json_over:.2f}x",
                        )
                    )
            continue
        peer = median(by_system[PYCRDT])
        for name in (CONVSYNC, CONVSYNC_SQLITE):
            if name not in by_system:
                continue
            ratio = peer / median(by_system[name])
            gate = barred and name == CONVSYNC
            table.append(
                Row(
                    f"**{key}: pycrdt-websocket time / {name} time**"
                    if gate
                    else f"{key}: pycrdt-websocket time / {name} time",
                    f"**{ratio:.2f}x**" if gate else f"{ratio:.2f}x",
                    bar=f">= {BARS[key]:g}x" if gate else "",
                    passed=(ratio >= BARS[key]) if gate else None,
                )
            )
            if gate and ratio < BARS[key]:
                failed.append(key)
    return table, failed


def section(
    table: list[Row],
    failed: list[str],
    settings: Settings,
    started: str,
    seconds: float,
    pushes: dict[str, list[int]],
    load: tuple[float, float],
) -> str:
    verdict = "all bars PASS" if not failed else f"FAILED: {', '.join(failed)}"
    n, readers = settings.messages, settings.readers
    loop, paced = pushes.get("converge"), pushes.get("converge-paced")
    batches = (
        f"{median(loop):.0f} pushes in a loop and {median(paced):.0f} paced"
        if loop and paced
        else "(not recorded)"
    )
    return "\n".join(
        [
            f"Command: `{command_line()}` (from the repository root, after "
            "`.venv/bin/pip install -e '.[bench]'`)  ",
            f"Date: {started}; the run took {seconds:.0f} s  ",
            f"Versions: {versions()}  ",
            f"Machine: {machine()}, shared with other jobs (1-minute load average "
            f"{load[0]:.1f} at the start, {load[1]:.1f} at the end)  ",
            f"Result: **{verdict}** (bars of issue 32: convsync converges >= "
            f"{BARS['converge']:g}x faster and a fresh replica catches up >= "
            f"{BARS['catch-up']:g}x faster than pycrdt-websocket)",
            "",
            "The same work on both systems, in one run: each server in a process of its own "
            "(started afresh for each repeat of each system, 127.0.0.1, port 0, it prints the "
            "port it got), writer and readers together in the benchmark's process, the same "
            "websocket library (`websockets`) on both sides, no compression, default keepalive "
            f"pings. Each figure is the median of {settings.repeats} repeats; the systems' "
            "repeats are interleaved (their order rotates per repeat); the spread is min-max "
            "over the repeats. A ratio is pycrdt-websocket's median time over convsync's: "
            "how many times faster convsync is.",
            "",
            f"- **Converge** (bar): one writer appends {n:,} messages of ~300 characters of "
            "text (the same texts on both sides, from `bench/model.py`), one operation per "
            f"message in a loop, while {readers} readers are connected; timed from the first "
            "append until every reader holds the last message. convsync: "
            "`writer.conversation.push(Message.user(text))` per message (the replica batches "
            "by itself, one batch in flight), readers `await replica.wait_for(n)` and then "
            f"hold `len(replica.conversation) == {n}`. pycrdt-websocket: per message one "
            '`doc.transaction()` appending a `Map({"id", "role", "text"})` to the `messages` '
            "`Array` of the writer's `Doc`; its `Provider` sends each transaction's update, the "
            "server's room applies it and broadcasts it to every client (the writer too); a "
            "reader is done when `len(array)` reaches n, checked each time its provider has "
            "handled a message (an `Array.observe` callback would cost the readers more than "
            "applying the updates: pycrdt converts every event's delta to Python objects).",
            "- **Converge, paced** (informative): the same, the writer awaiting "
            "`asyncio.sleep(0)` after each message, as an agent awaiting between steps does: "
            "the event loop runs between messages, so convsync's replica pushes smaller "
            f"batches. convsync's writer sent a median of {batches} for the "
            f"{n:,} messages (MemoryStore hub). pycrdt's `Provider` has no batching: one "
            "websocket message per transaction either way, and each reader's `Provider` also "
            "sends every update it receives back to the server (it forwards every transaction "
            "of its `Doc`; the server applies these as no-ops), so its server handles "
            f"{n:,} x {readers + 1} messages in and as many out.",
            f"- **Catch-up** (bar): a {settings.catch_up:,}-message conversation is built the "
            "same way (the build figure is informative: one writer, plus one reader waiting "
            "for all of it), the writer stays connected (so both servers keep the room "
            "loaded), then a fresh client connects; timed from the start of its connection "
            "(TCP and websocket handshakes included) until it holds all the messages. "
            "convsync: `async with connect(...)` of a fresh replica (it returns once the "
            "first catch-up is applied); by default it asks for the state as MessagePack "
            "(`state_format`, issue 32), and the informative JSON row is a second fresh replica "
            "asking for JSON on the same hub, right before or after it (the order alternates "
            "per repeat). pycrdt-websocket: a fresh `Doc` and `Provider` (Yjs "
            "sync step 1, the server's step 2 with the whole document) until `len(array)` "
            "reaches n.",
            "- Servers: `Hub(MemoryStore(), config=HubConfig(compression=None))`; the "
            "informative SQLite rows use `SqliteStore` on a fresh file with its defaults (WAL, "
            "`synchronous=FULL`, group commit). pycrdt-websocket: `WebsocketServer()` "
            "(in-memory rooms, no `YStore`) serving each `websockets` connection at its path "
            "through a small `Channel` adapter (`WsChannel` in the script).",
            "- `gc.collect()` runs in the client process before each timed trial; the "
            "garbage collector stays on during the trials, in both processes.",
            "",
            Results(rows=table).table(),
            *(
                [
                    "",
                    "A bar failed: the run then printed a cProfile of convsync's timed window of "
                    "each failing workload, hub and client side (reproduce with "
                    f"`.venv/bin/python bench/peer.py --profile-only {','.join(failed)}`).",
                ]
                if failed
                else []
            ),
        ]
    )


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run at small sizes (writes nothing)"
    )
    parser.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SqliteStore hub")
    parser.add_argument("--repeats", type=int, help="repeats of every trial (default: 5)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the run, cProfile the convsync workloads with a bar (failed ones always)",
    )
    parser.add_argument(
        "--profile-only",
        metavar="WORKLOADS",
        help="no run: only cProfile these comma-separated workloads "
        "(converge, converge-paced, catch-up)",
    )
    parser.add_argument(
        "--profile-system",
        default=CONVSYNC,
        choices=[CONVSYNC, PYCRDT],
        help="the system --profile-only profiles",
    )
    parser.add_argument("--serve", choices=["convsync", "pycrdt"], help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    if args.serve == "convsync":
        anyio.run(serve_convsync, args.db, args.profile_out)
        return 0
    if args.serve == "pycrdt":
        anyio.run(serve_pycrdt, args.profile_out)
        return 0

    settings = QUICK if args.quick else FULL
    if args.repeats is not None:
        settings = replace(settings, repeats=args.repeats)
    if args.profile_only:
        print(profile(settings, args.profile_only.split(","), args.profile_system))
        return 0
    started = now()
    load_before = os.getloadavg()[0]
    begin = time.perf_counter()
    samples = anyio.run(run, settings, not args.no_sqlite)
    seconds = time.perf_counter() - begin
    load = (load_before, os.getloadavg()[0])
    table, failed = rows(samples, settings)
    print(Results(rows=table).table())
    if args.quick or args.no_write:
        print("\n(not written to docs/benchmarks.md)")
    else:
        path = write_section(
            SECTION, section(table, failed, settings, started, seconds, samples.pushes, load)
        )
        print(f"\nwrote the {SECTION!r} section of {path}")
    phases = [key for key, _, barred in workloads(settings) if barred] if args.profile else failed
    if phases:
        print(f"\ncProfile of convsync's timed windows ({', '.join(phases)}), one trial each:")
        print(profile(settings, phases))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
