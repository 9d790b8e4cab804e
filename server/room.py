"""One conversation on the hub: the I/O shell around its `RoomCore`.

How this works: the room holds the conversation's `RoomCore` (the rules) and a lock, so per
conversation one operation runs at a time, in log order. Each operation hands the core what
arrived and carries out the actions it returns, in order: frames go to subscribers, and a store
call at the end is awaited and its outcome (a value or the exception raised) handed back to
`core.resume`, until the core asks for nothing more. The room decides nothing itself.
"""

from __future__ import annotations

import asyncio
import time

from sync import Conversation, Lineage
from sync.ids import now_ms
from sync.protocol import Hello, PushBatch

from .config import HubConfig
from .core import (
    Action,
    AppendRecords,
    CoreConfig,
    LoadLog,
    ReadRecords,
    RewriteLog,
    RoomCore,
    StoreCall,
    WriteSnapshot,
    deliver,
)
from .metrics import Metrics
from .store import LogStore
from .subscriber import Subscriber

__all__ = ["Room", "store_call"]


class Room:
    """One conversation: its core, its store, its lock."""

    def __init__(
        self, conversation_id: str, store: LogStore, config: HubConfig, metrics: Metrics
    ) -> None:
        self.id = conversation_id
        self._store = store
        self._metrics = metrics
        self.core: RoomCore[Subscriber] = RoomCore(
            conversation_id,
            CoreConfig(
                max_frame=config.max_frame,
                strict_pairing=config.strict_pairing,
                recent_records=config.recent_records,
                snapshot_every=config.snapshot_every,
                hub_rebase=config.hub_rebase,
            ),
            metrics,
        )
        self.lock = asyncio.Lock()
        self.users = 0  # connections holding this room (joined or about to)
        self.idle_since = time.monotonic()

    @property
    def exists(self) -> bool:
        """Whether the conversation has a log."""
        return self.core.exists

    @property
    def conversation(self) -> Conversation:
        return self.core.conversation

    @property
    def revision(self) -> int:
        return self.core.revision

    @property
    def lineage(self) -> int:
        return self.core.lineage

    async def load(self) -> None:
        """Fold the store's log (its latest snapshot, then the records after it)."""
        self.core.load(await self._store.load(self.id))

    async def join(self, sub: Subscriber, hello: Hello) -> None:
        """Welcome `sub`, bring it up to date, then deliver every record appended after."""
        async with self.lock:
            await self._carry_out(self.core.join(sub, hello))

    def leave(self, sub: Subscriber) -> None:
        self.core.leave(sub)

    async def push(self, sub: Subscriber, batch: PushBatch) -> None:
        """Hand `batch` to the core; answer `sub`, broadcast, append, as it says."""
        started = time.monotonic()
        metrics = self._metrics
        accepted = metrics.pushes_accepted
        async with self.lock:
            await self._carry_out(self.core.push(sub, batch, now_ms()))
        if metrics.pushes_accepted != accepted:
            metrics.observe_append(time.monotonic() - started)

    async def log_moved(self) -> None:
        """Another hub appended: forward what this room lacks to its subscribers."""
        async with self.lock:
            await self._carry_out(self.core.log_moved())

    async def rewrite(self, conversation: Conversation) -> None:
        """Replace the log with one `reset` record holding `conversation`'s state, under a
        fresh lineage; every subscriber is sent the new state and rereads."""
        async with self.lock:
            await self._carry_out(self.core.rewrite(conversation, Lineage.fresh(), now_ms()))

    async def shut_down(self) -> None:
        """Close every subscriber once an operation under way has finished."""
        async with self.lock:
            await self._carry_out(self.core.shut_down())

    def snapshot_json(self) -> bytes:
        """`{"lineage", "revision", "state"}` for `GET /v1/conversations/{id}`."""
        return self.core.snapshot_json()

    async def _carry_out(self, actions: list[Action[Subscriber]]) -> None:
        while (call := deliver(actions, _send, Subscriber.fail)) is not None:
            try:
                outcome: object = await store_call(self._store, self.id, call)
            except Exception as exc:
                outcome = exc
            actions = self.core.resume(outcome)


def _send(sub: Subscriber, frame: bytes, catch_up: bool) -> None:
    sub.send(frame, catch_up=catch_up)


async def store_call(store: LogStore, conversation_id: str, call: StoreCall) -> object:
    """Carry out one `StoreCall` of a `RoomCore` on `store`; its outcome for `resume`."""
    match call:
        case ReadRecords(lineage, from_):
            return await store.read(conversation_id, lineage, from_)
        case AppendRecords(lineage, from_, records, client, mark):
            return await store.append(conversation_id, lineage, from_, records, client, mark)
        case LoadLog():
            return await store.load(conversation_id)
        case WriteSnapshot(lineage, revision, data):
            await store.write_snapshot(conversation_id, lineage, revision, data)
        case RewriteLog(lineage, records, base):
            await store.rewrite(conversation_id, lineage, records, base=base)
    return None
