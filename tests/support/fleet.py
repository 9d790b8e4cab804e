"""A fleet for dashboard tests and `bench/dashboard.py`: many conversations written straight
into a hub's store, and a few of them kept busy by Python replicas, as agents would."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import msgspec

from client import connect
from server.store import LogStore
from sync import Conversation, Lineage, Message, encode

AT = 1_700_000_000_000


def fleet_ids(count: int, prefix: str = "fleet.") -> list[str]:
    """`fleet.0000`, `fleet.0001`, ...: ids that sort as their numbers."""
    return [f"{prefix}{n:04}" for n in range(count)]


def active_ids(ids: Sequence[str], active: int) -> list[str]:
    """`active` ids spread evenly over `ids` (every page by id has some)."""
    step = max(1, len(ids) // active)
    return list(ids[::step][:active])


async def seed_fleet(store: LogStore, ids: Sequence[str]) -> None:
    """One user message per conversation (`topic {n}`), appended to the store directly: a
    thousand conversations in well under a second, without a socket."""
    for n, conversation_id in enumerate(ids):
        maker = Conversation()
        maker.push(Message.user(f"topic {n:04}: the agent looks into ticket {n * 7919 % 10007}"))
        records = [encode(msgspec.structs.replace(r, at=AT)) for r in maker.take_unsaved()]
        await store.append(conversation_id, Lineage.fresh(), 0, records)


async def keep_busy(url: str, ids: Sequence[str], every: float, until: anyio.Event) -> int:
    """One replica per id pushing a message every `every` seconds (staggered) until `until` is
    set; returns the messages pushed (each one acknowledged)."""
    pushed = 0

    async def agent(at: int, conversation_id: str) -> None:
        nonlocal pushed
        async with connect(url, conversation_id, client=f"agent-{at}", kind="agent") as replica:
            with anyio.move_on_after(every * at / max(1, len(ids))):
                await until.wait()
            n = 0
            while not until.is_set():
                n += 1
                replica.conversation.push(Message.user(f"step {n} of {conversation_id}"))
                with anyio.fail_after(30):
                    await replica.flush()
                pushed += 1
                with anyio.move_on_after(every):
                    await until.wait()

    async with anyio.create_task_group() as group:
        for at, conversation_id in enumerate(ids):
            group.start_soon(agent, at, conversation_id)
    return pushed
