"""Two hubs on one store: replicas on both stay correct, and never get ahead of their hub."""

from __future__ import annotations

import anyio
import pytest
from conftest import bound, hub_config

from client import Replica, connect
from server import Hub, MemoryStore
from server.store import LogMoved
from sync import Conversation, Message, decode_record

CONVERSATION = "shared"


async def test_replicas_on_two_hubs_sharing_a_store_land_everything_and_never_run_ahead() -> None:
    """Replicas on two hubs push 20 messages each, 10 ms apart, on one conversation: every edit
    lands, no replica ever holds more of the log than its own hub's room, the loser of each
    race is rejected a bounded number of times (no resend spin), and after the hubs hear of
    the moves everyone holds the store's log."""
    store = MemoryStore()
    async with (
        Hub(store, config=hub_config()) as hub_a,
        Hub(store, config=hub_config()) as hub_b,
        connect(hub_a.url, CONVERSATION, client="writer-a") as a,
        connect(hub_b.url, CONVERSATION, client="writer-b") as b,
        connect(hub_a.url, CONVERSATION, client="watcher-a") as watcher,
    ):
        pairs: list[tuple[Replica, Hub]] = [(a, hub_a), (b, hub_b), (watcher, hub_a)]
        ahead: list[str] = []

        async def check_never_ahead() -> None:
            while True:
                for replica, hub in pairs:
                    room = hub._rooms.loaded.get(CONVERSATION)
                    confirmed = replica.session.confirmed
                    if room is not None and confirmed.lineage == room.lineage:
                        if confirmed.revision > room.revision:
                            ahead.append(f"{replica.client} {confirmed.revision}>{room.revision}")
                await anyio.sleep(0.001)

        async def write(replica: Replica, name: str) -> None:
            for k in range(20):
                replica.conversation.push(Message.user(f"{name} {k}"))
                await anyio.sleep(0.01)

        with anyio.fail_after(bound(30)):
            async with anyio.create_task_group() as group:
                group.start_soon(check_never_ahead)
                async with anyio.create_task_group() as writers:
                    writers.start_soon(write, a, "a")
                    writers.start_soon(write, b, "b")
                await a.flush()
                await b.flush()
                await hub_a.log_moved(CONVERSATION)
                await hub_b.log_moved(CONVERSATION)
                loaded = await store.load(CONVERSATION)
                assert loaded is not None
                for replica, _ in pairs:
                    await replica.wait_for(loaded.revision)
                group.cancel_scope.cancel()

        log = Conversation()
        for data in loaded.records:
            log.apply(decode_record(data))
        texts = sorted(m.content[0].text for m in log.messages())  # type: ignore[union-attr]
        assert texts == sorted([f"a {k}" for k in range(20)] + [f"b {k}" for k in range(20)])
        for replica, _ in pairs:
            assert replica.conversation == log
        assert ahead == []
        rejected = sum(hub_a.metrics.pushes_rejected.values()) + sum(
            hub_b.metrics.pushes_rejected.values()
        )
        assert rejected <= 100, rejected


async def test_a_lagging_hubs_rewrite_cannot_erase_another_hubs_acknowledged_records() -> None:
    """Hub B rewrites a conversation it last saw before hub A appended: the rewrite is
    refused with `LogMoved`, the acknowledged record stays, and B's replicas get it."""
    store = MemoryStore()
    async with (
        Hub(store, config=hub_config()) as hub_a,
        Hub(store, config=hub_config()) as hub_b,
        connect(hub_a.url, CONVERSATION, client="writer") as writer,
        connect(hub_b.url, CONVERSATION, client="watcher") as watcher,
    ):
        with anyio.fail_after(bound(10)):
            writer.conversation.push(Message.user("first"))
            await writer.flush()
            await hub_b.log_moved(CONVERSATION)
            await watcher.wait_for(1)
            writer.conversation.push(Message.user("acknowledged on A"))
            await writer.flush()  # acked: durable in the store; hub B has not heard of it
            with pytest.raises(LogMoved):
                await hub_b.rewrite(CONVERSATION, Conversation.from_messages([]))
            await watcher.wait_for(2)
        loaded = await store.load(CONVERSATION)
        assert loaded is not None and loaded.revision == 2
        texts = [m.content[0].text for m in watcher.conversation.messages()]  # type: ignore[union-attr]
        assert texts == ["first", "acknowledged on A"]
