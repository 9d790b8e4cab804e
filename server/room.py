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
from collections.abc import Callable, Iterator

from sync import Conversation, Lineage
from sync.ids import now_ms
from sync.protocol import DraftOp, Hello, PushBatch, StatusUpdate

from . import tracing
from .auth import ANONYMOUS, Grant
from .config import HubConfig
from .core import (
    Action,
    AppendRecords,
    CoreConfig,
    DropLease,
    LoadLog,
    PutLease,
    ReadMark,
    ReadRecords,
    RewriteLog,
    RoomCore,
    SendDraft,
    StoreCall,
    WriteSnapshot,
    deliver,
)
from .drafts import DraftConfig
from .metrics import Metrics
from .mirror import Change
from .remote import relay_pending, show_changes
from .session import Limits
from .store import Lease, LogStore
from .subscriber import Subscriber

__all__ = ["Room", "is_shared", "keeps_leases", "store_call"]


class Room:
    """One conversation: its core, its store, its lock."""

    def __init__(
        self,
        conversation_id: str,
        store: LogStore,
        config: HubConfig,
        metrics: Metrics,
        on_deadline: Callable[[int | None], None] | None = None,
        *,
        auth: bool = False,
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
                shared_store=is_shared(store),
                drafts=DraftConfig(
                    interval=round(config.draft_interval * 1000),
                    timeout=round(config.draft_timeout * 1000),
                    grace=round(config.draft_grace * 1000),
                    max_bytes=min(config.draft_max_bytes, config.max_frame // 2),
                    max_per_owner=config.draft_max_per_client,
                    max_parts=config.draft_max_parts,
                    max_per_conversation=config.draft_max_per_conversation,
                    relay=is_shared(store),
                ),
                auth=auth,
                hub_rebase=config.hub_rebase,
                turn_grace=round(config.turn_grace * 1000) if keeps_leases(store) else None,
                stop_grace=round(config.stop_grace * 1000),
                budgets={
                    str(kind): budget
                    for kind, budget in Limits(rate=config.rate, burst=config.rate_burst)
                    .budgets()
                    .items()
                },
            ),
            metrics,
        )
        self.lock = asyncio.Lock()
        self.users = 0  # connections holding this room (joined or about to)
        self.idle_since = time.monotonic()
        # The hub's timer: told this room's next deadline after each operation.
        self._on_deadline = on_deadline
        # Set by the hub's relay when a bus runs (SPEC 9): this room has news for other hubs.
        self.on_relay: Callable[[Room], None] | None = None
        # Set by the hub: the conversation was found deleted (SPEC 15); the hub drops the room.
        self.on_gone: Callable[[Room], None] | None = None

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
        """Fold the store's log (its latest snapshot, then the records after it); keep a
        lease for its open turn when the store has none."""
        self.core.load(await self._store.load(self.id))
        await self._carry_out(self.core.loaded_turn(now_ms()))

    async def renew_lease(self) -> None:
        """Renew the open turn's lease when its owner is connected here (SPEC 10)."""
        async with self.lock:
            await self._carry_out(self.core.renew(now_ms()))

    async def finish_expired(self, lease: Lease) -> None:
        """`lease` lapsed: end its turn unless the log says otherwise (see the core)."""
        async with self.lock:
            await self._carry_out(self.core.finish_expired(lease, now_ms()))

    async def join(self, sub: Subscriber, hello: Hello, grant: Grant = ANONYMOUS) -> None:
        """Welcome `sub` (holding `grant`), bring it up to date, then deliver every record
        appended after."""
        if tracing.TRACER is not None:
            return await self._join_traced(sub, hello, grant)
        async with self.lock:
            await self._carry_out(self.core.join(sub, hello, now_ms(), grant))

    async def regrant(self, sub: Subscriber, grant: Grant, now: float) -> None:
        """`sub` refreshed its token: its new grant applies from now on."""
        async with self.lock:
            await self._carry_out(self.core.regrant(sub, grant, now))

    def leave(self, sub: Subscriber) -> None:
        self.core.leave(sub, now_ms())
        self._deadline_moved()

    async def draft(self, sub: Subscriber, op: DraftOp) -> None:
        """Hand draft op `op` to the core (SPEC 7)."""
        if tracing.TRACER is not None:
            with tracing.draft_span(self.id, op):
                async with self.lock:
                    await self._carry_out(self.core.draft(sub, op, now_ms()))
            return
        async with self.lock:
            await self._carry_out(self.core.draft(sub, op, now_ms()))

    async def status(self, sub: Subscriber, update: StatusUpdate) -> None:
        """Hand a presence status to the core."""
        async with self.lock:
            await self._carry_out(self.core.status(sub, update, now_ms()))

    def next_deadline(self) -> int | None:
        """When the core next needs `tick` (ms since the epoch), or None."""
        return self.core.next_deadline()

    async def tick(self) -> None:
        """Carry out what is due now: coalesced deltas, draft timeouts, presence diffs."""
        async with self.lock:
            await self._carry_out(self.core.tick(now_ms()))

    async def push(self, sub: Subscriber, batch: PushBatch) -> None:
        """Hand `batch` to the core; answer `sub`, broadcast, append, as it says."""
        if tracing.TRACER is not None:
            return await self._push_traced(sub, batch)
        started = time.monotonic()
        metrics = self._metrics
        accepted = metrics.pushes_accepted
        async with self.lock:
            await self._carry_out(self.core.push(sub, batch, now_ms()))
        if metrics.pushes_accepted != accepted:
            metrics.observe_append(time.monotonic() - started)

    # ------------------------------------------------------------------ traced (the otel extra)

    async def _join_traced(self, sub: Subscriber, hello: Hello, grant: Grant) -> None:
        """`join`, in a `convsync.hello` span (server/tracing.py)."""
        with tracing.hello_span(self.id, hello, grant) as span:
            async with self.lock:
                await self._carry_out(self.core.join(sub, hello, now_ms(), grant))
                tracing.joined(span, hello, self.core.lineage, self.core.revision)

    async def _push_traced(self, sub: Subscriber, batch: PushBatch) -> None:
        """`push`, in a `convsync.push` span ending with its ack or reject."""
        metrics = self._metrics
        with tracing.push_span(self.id, batch) as span:
            started = time.monotonic()
            accepted, rejected = metrics.pushes_accepted, +metrics.pushes_rejected
            async with self.lock:
                await self._carry_out(self.core.push(sub, batch, now_ms()))
            if metrics.pushes_accepted != accepted:
                metrics.observe_append(time.monotonic() - started)
                tracing.pushed(span, batch.records, self.core.revision, None)
            else:
                reasons = metrics.pushes_rejected - rejected
                if reasons:
                    tracing.pushed(span, batch.records, self.core.revision, min(reasons))

    async def log_moved(self) -> None:
        """Another hub appended: forward what this room lacks to its subscribers."""
        async with self.lock:
            await self._carry_out(self.core.log_moved(now_ms()))

    async def head_check(self) -> None:
        """Re-read the log's head; forward what this room lacks (the periodic backstop)."""
        async with self.lock:
            await self._carry_out(self.core.head_check(now_ms()))

    async def rewrite(self, conversation: Conversation) -> None:
        """Replace the log with one `reset` record holding `conversation`'s state, under a
        fresh lineage; every subscriber is sent the new state and rereads."""
        async with self.lock:
            await self._carry_out(self.core.rewrite(conversation, Lineage.fresh(), now_ms()))

    async def delete(self, now: float) -> bool:
        """Delete the conversation from the store (SPEC 15) and close every subscriber
        `deleted`, under the room's lock (an operation under way finishes first). Returns
        whether there was a log to delete."""
        async with self.lock:
            if self.core.gone:
                return False
            if not await self._store.delete(self.id, now):
                return False  # no log (nothing to close for: a room with none is fresh)
            await self._carry_out(self.core.deleted())
            return True

    async def forget(self) -> None:
        """The store holds this conversation's tombstone (a load raced a delete): close every
        subscriber `deleted`, as `delete` does, writing nothing."""
        async with self.lock:
            if not self.core.gone:
                await self._carry_out(self.core.deleted())

    async def shut_down(self) -> None:
        """Close every subscriber once an operation under way has finished."""
        async with self.lock:
            await self._carry_out(self.core.shut_down())

    def snapshot_json(self) -> bytes:
        """`{"lineage", "revision", "state"}` for `GET /v1/conversations/{id}`."""
        return self.core.snapshot_json()

    async def _carry_out(self, actions: list[Action[Subscriber]]) -> None:
        # `deliver` itself, not `_deliver`: one frame fewer, twice a push.
        while (
            call := deliver(actions, _send, _fail, _send_draft, _broadcast, _send_frames)
        ) is not None:
            try:
                if tracing.TRACER is not None:
                    with tracing.store_span(self.id, call):
                        outcome: object = await store_call(self._store, self.id, call)
                else:
                    outcome = await store_call(self._store, self.id, call)
            except Exception as exc:
                outcome = exc
            actions = self.core.resume(outcome)
        self._deadline_moved()
        if self.core.gone and self.on_gone is not None:
            self.on_gone(self)

    def show_remote(self, changes: list[Change]) -> None:
        """Show other hubs' drafts and presence changes to this room's subscribers. Needs no
        lock: it touches the live boards only (see `server.remote`)."""
        changes_shown = show_changes(self.core, changes, now_ms())
        _deliver(changes_shown)
        self._deadline_moved()

    def _deadline_moved(self) -> None:
        if self._on_deadline is not None:
            self._on_deadline(self.core.next_deadline())
        if self.on_relay is not None and relay_pending(self.core):
            self.on_relay(self)


def _deliver(actions: list[Action[Subscriber]]) -> StoreCall | None:
    return deliver(actions, _send, _fail, _send_draft, _broadcast, _send_frames)


def _send(sub: Subscriber, frame: bytes, catch_up: bool) -> None:
    sub.send(frame, catch_up)


def _broadcast(subs: list[Subscriber], frame: bytes) -> None:
    for sub in subs:  # one call per subscriber, not two: the hot loop of every push
        sub.send(frame)


def _fail(sub: Subscriber, code: str, detail: str) -> None:
    sub.fail(code, detail)


def _send_draft(sub: Subscriber, action: SendDraft[Subscriber]) -> None:
    sub.send_draft(action.key, action.message, action.frame)


def _send_frames(sub: Subscriber, frames: Iterator[bytes]) -> None:
    sub.send_frames(frames)


async def store_call(store: LogStore, conversation_id: str, call: StoreCall) -> object:
    """Carry out one `StoreCall` of a `RoomCore` on `store`; its outcome for `resume`."""
    if isinstance(call, AppendRecords):  # first: one per push
        if call.lease is not None:  # the lease goes in the append's transaction (SPEC 10)
            return await store.append(
                conversation_id,
                call.lineage,
                call.from_,
                call.records,
                call.client,
                call.mark,
                lease=call.lease,
            )
        return await store.append(
            conversation_id, call.lineage, call.from_, call.records, call.client, call.mark
        )
    match call:
        case ReadRecords(lineage, from_):
            return await store.read(conversation_id, lineage, from_)
        case LoadLog():
            return await store.load(conversation_id)
        case WriteSnapshot(lineage, revision):
            data = call.data()  # now, before anything else runs: see `WriteSnapshot`
            await store.write_snapshot(conversation_id, lineage, revision, data)
            return len(data)  # the core weighs the next snapshot against it
        case RewriteLog(lineage, records, base):
            await store.rewrite(conversation_id, lineage, records, base=base)
        case ReadMark(client):
            return await store.client_mark(conversation_id, client)
        case PutLease(lease, replace):
            await store.put_lease(lease, replace=replace)
        case DropLease(turn):
            await store.drop_lease(conversation_id, turn)
    return None


def keeps_leases(store: object) -> bool:
    """Whether `store` keeps turn leases (SPEC 10); a store without them: turns never lapse."""
    return callable(getattr(store, "leases_due", None))


def is_shared(store: object) -> bool:
    """Whether other hubs may append to `store`: it can tell of moves (`watch`, PostgreSQL)."""
    return callable(getattr(store, "watch", None))
