"""The summary row's totals (SPEC 17): usage summed from the log, queued input, open
approvals, kept from the records that land."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from conftest import bound, hub_config
from faultproxy import FaultProxy

import client
from client import connect
from client.replica import Replica
from server import Hub, SqliteStore
from server.tally import USAGE_FIELDS, Tally, is_open_approval
from sync import (
    Aside,
    Assistant,
    Author,
    Conversation,
    Message,
    Stop,
    Text,
    Usage,
    User,
    decode_record,
)
from sync.steer import queue_records

ID = "usage.1"


def reply(n: int) -> Assistant:
    """An assistant reply with a usage of its own (some fields left unreported)."""
    usage = Usage(
        input_tokens=1000 + n,
        output_tokens=7 * n + 1,
        cache_read_tokens=n if n % 2 else None,
        cache_write_tokens=None,
        reasoning_tokens=3 if n % 3 == 0 else None,
    )
    return Assistant([Text(f"reply {n}")], Stop("stop"), usage=usage)


def exchange(n: int) -> list[User | Assistant]:
    """A question and its reply (strict pairing takes no two replies in a row)."""
    return [Message.user(f"question {n}"), reply(n)]


async def usage_in_the_log(hub: Hub, conversation_id: str) -> dict[str, int]:
    """The usage of the assistant messages the log folds to, every record read from the store
    from revision 0 (no snapshot, no hub state): what the row must say."""
    loaded = await hub.store.load(conversation_id)
    assert loaded is not None
    records = await hub.store.read(conversation_id, loaded.lineage, 0)
    assert records is not None and len(records) == loaded.revision
    folded = Conversation()
    for data in records:
        folded.apply(decode_record(data))
    sums = dict.fromkeys(USAGE_FIELDS, 0)
    for message in folded.messages():
        if isinstance(message, Assistant) and message.usage is not None:
            for name in USAGE_FIELDS:
                sums[name] += getattr(message.usage, name) or 0
    return sums


async def listed_usage(hub: Hub) -> Any:
    page = await client.list_conversations(hub.url, prefix=ID)
    [row] = page.rows
    return row["usage"]


async def flushed(*replicas: Replica) -> None:
    with anyio.fail_after(bound(20)):
        for replica in replicas:
            await replica.flush()


async def race(a: Replica, b: Replica, start: int, count: int) -> None:
    """Two writers push replies at once, neither waiting for the other's."""
    for n in range(start, start + count):
        a.conversation.extend(exchange(n))
        b.conversation.extend(exchange(1000 + n))
        await anyio.sleep(0.002)
    await flushed(a, b)


async def test_usage_sums_exactly_across_resends_rebases_placement_and_a_restart(
    tmp_path: Path,
) -> None:
    """The row's `usage` equals the sum read from the log itself: after pushes sent twice and
    an ack lost, pushes the hub placed, pushes the replicas rebased, an edit and a removal
    of replies, and after a hub restart."""
    db = str(tmp_path / "hub.db")
    async with Hub(SqliteStore(db), host="127.0.0.1", port=0, config=hub_config()) as hub:
        async with FaultProxy(hub.url) as proxy:
            proxy.duplicate_to_hub = lambda frame: b'"type":"push"' in frame
            async with connect(proxy.url, ID, client="resender") as resender:
                for n in range(5):
                    resender.conversation.extend(exchange(n))
                    await anyio.sleep(0.001)
                await flushed(resender)
                dropped = proxy.drop_next(b'"type":"ack"')
                resender.conversation.extend(exchange(5))
                await flushed(resender)
                assert dropped and resender.connects >= 2, "no ack was lost"
        async with connect(hub.url, ID, client="a") as a, connect(hub.url, ID, client="b") as b:
            await race(a, b, 10, 15)
            # An edit in place changes a reply's usage; a removal takes one out.
            a.conversation.edit_each(
                Author.user(),
                lambda ref: reply(99) if ref.index == 1 else None,
            )
            a.conversation.splice(range(2, 4), [], Author.user())
            await flushed(a)
        assert hub.metrics.pushes_placed > 0, "no push was placed"
        expected = await usage_in_the_log(hub, ID)
        assert expected["input_tokens"] > 0
        assert await listed_usage(hub) == expected
    restarted = hub_config(hub_rebase=False)  # stale pushes are refused: the replicas rebase
    async with Hub(SqliteStore(db), host="127.0.0.1", port=0, config=restarted) as hub:
        assert await listed_usage(hub) == expected  # rebuilt from the log on load
        async with connect(hub.url, ID, client="a") as a, connect(hub.url, ID, client="b") as b:
            await race(a, b, 30, 15)
        assert hub.metrics.pushes_rejected["behind"] > 0, "no push was rebased"
        expected = await usage_in_the_log(hub, ID)
        with anyio.fail_after(bound(20)):
            async for window in client.summary(hub.url, prefix=ID):
                if window.rows[ID]["usage"] == expected:
                    break
        assert await listed_usage(hub) == expected


def test_queued_and_open_approvals_are_counted_as_asides_come_and_go() -> None:
    """`queued` counts the `rig.queued` asides standing; `approvals` the `rig.approval`
    asides still open (a decided one is not); both follow removals and a reset."""
    conversation = Conversation()
    conversation.push(Message.user("hello"))
    tally = Tally()
    tally.rebuild(conversation)
    conversation.take_unsaved()

    def step(edit: Any) -> None:
        edit()
        tally.track(conversation, conversation.take_unsaved())

    user = Author.user()
    ask = Aside("rig.approval", None, Author.agent("w"), {"turn": 0, "key": "c1", "state": "open"})
    step(lambda: conversation.add_aside(ask))
    [(approval, _)] = [(i, a) for i, a in conversation.asides() if a.kind == "rig.approval"]
    assert len(tally.approvals) == 1 and is_open_approval(ask)
    queued = Conversation()
    queued.push(Message.user("later"))
    [pushed] = queued.take_unsaved()
    replayed = queue_records([pushed], conversation.id(0))
    assert replayed is not None
    for record in replayed:
        conversation.apply(record)
    tally.track(conversation, replayed)
    assert len(tally.queued) == 1
    decided = Aside("rig.approval", None, user, {"turn": 0, "key": "c1", "state": "approved"})
    step(lambda: conversation.replace_aside(approval, decided))
    assert len(tally.approvals) == 0
    step(lambda: conversation.replace_aside(approval, ask))
    assert len(tally.approvals) == 1
    step(lambda: conversation.reset(Conversation.from_messages([Message.user("fresh")]), user))
    assert (len(tally.queued), len(tally.approvals), tally.usage()) == (0, 0, None)


async def test_a_row_counts_queued_input_and_open_approvals(hub: Hub) -> None:
    """A message typed while the agent is mid-step shows as `queued: 1` until it lands; an
    approval the agent asks for shows as `approvals: 1` until it is decided."""

    async def until_row(check: Any) -> dict[str, Any]:
        async for window in client.summary(hub.url, prefix="steered."):
            row = window.rows.get("steered.1")
            if row is not None and check(row):
                return row
        raise AssertionError("the feed ended")

    with anyio.fail_after(bound(30)):
        async with (
            connect(hub.url, "steered.1", client="worker", kind="agent") as worker,
            connect(hub.url, "steered.1", client="ui") as ui,
        ):
            ui.conversation.push(Message.user("find x"))
            await flushed(ui)
            await worker.wait_for(1)
            turn = worker.conversation.open_turn()
            worker.begin_step()
            await flushed(worker)
            await worker.wait_for(ui.conversation.revision)
            ui.conversation.push(Message.user("also y"))
            await flushed(ui)
            row = await until_row(lambda r: r["queued"] == 1)
            assert row["approvals"] == 0 and row["turn"]["state"] == "running"
            value = {
                "turn": turn.index,
                "key": "call_1",
                "call": None,
                "prompt": "may I?",
                "schema": None,
                "state": "open",
                "answer": None,
                "reason": None,
                "asked_by": "anonymous",
                "decided_by": None,
                "decided_at": None,
            }
            after = worker.conversation.id(len(worker.conversation) - 1)
            approval = worker.conversation.add_aside(
                Aside("rig.approval", after, Author.agent("worker"), value)
            )
            worker.conversation.push(reply(1))
            worker.end_step()
            await flushed(worker)
            row = await until_row(lambda r: r["queued"] == 0 and r["approvals"] == 1)
            assert row["last"]["text"] == "also y"  # the queued message landed
            decided = {**value, "state": "approved", "decided_by": "anonymous"}
            await ui.wait_for(worker.conversation.revision)
            ui.conversation.replace_aside(
                approval, Aside("rig.approval", after, Author.user(), decided)
            )
            await flushed(ui)
            row = await until_row(lambda r: r["approvals"] == 0)
            assert row["queued"] == 0


async def test_a_draft_the_hub_times_out_leaves_the_row_with_nothing_else_changing() -> None:
    """A producer opens a draft and goes silent on an open socket: the hub's tick ends the
    draft (timeout) and the row says no draft is open, though no push or op touched it."""
    import json

    from websockets.asyncio.client import connect as ws_connect

    from server import MemoryStore
    from sync.ids import IdMinter
    from sync.protocol import SUBPROTOCOL

    config = hub_config(draft_grace=0.2, draft_timeout=0.8)
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub:
        async with connect(hub.url, "ticked.1", client="asker") as asker:
            asker.conversation.push(Message.user("go"))
            await flushed(asker)
        opened: list[int] = []
        with anyio.fail_after(bound(20)):
            async with ws_connect(
                f"{hub.url}/v1/conversations/ticked.1", subprotocols=[SUBPROTOCOL]
            ) as raw:
                hello = {"type": "hello", "client": "w", "lineage": 0, "revision": 0}
                await raw.send(json.dumps({**hello, "features": ["drafts", "presence"]}))
                assert json.loads(await raw.recv())["type"] == "welcome"
                draft = {"type": "draft", "id": IdMinter().message_id(), "op": "open"}
                await raw.send(json.dumps(draft))
                async for window in client.summary(hub.url, prefix="ticked."):
                    row = window.rows["ticked.1"]
                    opened.append(row["drafts"]["open"])
                    if opened[-1] == 0 and 1 in opened:
                        break
    assert opened[-1] == 0 and 1 in opened
