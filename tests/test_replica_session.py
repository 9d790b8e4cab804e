"""The replica's protocol logic over a fake link: catch-up, acks, rejects, rebase, conflicts."""

from __future__ import annotations

from typing import Any

from fakelink import FakeHub, Link, settle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import Run, operations

from client.session import Connected, Rebased, ReplicaSession, Reset
from sync import Author, Conversation, Message
from sync.protocol import decode_hub_message
from sync.rebase import Conflict


def replica(hub: FakeHub, name: str) -> tuple[ReplicaSession, Link]:
    session = ReplicaSession(name)
    return session, hub.link(session)


def test_fresh_replica_catches_up_and_mirrors() -> None:
    """A new replica takes the log and then sees every record another replica pushes."""
    hub = FakeHub()
    worker, wlink = replica(hub, "worker")
    settle([wlink])
    worker.local.extend([Message.user("q"), Message.assistant("a")])
    ui, ulink = replica(hub, "ui")
    settle([wlink, ulink])
    assert ui.local == worker.local == hub.conversation
    assert any(isinstance(event, Connected) for event in ulink.events)
    worker.local.push(Message.user("more"))
    settle([wlink, ulink])
    assert ui.local == hub.conversation and ui.confirmed.revision == len(hub.log)


def test_concurrent_pushes_rebase_without_conflict() -> None:
    """Two replicas pushing at once both land: the loser is rejected `behind` and rebases."""
    hub = FakeHub()
    a, alink = replica(hub, "a")
    b, blink = replica(hub, "b")
    settle([alink, blink])
    a.local.push(Message.user("from a"))
    b.local.push(Message.user("from b"))
    alink.pump()
    blink.pump()
    settle([alink, blink])
    assert a.local == b.local == hub.conversation
    assert len(hub.conversation) == 2
    assert "behind" in hub.rejected
    assert any(isinstance(event, Rebased) for event in alink.events + blink.events)
    assert not [e for e in alink.events + blink.events if isinstance(e, Conflict)]


def test_splice_of_entries_removed_elsewhere_is_a_conflict() -> None:
    """A splice whose entries another replica removed is reported, and nothing else is lost."""
    hub = FakeHub()
    a, alink = replica(hub, "a")
    b, blink = replica(hub, "b")
    a.local.extend([Message.user("one"), Message.user("two")])
    settle([alink, blink])
    b.local.splice(range(0, 2), [Message.user("summary")], Author.plugin("compact"))
    a.local.edit_each(Author.user(), lambda ref: Message.user("ONE") if ref.index == 0 else None)
    a.local.push(Message.user("three"))
    blink.pump()
    settle([blink])
    settle([alink, blink])
    conflicts = [e for e in alink.events if isinstance(e, Conflict)]
    assert [c.reason for c in conflicts] == ["removed_moved"]
    assert a.local == b.local == hub.conversation
    assert [m for m in hub.conversation.messages()] == [
        Message.user("summary"),
        Message.user("three"),
    ]


def test_lost_ack_is_not_resent_twice() -> None:
    """A batch whose ack was lost is known to have landed from the welcome: once in the log."""
    hub = FakeHub()
    a, alink = replica(hub, "a")
    settle([alink])
    a.local.push(Message.user("once"))
    alink.pump()
    alink.deliver_to_hub()
    alink.deliver_to_replica(drop=True)  # the ack
    assert a.pending == 1
    alink.cut()
    settle([alink])
    assert len(hub.log) == 1 and a.pending == 0
    assert a.local == hub.conversation


def test_resent_push_gets_the_original_ack() -> None:
    """The hub answers a duplicate push with the ack it gave the first, appending nothing."""
    hub = FakeHub()
    a, alink = replica(hub, "a")
    settle([alink])
    a.local.push(Message.user("once"))
    alink.pump()
    frame = alink.to_hub[0]
    alink.deliver_to_hub()
    alink.to_hub.append(frame)
    alink.deliver_to_hub()
    first, second = (decode_hub_message(data) for data in alink.to_replica)
    assert first == second
    assert len(hub.log) == 1


def test_invalid_push_is_a_conflict_and_later_edits_survive() -> None:
    """A rejected batch is reported as conflicts; edits made after it are replayed."""
    hub = FakeHub()  # strict pairing: a result that answers no call is refused
    b, blink = replica(hub, "b")
    settle([blink])
    b.local.push(Message.tool_result("no-such-call", "lookup", "bad"))
    blink.pump()
    b.local.push(Message.user("later"))
    settle([blink])
    conflicts = [e for e in blink.events if isinstance(e, Conflict)]
    assert [c.reason for c in conflicts] == ["invalid"]
    assert b.local == hub.conversation
    assert hub.conversation.messages() == [Message.user("later")]


def test_rewritten_log_sends_state_and_pending_replays() -> None:
    """After the log is rewritten under a new lineage, replicas reread and replay pending."""
    hub = FakeHub()
    a, alink = replica(hub, "a")
    a.local.push(Message.user("old"))
    settle([alink])
    alink.cut()
    a.local.push(Message.user("pending"))
    hub.rewrite(Conversation.from_messages([Message.user("new history")]))
    settle([alink])
    assert any(isinstance(event, Reset) for event in alink.events)
    assert a.local == hub.conversation
    assert hub.conversation.messages() == [Message.user("new history"), Message.user("pending")]


def test_too_large_record_is_refused_locally() -> None:
    """A record over the frame limit is refused before sending, with a conflict."""
    hub = FakeHub()
    session = ReplicaSession("big", max_frame=4096)
    link = hub.link(session)
    settle([link])
    session.local.push(Message.user("x" * 10_000))
    session.local.push(Message.user("small"))
    settle([link])
    assert [e.reason for e in link.events if isinstance(e, Conflict)] == ["too_large"]
    assert hub.conversation.messages() == [Message.user("small")]
    assert session.local == hub.conversation


replica_steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("edit"),
            st.integers(0, 2),
            # A reset replaces everything by design; "nothing lost" is about the other edits.
            operations.filter(lambda op: op[0] != "reset"),
        ),
        st.tuples(st.just("pump"), st.integers(0, 2)),
        st.tuples(st.just("to_hub"), st.integers(0, 2)),
        st.tuples(st.just("to_replica"), st.integers(0, 2)),
        st.tuples(st.just("drop_to_replica"), st.integers(0, 2)),
        st.tuples(st.just("cut"), st.integers(0, 2)),
        st.tuples(st.just("connect"), st.integers(0, 2)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replica_steps)
def test_replicas_converge_and_lose_nothing(steps: list[tuple[Any, ...]]) -> None:
    """Whatever the interleaving of edits, deliveries, lost messages and cuts, replicas end
    equal to the hub; every entry a replica pushed is in the log or reported in a conflict;
    the log refolds to the hub's value."""
    hub = FakeHub()
    sessions = [ReplicaSession(f"r{k}") for k in range(3)]
    links = [hub.link(session) for session in sessions]
    runs = [Run(conversation=session.local) for session in sessions]
    for step in steps:
        kind, k = step[0], step[1]
        link = links[k]
        match kind:
            case "edit":
                runs[k].do(step[2])
            case "pump":
                link.pump()
            case "to_hub":
                link.deliver_to_hub()
            case "to_replica":
                link.deliver_to_replica()
            case "drop_to_replica":
                if link.deliver_to_replica(drop=True):
                    link.cut()  # a lost message always comes with a lost connection
            case "cut":
                link.cut()
            case "connect":
                if not link.open:
                    link.connect()
    settle(links)
    for session in sessions:
        assert session.local == hub.conversation
        assert session.pending == 0
    assert hub.refolded() == hub.conversation
    for link, run in zip(links, runs, strict=True):
        conflicted = {
            entry.id
            for event in link.events
            if isinstance(event, Conflict)
            for entry in getattr(event.record.change, "entries", [])
        }
        for id_ in run.minted:
            assert (
                hub.conversation.holds(id_) or hub.conversation.is_retired(id_) or id_ in conflicted
            ), id_
