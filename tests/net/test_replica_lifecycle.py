"""A `Replica`'s waits end: after it is closed, after its connection task fails, and when a
bad argument is given (at once, not after the hub refuses it for good). Found by a review
at stop 22; each test fails on the replica before it."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from conftest import bound, hub_config

from client import Replica, connect
from client.live import LiveState
from server import Hub, MemoryStore
from sync import Message, UsageError
from sync.protocol import DraftInfo, Drafts, Welcome


async def test_waits_on_a_closed_replica_raise_instead_of_hanging() -> None:
    """`flush`, `wait_for` and a `flush` already waiting when another task closes the
    replica raise `UsageError` (`closed`); `events()` ends."""
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub:
        replica = connect(hub.url, "c", client="w")
        await replica.__aenter__()
        replica.conversation.push(Message.user("hello"))
        await replica.flush()
        await replica.aclose()
        with anyio.fail_after(bound(2)):
            for wait in (replica.flush(), replica.wait_for(10)):
                with pytest.raises(UsageError) as closed:
                    await wait
                assert closed.value.reason == "closed"
            assert [event async for event in replica.events()] != []  # the queue, then the end

        other = connect(hub.url, "c", client="w2")
        await other.__aenter__()
        waiting = asyncio.create_task(other.wait_for(1_000))
        await asyncio.sleep(0.05)
        await other.aclose()
        with anyio.fail_after(bound(2)), pytest.raises(UsageError):
            await waiting


async def test_a_replica_is_entered_once() -> None:
    """Entering a replica twice (open or closed) is refused: it started a second connection
    loop on the same session, or returned a dead replica as if connected."""
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub:
        replica = connect(hub.url, "c", client="w")
        async with replica:
            with pytest.raises(UsageError) as again:
                await replica.__aenter__()
            assert again.value.reason == "reentered"
        with pytest.raises(UsageError):
            await replica.__aenter__()


async def test_closing_does_not_swallow_the_callers_cancellation() -> None:
    """A task cancelled while it closes a replica is cancelled (`aclose` awaited the
    connection task under a `suppress(CancelledError)` that caught the caller's too)."""
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub:
        replica = connect(hub.url, "c", client="w")
        await replica.__aenter__()
        entered = asyncio.Event()

        async def close_then_go_on() -> str:
            entered.set()
            await replica.aclose()
            await asyncio.sleep(0)
            return "went on"

        closing = asyncio.create_task(close_then_go_on())
        await entered.wait()
        closing.cancel()
        with anyio.fail_after(bound(5)), pytest.raises(asyncio.CancelledError):
            await closing
        await replica.aclose()  # a second close waits for the task, which has ended


async def test_a_failing_token_callable_is_a_failed_attempt_not_a_dead_replica() -> None:
    """A token callable that raises (its service is down) fails that connection attempt:
    the replica says so and tries again, instead of its connection task dying unseen with
    every `flush` hanging. A token of the wrong type is refused when the replica is made."""
    with pytest.raises(UsageError) as bad:
        Replica("ws://127.0.0.1:1", "c", token=b"secret")  # type: ignore[arg-type]
    assert bad.value.reason == "bad_token" and "secret" not in str(bad.value)

    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionRefusedError("token service down: password=hunter2")
        return "a token"

    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub:
        replica = Replica(hub.url, "c", client="w", token=flaky, backoff=0.01)
        async with replica:  # the first attempt fails, the second connects
            assert calls == 2
            replica.conversation.push(Message.user("hello"))
            with anyio.fail_after(bound(5)):
                await replica.flush()


async def test_a_connection_task_that_fails_is_raised_to_the_waiters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever kills the connection task (a bug) reaches `flush` and `__aenter__`, with
    its own type: the waits hung, and entering took the whole connect timeout to raise a
    bare `TimeoutError`."""
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub:

        async def broken(self: Replica) -> None:
            raise RuntimeError("a bug in the connection loop")

        monkeypatch.setattr(Replica, "_run", broken)
        replica = Replica(hub.url, "c", client="w", connect_timeout=bound(30))
        with anyio.fail_after(bound(5)), pytest.raises(RuntimeError, match="a bug"):
            await replica.__aenter__()


async def test_a_status_the_hub_would_refuse_is_refused_at_the_call() -> None:
    """A status over 64 characters, a detail over 1 KiB or not JSON: the hub answers
    `bad_message`, which stops a replica for good, so `set_status` refuses it at once."""
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as hub:
        async with connect(hub.url, "c", client="w") as replica:
            for status, detail in (("x" * 65, None), ("ok", "d" * 2000), ("ok", object())):
                with pytest.raises(UsageError) as bad:
                    await replica.set_status(status, detail)
                assert bad.value.reason == "bad_status"
            await replica.set_status("x" * 64, {"step": 1})
            replica.conversation.push(Message.user("still here"))
            with anyio.fail_after(bound(5)):
                await replica.flush()


def test_a_drafts_snapshot_cut_off_with_its_connection_is_dropped() -> None:
    """The first chunks of a drafts snapshot, then the connection is cut: the next
    connection's snapshot replaces it (it was appended to it, bringing back a draft that had
    ended meanwhile, which nothing would ever end)."""
    live = LiveState()
    welcome = Welcome("c", 0, 0, features=["drafts"])
    live.connecting()
    live.welcomed(welcome)
    ended = DraftInfo("d1", "assistant", "p", "a", 1)
    live.receive(Drafts([ended], more=True))  # then the connection is cut
    live.connecting()
    live.welcomed(welcome)
    live.receive(Drafts([DraftInfo("d2", "assistant", "p", "b", 2)]))
    assert list(live.drafts) == ["d2"]


async def test_a_draft_whose_commit_cannot_be_pushed_stays_open_to_abort() -> None:
    """`commit` with a message too large to push raises, and the draft is still open (to
    abort, or to commit something smaller): it was forgotten first, so nobody told the hub,
    and others kept showing it until its timeout."""
    config = hub_config(max_frame=8192)
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub:
        async with connect(hub.url, "c", client="w", max_frame=8192) as replica:
            draft = replica.draft()
            await draft.open()
            draft.append("thinking")
            with pytest.raises(UsageError) as big:
                await draft.commit(Message.assistant("x" * 20_000))
            assert big.value.reason == "too_large"
            assert draft.status is None
            assert draft.id in replica.session.live.own
            await draft.abort()
            assert draft.status == "aborted"


async def test_own_drafts_the_hub_ends_are_let_go() -> None:
    """Drafts of this replica that the hub ends (here `timeout`) stop counting as work for
    its live loop, keep their text for the writer (it may still commit it), and are let go
    when the writer is done: they stayed in the live state for good, and it never went quiet.
    (A first fix dropped the text at once, and the README's pattern then committed an empty
    message: a review of this stop's changes.)"""
    config = hub_config(draft_timeout=0.3)
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub:
        async with connect(hub.url, "c", client="w", keep_every=10.0) as replica:
            writers = []
            for _ in range(3):
                draft = await replica.draft().open()
                draft.append("z" * 10_000)
                writers.append(draft)
            with anyio.fail_after(bound(5)):
                await asyncio.gather(*(draft.wait_ended() for draft in writers))
            assert {draft.status for draft in writers} == {"timeout"}
            assert replica.session.live.quiet
            assert writers[0].text == "z" * 10_000
            await writers[0].commit(Message.assistant(writers[0].text))
            for draft in writers[1:]:
                await draft.abort()
            assert replica.session.live.own == {}
            with anyio.fail_after(bound(5)):
                await replica.flush()
            assert replica.conversation.entries()[-1].message.content[0].text == "z" * 10_000  # type: ignore[union-attr]


def test_a_kind_the_hub_would_refuse_is_refused_when_the_replica_is_made() -> None:
    """A hello's `kind` is 1 to 64 printable characters (the hub refuses others for good,
    `bad_message`): the replica refuses it when it is made (a review of this stop's
    changes: the hub's check came without the replica's)."""
    for kind in ("", "k" * 65, "a\nb"):
        with pytest.raises(UsageError) as bad:
            Replica("ws://127.0.0.1:1", "c", kind=kind)
        assert bad.value.reason == "bad_kind"
    Replica("ws://127.0.0.1:1", "c", kind="k" * 64)
