"""The replica's live state over the fake link: drafts produced and watched, without sockets."""

from __future__ import annotations

from fakelink import FakeHub, Link, settle

from client.live import FEATURES, DraftEnded, LiveState
from client.session import ReplicaSession
from sync.budget import Budget
from sync.ids import IdMinter
from sync.protocol import DraftEnd, DraftState, Welcome, encode_message

_ids = IdMinter()


def send_live(link: Link, now: float = 0.0) -> None:
    """Queue the draft ops and status the replica would send now."""
    live = link.session.live
    status = live.status_to_send()
    if status is not None:
        link.to_hub.append(encode_message(status))
    for op in live.ops_to_send(now, keep_every=10.0):
        link.to_hub.append(encode_message(op))


def move(links: list[Link], rounds: int = 3) -> None:
    """Move messages, then live ops (the shell sends them after every frame it receives)."""
    settle(links)
    hub = links[0].hub
    for _ in range(rounds):
        for link in links:
            send_live(link)
        settle(links)
        hub.tick(hub.now + 100)  # past the draft interval and the presence throttle
        settle(links)


def test_a_producer_cut_mid_draft_resends_only_what_the_hub_lacks() -> None:
    """The worker's link is cut with appends in transit; after it reconnects it reopens the
    draft, the hub answers with its lengths, and the UI ends with the text exactly once."""
    hub = FakeHub()
    worker = hub.link(ReplicaSession("worker", features=FEATURES))
    ui = hub.link(ReplicaSession("ui", features=FEATURES))
    settle([worker, ui])
    live = worker.session.live
    d = _ids.message_id()
    live.open(d, None, None, 0.0)
    live.append(d, "Hello, ", "text", None)
    move([worker, ui])
    assert ui.session.live.drafts[d].text == "Hello, "
    live.append(d, "wor", "text", None)
    send_live(worker)
    worker.cut()  # "wor" was in transit: lost
    live.append(d, "ld!", "text", None)
    worker.connect()
    move([worker, ui])
    assert ui.session.live.drafts[d].text == "Hello, world!"
    assert hub.core.drafts.text(d) == "Hello, world!"


def test_a_gap_makes_the_producer_reopen_and_resend_from_the_hubs_lengths() -> None:
    """After `draft_end gap` the producer opens again (a higher epoch) and sends nothing
    more until `draft_state` says what the hub holds; then it resends from there."""
    live = LiveState()
    live.welcomed(Welcome(1, 0, 0, ["drafts"]))
    d = _ids.message_id()
    live.open(d, None, None, 0.0)
    live.append(d, "abcdef", "text", None)
    [opened, appended] = live.ops_to_send(0.0, 10.0)
    assert (opened.op, appended.op, appended.offset, appended.text) == (
        "open",
        "append",
        0,
        "abcdef",
    )
    live.receive(DraftEnd(d, "gap", ""))
    [reopened] = live.ops_to_send(1.0, 10.0)
    assert reopened.op == "open" and reopened.epoch == 1
    assert live.ops_to_send(1.0, 10.0) == []  # waiting for the hub's lengths
    live.receive(DraftState(d, {"text": 2}))
    [resent] = live.ops_to_send(2.0, 10.0)
    assert (resent.offset, resent.text) == (2, "cdef")


def test_a_silent_draft_is_kept_alive_every_keep_interval() -> None:
    """With nothing appended for `keep_every` seconds, one `keep` goes."""
    live = LiveState()
    live.welcomed(Welcome(1, 0, 0, ["drafts"]))
    d = _ids.message_id()
    live.open(d, None, None, 0.0)
    assert [op.op for op in live.ops_to_send(0.0, 10.0)] == ["open"]
    assert live.ops_to_send(9.9, 10.0) == []
    assert [op.op for op in live.ops_to_send(10.0, 10.0)] == ["keep"]
    assert live.ops_to_send(15.0, 10.0) == []


def test_appends_go_at_once_within_the_draft_budget_and_together_past_it() -> None:
    """Within the hub's draft budget (`welcome.limits`, paced at 0.9 of its rate and half its
    burst) every append is its own op, sent when made; once the burst is spent nothing goes
    until a token is back (`paced_until`), and what was appended meanwhile goes as one op
    carrying all of it, from the offset the hub has."""
    live = LiveState()
    live.welcomed(Welcome(1, 0, 0, ["drafts"], limits={"draft": Budget(10.0, 4.0)}))
    d = _ids.message_id()
    live.open(d, None, None, 0.0)
    live.append(d, "a", "text", None)
    assert [op.op for op in live.ops_to_send(0.0, 10.0)] == ["open", "append"]  # 2 of 2
    live.append(d, "b", "text", None)
    assert live.ops_to_send(0.0, 10.0) == []  # the paced burst (2) is spent
    assert live.paced_until == 1 / 9  # one token back at 9 a second
    for token in "cde":
        live.append(d, token, "text", None)
        assert live.ops_to_send(0.05, 10.0) == []
    [together] = live.ops_to_send(1 / 9, 10.0)
    assert (together.offset, together.text, live.paced_until) == (1, "bcde", None)
    live.append(d, "f", "text", None)
    assert live.ops_to_send(1 / 9 + 0.01, 10.0) == []
    [alone] = live.ops_to_send(2 / 9, 10.0)
    assert (alone.offset, alone.text) == (5, "f")


def test_without_a_draft_budget_nothing_is_held_back() -> None:
    """A hub that meters no drafts (no `limits`): every append goes when asked."""
    live = LiveState()
    live.welcomed(Welcome(1, 0, 0, ["drafts"]))
    d = _ids.message_id()
    live.open(d, None, None, 0.0)
    sent = []
    for i in range(500):
        live.append(d, str(i % 10), "text", None)
        sent += live.ops_to_send(0.0, 10.0)
    assert len(sent) == 501 and live.paced_until is None


def test_a_refused_op_ends_the_producers_draft_but_not_the_one_it_watches() -> None:
    """`draft_end refused` goes to the sender only: its own writer ends, the draft it sees
    (another client's) stays."""
    hub = FakeHub()
    worker = hub.link(ReplicaSession("worker", features=FEATURES))
    intruder = hub.link(ReplicaSession("intruder", features=FEATURES))
    settle([worker, intruder])
    d = _ids.message_id()
    worker.session.live.open(d, None, None, 0.0)
    worker.session.live.append(d, "mine", "text", None)
    move([worker, intruder])
    intruder.session.live.open(d, None, None, 0.0)
    intruder.session.live.append(d, "theirs", "text", None)
    intruder.events.clear()
    move([worker, intruder])
    assert DraftEnded(d, "refused") in intruder.events
    assert intruder.session.live.drafts[d].text == "mine"
    assert hub.core.drafts.text(d) == "mine"
