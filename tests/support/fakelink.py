"""The hub's real core linked to `ReplicaSession`s without sockets.

Like h11's `ConnectionPair`: a test decides when each message crosses, in which order, and can
cut a link (messages in transit are lost). Every message crosses as JSON bytes, so the codecs
are exercised too. The hub side is the hub's own code: each link's frames go through a real
`HubSession`, then to one `RoomCore`, whose store calls run on a real `MemoryStore`. This
module only moves bytes; it holds no rule of the protocol.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

from client.session import Event, ReplicaSession
from server.auth import ANONYMOUS, Grant
from server.core import Action, CoreConfig, RoomCore, deliver
from server.drafts import DraftConfig
from server.room import store_call
from server.session import HubSession
from server.store import MemoryStore
from sync import ChangeRecord, Conversation, Lineage, decode_record
from sync.errors import ErrorCode, ProtocolError
from sync.frames import MAX_FRAME
from sync.protocol import (
    DraftOp,
    Error,
    Hello,
    PushBatch,
    StatusUpdate,
    decode_hub_message,
    encode_message,
)

T = TypeVar("T")

CONVERSATION = "fake"
NOW = 1_700_000_000_000  # the hub's clock, in ms: fixed, so runs repeat exactly


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a `MemoryStore` call to its end at once (it never awaits)."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coroutine.close()
    raise AssertionError("the memory store awaited")


class Link:
    """One connection between a replica session and the fake hub."""

    def __init__(self, hub: FakeHub, session: ReplicaSession, grant: Grant = ANONYMOUS) -> None:
        self.hub = hub
        self.session = session
        self.grant = grant  # what this link's token allows (the hub checks it with `auth`)
        self.to_hub: deque[bytes] = deque()
        self.to_replica: deque[bytes] = deque()
        self.open = False
        self.events: list[Event] = []
        self.hub_session = HubSession(hub.core.config.max_frame)

    def connect(self) -> None:
        """Open a new connection: the replica says hello."""
        self.to_hub.clear()
        self.to_replica.clear()
        self.open = True
        self.hub_session = HubSession(self.hub.core.config.max_frame)
        self.to_hub.append(encode_message(self.session.hello()))

    def cut(self) -> None:
        """Drop the connection; what is in transit is lost."""
        if self.open:
            self.open = False
            self.to_hub.clear()
            self.to_replica.clear()
            self.hub.core.leave(self)
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
    """One conversation on the hub's real core, over a `MemoryStore`, with no sockets."""

    def __init__(
        self,
        *,
        max_frame: int = MAX_FRAME,
        strict_pairing: bool = True,
        hub_rebase: bool = True,
        drafts: DraftConfig | None = None,
        store: MemoryStore | None = None,
        turn_grace: int | None = None,
        stop_grace: int = 10_000,
        auth: bool = False,
    ) -> None:
        self.store = store if store is not None else MemoryStore()
        config = CoreConfig(
            max_frame=max_frame,
            strict_pairing=strict_pairing,
            hub_rebase=hub_rebase,
            turn_grace=turn_grace,
            stop_grace=stop_grace,
            auth=auth,
        )
        if drafts is not None:
            config = dataclasses.replace(config, drafts=drafts)
        self.core: RoomCore[Link] = RoomCore(CONVERSATION, config)
        self.now = NOW  # the hub's clock (ms); tests move it and call `tick`
        self.core.load(run_now(self.store.load(CONVERSATION)))
        self.closed: list[tuple[Link, str]] = []  # links the hub closed, with the code

    # ------------------------------------------------------------------ what tests read

    @property
    def conversation(self) -> Conversation:
        return self.core.conversation

    @property
    def lineage(self) -> int:
        return self.core.lineage

    @property
    def log(self) -> list[ChangeRecord]:
        """The records the store holds, decoded."""
        records = run_now(self.store.read(CONVERSATION, self.core.lineage, 0))
        return [decode_record(data) for data in records or []]

    @property
    def rejected(self) -> list[str]:
        """The reasons of every reject the core sent."""
        return list(self.core.metrics.pushes_rejected.elements())

    def refolded(self) -> Conversation:
        """The log folded from scratch (the fold law on the hub side)."""
        conversation = Conversation()
        for record in self.log:
            conversation.apply(record)
        return conversation

    # ------------------------------------------------------------------ moving messages

    def link(self, session: ReplicaSession, grant: Grant = ANONYMOUS) -> Link:
        link = Link(self, session, grant)
        link.connect()
        return link

    def receive(self, link: Link, data: bytes) -> None:
        try:
            message = link.hub_session.receive(data)
        except ProtocolError as error:
            self._close(link, error.reason, error.message)  # type: ignore[arg-type]
            return
        match message:
            case Hello():
                grant = link.grant if self.core.config.auth else ANONYMOUS  # as the hub does
                self._carry_out(self.core.join(link, message, self.now, grant))
            case PushBatch():
                self._carry_out(self.core.push(link, message, NOW))
            case DraftOp():
                self._carry_out(self.core.draft(link, message, self.now))
            case StatusUpdate():
                self._carry_out(self.core.status(link, message, self.now))

    def tick(self, now: int) -> None:
        """Move the hub's clock to `now` and carry out what is due."""
        self.now = now
        self._carry_out(self.core.tick(now))

    def carry_out(self, actions: list[Action[Link]]) -> None:
        """Carry out what a core entry point a test called returned (store calls too)."""
        self._carry_out(actions)

    def rewrite(self, conversation: Conversation) -> None:
        """Replace the log with one reset under a fresh lineage; every link gets the state."""
        self._carry_out(self.core.rewrite(conversation, Lineage.fresh(), NOW))

    def _carry_out(self, actions: list[Action[Link]]) -> None:
        while (call := deliver(actions, _send, self._close)) is not None:
            try:
                outcome: object = run_now(store_call(self.store, CONVERSATION, call))
            except Exception as exc:
                outcome = exc
            actions = self.core.resume(outcome)

    def _close(self, link: Link, code: ErrorCode, detail: str) -> None:
        link.to_replica.append(encode_message(Error(code, detail)))
        self.closed.append((link, code))
        self.core.leave(link)


def _send(link: Link, frame: bytes, catch_up: bool) -> None:
    link.to_replica.append(frame)


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
