"""A placed push whose ack was lost is reported as it landed (found by chaos seeds 8, 36, 81)."""

from __future__ import annotations

import pytest
from fakelink import FakeHub, Link, settle

from client.session import ReplicaSession
from sync import ChangeRecord, Message
from sync.protocol import Ack, Records, decode_hub_message


def change_of(record: ChangeRecord) -> tuple[object, object]:
    """What identifies a record in the log (the hub stamps `at`)."""
    return (record.change, record.by)


def placed_splice(hub: FakeHub) -> tuple[ReplicaSession, Link, list[tuple[int, list[object]]]]:
    """`a` splices entry 1 while `b` inserts at the front first: the hub places `a`'s splice
    one entry further on (a different record than `a` sent). Returns `a`, its link (the
    hub's records and ack for the placed push still in transit) and `a`'s landed reports."""
    a = ReplicaSession("a")
    alink = hub.link(a)
    b = ReplicaSession("b")
    blink = hub.link(b)
    reports: list[tuple[int, list[object]]] = []
    a.on_landed = lambda seq, records: reports.append((seq, [change_of(r) for r in records]))
    a.local.extend([Message.user("zero"), Message.user("one")])
    settle([alink, blink])
    reports.clear()
    b.local.splice(range(0, 0), [Message.user("front")], None)
    blink.pump()
    blink.deliver_to_hub()
    a.local.splice(range(1, 2), [Message.user("ONE")], None)
    assert alink.pump()
    assert alink.deliver_to_hub()  # made at revision 2, placed at 3
    assert [type(decode_hub_message(f)) for f in alink.to_replica][-2:] == [Records, Ack]
    assert not hub.rejected
    return a, alink, reports


@pytest.mark.parametrize("records_arrived", [False, True])
def test_a_placed_push_whose_ack_was_lost_is_reported_as_it_landed(records_arrived: bool) -> None:
    """The hub placed a push (re-targeted its splice), then the connection dropped before
    the ack (and, or not, before the placed records): after the reconnect the replica reports
    the batch with the records the log holds, not the ones it sent, and mirrors the hub."""
    hub = FakeHub()
    a, alink, reports = placed_splice(hub)
    [placed] = [change_of(r) for r in hub.log[-1:]]
    while len(alink.to_replica) > 1:  # the welcome, catch-up, b's records, a's placed records
        alink.deliver_to_replica(drop=not records_arrived and len(alink.to_replica) == 2)
    alink.cut()  # the ack is lost with the connection
    settle([alink])
    assert reports == [(2, [placed])]
    assert a.local == a.confirmed == hub.conversation
    assert a.pending == 0
