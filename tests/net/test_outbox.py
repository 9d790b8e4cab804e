"""The persisted outbox (SPEC 14): an edit that returned survives its worker's SIGKILL and lands
exactly once, with the hub up or down; an offline start; one owner per outbox; bad files."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import msgspec
import pytest
from conftest import bound
from faultproxy import FaultProxy

from client import connect
from server import Hub
from sync import Message, UsageError, encode

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "support" / "outbox_worker.py"
DOWN = "ws://127.0.0.1:1"  # nothing listens there: a hub that is down


async def worker(url: str, outbox: Path, text: str, mode: str) -> asyncio.subprocess.Process:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        url,
        "c",
        str(outbox),
        text,
        mode,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )


async def said(process: asyncio.subprocess.Process, word: str) -> None:
    assert process.stdout is not None
    with anyio.fail_after(bound(30)):
        line = (await process.stdout.readline()).decode()
    assert line.strip() == word, f"the worker said {line!r}, not {word!r}"


async def ended(process: asyncio.subprocess.Process) -> int:
    with anyio.fail_after(bound(30)):
        return await process.wait()


async def killed(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGKILL)
    assert await ended(process) == -signal.SIGKILL


async def texts(hub: Hub) -> list[str]:
    """The texts of every message in the hub's conversation `c` (none when it holds none),
    and `+N` for each record past one per message (a note, or a record landed twice)."""
    with anyio.fail_after(bound(10)):
        return await anyio.to_thread.run_sync(_texts, hub)


def _texts(hub: Hub) -> list[str]:
    url = f"http://127.0.0.1:{hub.port}/v1/conversations/c"
    try:
        with urllib.request.urlopen(url, timeout=bound(5)) as response:
            body = msgspec.json.decode(response.read())
    except urllib.error.HTTPError as error:
        assert error.code == 404
        return []
    said = [
        part["text"]
        for entry in body["state"]["entries"]
        for part in entry["message"]["content"]
        if part.get("type") == "text"
    ]
    return said + [f"+{body['revision'] - len(said)}"] * (body["revision"] > len(said))


async def restarted(url: str, outbox: Path) -> None:
    """Run a worker on `outbox` that only flushes what it kept."""
    process = await worker(url, outbox, "", "flush")
    await said(process, "flushed")
    assert await ended(process) == 0


@pytest.fixture
async def proxy(hub: Hub) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(f"ws://127.0.0.1:{hub.port}") as relay:
        yield relay


async def test_edit_before_it_was_sent_survives_sigkill_and_lands_once(
    hub: Hub, tmp_path: Path
) -> None:
    """A worker killed right after its edit returned (nothing sent yet), restarted on the
    same outbox: the edit lands exactly once, and a further restart sends nothing again."""
    url = f"ws://127.0.0.1:{hub.port}"
    outbox = tmp_path / "worker.outbox"
    process = await worker(url, outbox, "kept across a kill", "die")
    assert await ended(process) == -signal.SIGKILL
    assert await texts(hub) == []  # it never went
    await restarted(url, outbox)
    assert await texts(hub) == ["kept across a kill", "+1"]
    await restarted(url, outbox)
    assert await texts(hub) == ["kept across a kill", "+1"]


async def test_edit_landed_with_its_ack_lost_lands_once_after_sigkill(
    hub: Hub, proxy: FaultProxy, tmp_path: Path
) -> None:
    """The hub lands the push, its ack never reaches the worker, the worker is killed: the
    restarted worker resends nothing the hub holds (its seq says so): exactly once."""
    proxy.cut_after_drop = False
    proxy.drop_to_replica = lambda frame: b'"type":"ack"' in frame
    outbox = tmp_path / "worker.outbox"
    async with connect(f"ws://127.0.0.1:{hub.port}", "c") as observer:
        process = await worker(proxy.url, outbox, "landed, ack lost", "hold")
        try:
            await said(process, "edited")
            with anyio.fail_after(bound(30)):
                while b"landed, ack lost" not in encode(observer.conversation):
                    await observer.wait_for(observer.revision + 1)
            with sqlite3.connect(f"file:{outbox}?mode=ro", uri=True, timeout=0) as db:
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    db.execute("SELECT seq FROM pending").fetchall()  # held by the worker
        finally:
            await killed(process)
    proxy.heal()
    await restarted(proxy.url, outbox)
    assert await texts(hub) == ["landed, ack lost", "+1"]


async def test_edit_made_while_the_hub_is_down_survives_sigkill(
    hub: Hub, proxy: FaultProxy, tmp_path: Path
) -> None:
    """The worker starts offline (no hub answers), edits, is killed; the hub comes up and the
    restarted worker lands the edit exactly once."""
    proxy.upstream = DOWN
    outbox = tmp_path / "worker.outbox"
    process = await worker(proxy.url, outbox, "made offline", "die")
    assert await ended(process) == -signal.SIGKILL
    proxy.upstream = f"ws://127.0.0.1:{hub.port}"
    assert await texts(hub) == []
    await restarted(proxy.url, outbox)
    assert await texts(hub) == ["made offline", "+1"]
    await restarted(proxy.url, outbox)
    assert await texts(hub) == ["made offline", "+1"]


async def test_offline_start_opens_from_the_outbox_and_sends_later(
    hub: Hub, proxy: FaultProxy, tmp_path: Path
) -> None:
    """With no hub answering, entering opens at once from the outbox (the value it had, not
    connected); an edit made then goes once a hub answers."""
    outbox = tmp_path / "r.outbox"
    async with connect(proxy.url, "c", outbox=outbox) as replica:
        replica.conversation.push(Message.user("before"))
        with anyio.fail_after(bound(10)):
            await replica.flush()
        client = replica.client
    proxy.upstream = DOWN
    with anyio.fail_after(bound(10)):  # well before the catch-up timeout
        async with connect(proxy.url, "c", outbox=outbox, connect_timeout=bound(60)) as replica:
            assert not replica.connected
            assert replica.client == client
            assert len(replica.conversation) == 1 and b"before" in encode(replica.conversation)
            replica.conversation.push(Message.user("while down"))
            assert replica.pending == 1
            proxy.upstream = f"ws://127.0.0.1:{hub.port}"
            await replica.flush()
            assert replica.connected
    assert await texts(hub) == ["before", "while down"]


async def test_a_second_live_owner_is_refused_naming_the_outbox(hub: Hub, tmp_path: Path) -> None:
    """While a worker process holds an outbox, another replica (another process, or one in
    this process) is refused with an error that names the file; once the holder died, a new
    one takes it over."""
    url = f"ws://127.0.0.1:{hub.port}"
    outbox = tmp_path / "owned.outbox"
    process = await worker(url, outbox, "", "own")
    try:
        await said(process, "holding")
        with pytest.raises(UsageError, match="outbox_locked") as refused:
            async with connect(url, "c", outbox=outbox):
                pass
        assert str(outbox) in str(refused.value)
    finally:
        await killed(process)
    async with connect(url, "c", outbox=outbox) as replica:
        with pytest.raises(UsageError, match="in use"):
            async with connect(url, "c", outbox=outbox):
                pass
        assert replica.connected


async def test_bad_outbox_files_are_refused_and_left_as_they_were(hub: Hub, tmp_path: Path) -> None:
    """A file that is not SQLite, another program's SQLite file, another conversation's
    outbox, another client's, or a newer layout: a clear error naming the file, and the file
    unchanged."""
    url = f"ws://127.0.0.1:{hub.port}"
    garbage = tmp_path / "garbage.outbox"
    garbage.write_bytes(b"not a database at all, " * 100)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
        db.execute("INSERT INTO meta VALUES ('format', 'something else')")
    db.close()
    other = tmp_path / "other.outbox"
    async with connect(url, "other", outbox=other, client="me"):
        pass
    newer = tmp_path / "newer.outbox"
    async with connect(url, "c", outbox=newer, client="me"):
        pass
    with sqlite3.connect(newer) as db:
        db.execute("UPDATE meta SET value='2' WHERE key='version'")
    db.close()
    cases = [
        (garbage, {}, "not readable as a convsync outbox"),
        (foreign, {}, "not a convsync outbox"),
        (other, {}, "keeps conversation 'other', not 'c'"),
        (newer, {}, "layout version 2"),
        (other, {"client": "you"}, "keeps conversation"),
    ]
    for path, options, why in cases:
        before = path.read_bytes()
        with pytest.raises(UsageError, match="bad_outbox") as refused:
            async with connect(url, "c", outbox=path, **options):  # type: ignore[arg-type]
                pass
        assert str(path) in str(refused.value) and why in str(refused.value), refused.value
        assert path.read_bytes() == before, f"{path.name} changed"
    mine = tmp_path / "mine.outbox"
    async with connect(url, "c", outbox=mine, client="me"):
        pass
    before = mine.read_bytes()
    with pytest.raises(UsageError, match="keeps client 'me', not 'you'"):
        async with connect(url, "c", outbox=mine, client="you"):
            pass
    assert mine.read_bytes() == before
