"""The hub's rules for one conversation, pure: messages and store outcomes in, actions out.

How this works: a `RoomCore` holds one conversation as the hub knows it (the folded log, its
lineage and revision, each client's last accepted push, the encoded tail of the log) and the
connections subscribed to it. The I/O shell (`server.room.Room`) calls `join`, `push`,
`rewrite`, ... with decoded client messages and the time, and gets back a list of actions
(`server.actions`):

    replica frames ──► join / push ──► [Send, Broadcast, Close, ..., at most one StoreCall]
                                                                        │
    store outcome ───► resume(result) ──► [more actions] ◄──────────────┘

The shell carries the actions out in order: it writes frames to sockets, and when the list
ends with a `StoreCall` it awaits that call on the store and hands the outcome (a value, or the
exception raised) back to `resume`, which continues the same operation. The shell runs one
operation at a time per conversation, so the core never sees two interleaved.

Inside, every operation that waits on the store is a generator that reads top to bottom, as
websockets' `Protocol.parse()` does: `outcome = yield ReadRecords(...)` hands the call to the
shell and gets its value back; a store error is thrown in at that `yield` and caught with
`try`/`except`. A generator yields a list of actions to have them sent before it waits, and
returns the actions that end it. One driver (`_drive`) runs them. The one exception is the
push, the hot path: it waits on its append as a plain value (`server.push`, `_pending`).

Every protocol rule of SPEC 2.4 lives here once: resend acks, lineage / behind / invalid
rejects, strict pairing, catch-up by records or by state, broadcast, and what to do when the
store says the log moved under us (another hub appended) or failed. So do the access rules of
SPEC 6 that concern the log: each connection joins with a `Grant` (verified by the session),
needs `read` to join and `write` for every push, is known by (principal, client) for seqs and
marks, and replaces an older socket of the same pair. Drafts and presence (SPEC 7) are kept by
`server.live.LiveRoom`, what the room knows of its open turn by `server.turns.Turns`. The core
never awaits, never reads a clock of its own and imports no I/O library; the test fake link
drives it directly.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from typing import TypeVar

import msgspec

from sync import (
    Author,
    ChangeRecord,
    Conversation,
    Lineage,
    Reset,
    TurnEnd,
    encode,
)
from sync.errors import ApplyError
from sync.frames import RECORDS_OVERHEAD, records_frames
from sync.protocol import (
    AuthOk,
    DraftOp,
    Hello,
    StatusUpdate,
    Welcome,
    encode_message,
)
from sync.steer import (
    WENT_AWAY,
    finish_records,
)

from .actions import (
    SNAPSHOT_SPAN,
    Action,
    AppendRecords,
    Broadcast,
    Close,
    DropLease,
    LoadLog,
    PutLease,
    Raise,
    ReadMark,
    ReadRecords,
    RewriteLog,
    Send,
    SendDraft,
    SendFrames,
    StoreCall,
    WriteSnapshot,
    deliver,
    error_frame,
    live_actions,
)
from .auth import ANONYMOUS, AuthError, Grant
from .live import LIVE_FEATURES
from .push import (
    Pushing,
    both,
)
from .roomlog import DELETED, CoreConfig, Op
from .store.base import ClientMark, Lease, LogMoved
from .turns import owner_draft

__all__ = [
    "LIVE_FEATURES",
    "SNAPSHOT_SPAN",
    "Action",
    "AppendRecords",
    "Broadcast",
    "Close",
    "CoreConfig",
    "DropLease",
    "LoadLog",
    "PutLease",
    "Raise",
    "ReadMark",
    "ReadRecords",
    "RewriteLog",
    "RoomCore",
    "Send",
    "SendDraft",
    "SendFrames",
    "StoreCall",
    "WriteSnapshot",
    "deliver",
    "error_frame",
    "live_actions",
]

log = logging.getLogger("convsync.hub")


HUB_REBASE = "hub_rebase"
"""The feature a replica lists when it takes a placed push's records as its batch."""
AUTH = "auth"
"""The feature a hub with auth lists in `welcome` (SPEC 5)."""
PING = "ping"
"""The feature of a hub that answers `ping` with `pong` (keepalive for browser replicas)."""

C = TypeVar("C", bound=Hashable)
"""A connection, as the shell names it (the core only compares and hashes it)."""


class RoomCore(Pushing[C]):
    """The rules of one conversation on the hub.

    Every entry point returns the actions to carry out, in order. When the last one is a
    `StoreCall`, carry it out and pass its outcome (the value it returned, or the exception it
    raised) to `resume`, which returns the next actions; until then, call nothing else.

    Args:
        conversation_id: the conversation's id (for messages and logs).
        config: the settings the rules read.
        metrics: the hub's counters, updated as pushes land or are rejected.
    """

    # ------------------------------------------------------------------ joining

    def join(
        self, conn: C, hello: Hello, now: int | None = None, grant: Grant = ANONYMOUS
    ) -> list[Action[C]]:
        """Welcome `conn`, bring it up to date; from then on it gets every record appended.
        `now` (ms) dates its presence entry and gives `welcome.expires_in`.

        `grant` is what the connection's token allows (verified already; `ANONYMOUS` without
        auth) and must hold `read` on this conversation, else `conn` is closed `forbidden`.
        With auth, an older connection of the same principal and client is closed `replaced`.
        """
        try:
            grant.require(self.id, "read")
        except AuthError as refused:
            return [Close(conn, refused.code, refused.detail)]
        if self.gone:
            return [Close(conn, "deleted", DELETED)]
        self._now = self._now if now is None else now
        self.live.hellos[conn] = hello
        self.grants[conn] = grant
        return self._drive(self._joining(conn, hello, grant))

    def _joining(self, conn: C, hello: Hello, grant: Grant) -> Op[C]:
        if not (yield from self._reload_if_stale()):
            return []
        if self.config.shared_store:
            # On a shared store, the welcome's `acked` comes from the store (SPEC 9): the
            # client may have pushed through another hub since this room last heard of it.
            key = self._mark_key(grant, hello.client)
            try:
                stored = yield ReadMark(key)
            except Exception as exc:
                log.error(
                    "reading the mark of %s in %s failed", hello.client, self.id, exc_info=exc
                )
                return [self._unavailable(conn)]
            cached = self.marks.get(key)
            if isinstance(stored, ClientMark) and (cached is None or cached.seq < stored.seq):
                # A push this room has not seen landed through another hub: fold what the room
                # lacks first, so the welcome's `acked` never runs ahead of the records the
                # replica gets.
                self.marks[key] = stored
                forwarded = yield from self._forward_missing()
                if self._stale:
                    return forwarded
                yield forwarded
        return (yield from self._welcome(conn, hello, grant))

    def _welcome(self, conn: C, hello: Hello, grant: Grant) -> Op[C]:
        """Send `welcome`, then what `conn` lacks: records from its revision, or the state."""
        if self._stale:
            return [self._unavailable(conn)]
        actions: list[Action[C]] = []
        # With auth only: without it no one owns a client id, and sockets sharing one (tools
        # that reuse a fixed id, probes) have always been served side by side.
        for other, client in list(self.subscribers.items()) if self.config.auth else []:
            if client == hello.client and self.grants.get(other, ANONYMOUS).sub == grant.sub:
                self.leave(other, self._now)
                actions.append(Close(other, "replaced", "the same client connected again"))
        actions.append(Send(conn, encode_message(self._welcome_of(conn, hello, grant)), True))
        lineage, revision = hello.lineage, hello.revision
        fresh = lineage == Lineage.EMPTY and revision == 0
        if not ((lineage == self.lineage or fresh) and revision <= self.revision):
            return (yield from self._subscribe(conn, hello.client, actions + self._state_to(conn)))
        missing = self.revision - revision
        state_items = len(self.conversation) + len(self.conversation.asides())
        if missing == 0:
            return (yield from self._subscribe(conn, hello.client, actions))
        if fresh and missing >= state_items:
            return (yield from self._subscribe(conn, hello.client, actions + self._state_to(conn)))
        if revision >= self._recent_from:
            records: object = self._recent[revision - self._recent_from :]
        else:
            yield actions
            actions = []
            try:
                records = yield ReadRecords(self.lineage, revision)
            except Exception as exc:
                log.error("reading %s for a catch-up failed", self.id, exc_info=exc)
                return [self._unavailable(conn)]
        if records is None:  # compacted away or rewritten meanwhile: the state it is
            catch_up = self._state_to(conn)
        else:
            assert isinstance(records, Sequence)
            catch_up = self._catch_up(conn, revision, records)
        return (yield from self._subscribe(conn, hello.client, actions + catch_up))

    def _welcome_of(self, conn: C, hello: Hello, grant: Grant) -> Welcome:
        mark = self.marks.get(self._mark_key(grant, hello.client))
        features = [HUB_REBASE] if self.config.hub_rebase else []
        if HUB_REBASE in features and HUB_REBASE in hello.features:
            self._placing.add(conn)
        features += [feature for feature in LIVE_FEATURES if feature in hello.features]
        if PING in hello.features:
            features.append(PING)
        if self.config.auth:
            features.append(AUTH)  # tokens are checked; `scopes` and `expires_in` follow
        welcome = Welcome(
            self.lineage,
            self.revision,
            mark.seq if mark else 0,
            features,
            limits=self.config.budgets,
            state_format="msgpack" if hello.state_format == "msgpack" else None,
        )
        if self.config.auth:
            welcome = msgspec.structs.replace(
                welcome,
                scopes=grant.scope_list,
                expires_in=grant.expires_in(self._now / 1000),
                sub=grant.sub,
            )
        return welcome

    def _catch_up(self, conn: C, revision: int, records: Sequence[bytes]) -> list[Action[C]]:
        """`records` from `revision` as catch-up frames; a state when one record is too large
        for a frame (a rewrite's reset)."""
        budget = self.config.max_frame - RECORDS_OVERHEAD
        if any(len(record) > budget for record in records):
            return self._state_to(conn)
        frames = records_frames(revision, records, None, self.config.max_frame)
        return [Send(conn, frame, True) for frame in frames]

    def _subscribe(self, conn: C, client: str, actions: list[Action[C]]) -> Op[C]:
        """From now on `conn` gets every record; `actions` first, then its drafts and presence
        (and its turn's lease renewed, if it owns the open turn: its turn goes on)."""
        self.subscribers[conn] = client
        self._others.clear()
        actions = actions + self._live_join(conn)
        state = self.turns.state
        if state is None or state.key != self._mark_key(self.grants.get(conn, ANONYMOUS), client):
            return actions
        yield actions
        return (yield from self._renewing())

    def regrant(self, conn: C, grant: Grant, now: float) -> list[Action[C]]:
        """`conn` refreshed its token (`auth`, verified by the session for the same principal
        and conversation): its new scopes apply from the next message on; answer `auth_ok`."""
        if conn not in self.grants:
            return []
        self.grants[conn] = grant
        actions: list[Action[C]] = [Send(conn, encode_message(AuthOk(grant.expires_in(now))))]
        if not self._may_write(conn):
            actions += self.live.lost_write(conn)
        return actions

    # ------------------------------------------------------------------ turns end (SPEC 10)

    def finish_expired(self, lease: Lease, now: int) -> list[Action[C]]:
        """`lease` lapsed (the store said so at `now`): end its turn as `finish_stopped` would,
        authored `Author.rig()` — `failed` ("the worker went away", no halt: the request
        stays owed) or, when a stop stands, `stopped` — unless the log says otherwise (the
        turn ended already, its owner is connected here, it is parked). The owner's open
        draft's text is kept as the aborted message."""
        self._now = now
        if self.config.turn_grace is None or self.closing:
            return []
        return self._drive(self._finishing(lease, now))

    def _finishing(self, lease: Lease, now: int) -> Op[C]:
        if not (yield from self._reload_if_stale()) or self._stale:
            return []
        self.turns.state = state = self._turn_now()
        if state is None or state.index != lease.turn:
            return (yield from self._keep_leases([DropLease(lease.turn)]))  # it ended meanwhile
        stop_due = state.stopping and lease.stop_expires is not None and lease.stop_expires <= now
        if not stop_due:
            if state.parked or state.key in self._connected_keys():
                return (yield from self._keep_leases([PutLease(self._lease_of(state))]))
            if lease.expires is None or lease.expires > now:
                return []
        end = TurnEnd.stopped() if state.stopping else TurnEnd.failed(WENT_AWAY)
        conversation = self.conversation
        partial = owner_draft(state, self.drafts)
        records = finish_records(
            conversation, state.turn_id, end, lambda: self._ids.message_id(now), now, partial
        )
        try:
            undo = conversation.apply_batch(records)
        except ApplyError:
            log.exception("finishing turn %d of %s did not fit", state.index, self.id)
            return []
        steering = self.steering.copy()
        steering.track(conversation, records)
        queue = self._landing(steering, now)
        if queue:
            undo = both(undo, conversation.apply_batch(queue))
        turn = self._turn_after(steering, [*records, *queue])
        encoded = [encode(record) for record in [*records, *queue]]
        from_ = self.revision
        try:  # the lease goes with the records that end the turn (SPEC 10)
            yield AppendRecords(
                self.lineage, from_, encoded, None, None, None if turn is None else turn.change
            )
        except Exception as exc:
            undo()
            if isinstance(exc, LogMoved):  # another hub moved first (maybe finishing it)
                return (yield from self._forward_missing())
            log.error("finishing turn %d of %s failed", state.index, self.id, exc_info=exc)
            self._stale = True
            return []
        self.exists = True
        self.revision = from_ + len(encoded)
        self._remember(encoded)
        self._note_edits(from_, [*records, *queue])
        self.steering = steering
        self._steered(records, from_ + len(records))
        if queue:
            self._steered(queue, self.revision)
        self.turns.stale_owners[state.key] = self.revision
        how = "stopped" if state.stopping else "failed"
        log.info("turn %d of %s ended %s: its worker did not finish it", state.index, self.id, how)
        frames = records_frames(from_, encoded, None, self.config.max_frame)
        to = list(self.subscribers)
        actions: list[Action[C]] = [Broadcast(to, frame) for frame in frames]
        if self.drafts.drafts:
            actions += self.live.landed(records)
        self.metrics.records_appended += len(encoded)
        self.turns.landed(turn)
        return actions

    # ------------------------------------------------------------------ rewriting

    def rewrite(self, conversation: Conversation, lineage: int, now: int) -> list[Action[C]]:
        """Replace the log with one `reset` record holding `conversation`'s state under the
        fresh `lineage`; every subscriber is sent the new state and rereads."""
        record = ChangeRecord(Reset(conversation.state()), Author.rig(), now)
        # Always compare-and-set: a room that saw no log expects none (revision 0), so a log
        # another hub created meanwhile is never erased.
        base = (self.lineage, self.revision)
        return self._drive(self._rewriting(RewriteLog(lineage, [encode(record)], base)))

    def _rewriting(self, call: RewriteLog) -> Op[C]:
        try:
            yield call
        except LogMoved as moved:
            # Another hub appended since this room last saw the log: bring everyone up to it,
            # then tell the caller; it may rewrite again from what it now sees.
            actions = yield from self._forward_missing()
            return actions if self._stale else [*actions, Raise(moved)]
        # Any other error reaches the caller of `Hub.rewrite`; nothing changed here.
        return (yield from self._reload_for_all(rewrite=True))

    # ------------------------------------------------------------------ shutting down

    def shut_down(self) -> list[Action[C]]:
        """Close every subscriber; later pushes are refused."""
        self.closing = True
        return [
            Close(conn, "shutting_down", "the hub is shutting down; reconnect later")
            for conn in self.subscribers
        ]

    # ------------------------------------------------------------------ drafts and presence

    def draft(self, conn: C, op: DraftOp, now: int) -> list[Action[C]]:
        """Handle draft op `op` from `conn` (joined): open, append, keep, abort (SPEC 7)."""
        self._now = now
        if conn not in self.subscribers:
            return []
        owner = self._owner(conn)
        return self.live.draft(conn, owner, self._may_write(conn), op, self.conversation, now)

    def status(self, conn: C, update: StatusUpdate, now: int) -> list[Action[C]]:
        """`conn` set its presence status (checked by the hub session); ignored unless its
        grant holds `presence` or `write`."""
        self._now = now
        if conn in self.subscribers and self.grants.get(conn, ANONYMOUS).can_presence:
            return self.live.status(conn, update.status, update.detail, now)
        return self.live.tick(now)

    def tick(self, now: int) -> list[Action[C]]:
        """What is due at `now`: coalesced draft deltas, drafts that timed out, a presence
        diff; the state frames kept for fresh replicas let go of. The shell calls it when
        `next_deadline()` comes."""
        self._now = now
        self._expire_cache(now)
        return self.live.tick(now)

    def next_deadline(self) -> int | None:
        """When `tick` next has something to do (ms, on the callers' clock), or None."""
        live, cache = self.live.next_deadline(), self._cache_deadline()
        if live is None or cache is None:
            return cache if live is None else live
        return min(live, cache)

    def _live_join(self, conn: C) -> list[Action[C]]:
        """A joined connection's presence entry, then the drafts and presence it sees."""
        hello = self.live.hellos.get(conn)
        if hello is None:
            return []
        # With auth, presence shows what the token says (kind, name), not what the hello claims.
        grant = self.grants.get(conn, ANONYMOUS)
        kind = grant.kind if self.config.auth else hello.kind
        return self.live.join(conn, self._owner(conn), kind, grant.name, self._now)

    # ------------------------------------------------------------------ reads

    def snapshot_json(self) -> bytes:
        """`{"lineage", "revision", "state"}` for `GET /v1/conversations/{id}`."""
        state = encode(self.conversation)
        return b'{"lineage":%d,"revision":%d,"state":%s}' % (self.lineage, self.revision, state)
