"""Turns end (SPEC 10): a turn's owner, parked turns, and leases that let any hub finish a turn
whose worker went away, on the hub's real core and stores."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from server.store import Lease, LogStore
from sync import Aside, Assistant, Author, Conversation, Message, Text, ToolCall, TurnEnd, TurnOwner
from sync.steer import STEP_KIND, parked, step_value, turn_owner

WORKER = TurnOwner("anonymous", "worker")


def _asked() -> Conversation:
    conversation = Conversation()
    conversation.push(Message.user("find x"))
    return conversation


# ---------------------------------------------------------------------- the pure rules


def test_the_open_turn_names_its_owner_until_it_ends() -> None:
    """`turn_owner` is who runs the open turn, and nobody once it ended."""
    conversation = _asked()
    assert turn_owner(conversation) is None
    conversation.open_turn(WORKER)
    assert turn_owner(conversation) == WORKER
    conversation.push(Message.assistant("x"))
    conversation.end_turn(TurnEnd.answered(None))
    assert turn_owner(conversation) is None
    assert conversation.turns()[-1][1].owner == WORKER  # the ended record keeps it


def test_a_turn_record_without_an_owner_encodes_as_before() -> None:
    """A turn opened with no owner has the three fields it always had (old logs unchanged)."""
    conversation = _asked()
    conversation.open_turn()
    [(_, aside)] = conversation.asides()
    assert set(aside.value) == {"index", "start", "end"}


def test_a_turn_waiting_on_an_open_approval_or_a_frontend_tool_is_parked() -> None:
    """Parked: an open approval of the turn, or only frontend tools pending, and no model call."""
    conversation = _asked()
    conversation.open_turn(WORKER)
    assert not parked(conversation)
    conversation.push(Assistant([Text("asking"), ToolCall("c1", "pick_date", {})]))
    assert not parked(conversation)  # a tool the worker runs
    tools = conversation.add_aside(Aside("rig.tools", None, Author.rig(), {"tools": ["pick_date"]}))
    assert parked(conversation)  # only a person's frontend tool is pending
    step = conversation.add_aside(Aside(STEP_KIND, None, Author.rig(), step_value(0, 1)))
    assert not parked(conversation)  # a model call is under way
    conversation.remove_aside(step)
    conversation.remove_aside(tools)
    value = {"turn": 0, "key": "c1", "call": "c1", "state": "open"}
    approval = conversation.add_aside(Aside("rig.approval", None, Author.rig(), value))
    assert parked(conversation)
    conversation.replace_aside(
        approval, Aside("rig.approval", None, Author.rig(), {**value, "state": "approved"})
    )
    assert not parked(conversation)


# ---------------------------------------------------------------------- the stores


@pytest.fixture
async def any_store(backend: Callable[[], LogStore]) -> AsyncIterator[LogStore]:
    async with backend() as made:
        yield made


async def test_a_store_keeps_leases_and_finds_those_due(any_store: LogStore) -> None:
    """Leases are kept per turn, found once due, and a stop's deadline never moves later."""
    store = any_store
    await store.put_lease(Lease("c", 0, "worker", 1_000))
    await store.put_lease(Lease("d", 2, "other", None))  # parked: never due by its own
    assert await store.leases_due(999) == []
    assert await store.leases_due(1_000) == [Lease("c", 0, "worker", 1_000)]
    await store.put_lease(Lease("c", 0, "worker", 5_000))  # renewed
    assert await store.leases_due(4_999) == []
    await store.put_lease(Lease("d", 2, "other", None, stop_expires=3_000))  # a stop stands
    await store.put_lease(Lease("d", 2, "other", None, stop_expires=9_000))  # never later
    assert await store.leases_due(4_999) == [Lease("d", 2, "other", None, 3_000)]
    await store.put_lease(Lease("c", 0, "worker", 1), replace=False)  # a repair: none missing
    assert await store.leases_due(4_999) == [Lease("d", 2, "other", None, 3_000)]
    await store.drop_lease("d", 2)
    await store.drop_lease("d", 2)  # gone already: nothing
    assert await store.leases_due(10_000) == [Lease("c", 0, "worker", 5_000)]
