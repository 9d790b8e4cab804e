"""The hub refuses a compaction that would take a pinned entry out (SPEC §11, reject
`pinned`): in the core without sockets, and through replicas racing a pin."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from conftest import bound
from faultproxy import FaultProxy

from client import Replica, connect
from server import Hub
from server.core import AppendRecords, CoreConfig, RoomCore, Send
from sync import Aside, Author, ChangeRecord, Conversation, Entry, Message
from sync.compact import COMPACTED_KIND, compact, compaction_unpins, pin, pinned
from sync.protocol import Hello, PushBatch, Reject, decode_hub_message
from sync.rebase import Conflict

NOW = 1_700_000_000_000


def _room(*conns: str, features: list[str] | None = None) -> RoomCore[str]:
    room: RoomCore[str] = RoomCore("c", CoreConfig(max_frame=1 << 20))
    room.load(None)
    for conn in conns:
        room.join(conn, Hello(conn, room.lineage, room.revision, features=features or []))
    return room


def _land(room: RoomCore[str], conn: str, seq: int, records: list[ChangeRecord]) -> list[Any]:
    """Push `records` at the room's head and let the store take them."""
    actions = room.push(conn, PushBatch(seq, room.lineage, room.revision, records), NOW)
    call = actions[-1]
    assert isinstance(call, AppendRecords), actions
    return room.resume(call.from_ + len(call.records))


def _rejects(actions: list[Any], conn: str) -> list[Reject]:
    frames = [decode_hub_message(a.frame) for a in actions if isinstance(a, Send) and a.to == conn]
    return [frame for frame in frames if isinstance(frame, Reject)]


def _three(room: RoomCore[str]) -> Conversation:
    """Land user / assistant / user on `room`; a copy of what the room holds then."""
    maker = Conversation()
    maker.extend([Message.user("a"), Message.assistant("b"), Message.user("c")])
    _land(room, "w", 1, maker.take_unsaved())
    return room.conversation.copy()


def test_core_refuses_a_compaction_made_before_a_pin_landed_and_nothing_changes() -> None:
    """A compaction made on a base without the pin, arriving after it (at the head after a
    rebase, or placed by the hub): `reject pinned` naming the id; the log is as before."""
    for features in ([], ["hub_rebase"]):
        room = _room("w", "ui", features=features)
        base = _three(room)
        compacting = base.copy()
        assert compact(compacting, keep=1, summary=Message.user("a, b")) is not None
        compaction = compacting.take_unsaved()
        held = base.id(1)
        assert held is not None
        pinning = room.conversation.copy()
        pin(pinning, held)
        _land(room, "ui", 1, pinning.take_unsaved())
        before, revision = room.conversation.copy(), room.revision
        # Rebased by its replica onto the head, or sent on its old base for the hub to place.
        for seq, at in ((2, revision), (3, revision - 1)):
            actions = room.push("w", PushBatch(seq, room.lineage, at, compaction), NOW)
            [reject] = _rejects(actions, "w")
            if at != revision and not features:
                assert reject.reason == "behind"  # not placed: the replica rebases, resends
                continue
            assert reject.reason == "pinned" and held in reject.detail
            assert room.conversation == before and room.revision == revision
            assert not room.waiting
        assert room.metrics.pushes_rejected["pinned"] >= 1


def test_core_lets_other_splices_of_a_pinned_entry_and_compactions_around_it_land() -> None:
    """Only a compaction is refused: an edit keeping the pinned id, a user's own splice, and
    a compaction of unpinned entries land."""
    room = _room("w")
    base = _three(room)
    held = base.id(0)
    assert held is not None
    pinning = base.copy()
    pin(pinning, held)
    _land(room, "w", 2, pinning.take_unsaved())
    edit = room.conversation.copy()
    edit.splice(slice(0, 1), [Entry(Message.user("A"), id=held)], None)
    _land(room, "w", 3, edit.take_unsaved())
    assert room.conversation.messages()[0] == Message.user("A")
    around = room.conversation.copy()
    assert compact(around, keep=0, summary=Message.user("b, c")) is not None
    _land(room, "w", 4, around.take_unsaved())
    assert room.conversation.index_of(held) == 0 and len(room.conversation) == 2
    by_user = room.conversation.copy()
    by_user.splice(slice(0, 1), [], Author.user())
    _land(room, "w", 5, by_user.take_unsaved())
    assert not room.conversation.holds(held)


def test_compaction_unpins_names_a_compaction_by_its_aside_or_its_author() -> None:
    """A splice in a push with a `rig.compacted` aside is a compaction whoever made it, as is
    a splice by `Author.plugin("compact")` alone (its aside went in a later push); an agent's
    own splice is not."""
    conversation = Conversation.from_messages(
        [Message.user("a"), Message.assistant("b"), Message.user("c")]
    )
    held = conversation.id(0)
    assert held is not None
    pin(conversation, held)
    conversation.take_unsaved()
    for by, with_aside, refused in (
        (Author.agent("me"), False, []),
        (Author.agent("me"), True, [held]),
        (Author.plugin("compact"), False, [held]),
    ):
        edited = conversation.copy()
        edited.splice(slice(0, 2), [Message.user("x")], by)
        if with_aside:
            edited.add_aside(Aside(COMPACTED_KIND, edited.id(0), by, {"originals": []}))
        assert compaction_unpins(edited, edited.take_unsaved()) == refused


class HeldPushes(FaultProxy):
    """A relay that holds the replica's pushes until `release` is set."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.release = asyncio.Event()

    async def _to_hub(self, frame: bytes, out: Any) -> None:
        if frame.startswith(b'{"type":"push"'):
            await self.release.wait()
        await super()._to_hub(frame, out)


async def _conflicts(replica: Replica) -> list[Conflict]:
    """The replica's events up to its first `Conflict`, which it returns with any after it."""
    async for event in replica.events():
        if isinstance(event, Conflict):
            return [event, *[e for e in replica.events_nowait() if isinstance(e, Conflict)]]
    raise AssertionError("the replica closed without a conflict")


async def test_a_pin_racing_a_compaction_wins_and_the_compactor_gets_a_conflict(hub: Hub) -> None:
    """A worker compacts while a UI pins an entry the compaction covers; the pin lands first:
    the worker gets `Conflict(pinned)` for its compaction, and every replica ends with all
    three entries and the pin."""
    async with HeldPushes(hub.url) as proxy:
        ui = connect(hub.url, "race", client="ui")
        async with ui:
            ui.conversation.extend([Message.user("a"), Message.assistant("b"), Message.user("c")])
            with anyio.fail_after(bound(10)):
                await ui.flush()
            async with connect(proxy.url, "race", client="worker") as worker:
                with anyio.fail_after(bound(10)):
                    await worker.wait_for(ui.session.revision)
                assert compact(worker.conversation, keep=1, summary=Message.user("a, b"))
                assert len(worker.conversation) == 2  # held in the relay
                held = ui.conversation.id(1)
                assert held is not None
                pin(ui.conversation, held)
                with anyio.fail_after(bound(10)):
                    await ui.flush()
                proxy.release.set()
                with anyio.fail_after(bound(10)):
                    conflicts = await _conflicts(worker)
                    await worker.flush()
                assert {c.reason for c in conflicts} == {"pinned"}
                assert held in conflicts[0].detail
                assert worker.conversation == ui.conversation
                assert [m.content[0].text for m in worker.conversation.messages()] == [  # type: ignore[union-attr]
                    "a",
                    "b",
                    "c",
                ]
                assert pinned(worker.conversation) == {held}
                assert not [a for _, a in worker.conversation.asides() if a.kind == COMPACTED_KIND]


def test_readme_reject_table_names_every_reject_reason() -> None:
    """The README's table of reject reasons lists every reason the hub can send."""
    import re
    from pathlib import Path

    from sync.errors import REJECTS

    readme = Path(__file__).resolve().parents[2] / "README.md"
    listed = set(re.findall(r"^\| `([a-z_]+)` \| .* \| .* \|$", readme.read_text(), re.M))
    assert set(REJECTS) <= listed


async def test_two_people_pinning_at_once_both_keep_their_pin(hub: Hub) -> None:
    """Two UIs pin different entries at the same moment (neither has seen the other's pin):
    every replica ends with both pins (one `rig.pin` aside each; a single list would lose one
    to the rebase)."""
    async with (
        connect(hub.url, "pins", client="a") as a,
        connect(hub.url, "pins", client="b") as b,
    ):
        a.conversation.extend([Message.user("x"), Message.assistant("y")])
        with anyio.fail_after(bound(10)):
            await a.flush()
            await b.wait_for(a.session.revision)
        first, second = a.conversation.id(0), a.conversation.id(1)
        assert first is not None and second is not None
        pin(a.conversation, first)
        pin(b.conversation, second)  # before either flushes
        with anyio.fail_after(bound(10)):
            await a.flush()
            await b.flush()
            await a.flush()
            await a.wait_for(b.session.revision)
        assert pinned(a.conversation) == pinned(b.conversation) == {first, second}


def test_readme_pins_and_compaction_example_runs() -> None:
    """The README's pins and compaction example runs as written."""
    import subprocess
    import sys
    from pathlib import Path

    from test_readme import readme_block

    root = Path(__file__).resolve().parents[2]
    code = readme_block("### Context that fits")
    assert "uncompact(conversation, aside_id)" in code
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=bound(60)
    )
    assert result.returncode == 0, result.stderr
