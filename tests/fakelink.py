"""A hub in memory with the protocol's rules, linked to `ReplicaSession`s without sockets.

Like h11's `ConnectionPair`: a test decides when each message crosses, in which order, and can
cut a link (messages in transit are lost). Every message crosses as JSON bytes, so the codecs
are exercised too. The hub side follows SPEC §2.4: catch-up by records or state, idempotent
pushes by seq, reject `behind`/`lineage`/`invalid`, broadcast to everyone but the pusher.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import msgspec

from client.session import Event, ReplicaSession
from sync import ApplyError, ChangeRecord, Conversation, Lineage, encode
from sync.protocol import (
    Ack,
    Hello,
    PushBatch,
    PushOrigin,
    Records,
    Reject,
    State,
    Welcome,
    decode_client_message,
    decode_hub_message,
    encode_message,
)


class Link:
    """One connection between a replica session and the fake hub."""

    def __init__(self, hub: FakeHub, session: ReplicaSession) -> None:
        self.hub = hub
        self.session = session
        self.to_hub: deque[bytes] = deque()
        self.to_replica: deque[bytes] = deque()
        self.open = False
        self.events: list[Event] = []

    def connect(self) -> None:
        """Open a new connection: the replica says hello."""
        self.to_hub.clear()
        self.to_replica.clear()
        self.open = True
        self.to_hub.append(encode_message(self.session.hello()))

    def cut(self) -> None:
        """Drop the connection; what is in transit is lost."""
        if self.open:
            self.open = False
            self.to_hub.clear()
            self.to_replica.clear()
            self.hub.links.discard(self)
            self.events += self.session.disconnected("cut")

    def pump(self) -> bool:
        """Let the replica send its next push, if it may. Whether one went."""
        if not self.open:
            return False
        frame, conflicts = self.session.next_push()
        self.events += conflicts
        if frame is not None:
            self.to_hub.append(frame)
            return True
        return False

    def deliver_to_hub(self) -> bool:
        if not self.open or not self.to_hub:
            return False
        self.hub.receive(self, self.to_hub.popleft())
        return True

    def deliver_to_replica(self, drop: bool = False) -> bool:
        if not self.open or not self.to_replica:
            return False
        data = self.to_replica.popleft()
        if not drop:
            self.events += self.session.receive(decode_hub_message(data))
        return True


class FakeHub:
    """The log of one conversation, with the hub's rules and no durability."""

    def __init__(self) -> None:
        self.conversation = Conversation()
        self.lineage = Lineage.fresh()
        self.log: list[ChangeRecord] = []
        self.marks: dict[str, tuple[int, int, int]] = {}
        self.links: set[Link] = set()
        self.rejected: list[str] = []
        self.refuse: Callable[[ChangeRecord], bool] = lambda record: False  # strict rules

    def link(self, session: ReplicaSession) -> Link:
        link = Link(self, session)
        link.connect()
        return link

    def send(self, link: Link, message: msgspec.Struct) -> None:
        link.to_replica.append(encode_message(message))

    def receive(self, link: Link, data: bytes) -> None:
        message = decode_client_message(data)
        if isinstance(message, Hello):
            self.hello(link, message)
        else:
            assert isinstance(message, PushBatch)
            self.push(link, message)

    def hello(self, link: Link, hello: Hello) -> None:
        mark = self.marks.get(hello.client)
        self.send(link, Welcome(self.lineage, len(self.log), mark[0] if mark else 0))
        fresh = hello.lineage == Lineage.EMPTY and hello.revision == 0
        if (hello.lineage == self.lineage or fresh) and hello.revision <= len(self.log):
            if hello.revision < len(self.log):
                self.send(link, Records(hello.revision, self.log[hello.revision :]))
        else:
            self.send_state(link)
        self.links.add(link)

    def send_state(self, link: Link) -> None:
        self.send(link, State(self.lineage, len(self.log), self.conversation.state()))

    def push(self, link: Link, batch: PushBatch) -> None:
        client = link.session.client
        mark = self.marks.get(client)
        if mark is not None and batch.seq <= mark[0]:
            self.send(link, Ack(batch.seq, mark[1], mark[2]))
            return
        revision = len(self.log)
        if batch.lineage != self.lineage and not (batch.lineage == 0 and revision == 0):
            self.reject(link, batch, "lineage")
            self.send_state(link)
            return
        if batch.revision != revision:
            self.reject(link, batch, "behind")
            return
        if any(self.refuse(record) for record in batch.records):
            self.reject(link, batch, "invalid", "refused")
            return
        try:
            self.conversation.apply_batch(batch.records)
        except ApplyError as error:
            self.reject(link, batch, "invalid", str(error))
            return
        self.log.extend(batch.records)
        self.marks[client] = (batch.seq, revision, len(self.log))
        self.send(link, Ack(batch.seq, revision, len(self.log)))
        for other in self.links:
            if other is not link:
                self.send(other, Records(revision, batch.records, PushOrigin(client, batch.seq)))

    def reject(self, link: Link, batch: PushBatch, reason: str, detail: str = "") -> None:
        self.rejected.append(reason)
        self.send(link, Reject(batch.seq, reason, detail, self.lineage, len(self.log)))  # type: ignore[arg-type]

    def rewrite(self, conversation: Conversation) -> None:
        """Replace the log with one reset under a fresh lineage; every link gets the state."""
        from sync import Reset

        self.lineage = Lineage.fresh()
        self.log = [ChangeRecord(Reset(conversation.state()))]
        self.conversation = Conversation()
        self.conversation.apply(self.log[0])
        for link in self.links:
            self.send_state(link)

    def refolded(self) -> Conversation:
        """The log folded from scratch (the fold law on the hub side)."""
        conversation = Conversation()
        for record in self.log:
            conversation.apply(msgspec.json.decode(encode(record), type=ChangeRecord))
        return conversation


def settle(links: list[Link], rounds: int = 10_000) -> None:
    """Reconnect every link and move messages until nothing is left to send."""
    for link in links:
        if not link.open:
            link.connect()
    for _ in range(rounds):
        moved = False
        for link in links:
            moved |= link.pump()
            while link.deliver_to_hub():
                moved = True
            while link.deliver_to_replica():
                moved = True
        if not moved:
            return
    raise AssertionError("the links did not settle")
