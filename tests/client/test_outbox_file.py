"""The outbox file keeps a consistent pair (SPEC 14): at any moment its confirmed value with its
pending records on top is the replica's value, and a replica restarted from it converges."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from fakelink import FakeHub, Link, settle
from strategies import Run, draw_op

from client.outbox import Kept, Outbox, _load
from client.session import ReplicaSession
from sync import Conversation


class OutboxLink(Link):
    """A link whose session's messages and pushes go through its outbox, as `Replica` does."""

    outbox: Outbox

    def pump(self) -> bool:
        if not self.open:
            return False
        frame, conflicts, written = self.outbox.next_push(0.0)
        self.events += conflicts
        if written is not None:
            written.result()  # the seq is in the file before the frame goes
        if frame is not None:
            self.to_hub.append(frame)
            return True
        return False

    def deliver_to_replica(self, drop: bool = False) -> bool:
        from sync.protocol import decode_hub_message

        if not self.open or not self.to_replica:
            return False
        data = self.to_replica.popleft()
        if not drop:
            self.events += self.outbox.receive(decode_hub_message(data))
        return True


async def replica(hub: FakeHub, path: Path, name: str) -> OutboxLink:
    """A session resumed from (or starting) the outbox at `path`, on a link of the fake hub."""
    session = ReplicaSession(name)
    outbox = Outbox(path)
    await outbox.open(session, "c", client=None, fresh_value=False)
    session.local.on_edit(outbox.edited)
    link = OutboxLink(hub, session)
    link.outbox = outbox
    return link


def kept(link: OutboxLink) -> Kept:
    """What the file holds now, read on the outbox's own thread once its writes are done."""
    writer = link.outbox._writer
    assert writer is not None
    writer.write(lambda db: None).result()  # every write queued before it has committed
    db = writer.db
    assert db is not None
    return writer.call(lambda: _load(db, link.outbox.path, "c")).result()  # type: ignore[no-any-return]


def value_of(file: Kept) -> Conversation:
    value = file.confirmed.copy()
    for _, record in file.pending:
        value.replay(record)
    return value


@pytest.mark.parametrize("seed", range(12))
async def test_the_file_always_holds_the_replicas_value_and_restarts_converge(
    seed: int, tmp_path: Path
) -> None:
    """Random edits by two replicas with outboxes, cuts, lost frames and restarts from the
    file: after every step the file's confirmed value plus its pending records equals the
    replica's value, with the batch in flight under the session's seq; at the end both equal
    the hub, nothing pending."""
    rng = random.Random(seed)
    hub = FakeHub()
    paths = [tmp_path / "a.outbox", tmp_path / "b.outbox"]
    links = [await replica(hub, paths[0], "a"), await replica(hub, paths[1], "b")]
    settle(links)
    for _ in range(200):
        k = rng.randrange(2)
        link = links[k]
        roll = rng.random()
        if roll < 0.45:
            Run(conversation=link.session.local).do(draw_op(rng))
        elif roll < 0.55:
            link.cut()
        elif roll < 0.62:
            await link.outbox.close()  # the process dies; a new one opens the file
            links[k] = link = await replica(hub, paths[k], link.session.client)
        elif not link.open:
            link.connect()
        else:
            move = rng.random()
            if move < 0.3:
                link.pump()
            elif move < 0.6:
                link.deliver_to_hub()
            elif move < 0.65:  # a lost frame comes with a lost connection
                link.deliver_to_replica(drop=True)
                link.cut()
            else:
                link.deliver_to_replica()
        for each in links:
            file = kept(each)
            assert value_of(file) == each.session.local, f"seed {seed}: file and value differ"
            sent = [seq for seq, _ in file.pending if seq is not None]
            if sent:
                assert set(sent) == {file.seq} and file.seq <= each.session.seq
    settle(links)
    for each in links:
        settle(links)
        assert each.session.settled and each.session.local == hub.conversation
        file = kept(each)
        assert file.pending == [] and value_of(file) == hub.conversation
        await each.outbox.close()
