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
returns the actions that end it. One driver (`_drive`) runs them.

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
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec

from sync import (
    AsideChange,
    Author,
    ChangeRecord,
    Conversation,
    Lineage,
    Push,
    Reset,
    Splice,
    TurnEnd,
    Via,
    approvals,
    decode_record,
    decode_state,
    encode,
)
from sync.budget import Budget
from sync.compact import compaction_unpins
from sync.errors import ApplyError, LocalProtocolError
from sync.frames import RECORDS_OVERHEAD, records_frames, state_frames
from sync.ids import IdMinter
from sync.protocol import (
    AuthOk,
    DraftOp,
    Hello,
    PushBatch,
    PushOrigin,
    Reject,
    RejectReason,
    StatusUpdate,
    Welcome,
    encode_message,
)
from sync.rebase import place
from sync.steer import (
    QUEUED_KIND,
    STOP_KIND,
    WENT_AWAY,
    Steering,
    finish_records,
    landing_records,
    queued_entry,
    queued_id,
    user_text_push,
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
from .drafts import DraftBoard, DraftConfig, Owner
from .live import LIVE_FEATURES, LiveRoom
from .metrics import Metrics
from .presence import PresenceBoard
from .push import (
    ack,
    both,
    pushes_assistant,
    scope_refusal,
    stopper,
    strict_check,
    turn_ended,
    unchanged,
)
from .store.base import ClientMark, Deleted, Lease, Loaded, LogMoved, SeqTaken
from .tally import Tally
from .turns import Turns, TurnState, moves_calls, owner_draft

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

_DELETED = "the conversation was deleted"
_UNREADABLE = "the log cannot be read now; reconnect later"

HUB_REBASE = "hub_rebase"
"""The feature a replica lists when it takes a placed push's records as its batch."""
AUTH = "auth"
"""The feature a hub with auth lists in `welcome` (SPEC 5)."""
PING = "ping"
"""The feature of a hub that answers `ping` with `pong` (keepalive for browser replicas)."""

C = TypeVar("C", bound=Hashable)
"""A connection, as the shell names it (the core only compares and hashes it)."""

T = TypeVar("T")

Steps = Generator[StoreCall | list[Action[C]], object, T]
"""An operation that may wait on the store: it yields a `StoreCall` and is sent its outcome (or
thrown the error it raised), or yields a list of actions to send before it waits; it returns
`T`."""
Op = Steps[C, list[Action[C]]]
"""An operation that returns the actions that end it."""


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """The settings the rules read (a subset of `HubConfig`)."""

    max_frame: int
    strict_pairing: bool = True
    recent_records: int = 1000
    snapshot_every: int = 1000
    hub_rebase: bool = True
    """Place a stale push by intent for replicas that list `hub_rebase` (SPEC 2.4.6)."""
    shared_store: bool = False
    """Other hubs append to the same store (SPEC 9): a `hello` reads the client's mark from
    the store instead of trusting the room's copy."""
    drafts: DraftConfig = field(default_factory=DraftConfig)
    presence_throttle: int = 100
    """Least ms between two presence diffs."""
    auth: bool = False
    """Whether the hub checks tokens: marks are then keyed by (principal, client) and every
    accepted record is stamped `via`; without auth, by the client id alone, as before."""
    budgets: dict[str, Budget] | None = None
    """What each socket may send (`welcome.limits`); the shell meters it, the core says it."""
    turn_grace: int | None = None
    """Ms an open turn's lease lasts past its owner's last renewal (SPEC 10); None: the room
    keeps no leases (a store without them)."""
    stop_grace: int = 10_000
    """Ms a worker has to finish a stopped turn before any hub finishes it."""


@dataclass(slots=True)
class _Append:
    """A push folded into the room, waiting for the store to append it."""

    call: AppendRecords
    records: list[ChangeRecord]
    """The pushed records as they land (placed, stamped)."""
    queue: list[ChangeRecord]
    """Queued input the hub lands right after them, in the same append (SPEC 10)."""
    steering: Steering
    """The steering index once both landed."""
    undo: Callable[[], None]
    """Takes both out of the room again (the append failed)."""


class RoomCore(Generic[C]):
    """The rules of one conversation on the hub.

    Every entry point returns the actions to carry out, in order. When the last one is a
    `StoreCall`, carry it out and pass its outcome (the value it returned, or the exception it
    raised) to `resume`, which returns the next actions; until then, call nothing else.

    Args:
        conversation_id: the conversation's id (for messages and logs).
        config: the settings the rules read.
        metrics: the hub's counters, updated as pushes land or are rejected.
    """

    def __init__(
        self, conversation_id: str, config: CoreConfig, metrics: Metrics | None = None
    ) -> None:
        self.id = conversation_id
        self.config = config
        self.metrics = metrics if metrics is not None else Metrics()
        self.conversation = Conversation()
        self.lineage: int = Lineage.fresh()
        self.revision = 0
        self.exists = False
        self.marks: dict[str, ClientMark] = {}
        self.subscribers: dict[C, str] = {}  # connection -> its client id
        self._others: dict[C, list[C]] = {}  # connection -> every other subscriber (a cache)
        self.grants: dict[C, Grant] = {}  # connection -> what its token allows
        self._placing: set[C] = set()  # connections whose stale pushes the hub may place
        self._answered: dict[C, int] = {}  # connection -> the last push seq it was answered
        self.closing = False
        self.gone = False  # the conversation was deleted (SPEC 15): the room serves no one
        self._recent: list[bytes] = []
        self._recent_from = 0
        # The revision that last replaced each entry's content or each aside, since
        # `_edits_from` (the revision this room first saw): a stale edit is placed only on
        # content that has not changed since its base (SPEC 16; the hub keeps no bases).
        self._edited: dict[str, int] = {}
        self._edits_from = 0
        self._snapshot_revision = 0
        # The latest snapshot's size, and the bytes of the records after it: the next one is
        # written only once those outweigh it (see `_snapshot_due`).
        self._snapshot_bytes = 0
        self._bytes_since_snapshot = 0
        self._op: Op[C] | None = None  # the operation waiting on a store call
        self._stale = False  # the store failed in a way that may leave us behind it
        # Live drafts and presence (SPEC 7), kept in memory only.
        self.live: LiveRoom[C] = LiveRoom(
            config.drafts, self.metrics, config.max_frame, config.presence_throttle
        )
        self._now = 0  # the latest time a caller gave (ms)
        # Steering (SPEC 10): the markers and queue standing, kept from the records that land
        # so the mid-step check on every push is O(1) plus the last step; and the revision
        # right after the latest user request landed (0 after a load: nothing is superseded
        # by a request this room did not see land).
        self.steering = Steering()
        self._request_revision = 0
        self._queuers: dict[str, str] = {}  # queued aside -> the mark key of who queued it
        self._ids = IdMinter(lambda: self._now)  # the STOPPED note before a landing queue
        # The summary row's totals (SPEC 17: usage, queued, approvals, the latest turn), kept
        # from the records that land, so a row never rereads the log.
        self.tally = Tally()
        # Turns end (SPEC 10): the open turn as its lease was last written, and what the log
        # does not say about turns.
        self.turns = Turns(
            conversation_id, config.turn_grace, config.stop_grace, self._key_of, config.auth
        )

    @property
    def drafts(self) -> DraftBoard[C]:
        """The open drafts (SPEC 7)."""
        return self.live.drafts

    @property
    def presence(self) -> PresenceBoard[C]:
        """Who is here (SPEC 7)."""
        return self.live.presence

    @property
    def watching(self) -> set[C]:
        """Subscribers that watch: in no presence, not `online` (SPEC 17)."""
        return self.live.watching

    # ------------------------------------------------------------------ driving

    @property
    def waiting(self) -> bool:
        """Whether the core waits for the outcome of a `StoreCall` (`resume`)."""
        return self._op is not None

    def resume(self, outcome: object) -> list[Action[C]]:
        """Continue the operation that asked for a store call, with its outcome: the value
        it returned, or the exception it raised (thrown into the operation)."""
        op, self._op = self._op, None
        assert op is not None, "resume without a store call"
        if isinstance(outcome, Deleted):  # whatever asked: the log is gone (SPEC 15)
            op.close()
            return self.deleted()
        if isinstance(outcome, BaseException):
            return self._drive(op, error=outcome)
        return self._drive(op, outcome)

    def _drive(
        self, op: Op[C], value: object = None, error: BaseException | None = None
    ) -> list[Action[C]]:
        """Run `op` (sending it `value`, or throwing `error` in) until it waits on the store
        or ends: the actions it gave meanwhile, then the store call it waits on, if any."""
        actions: list[Action[C]] = []
        try:
            step = op.send(value) if error is None else op.throw(error)
            while isinstance(step, list):
                actions += step
                step = op.send(None)
        except StopIteration as end:
            actions += end.value
            return actions
        self._op = op
        actions.append(step)
        return actions

    def _unavailable(self, conn: C) -> Close[C]:
        """Close `conn`: the room cannot match the store now."""
        return Close(conn, "unavailable", _UNREADABLE)

    # ------------------------------------------------------------------ loading

    def load(self, loaded: Loaded | None) -> None:
        """Take the store's log (`LogStore.load`'s answer) as the room's state."""
        self._stale = False
        self._snapshot_revision = 0
        self._snapshot_bytes = self._bytes_since_snapshot = 0
        self._recent, self._recent_from = [], 0
        self._edited, self._edits_from = {}, 0 if loaded is None else loaded.revision
        self._request_revision = 0
        self.turns.reset()
        if loaded is None:
            self.conversation = Conversation()
            self.lineage, self.revision, self.exists = Lineage.fresh(), 0, False
            self.marks = {}
            self.steering.rebuild(self.conversation)
            self.tally.rebuild(self.conversation)
            return
        conversation = decode_state(loaded.snapshot) if loaded.snapshot else Conversation()
        for data in loaded.records:
            conversation.apply(decode_record(data))
        conversation.continue_log(loaded.lineage, loaded.revision)
        self.conversation = conversation
        self.steering.rebuild(conversation)
        self.tally.rebuild(conversation)
        self.lineage, self.revision, self.exists = loaded.lineage, loaded.revision, True
        self.marks = dict(loaded.clients)
        keep = self.config.recent_records
        self._recent = list(loaded.records[-keep:]) if keep else []
        self._recent_from = loaded.revision - len(self._recent)
        self._snapshot_revision = loaded.snapshot_revision
        self._snapshot_bytes = len(loaded.snapshot) if loaded.snapshot else 0
        self._bytes_since_snapshot = sum(map(len, loaded.records))

    def _reload_if_stale(self) -> Steps[C, bool]:
        """After a store failure, reload the room so it matches the store: whether it does
        (a failed reload is logged; the operation then ends, saying nothing)."""
        if not self._stale:
            return True
        try:
            loaded = yield LoadLog()
        except Exception as exc:
            log.error("reloading %s failed", self.id, exc_info=exc)
            return False
        self.load(_loaded(loaded))
        return True

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
            return [Close(conn, "deleted", _DELETED)]
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

    def _state_to(self, conn: C) -> list[Action[C]]:
        hello = self.live.hellos.get(conn)
        state_format = hello.state_format if hello is not None else None
        return [Send(conn, frame, True) for frame in self._state_frames(state_format)]

    def _state_frames(self, state_format: str | None = None) -> list[bytes]:
        state = self.conversation.state()
        return state_frames(self.lineage, self.revision, state, self.config.max_frame, state_format)

    def leave(self, conn: C, now: int | None = None) -> None:
        """`conn` is gone; it gets nothing more. Its presence entry goes at the next `tick`;
        drafts it produced wait `draft_grace` for their producer to come back."""
        self.subscribers.pop(conn, None)
        self._others.clear()
        self.grants.pop(conn, None)
        self._placing.discard(conn)
        self._answered.pop(conn, None)
        self.live.leave(conn, self._now if now is None else now)

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

    def _mark_key(self, grant: Grant, client: str) -> str:
        """The store's key for a client's mark: the client id without auth (so stores and
        marks from before auth stay valid); with auth, the principal too, so one principal
        can never spend or read another's seqs (`/` in `sub` escaped: the key splits once)."""
        return self._key_of(grant.sub, client)

    def _key_of(self, sub: str, client: str) -> str:
        """The mark key of identity (`sub`, `client`) (see `_mark_key`)."""
        if not self.config.auth:
            return client
        sub = sub.replace("%", "%25").replace("/", "%2F")
        return f"{sub}/{client}"

    # ------------------------------------------------------------------ pushing

    def push(self, conn: C, batch: PushBatch, now: int) -> list[Action[C]]:
        """Handle `batch` from `conn` (joined); `now` stamps records without a time (ms)."""
        return self._drive(self._pushing(conn, batch, now))

    def _pushing(self, conn: C, batch: PushBatch, now: int) -> Op[C]:
        """One push, step by step: refuse it, fold it into the room, stamp it, land queued
        input behind it, append both, answer and broadcast, keep the lease, snapshot."""
        if self._stale and not (yield from self._reload_if_stale()):
            return []
        self._now = now
        closed = self._closed_to_pushes(conn)
        if closed is not None:
            return [closed]
        client = self.subscribers.get(conn)
        if client is None:
            raise LocalProtocolError("no_join", "a push from a connection that has not joined")
        grant = self.grants.get(conn, ANONYMOUS)
        key = self._mark_key(grant, client)
        refused = self._refusal(conn, batch, grant, client, key, now)
        if refused is not None:
            return refused
        folded = self._fold(conn, batch)
        if isinstance(folded, list):
            return folded
        landed, undo, placed = folded
        append = self._append_of(batch, key, self._stamped(landed, grant, client, now), undo)
        try:
            yield append.call
        except Exception as exc:
            append.undo()
            return (yield from self._not_appended(conn, batch, append.call, exc))
        actions = self._appended(conn, batch, append, placed)
        leases = self._lease_calls([*append.records, *append.queue])
        if leases:
            yield actions
            actions = yield from self._keep_leases(leases)
        if self._snapshot_due():
            yield actions
            return (yield from self._snapshot())
        return actions

    def _closed_to_pushes(self, conn: C) -> Close[C] | None:
        """How the room answers any push when it takes none: deleted, shutting down."""
        if self.gone:
            return Close(conn, "deleted", _DELETED)
        if self.closing:
            return Close(conn, "shutting_down", "the hub is shutting down; reconnect later")
        if self._stale:
            return self._unavailable(conn)
        return None

    def _refusal(
        self, conn: C, batch: PushBatch, grant: Grant, client: str, key: str, now: int
    ) -> list[Action[C]] | None:
        """How to answer `batch` without folding it, or None: it may be folded. Refused by the
        token, a resend (its ack again), a copy of a push refused, the wrong lineage, another
        client's draft id, a turn rule, a steering or approval rule."""
        why = scope_refusal(grant, batch.records, now)
        if why is not None:
            # Checked before anything else, a resend too: the token decides, not the seq.
            return [Send(conn, self._reject(batch, "forbidden", why))]
        mark = self.marks.get(key)
        if mark is not None and batch.seq <= mark.seq:
            # A resend of a push that landed: answer with its ack, append nothing.
            return [Send(conn, ack(batch.seq, mark))]
        if batch.seq <= self._answered.get(conn, 0):
            # A copy of a push this connection was refused (the network sent it twice): its
            # replica has rebased those records since, so placing the copy would land them twice.
            return [Send(conn, self._reject(batch, "behind", "a copy of a push answered already"))]
        self._answered[conn] = batch.seq
        if batch.lineage != self.lineage and not (
            batch.lineage == Lineage.EMPTY and self.revision == 0
        ):
            reject = self._reject(batch, "lineage", "the log was rewritten; a state follows")
            return [Send(conn, reject), *self._state_to(conn)]
        clash = self.live.clash(self._owner(conn), batch.records) if self.drafts.drafts else None
        if clash is not None:
            return [Send(conn, self._reject(batch, "invalid", clash))]
        turn = self.turns.refusal(self.conversation, batch, key, grant.sub, client)
        if turn is not None:
            return [Send(conn, self._reject(batch, *turn))]
        steer = self._steer_refusal(batch, key, grant.sub) or self._approval_refusal(
            conn, batch, grant
        )
        if steer is not None:
            return [Send(conn, self._reject(batch, *steer))]
        return None

    def _fold(
        self, conn: C, batch: PushBatch
    ) -> tuple[Sequence[ChangeRecord], Callable[[], None], bool] | list[Action[C]]:
        """Fold `batch` into the room: (the records as they land, how to undo them, whether
        they were placed), or the reject when they do not fit (undone already)."""
        since = len(self.conversation)
        placed = batch.revision != self.revision
        if placed:
            # Made on an older revision: place it by intent when every record replays without
            # conflict and unchanged (SPEC 2.4.6) and the pusher understands a placed push;
            # else `behind`. Unchanged: what lands is exactly what was sent, so a lost ack
            # and the replica's resend or welcome still name the very records in the log.
            outcome = (
                place(self.conversation, batch.records, self._edited_after(batch.revision))
                if batch.revision < self.revision and conn in self._placing
                else None
            )
            if isinstance(outcome, tuple) and not unchanged(outcome[0], batch.records):
                outcome[1]()
                outcome = None
            if not isinstance(outcome, tuple):
                detail = f"the log is at {self.revision}"
                return [Send(conn, self._reject(batch, "behind", detail))]
            landed, undo = outcome
        else:
            try:
                undo = self.conversation.apply_batch(batch.records)
            except ApplyError as error:
                return self._invalid(conn, batch, str(error))
            landed = batch.records
        if self.config.strict_pairing:
            violation = strict_check(self.conversation, landed, since)
            if violation is not None:
                undo()
                if placed:  # judged at its own base, as before: the replica resends it there
                    return [Send(conn, self._reject(batch, "behind", "the log moved"))]
                return self._invalid(conn, batch, f"strict pairing: {violation}")
        unpins = self._pins_refusal(landed)
        if unpins is not None:
            undo()
            return [Send(conn, self._reject(batch, "pinned", unpins))]
        return landed, undo, placed

    def _invalid(self, conn: C, batch: PushBatch, detail: str) -> list[Action[C]]:
        """Reject `batch` `invalid`; drafts its records carry end."""
        rejected = Send(conn, self._reject(batch, "invalid", detail))
        if not self.drafts.drafts:
            return [rejected]
        return [rejected, *self.live.refused(self._owner(conn), batch.records)]

    def _stamped(
        self, landed: Sequence[ChangeRecord], grant: Grant, client: str, now: int
    ) -> list[ChangeRecord]:
        """`landed` as the log keeps them: dated `now` if undated; with auth, `via` the
        pushing principal and client."""
        if self.config.auth:
            via = Via(grant.sub, client)
            return [
                msgspec.structs.replace(record, via=via, at=now if record.at is None else record.at)
                for record in landed
            ]
        return [
            record if record.at is not None else msgspec.structs.replace(record, at=now)
            for record in landed
        ]

    def _append_of(
        self, batch: PushBatch, key: str, records: list[ChangeRecord], undo: Callable[[], None]
    ) -> _Append:
        """The append of `records` (folded in already, undone by `undo`) with the records
        that follow them in the same append: approvals a stop cancels, queued input that
        lands once the step ends."""
        now = self._now
        steering = self.steering
        if steering.touches(records):
            steering = steering.copy()
            steering.track(self.conversation, records)
        queue = approvals.stop_cancels(self.conversation, records, now) + self._landing(
            steering, now
        )
        if queue:
            undo = both(undo, self.conversation.apply_batch(queue))
        encoded = [encode(record) for record in records]
        encoded += [encode(record) for record in queue]
        from_ = self.revision
        mark = ClientMark(batch.seq, from_, from_ + len(encoded))
        call = AppendRecords(self.lineage, from_, encoded, key, mark)
        return _Append(call, records, queue, steering, undo)

    def _appended(
        self, conn: C, batch: PushBatch, append: _Append, placed: bool
    ) -> list[Action[C]]:
        """The store appended `append`: the room follows, the pusher gets its ack, every
        other subscriber the records."""
        call, records, queue, steering = append.call, append.records, append.queue, append.steering
        key, mark = call.client, call.mark
        assert key is not None and mark is not None  # a client's push
        pushed = len(records)
        self.exists = True
        from_ = call.from_
        self.revision = mark.ack_revision
        self.marks[key] = mark
        self._remember(call.records)
        self.turns.note_owners(records, key)
        self._note_edits(from_, [*records, *queue] if queue else records)
        self.steering = steering
        self._steered(records, from_ + pushed)
        for record in records:
            change = record.change
            if type(change) is AsideChange and change.id in steering.queue:
                self._queuers[change.id] = key
        if queue:
            self._steered(queue, self.revision)
        if steering.touches(records):
            self.turns.pushed(key, records)
        # The bare client id (a replica knows its own pushes by it), not the mark's store key.
        origin = PushOrigin(self.subscribers.get(conn, key), batch.seq)
        max_frame = self.config.max_frame
        frames = records_frames(from_, call.records[:pushed], origin, max_frame)
        # A placed push may differ from what was sent: the pusher gets what landed, then the ack.
        # The ack goes before the others' records: a pipelined writer sends its next batch on
        # it (docs/design.md, "Performance choices"; sending the records first was measured and
        # undone, git 4c55c58 and 1ebd20f).
        actions: list[Action[C]] = [Send(conn, frame) for frame in frames] if placed else []
        actions.append(Send(conn, ack(batch.seq, mark)))
        others = self._others.get(conn)
        if others is None:
            others = self._others[conn] = [other for other in self.subscribers if other != conn]
        if others:
            actions += [Broadcast(others, frame) for frame in frames]
        if queue:
            # A queue landed in the same append: made by the hub (no origin), sent to everyone
            # right after the pusher's ack, which counts them (SPEC 10).
            landed = records_frames(from_ + pushed, call.records[pushed:], None, max_frame)
            actions += [Broadcast(list(self.subscribers), frame) for frame in landed]
        if self.drafts.drafts:
            actions += self.live.landed(batch.records)  # in the same step as the records
        metrics = self.metrics
        metrics.records_appended += len(call.records)
        metrics.pushes_accepted += 1
        metrics.pushes_placed += int(placed)
        return actions

    def _not_appended(
        self, conn: C, batch: PushBatch, append: AppendRecords, error: Exception
    ) -> Op[C]:
        """The store did not append `batch` (undone in the room already): say why."""
        if isinstance(error, SeqTaken):
            # Another hub (or this one before a restart) appended this push: bring the room
            # and everyone up to the store, then answer with the ack the store holds.
            assert append.client is not None
            self.marks[append.client] = error.mark
            actions = yield from self._forward_missing()
            return actions if self._stale else [*actions, Send(conn, ack(batch.seq, error.mark))]
        if isinstance(error, LogMoved):
            # Another hub sharing the store appended first: forward what it appended (exactly
            # what this room folds), then reject; the replica rebases on those records.
            actions = yield from self._forward_missing()
            if self._stale:
                return actions
            if batch.lineage != self.lineage:
                reject = self._reject(batch, "lineage", "the log was rewritten")
            else:
                reject = self._reject(batch, "behind", "the log moved on another hub")
            return [*actions, Send(conn, reject)]
        # The write may or may not have landed: trust only what the store says.
        log.error("append to %s failed", self.id, exc_info=error)
        self._stale = True
        return [Close(conn, "unavailable", f"storage failed: {error}; reconnect and resend")]

    def _snapshot(self) -> Op[C]:
        """Write a snapshot of the room as it is (`_snapshot_due` said so)."""
        try:
            size = yield WriteSnapshot(self.lineage, self.revision, self.conversation)
        except Exception as exc:  # a snapshot only speeds up loading
            log.error("snapshot of %s failed", self.id, exc_info=exc)
            return []
        self._snapshot_revision = self.revision
        # Its size in bytes; a shell that does not say weighs the next one by count alone.
        self._snapshot_bytes = size if isinstance(size, int) else 0
        self._bytes_since_snapshot = 0
        return []

    def _snapshot_due(self) -> bool:
        """Whether to write a snapshot now: `snapshot_every` records since the latest one, and
        either those records weigh at least as much as it or there are `SNAPSHOT_SPAN` times
        `snapshot_every` of them.

        A snapshot encodes and writes the whole conversation; taken every `snapshot_every`
        records alone, its cost per record grows with the conversation (at 100,000 messages,
        60-115 ms on the event loop and 44 MB written per 1,000 records). Waiting until the
        records since it outweigh it bounds both to about the records' own size. The span
        bounds what a load folds after the snapshot when records are cheap to store but dear
        to fold (a splice near the start of a long conversation moves every entry after it)."""
        since = self.revision - self._snapshot_revision
        every = self.config.snapshot_every
        return since >= every and (
            self._bytes_since_snapshot >= self._snapshot_bytes or since >= SNAPSHOT_SPAN * every
        )

    def _reject(self, batch: PushBatch, reason: RejectReason, detail: str) -> bytes:
        self.metrics.pushes_rejected[reason] += 1
        return encode_message(Reject(batch.seq, reason, detail, self.lineage, self.revision))

    def _steer_refusal(
        self, batch: PushBatch, key: str, sub: str
    ) -> tuple[RejectReason, str] | None:
        """Why `batch` may not land as sent for steering (SPEC 10), or None: user text
        mid-step (or while a stop stands) waits as queued input; an assistant message made on
        a base older than a user request that landed since is superseded; a stop naming a
        turn that ended is refused, and so is one (with auth) whose author is not the user
        the token names (`sub`: checked, never overwritten); a queued entry is put only as
        `queue_records` makes it,
        and withdrawn only by whoever queued it (`key`)."""
        steering = self.steering
        conversation = self.conversation
        # The steering asides first: a stop too late must be refused `turn_ended` also when
        # a message was typed with it (the replica then replays the message alone).
        for record in batch.records:
            change = record.change
            if type(change) is not AsideChange:
                continue
            aside = change.aside
            if aside is None:
                queuer = self._queuers.get(change.id)
                if queuer is not None and queuer != key and change.id in steering.queue:
                    return "forbidden", "only the sender may withdraw a queued entry"
            elif aside.kind == STOP_KIND and self.config.auth and stopper(aside) != sub:
                return "forbidden", "a stop request's author is the user the token names"
            elif aside.kind == STOP_KIND and turn_ended(conversation, aside):
                return "turn_ended", "the stop names a turn that has ended"
            elif aside.kind == QUEUED_KIND:
                entry = queued_entry(aside)
                if entry is None or queued_id(entry.id) != change.id:  # type: ignore[arg-type]
                    return "invalid", "a queued aside holds one user text entry, under its id"
                if conversation.holds(entry.id) or conversation.is_retired(entry.id):  # type: ignore[arg-type]
                    if batch.revision < self.revision:  # landed since its base: rebase it
                        return "behind", f"entry id {entry.id} landed since this push's base"
                    return "invalid", f"entry id {entry.id} is in the log already"
        if user_text_push(batch.records):
            if steering.stops or steering.mid_step(conversation):
                return "queued", "mid-step: the hub lands it once the step ends"
            return None
        if batch.revision < self._request_revision and pushes_assistant(batch.records):
            return "superseded", "a user request landed after the base of this answer"
        return None

    def _pins_refusal(self, landed: Sequence[ChangeRecord]) -> str | None:
        """Why `landed` (folded in already) may not stay: a compaction that took a pinned
        entry out (SPEC 11), so a pin racing a compaction wins; or None."""
        unpins = compaction_unpins(self.conversation, landed)
        if not unpins:
            return None
        return f"a compaction may not remove pinned entries: {', '.join(unpins)}"

    def _approval_refusal(
        self, conn: C, batch: PushBatch, grant: Grant
    ) -> approvals.Refusal | None:
        """Why `batch` may not land for the approval rules (SPEC 12, `sync.approvals.check`):
        the pusher is the socket's principal and client, may decide with `approve`."""
        if not any(type(r.change) in (AsideChange, Reset) for r in batch.records):
            return None
        actor = approvals.Actor(
            grant.sub, self.subscribers.get(conn, ""), grant.can_approve, self.config.auth
        )
        return approvals.check(self.conversation, batch.records, actor, self.turns.owners.get)

    def _landing(self, steering: Steering, now: int) -> list[ChangeRecord]:
        """The records that land the queue after the push folded in already, when it leaves
        the log not mid-step with no stop standing (`Steering.lands`); else none."""
        if not steering.queue or not steering.lands(self.conversation):
            return []
        note = self._ids.message_id(now)  # taken only when the note goes in
        return landing_records(self.conversation, list(steering.queue), now, note)

    def _steered(self, records: Sequence[ChangeRecord], revision: int) -> None:
        """`records` landed, the log now at `revision`: follow them in the steering index,
        and note when a user request landed."""
        self.tally.track(self.conversation, records)
        if self.steering.touches(records):
            self.steering.track(self.conversation, records)
            queue = self.steering.queue
            for id_ in [id_ for id_ in self._queuers if id_ not in queue]:
                del self._queuers[id_]
        if any(user_text_push([record]) for record in records if type(record.change) is Push):
            self._request_revision = revision

    def _note_edits(self, from_: int, records: Sequence[ChangeRecord]) -> None:
        """Remember which entries and asides `records` (landing after revision `from_`)
        replaced, and when."""
        edited = self._edited
        for revision, record in enumerate(records, from_ + 1):
            change = record.change
            if isinstance(change, Splice) and change.entries:
                for id_ in change.removed:
                    edited[id_] = revision
            elif isinstance(change, AsideChange):
                edited[change.id] = revision
            elif isinstance(change, Reset):
                edited.clear()
                self._edits_from = revision

    def _edited_after(self, revision: int) -> Callable[[str], bool]:
        """Whether the log replaced an entry or aside (by id) after `revision`; an id not seen
        replaced since this room's first revision counts as replaced then."""
        edited, known_from = self._edited, self._edits_from
        return lambda id_: edited.get(id_, known_from) > revision

    def _remember(self, encoded: list[bytes]) -> None:
        self._bytes_since_snapshot += sum(map(len, encoded))
        keep = self.config.recent_records
        if not keep:
            self._recent_from = self.revision
            return
        self._recent.extend(encoded)
        if len(self._recent) > 2 * keep:
            drop = len(self._recent) - keep
            del self._recent[:drop]
            self._recent_from += drop

    # ------------------------------------------------------------------ the log moved

    def log_moved(self, now: int | None = None) -> list[Action[C]]:
        """Another hub appended to this conversation: forward what the room lacks."""
        self._now = self._now if now is None else now
        return self._drive(self._moved())

    def _moved(self) -> Op[C]:
        if not (yield from self._reload_if_stale()):
            return []
        return (yield from self._forward_missing())

    def head_check(self, now: int | None = None) -> list[Action[C]]:
        """The periodic re-read of the head (SPEC 9) on a store other hubs share: forward the
        records the room lacks, like `log_moved`. Correctness never depends on a notice; this
        is the backstop. A read that fails changes nothing (the next check tries again)."""
        self._now = self._now if now is None else now
        return self._drive(self._checking_head())

    def _checking_head(self) -> Op[C]:
        if not (yield from self._reload_if_stale()):
            return []
        try:
            records = yield ReadRecords(self.lineage, self.revision)
        except Exception as exc:
            log.warning("re-reading the head of %s failed: %s", self.id, exc)
            return []
        return (yield from self._forwarded(records))

    def _forward_missing(self) -> Op[C]:
        """Read the records this room lacks, fold them, send exactly those to every
        subscriber (a replica never holds more than its hub's room). When they cannot be
        read, reload; when that fails too, the room is stale (the caller goes no further)."""
        try:
            records = yield ReadRecords(self.lineage, self.revision)
        except Exception:
            records = None  # unreadable: reload, as when rewritten meanwhile
        return (yield from self._forwarded(records))

    def _forwarded(self, records: object) -> Op[C]:
        """Fold `records` (the store's answer to reading after the room's revision) and send
        them to every subscriber; None (rewritten meanwhile): reload, everyone rereads."""
        if records is None:
            return (yield from self._reload_for_all())
        assert isinstance(records, Sequence)
        encoded = list(records)
        if not encoded:
            return []
        from_ = self.revision
        decoded = [decode_record(data) for data in encoded]
        for record in decoded:
            self.conversation.apply(record)
        self._note_edits(from_, decoded)
        self.revision += len(encoded)
        self._steered(decoded, self.revision)
        self.conversation.continue_log(self.lineage, self.revision)
        self.exists = True
        self._remember(encoded)
        to = list(self.subscribers)
        frames = records_frames(from_, encoded, None, self.config.max_frame)
        sent: list[Action[C]] = [Broadcast(to, frame) for frame in frames]
        if self.drafts.drafts:
            sent += self.live.landed(decoded)
        leases = self._lease_calls(decoded)
        if not leases:
            return sent
        yield sent
        return (yield from self._keep_leases(leases))

    def _reload_for_all(self, *, rewrite: bool = False) -> Op[C]:
        """Reload the room; every subscriber gets the state (a rewrite ends every draft).
        When the log cannot be read, the room is stale and every subscriber is closed."""
        try:
            loaded = _loaded((yield LoadLog()))
        except Exception as exc:
            log.error("reloading %s failed", self.id, exc_info=exc)
            self._stale = True
            return [self._unavailable(conn) for conn in self.subscribers]
        if loaded is None and not self.exists:
            return []  # still no log: the room's fresh lineage stands, nothing to send
        rewritten = rewrite or self.exists
        self.load(loaded)
        frames = self._state_frames()
        to = list(self.subscribers)
        # A rewrite ends every draft; a log another hub created where this room had none is
        # no rewrite (its first record may well be a worker's step marker, pushed as its
        # draft opens: ending the draft here hid it from this hub's UIs).
        ended = self.live.rewritten() if rewritten else []
        return [*(Broadcast(to, frame) for frame in frames), *ended]

    # ------------------------------------------------------------------ turns end (SPEC 10)
    #
    # See `server.turns`: the lease of an open turn is written as records open, park, unpark
    # or stop it, renewed by the owner's hub while the owner is connected (`renew`), repaired
    # when a room loads (`loaded_turn`); a hub that finds it lapsed finishes the turn.

    @property
    def has_open_turn(self) -> bool:
        """Whether this room keeps the lease of an open turn."""
        return self.turns.state is not None

    def renew(self, now: int) -> list[Action[C]]:
        """Renew the open turn's lease when its owner is connected to this room."""
        self._now = now
        return self._drive(self._renewing())

    def _renewing(self) -> Op[C]:
        state = self.turns.state
        if state is None or self.config.turn_grace is None:
            return []
        if state.key not in self._connected_keys():
            return []
        return (yield from self._keep_leases([PutLease(self._lease_of(state))]))

    def loaded_turn(self, now: int) -> list[Action[C]]:
        """After a load: keep a lease for the open turn when the store has none (a hub that
        appended the turn and died before writing it), never extending one that stands."""
        self._now = now
        if self.config.turn_grace is None:
            return []
        self.turns.state = state = self._turn_now()
        if state is None:
            return []
        return self._drive(self._keep_leases([PutLease(self._lease_of(state), replace=False)]))

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
        encoded = [encode(record) for record in [*records, *queue]]
        from_ = self.revision
        try:
            yield AppendRecords(self.lineage, from_, encoded, None, None)
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
        leases = self._lease_calls([*records, *queue])
        if not leases:
            return actions
        yield actions
        return (yield from self._keep_leases(leases))

    def _keep_leases(self, calls: Sequence[StoreCall]) -> Op[C]:
        """Carry out lease `calls` one after the other; a failure is logged (a lease is a
        hint, renewed again soon)."""
        for call in calls:
            try:
                yield call
            except Exception as exc:
                log.warning("keeping the turn lease of %s failed: %s", self.id, exc)
        return []

    def _lease_calls(self, records: Sequence[ChangeRecord]) -> list[StoreCall]:
        """The lease writes `records` (folded already) call for: a turn opened, ended,
        parked, unparked or stopped. Nothing for records that cannot change a turn."""
        if self.config.turn_grace is None:
            return []
        turns = self.turns
        if not self.steering.touches(records) and (
            turns.state is None or not any(moves_calls(record) for record in records)
        ):
            return []
        old, new = turns.state, self._turn_now()
        change = turns.change(old, new, self._lease_of(new) if new is not None else None)
        if change is None:
            return []
        turns.state = new
        calls: list[StoreCall] = []
        if change.drop is not None:
            calls.append(DropLease(change.drop))
        if change.put is not None:
            calls.append(PutLease(change.put))
        return calls

    def _turn_now(self) -> TurnState | None:
        """The open turn as the lease sees it, read from the log (see `Turns.read`); notes
        when this room first saw the standing stop."""
        state, self.turns.stop_seen = self.turns.read(
            self.conversation, bool(self.steering.stops), self._now
        )
        return state

    def _lease_of(self, state: TurnState) -> Lease:
        return self.turns.lease_of(state, self._now)

    def _connected_keys(self) -> set[str]:
        grants = self.grants
        return {
            self._mark_key(grants.get(conn, ANONYMOUS), client)
            for conn, client in self.subscribers.items()
        }

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

    # ------------------------------------------------------------------ deleting (SPEC 15)

    def deleted(self) -> list[Action[C]]:
        """The conversation was deleted (by this hub, or another sharing the store): close
        every connection `deleted` (4410, never retried), drop the log, drafts and presence
        the room held; from now on a hello or a push on this room is closed the same way."""
        self.gone = True
        self.exists = False
        self._op = None
        conns = list(dict.fromkeys([*self.subscribers, *self.grants]))
        for conn in conns:
            self.leave(conn, self._now)
        self.conversation = Conversation()
        self.revision, self.marks, self._recent, self._recent_from = 0, {}, [], 0
        self.live.clear()
        return [Close(conn, "deleted", _DELETED) for conn in conns]

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
        diff. The shell calls it when `next_deadline()` comes."""
        self._now = now
        return self.live.tick(now)

    def next_deadline(self) -> int | None:
        """When `tick` next has something to do (ms, on the callers' clock), or None."""
        return self.live.next_deadline()

    def _owner(self, conn: C) -> Owner:
        """Who `conn` is for draft ownership and presence: (principal, client)."""
        hello = self.live.hellos[conn]
        return (self.grants.get(conn, ANONYMOUS).sub, hello.client)

    def _may_write(self, conn: C) -> bool:
        """Whether `conn`'s grant holds `write` on this conversation (drafts need it)."""
        grant = self.grants.get(conn, ANONYMOUS)
        return grant.can_write and grant.allows(self.id) and self._now < grant.exp * 1000

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


def _loaded(outcome: object) -> Loaded | None:
    """`outcome` of a `LoadLog`, checked."""
    assert outcome is None or isinstance(outcome, Loaded)
    return outcome
