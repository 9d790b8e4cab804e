"""`convsync backup` and `convsync restore`: a SQLite store copied while its hub runs, and a new
store made from the copy under fresh lineages (SPEC 15)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest
from cliproc import convsync
from conftest import bound, hub_config

from client import connect, fetch_conversation
from server import Hub
from server.store import SqliteStore
from server.store.backup import backup, restore
from sync import Message, Text, UsageError

WRITERS = 20


def _texts(conversation: object) -> list[str]:
    texts = []
    for ref in conversation.entries():  # type: ignore[attr-defined]
        for part in ref.entry.message.content:
            if isinstance(part, Text):
                texts.append(part.text)
    return texts


async def test_a_backup_under_twenty_writers_restores_every_acknowledged_record(
    tmp_path: Path,
) -> None:
    """While 20 writers push, `convsync backup` copies the store; a hub on the store restored
    from the copy holds every record acknowledged before the backup began, each conversation
    under a new lineage, and a replica that saw revisions past the backup rereads the log."""
    db, copy, restored = tmp_path / "hub.db", tmp_path / "copy.db", tmp_path / "restored.db"
    acked: dict[int, int] = dict.fromkeys(range(WRITERS), 0)  # records flushed, per writer
    lineages: dict[int, int] = {}
    taken: dict[int, int] = {}
    backup_began = anyio.Event()
    backup_done = anyio.Event()
    under_way = anyio.Event()  # every writer has 20 records acknowledged

    async with Hub(SqliteStore(str(db)), host="127.0.0.1", port=0, config=hub_config()) as hub:

        async def write(k: int) -> None:
            async with connect(hub.url, f"conv-{k}", client=f"writer-{k}") as replica:
                n = 0
                while not backup_done.is_set() or n < 40:
                    for _ in range(5):
                        replica.conversation.push(Message.user(f"w{k}-{n}"))
                        n += 1
                    with anyio.fail_after(bound(20)):
                        await replica.flush()
                    if not backup_began.is_set():
                        acked[k] = n
                        if min(acked.values()) >= 20:
                            under_way.set()
                    lineages[k] = replica.session.lineage

        async def back_up() -> None:
            await under_way.wait()
            backup_began.set()
            taken.update(acked)
            done = await anyio.to_thread.run_sync(
                lambda: convsync("backup", "--db", str(db), str(copy))
            )
            assert done.returncode == 0, done.stderr
            assert "backed up 20 conversations" in done.stderr
            backup_done.set()

        with anyio.fail_after(bound(120)):
            async with anyio.create_task_group() as group:
                for k in range(WRITERS):
                    group.start_soon(write, k)
                group.start_soon(back_up)

    done = convsync("restore", str(copy), "--db", str(restored))
    assert done.returncode == 0, done.stderr
    async with Hub(
        SqliteStore(str(restored)), host="127.0.0.1", port=0, config=hub_config()
    ) as hub:
        for k in range(WRITERS):
            fetched = await fetch_conversation(hub.url, f"conv-{k}")
            texts = _texts(fetched.conversation)
            assert texts[: taken[k]] == [f"w{k}-{n}" for n in range(taken[k])]
            assert fetched.lineage != lineages[k]  # a fresh lineage: nothing continues the old
        # A replica that saw the log past the backup (conv-0 went on after it) rereads it.
        async with connect(hub.url, "conv-0", client="writer-0") as replica:
            with anyio.fail_after(bound(20)):
                await replica.flush()
            fetched = await fetch_conversation(hub.url, "conv-0")
            assert replica.conversation == fetched.conversation


def test_backup_and_restore_never_overwrite_and_refuse_what_is_not_a_store(
    tmp_path: Path,
) -> None:
    """An existing target is refused with nothing changed; so is a file that is not a
    convsync store; no temporary file is left behind."""
    not_a_store = tmp_path / "notes.db"
    with sqlite3.connect(not_a_store) as conn:
        conn.execute("CREATE TABLE t (x)")
    existing = tmp_path / "existing.db"
    existing.write_bytes(b"keep me")
    with pytest.raises(UsageError) as refused:
        backup(str(not_a_store), str(tmp_path / "out.db"))
    assert refused.value.reason == "not_a_store"
    with pytest.raises(UsageError) as refused:
        backup(str(not_a_store), str(existing))
    assert refused.value.reason == "exists"
    with pytest.raises(UsageError) as refused:
        restore(str(tmp_path / "missing.db"), str(tmp_path / "new.db"))
    assert refused.value.reason == "not_a_store"
    assert existing.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.db", "notes.db"]
    done = convsync("restore", str(not_a_store), "--db", str(existing))
    assert done.returncode == 1 and "exists" in done.stderr
    assert len(done.stderr.splitlines()) == 1
