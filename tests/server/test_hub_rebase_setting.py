"""`HubConfig.hub_rebase` reaches the room's rules, and placed pushes are counted."""

from __future__ import annotations

import pytest

from server.config import HubConfig
from server.core import AppendRecords, Send
from server.metrics import Metrics
from server.room import Room
from server.store import MemoryStore
from sync import ChangeRecord, Conversation, Message
from sync.errors import UsageError
from sync.protocol import Ack, Hello, PushBatch, Reject, Welcome, decode_hub_message

NOW = 1_700_000_000_000


def record(text: str) -> ChangeRecord:
    """A push record of one user message, with a fresh id."""
    maker = Conversation()
    maker.push(Message.user(text))
    [made] = maker.take_unsaved()
    return made


def stale_push(config: HubConfig) -> tuple[Room, Metrics, list[object]]:
    """`b` lands one record, then `a` (which lists `hub_rebase`) pushes one made at revision 0;
    returns the room, its metrics and the messages `a` got for that push, decoded."""
    metrics = Metrics()
    room = Room("c", MemoryStore(), config, metrics)
    core = room.core
    core.load(None)
    [welcome] = core.join("a", Hello("a", core.lineage, 0, features=["hub_rebase"]))
    core.join("b", Hello("b", core.lineage, 0))
    assert isinstance(welcome, Send)
    hello_answer = decode_hub_message(welcome.frame)
    assert isinstance(hello_answer, Welcome)
    assert ("hub_rebase" in hello_answer.features) is config.hub_rebase
    first = core.push("b", PushBatch(1, core.lineage, 0, [record("from b")]), NOW)
    assert isinstance(first[-1], AppendRecords)
    core.resume(1)
    actions = core.push("a", PushBatch(1, core.lineage, 0, [record("from a")]), NOW)
    if isinstance(actions[-1], AppendRecords):
        actions = core.resume(2)
    to_a = [decode_hub_message(a.frame) for a in actions if isinstance(a, Send) and a.to == "a"]
    return room, metrics, list(to_a)


def test_hub_rebase_comes_from_the_environment() -> None:
    """`CONVSYNC_HUB_REBASE` sets `hub_rebase` (on by default); a bad value is a usage error."""
    assert HubConfig().hub_rebase is True
    assert HubConfig.from_env({"CONVSYNC_HUB_REBASE": "off"}).hub_rebase is False
    assert HubConfig.from_env({"CONVSYNC_HUB_REBASE": "1"}).hub_rebase is True
    with pytest.raises(UsageError):
        HubConfig.from_env({"CONVSYNC_HUB_REBASE": "sometimes"})


def test_a_room_places_stale_pushes_only_when_the_hub_config_says_so() -> None:
    """With `hub_rebase` on a room places the stale push and counts it in `pushes_placed`;
    with it off the same push is rejected `behind` and nothing is placed."""
    room, metrics, to_a = stale_push(HubConfig())
    assert isinstance(to_a[-1], Ack) and to_a[-1].revision == 2
    assert len(room.conversation) == 2
    assert (metrics.pushes_accepted, metrics.pushes_placed) == (2, 1)
    assert "convsync_pushes_placed_total 1\n" in metrics.render()

    room, metrics, to_a = stale_push(HubConfig(hub_rebase=False))
    [reject] = to_a
    assert isinstance(reject, Reject) and reject.reason == "behind"
    assert len(room.conversation) == 1
    assert (metrics.pushes_accepted, metrics.pushes_placed) == (1, 0)
    assert metrics.pushes_rejected["behind"] == 1
    assert "convsync_pushes_placed_total 0\n" in metrics.render()
