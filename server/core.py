"""The hub's rules for one conversation, pure: messages and store outcomes in, actions out.

How this works: a `RoomCore` holds one conversation as the hub knows it (the folded log, its
lineage and revision, each client's last accepted push, the encoded tail of the log) and the
connections subscribed to it. The I/O shell (`server.room.Room`) calls `join`, `push`,
`rewrite`, ... with decoded client messages and the time, and gets back a list of actions:

    replica frames ──► join / push ──► [Send, Broadcast, Close, ..., at most one StoreCall]
                                                                        │
    store outcome ───► resume(result) ──► [more actions] ◄──────────────┘

The shell carries the actions out in order: it writes frames to sockets, and when the list
ends with a `StoreCall` it awaits that call on the store and hands the outcome (a value, or the
exception raised) back to `resume`, which continues the same operation. The shell runs one
operation at a time per conversation, so the core never sees two interleaved. Every protocol
rule of SPEC 2.4 lives here once: resend acks, lineage / behind / invalid rejects, strict
pairing, catch-up by records or by state, broadcast, and what to do when the store says the
log moved under us (another hub appended) or failed. So do the access rules of SPEC 6 that
concern the log: each connection joins with a `Grant` (verified by the session), needs `read`
to join and `write` for every push, is known by (principal, client) for seqs and marks, and
replaces an older socket of the same pair. The core never awaits, never reads a
clock of its own and imports no I/O library; the test fake link drives it directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec

from sync import (
    Aside,
    AsideChange,
    Assistant,
    Author,
    ChangeRecord,
    Conversation,
    Entry,
    Halt,
    HaltChange,
    Lineage,
    Push,
    Reset,
    Splice,
    ToolResult,
    TurnEnd,
    User,
    Via,
    approvals,
    decode_record,
    decode_state,
    encode,
)
from sync.budget import Budget
from sync.compact import compaction_unpins
from sync.entries import TURN_KIND, TurnOwner
from sync.errors import ApplyError, ErrorCode, LocalProtocolError
from sync.frames import RECORDS_OVERHEAD, records_frames, state_frames
from sync.ids import IdMinter
from sync.messages import Reasoning, Text
from sync.protocol import (
    Ack,
    AuthOk,
    DraftEnd,
    DraftOp,
    DraftUpdate,
    Error,
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
    open_turn,
    queued_entry,
    queued_id,
    user_text_push,
)
from sync.strict import strict_violation

from .auth import ANONYMOUS, AuthError, Grant
from .drafts import Delta, DraftBoard, DraftConfig, Frame, Out, Owner
from .metrics import Metrics
from .presence import PresenceBoard
from .store.base import ClientMark, Deleted, Lease, Loaded, LogMoved, SeqTaken
from .tally import Tally

__all__ = [
    "SNAPSHOT_SPAN",
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
]

log = logging.getLogger("convsync.hub")

_DELETED = "the conversation was deleted"

HUB_REBASE = "hub_rebase"
"""The feature a replica lists when it takes a placed push's records as its batch."""
AUTH = "auth"
"""The feature a hub with auth lists in `welcome` (SPEC 5)."""
PING = "ping"
"""The feature of a hub that answers `ping` with `pong` (keepalive for browser replicas)."""

C = TypeVar("C", bound=Hashable)
"""A connection, as the shell names it (the core only compares and hashes it)."""


# ---------------------------------------------------------------------- actions


class Send(msgspec.Struct, Generic[C], frozen=True):
    """Write `frame` to `to`. A catch-up frame never counts toward the subscriber's
    `lagging` limit (it is bounded by the log)."""

    to: C
    frame: bytes
    catch_up: bool = False


class Broadcast(msgspec.Struct, Generic[C], frozen=True):
    """Write the same `frame` to every connection of `to`."""

    to: list[C]
    frame: bytes


class SendFrames(msgspec.Struct, Generic[C], frozen=True):
    """Write the frames of `frames` to `to`, in order, as catch-up (never `lagging`): built
    one at a time as they are read, so a shell that reads the next only once the last was
    sent holds one at a time (the `drafts` snapshot, issue 27)."""

    to: C
    frames: Iterator[bytes]


class Close(msgspec.Struct, Generic[C], frozen=True):
    """Send `error {code, detail}` to `to`, then close it with the code's close code."""

    to: C
    code: ErrorCode
    detail: str


class SendDraft(msgspec.Struct, Generic[C], frozen=True):
    """Write `frame` (the encoded `message`: one draft part grown) to every connection of
    `to`. A shell may merge it into a delta for the same `key` still queued for a slow peer;
    draft deltas never count toward `lagging` (SPEC 7)."""

    to: list[C]
    key: tuple[str, str]
    message: DraftUpdate
    frame: bytes


class ReadRecords(msgspec.Struct, frozen=True):
    """Read the log's records after revision `from_`, at `lineage` (None: gone)."""

    lineage: int
    from_: int


class ReadMark(msgspec.Struct, frozen=True):
    """Read `client`'s last accepted push from the store (`LogStore.client_mark`)."""

    client: str


class AppendRecords(msgspec.Struct, frozen=True):
    """Compare-and-append `records` at `lineage`/`from_`, with `client`'s new `mark` (None for
    records the hub makes on its own: a turn it finishes)."""

    lineage: int
    from_: int
    records: list[bytes]
    client: str | None
    mark: ClientMark | None


class PutLease(msgspec.Struct, frozen=True):
    """Keep `lease` for its turn in the store (`LogStore.put_lease`); its outcome is ignored
    (a lease is a hint: a failed write is retried by the next renewal)."""

    lease: Lease
    replace: bool = True


class DropLease(msgspec.Struct, frozen=True):
    """Forget the lease of turn `turn` (it ended)."""

    turn: int


class LoadLog(msgspec.Struct, frozen=True):
    """Load the conversation from the store (its snapshot and the records after it)."""


SNAPSHOT_SPAN = 10
"""At most this many times `snapshot_every` records between two snapshots (`_snapshot_due`)."""


class WriteSnapshot(msgspec.Struct, frozen=True):
    """Store the state of `conversation` at `lineage`/`revision`, encoded by `data()` when
    the call is carried out: after the frames before it went, so that encoding the whole
    conversation never holds up the ack and the records of the push that asked for it. The
    room runs no other step between delivering those frames and calling `data()`, so it
    encodes the state as it was when the core asked. Its outcome is the size of that encoded
    state in bytes."""

    lineage: int
    revision: int
    conversation: Conversation

    def data(self) -> bytes:
        return encode(self.conversation)


class RewriteLog(msgspec.Struct, frozen=True):
    """Replace the log with `records` under the new `lineage`, only if it is still at `base`
    (lineage, revision): a lagging hub never erases what another hub acknowledged."""

    lineage: int
    records: list[bytes]
    base: tuple[int, int] | None


class Raise(msgspec.Struct, frozen=True):
    """Raise `error` to the caller of the operation, once the actions before it are done."""

    error: Exception


StoreCall = (
    ReadRecords
    | AppendRecords
    | LoadLog
    | WriteSnapshot
    | RewriteLog
    | ReadMark
    | PutLease
    | DropLease
)
Action = Send[C] | Broadcast[C] | Close[C] | SendDraft[C] | SendFrames[C] | Raise | StoreCall
_Then = Callable[[object], list[Action[C]]]


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


LIVE_FEATURES = ("drafts", "presence")
"""Live drafts and presence (SPEC 7): a welcome lists those the hello asked for, and the core
uses them only with that connection."""


# ---------------------------------------------------------------------- the core


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
        self.watching: set[C] = set()  # subscribers that watch: in no presence, not `online`
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
        self._then: _Then[C] | None = None
        self._stale = False  # the store failed in a way that may leave us behind it
        # Live drafts and presence (SPEC 7), kept in memory only.
        self.drafts: DraftBoard[C] = DraftBoard(config.drafts, self.metrics, config.max_frame)
        self.presence: PresenceBoard[C] = PresenceBoard(self.metrics, config.presence_throttle)
        self._hellos: dict[C, Hello] = {}
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
        # Turns end (SPEC 10): the open turn as its lease was last written, who opened turn
        # records that name no owner (this room saw them land), when this room first saw the
        # standing stop, and owners whose turn a hub finished (their pushes are refused
        # `turn_ended` until they open a new turn), by mark key, with the revision it ended.
        self._turn: _TurnState | None = None
        self._openers: dict[str, str] = {}
        self._stop_seen: int | None = None
        self._stale_owners: dict[str, int] = {}
        # Approvals (SPEC 12): who opened each turn record, as this room saw it land (the log
        # does not say it yet without auth; issue 26 puts the owner in the record).
        self._turn_owners: dict[str, tuple[str, str]] = {}

    # ------------------------------------------------------------------ driving

    @property
    def waiting(self) -> bool:
        """Whether the core waits for the outcome of a `StoreCall` (`resume`)."""
        return self._then is not None

    def resume(self, outcome: object) -> list[Action[C]]:
        """Continue the operation that asked for a store call, with its outcome: the value
        it returned, or the exception it raised."""
        then, self._then = self._then, None
        assert then is not None, "resume without a store call"
        if isinstance(outcome, Deleted):  # whatever asked: the log is gone (SPEC 15)
            return self.deleted()
        return then(outcome)

    def _call(self, call: StoreCall, then: _Then[C]) -> list[Action[C]]:
        self._then = then
        return [call]

    # ------------------------------------------------------------------ loading

    def load(self, loaded: Loaded | None) -> None:
        """Take the store's log (`LogStore.load`'s answer) as the room's state."""
        self._stale = False
        self._snapshot_revision = 0
        self._snapshot_bytes = self._bytes_since_snapshot = 0
        self._recent, self._recent_from = [], 0
        self._edited, self._edits_from = {}, 0 if loaded is None else loaded.revision
        self._request_revision = 0
        self._turn, self._stop_seen = None, None
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

    def _fresh(self, then: Callable[[], list[Action[C]]]) -> list[Action[C]]:
        """Run `then` on a room that matches the store: reload first after a store failure."""
        if not self._stale:
            return then()
        return self._call(LoadLog(), lambda outcome: self._reloaded(outcome, then))

    def _reloaded(self, outcome: object, then: Callable[[], list[Action[C]]]) -> list[Action[C]]:
        if isinstance(outcome, Exception):
            log.error("reloading %s failed", self.id, exc_info=outcome)
            return []
        assert outcome is None or isinstance(outcome, Loaded)
        self.load(outcome)
        return then()

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
        self._hellos[conn] = hello
        self.grants[conn] = grant
        if self.config.shared_store:
            return self._fresh(lambda: self._read_mark(conn, hello))
        return self._fresh(lambda: self._join(conn, hello))

    def _join(self, conn: C, hello: Hello) -> list[Action[C]]:
        grant = self.grants.get(conn, ANONYMOUS)
        if self._stale:
            return [Close(conn, "unavailable", "the log cannot be read now; reconnect later")]
        actions: list[Action[C]] = []
        # With auth only: without it no one owns a client id, and sockets sharing one (tools
        # that reuse a fixed id, probes) have always been served side by side.
        for other, client in list(self.subscribers.items()) if self.config.auth else []:
            if client == hello.client and self.grants.get(other, ANONYMOUS).sub == grant.sub:
                self.leave(other, self._now)
                actions.append(Close(other, "replaced", "the same client connected again"))
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
        actions.append(Send(conn, encode_message(welcome), True))
        lineage, revision = hello.lineage, hello.revision
        fresh = lineage == Lineage.EMPTY and revision == 0
        if (lineage == self.lineage or fresh) and revision <= self.revision:
            missing = self.revision - revision
            state_items = len(self.conversation) + len(self.conversation.asides())
            if missing == 0:
                return self._subscribe(conn, hello.client, actions)
            if not (fresh and missing >= state_items):
                if revision >= self._recent_from:
                    records = self._recent[revision - self._recent_from :]
                    catch_up = self._catch_up(conn, revision, records)
                    return self._subscribe(conn, hello.client, actions + catch_up)
                read = ReadRecords(self.lineage, revision)
                return actions + self._call(
                    read, lambda outcome: self._caught_up(conn, hello.client, revision, outcome)
                )
        return self._subscribe(conn, hello.client, actions + self._state_to(conn))

    def _read_mark(self, conn: C, hello: Hello) -> list[Action[C]]:
        """On a shared store, the welcome's `acked` comes from the store (SPEC 9): the client
        may have pushed through another hub since this room last heard of it."""
        key = self._mark_key(self.grants.get(conn, ANONYMOUS), hello.client)
        return self._call(ReadMark(key), lambda outcome: self._mark_read(conn, hello, outcome))

    def _mark_read(self, conn: C, hello: Hello, outcome: object) -> list[Action[C]]:
        if isinstance(outcome, Exception):
            log.error(
                "reading the mark of %s in %s failed", hello.client, self.id, exc_info=outcome
            )
            return [Close(conn, "unavailable", "the log cannot be read now; reconnect later")]
        if outcome is None:
            return self._join(conn, hello)
        assert isinstance(outcome, ClientMark)
        key = self._mark_key(self.grants.get(conn, ANONYMOUS), hello.client)
        cached = self.marks.get(key)
        if cached is not None and cached.seq >= outcome.seq:
            return self._join(conn, hello)
        # A push this room has not seen landed through another hub: fold what the room lacks
        # first, so the welcome's `acked` never runs ahead of the records the replica gets.
        self.marks[key] = outcome
        return self._forward_missing(lambda: self._join(conn, hello))

    def _caught_up(self, conn: C, client: str, revision: int, outcome: object) -> list[Action[C]]:
        if isinstance(outcome, Exception):
            log.error("reading %s for a catch-up failed", self.id, exc_info=outcome)
            return [Close(conn, "unavailable", "the log cannot be read now; reconnect later")]
        if outcome is None:  # compacted away or rewritten meanwhile: the state it is
            return self._subscribe(conn, client, self._state_to(conn))
        assert isinstance(outcome, Sequence)
        return self._subscribe(conn, client, self._catch_up(conn, revision, outcome))

    def _catch_up(self, conn: C, revision: int, records: Sequence[bytes]) -> list[Action[C]]:
        """`records` from `revision` as catch-up frames; a state when one record is too large
        for a frame (a rewrite's reset)."""
        budget = self.config.max_frame - RECORDS_OVERHEAD
        if any(len(record) > budget for record in records):
            return self._state_to(conn)
        frames = records_frames(revision, records, None, self.config.max_frame)
        return [Send(conn, frame, True) for frame in frames]

    def _subscribe(self, conn: C, client: str, actions: list[Action[C]]) -> list[Action[C]]:
        self.subscribers[conn] = client
        self._others.clear()
        actions = actions + self._live_join(conn)
        state = self._turn
        if state is not None and state.key == self._mark_key(
            self.grants.get(conn, ANONYMOUS), client
        ):
            return actions + self.renew(self._now)  # the owner is back: its turn goes on
        return actions

    def _state_to(self, conn: C) -> list[Action[C]]:
        hello = self._hellos.get(conn)
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
        self._live_leave(conn, self._now if now is None else now)

    def regrant(self, conn: C, grant: Grant, now: float) -> list[Action[C]]:
        """`conn` refreshed its token (`auth`, verified by the session for the same principal
        and conversation): its new scopes apply from the next message on; answer `auth_ok`."""
        if conn not in self.grants:
            return []
        self.grants[conn] = grant
        actions: list[Action[C]] = [Send(conn, encode_message(AuthOk(grant.expires_in(now))))]
        if not self._may_write(conn):
            # It lost `write`: the drafts it produces end now, for everyone (issue 27).
            actions += live_actions(self.drafts.end_produced_by(conn, "aborted"))
            self.presence.set_drafting(self.drafts.owners())
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
        if self._stale:
            return self._fresh(lambda: self._push(conn, batch, now))
        return self._push(conn, batch, now)

    def _push(self, conn: C, batch: PushBatch, now: int) -> list[Action[C]]:
        self._now = now
        if self.gone:
            return [Close(conn, "deleted", _DELETED)]
        if self.closing:
            return [Close(conn, "shutting_down", "the hub is shutting down; reconnect later")]
        if self._stale:
            return [Close(conn, "unavailable", "the log cannot be read now; reconnect later")]
        client = self.subscribers.get(conn)
        if client is None:
            raise LocalProtocolError("no_join", "a push from a connection that has not joined")
        grant = self.grants.get(conn, ANONYMOUS)
        why = _scope_refusal(grant, batch.records, now)
        if why is not None:
            # Checked before anything else, a resend too: the token decides, not the seq.
            return [Send(conn, self._reject(batch, "forbidden", why))]
        key = self._mark_key(grant, client)
        mark = self.marks.get(key)
        if mark is not None and batch.seq <= mark.seq:
            # A resend of a push that landed: answer with its ack, append nothing.
            return [Send(conn, _ack(batch.seq, mark))]
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
        clash = self._draft_clash(conn, batch.records) if self.drafts.drafts else None
        if clash is not None:
            return [Send(conn, self._reject(batch, "invalid", clash))]
        turn = self._turn_refusal(batch, key, grant, client)
        if turn is not None:
            return [Send(conn, self._reject(batch, *turn))]
        # Whether the batch holds an aside change or a reset, asked once: most pushes hold
        # neither, and then the approval rules, stop cancels, turn owners and the queue's
        # senders have nothing to look at (each helper would find that itself, a call each).
        asides = self.steering.touches(batch.records)
        steer = self._steer_refusal(batch, key, grant.sub)
        if steer is None and asides:
            steer = self._approval_refusal(conn, batch, grant)
        if steer is not None:
            return [Send(conn, self._reject(batch, *steer))]
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
            if isinstance(outcome, tuple) and not _unchanged(outcome[0], batch.records):
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
                rejected = Send(conn, self._reject(batch, "invalid", str(error)))
                return [rejected, *self._drafts_refused(conn, batch.records)]
            landed = batch.records
        if self.config.strict_pairing:
            violation = _strict_check(self.conversation, landed, since)
            if violation is not None:
                undo()
                if placed:  # judged at its own base, as before: the replica resends it there
                    return [Send(conn, self._reject(batch, "behind", "the log moved"))]
                detail = f"strict pairing: {violation}"
                rejected = Send(conn, self._reject(batch, "invalid", detail))
                return [rejected, *self._drafts_refused(conn, batch.records)]
        unpins = self._pins_refusal(landed)
        if unpins is not None:
            undo()
            return [Send(conn, self._reject(batch, "pinned", unpins))]
        if self.config.auth:
            via = Via(grant.sub, client)
            records = [
                msgspec.structs.replace(record, via=via, at=now if record.at is None else record.at)
                for record in landed
            ]
        else:
            records = [
                record if record.at is not None else msgspec.structs.replace(record, at=now)
                for record in landed
            ]
        steering = self.steering
        if asides:  # `records` hold the very changes of `batch.records` (see `_unchanged`)
            steering = steering.copy()
            steering.track(self.conversation, records)
        queue = self._landing(steering, now)
        if asides:
            queue = approvals.stop_cancels(self.conversation, records, now) + queue
        if queue:
            undo = _both(undo, self.conversation.apply_batch(queue))
        encoded = [encode(record) for record in records]
        pushed = len(encoded)
        encoded += [encode(record) for record in queue]
        from_ = self.revision
        append = AppendRecords(
            self.lineage, from_, encoded, key, ClientMark(batch.seq, from_, from_ + len(encoded))
        )
        done = (records, queue, steering, asides)
        return self._call(
            append,
            lambda outcome: self._appended(
                conn, batch, append, undo, placed, outcome, pushed, done
            ),
        )

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
            elif aside.kind == STOP_KIND and self.config.auth and _stopper(aside) != sub:
                return "forbidden", "a stop request's author is the user the token names"
            elif aside.kind == STOP_KIND and _turn_ended(conversation, aside):
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
        if batch.revision < self._request_revision and _pushes_assistant(batch.records):
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
        if not self.steering.touches(batch.records):  # no aside change, no reset
            return None
        actor = approvals.Actor(
            grant.sub, self.subscribers.get(conn, ""), grant.can_approve, self.config.auth
        )
        return approvals.check(self.conversation, batch.records, actor, self._turn_owners.get)

    def _note_owners(self, records: Sequence[ChangeRecord], key: str) -> None:
        """Remember who put each turn record `records` open (the mark key split back into
        principal and client): the turn's owner, until turn records name it (issue 26)."""
        for record in records:
            change = record.change
            if type(change) is AsideChange and change.aside is not None:
                if change.aside.kind == "rig.turn" and change.id not in self._turn_owners:
                    self._turn_owners[change.id] = _owner_of_key(key, self.config.auth)

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
        if user_text_push(records):  # (it looks at pushes only)
            self._request_revision = revision

    def _appended(
        self,
        conn: C,
        batch: PushBatch,
        append: AppendRecords,
        undo: Callable[[], None],
        placed: bool,
        outcome: object,
        pushed: int,
        done: tuple[list[ChangeRecord], list[ChangeRecord], Steering, bool],
    ) -> list[Action[C]]:
        if isinstance(outcome, Exception):
            undo()
            return self._not_appended(conn, batch, append, outcome)
        assert append.client is not None and append.mark is not None  # a client's push
        self.exists = True
        from_ = append.from_
        self.revision = append.mark.ack_revision
        self.marks[append.client] = append.mark
        self._remember(append.records)
        records, queue, steering, asides = done
        if asides:  # (turn records and queued entries are asides)
            self._note_owners(records, append.client)
        self._note_edits(from_, [*records, *queue])
        self.steering = steering
        self._steered(records, from_ + pushed)
        if asides:
            for record in records:
                change = record.change
                if type(change) is AsideChange and change.id in steering.queue:
                    self._queuers[change.id] = append.client
        if queue:
            self._steered(queue, self.revision)
        if asides:
            self._turn_pushed(append.client, records)
        # The bare client id (a replica knows its own pushes by it), not the mark's store key.
        origin = PushOrigin(self.subscribers.get(conn, append.client), batch.seq)
        max_frame = self.config.max_frame
        frames = records_frames(from_, append.records[:pushed], origin, max_frame)
        # A placed push may differ from what was sent: the pusher gets what landed, then the ack.
        # The ack goes before the others' records: a pipelined writer sends its next batch on
        # it (docs/design.md, "Performance choices"; sending the records first was measured and
        # undone, git 4c55c58 and 1ebd20f).
        actions: list[Action[C]] = [Send(conn, frame) for frame in frames] if placed else []
        actions.append(Send(conn, _ack(batch.seq, append.mark)))
        others = self._others.get(conn)
        if others is None:
            others = self._others[conn] = [other for other in self.subscribers if other != conn]
        if others:
            actions += [Broadcast(others, frame) for frame in frames]
        if queue:
            # A queue landed in the same append: made by the hub (no origin), sent to everyone
            # right after the pusher's ack, which counts them (SPEC 10). Framed only then: on
            # an empty list `records_frames` still encodes one empty frame, every push.
            landed = records_frames(from_ + pushed, append.records[pushed:], None, max_frame)
            actions += [Broadcast(list(self.subscribers), frame) for frame in landed]
        if self.drafts.drafts:
            actions += self._drafts_landed(batch.records)  # in the same step as the records
        metrics = self.metrics
        metrics.records_appended += len(append.records)
        metrics.pushes_accepted += 1
        metrics.pushes_placed += int(placed)
        leases = self._lease_calls([*records, *queue])
        if leases:
            return actions + self._calls(leases, self._snapshot_if_due)
        return actions + self._snapshot_if_due()

    def _snapshot_if_due(self) -> list[Action[C]]:
        if self._snapshot_due():
            snapshot = WriteSnapshot(self.lineage, self.revision, self.conversation)
            return self._call(snapshot, self._snapshot_written)
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

    def _not_appended(
        self, conn: C, batch: PushBatch, append: AppendRecords, outcome: Exception
    ) -> list[Action[C]]:
        """The store did not append `batch` (undone in the room already): say why."""
        if isinstance(outcome, SeqTaken):
            # Another hub (or this one before a restart) appended this push: bring the room
            # and everyone up to the store, then answer with the ack the store holds.
            assert append.client is not None
            self.marks[append.client] = outcome.mark
            ack = Send(conn, _ack(batch.seq, outcome.mark))
            return self._forward_missing(lambda: [ack])
        if isinstance(outcome, LogMoved):
            # Another hub sharing the store appended first: forward what it appended (exactly
            # what this room folds), then reject; the replica rebases on those records.
            return self._forward_missing(lambda: self._reject_after_move(conn, batch))
        # The write may or may not have landed: trust only what the store says.
        log.error("append to %s failed", self.id, exc_info=outcome)
        self._stale = True
        detail = f"storage failed: {outcome}; reconnect and resend"
        return [Close(conn, "unavailable", detail)]

    def _reject_after_move(self, conn: C, batch: PushBatch) -> list[Action[C]]:
        if batch.lineage != self.lineage:
            return [Send(conn, self._reject(batch, "lineage", "the log was rewritten"))]
        return [Send(conn, self._reject(batch, "behind", "the log moved on another hub"))]

    def _snapshot_written(self, outcome: object) -> list[Action[C]]:
        if isinstance(outcome, Exception):  # a snapshot only speeds up loading
            log.error("snapshot of %s failed", self.id, exc_info=outcome)
        else:
            self._snapshot_revision = self.revision
            # Its size in bytes; a shell that does not say weighs the next one by count alone.
            weight = outcome if isinstance(outcome, int) else 0
            self._snapshot_bytes, self._bytes_since_snapshot = weight, 0
        return []

    def _reject(self, batch: PushBatch, reason: RejectReason, detail: str) -> bytes:
        self.metrics.pushes_rejected[reason] += 1
        return encode_message(Reject(batch.seq, reason, detail, self.lineage, self.revision))

    def _note_edits(self, from_: int, records: Sequence[ChangeRecord]) -> None:
        """Remember which entries and asides `records` (landing after revision `from_`)
        replaced, and when."""
        edited = self._edited
        for revision, record in enumerate(records, from_ + 1):
            change = record.change
            if type(change) is Push:  # most records: they replace nothing
                continue
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
        return self._fresh(lambda: self._forward_missing(list))

    def head_check(self, now: int | None = None) -> list[Action[C]]:
        """The periodic re-read of the head (SPEC 9) on a store other hubs share: forward the
        records the room lacks, like `log_moved`. Correctness never depends on a notice; this
        is the backstop. A read that fails changes nothing (the next check tries again)."""
        self._now = self._now if now is None else now

        def check() -> list[Action[C]]:
            read = ReadRecords(self.lineage, self.revision)
            return self._call(read, self._head_read)

        return self._fresh(check)

    def _head_read(self, outcome: object) -> list[Action[C]]:
        if isinstance(outcome, Exception):
            log.warning("re-reading the head of %s failed: %s", self.id, outcome)
            return []
        return self._forwarded(outcome, list)

    def _forward_missing(self, then: Callable[[], list[Action[C]]]) -> list[Action[C]]:
        """Read the records this room lacks, fold them, send exactly those to every
        subscriber (a replica never holds more than its hub's room), then `then()`."""
        read = ReadRecords(self.lineage, self.revision)
        return self._call(read, lambda outcome: self._forwarded(outcome, then))

    def _forwarded(self, outcome: object, then: Callable[[], list[Action[C]]]) -> list[Action[C]]:
        if isinstance(outcome, Exception) or outcome is None:
            # Rewritten meanwhile (or unreadable): reload, and everyone rereads the state.
            return self._call(LoadLog(), lambda loaded: self._reloaded_for_all(loaded, then))
        assert isinstance(outcome, Sequence)
        records = list(outcome)
        if not records:
            return then()
        from_ = self.revision
        decoded = [decode_record(data) for data in records]
        for record in decoded:
            self.conversation.apply(record)
        self._note_edits(from_, decoded)
        self.revision += len(records)
        self._steered(decoded, self.revision)
        self.conversation.continue_log(self.lineage, self.revision)
        self.exists = True
        self._remember(records)
        to = list(self.subscribers)
        frames = records_frames(from_, records, None, self.config.max_frame)
        landed = self._drafts_landed(decoded)
        sent: list[Action[C]] = [*(Broadcast(to, frame) for frame in frames), *landed]
        leases = self._lease_calls(decoded)
        if leases:
            return sent + self._calls(leases, then)
        return sent + then()

    def _reloaded_for_all(
        self, outcome: object, then: Callable[[], list[Action[C]]], *, rewrite: bool = False
    ) -> list[Action[C]]:
        if isinstance(outcome, Exception):
            log.error("reloading %s failed", self.id, exc_info=outcome)
            self._stale = True
            return [
                Close(conn, "unavailable", "the log cannot be read now; reconnect later")
                for conn in self.subscribers
            ]
        assert outcome is None or isinstance(outcome, Loaded)
        if outcome is None and not self.exists:
            return then()  # still no log: the room's fresh lineage stands, nothing to send
        rewritten = rewrite or self.exists
        self.load(outcome)
        frames = self._state_frames()
        to = list(self.subscribers)
        # A rewrite ends every draft; a log another hub created where this room had none is
        # no rewrite (its first record may well be a worker's step marker, pushed as its
        # draft opens: ending the draft here hid it from this hub's UIs).
        ended = live_actions(self.drafts.end_all("aborted")) if rewritten else []
        return [*(Broadcast(to, frame) for frame in frames), *ended, *then()]

    # ------------------------------------------------------------------ turns end (SPEC 10)
    #
    # An open turn whose record names an owner (or whose opener this room saw) has a lease in
    # the store beside the log: written when the turn opens, parks, unparks or is stopped
    # (`_lease_calls`, by every hub that folds the change: they write the same thing),
    # renewed by the owner's hub while the owner is connected (`renew`), repaired when a room
    # loads (`loaded_turn`). Any hub that finds a lapsed lease (`finish_expired`) ends the turn
    # by compare-and-append, so of several hubs exactly one does; the others fold its records.

    @property
    def has_open_turn(self) -> bool:
        """Whether this room keeps the lease of an open turn."""
        return self._turn is not None

    def renew(self, now: int) -> list[Action[C]]:
        """Renew the open turn's lease when its owner is connected to this room."""
        self._now = now
        state = self._turn
        if state is None or self.config.turn_grace is None:
            return []
        if state.key not in self._connected_keys():
            return []
        return self._calls([PutLease(self._lease_of(state))], list)

    def loaded_turn(self, now: int) -> list[Action[C]]:
        """After a load: keep a lease for the open turn when the store has none (a hub that
        appended the turn and died before writing it), never extending one that stands."""
        self._now = now
        if self.config.turn_grace is None:
            return []
        self._turn = state = self._turn_now()
        if state is None:
            return []
        return self._calls([PutLease(self._lease_of(state), replace=False)], list)

    def finish_expired(self, lease: Lease, now: int) -> list[Action[C]]:
        """`lease` lapsed (the store said so at `now`): end its turn as `finish_stopped` would,
        authored `Author.rig()` — `failed` ("the worker went away", no halt: the request
        stays owed) or, when a stop stands, `stopped` — unless the log says otherwise (the
        turn ended already, its owner is connected here, it is parked). The owner's open
        draft's text is kept as the aborted message."""
        self._now = now
        if self.config.turn_grace is None or self.closing:
            return []
        return self._fresh(lambda: self._finish(lease, now))

    def _finish(self, lease: Lease, now: int) -> list[Action[C]]:
        if self._stale:
            return []
        self._turn = state = self._turn_now()
        if state is None or state.index != lease.turn:
            return self._calls([DropLease(lease.turn)], list)  # it ended meanwhile
        stop_due = state.stopping and lease.stop_expires is not None and lease.stop_expires <= now
        if not stop_due:
            if state.parked or state.key in self._connected_keys():
                return self._calls([PutLease(self._lease_of(state))], list)
            if lease.expires is None or lease.expires > now:
                return []
        end = TurnEnd.stopped() if state.stopping else TurnEnd.failed(WENT_AWAY)
        conversation = self.conversation
        partial = self._owner_draft(state)
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
            undo = _both(undo, conversation.apply_batch(queue))
        encoded = [encode(record) for record in [*records, *queue]]
        append = AppendRecords(self.lineage, self.revision, encoded, None, None)
        done = (records, queue, steering)
        return self._call(
            append, lambda outcome: self._finished(append, undo, done, state, outcome)
        )

    def _finished(
        self,
        append: AppendRecords,
        undo: Callable[[], None],
        done: tuple[list[ChangeRecord], list[ChangeRecord], Steering],
        state: _TurnState,
        outcome: object,
    ) -> list[Action[C]]:
        if isinstance(outcome, Exception):
            undo()
            if isinstance(outcome, LogMoved):  # another hub moved first (maybe finishing it)
                return self._forward_missing(list)
            log.error("finishing turn %d of %s failed", state.index, self.id, exc_info=outcome)
            self._stale = True
            return []
        records, queue, steering = done
        from_ = append.from_
        self.exists = True
        self.revision = from_ + len(append.records)
        self._remember(append.records)
        self._note_edits(from_, [*records, *queue])
        self.steering = steering
        self._steered(records, from_ + len(records))
        if queue:
            self._steered(queue, self.revision)
        self._stale_owners[state.key] = self.revision
        how = "stopped" if state.stopping else "failed"
        log.info("turn %d of %s ended %s: its worker did not finish it", state.index, self.id, how)
        frames = records_frames(from_, append.records, None, self.config.max_frame)
        to = list(self.subscribers)
        actions: list[Action[C]] = [Broadcast(to, frame) for frame in frames]
        if self.drafts.drafts:
            actions += self._drafts_landed(records)
        self.metrics.records_appended += len(append.records)
        return actions + self._calls(self._lease_calls([*records, *queue]), list)

    def _calls(
        self, calls: Sequence[StoreCall], then: Callable[[], list[Action[C]]]
    ) -> list[Action[C]]:
        """Carry out lease `calls` one after the other (a failure is logged: a lease is a
        hint, renewed again soon), then `then()`."""
        if not calls:
            return then()
        first, rest = calls[0], calls[1:]

        def after(outcome: object) -> list[Action[C]]:
            if isinstance(outcome, Exception):
                log.warning("keeping the turn lease of %s failed: %s", self.id, outcome)
            return self._calls(rest, then)

        return self._call(first, after)

    def _lease_calls(self, records: Sequence[ChangeRecord]) -> list[StoreCall]:
        """The lease writes `records` (folded already) call for: a turn opened, ended,
        parked, unparked or stopped. Nothing for records that cannot change a turn."""
        if self.config.turn_grace is None:
            return []
        if not self.steering.touches(records) and (
            self._turn is None or not any(_moves_calls(record) for record in records)
        ):
            return []
        old, new = self._turn, self._turn_now()
        if new == old:
            return []
        self._turn = new
        calls: list[StoreCall] = []
        if old is not None and (new is None or new.index != old.index):
            calls.append(DropLease(old.index))
        if new is not None:
            calls.append(PutLease(self._lease_of(new)))
        return calls

    def _turn_now(self) -> _TurnState | None:
        """The open turn as the lease sees it, read from the log; None when no turn is open or
        nobody is known to own it."""
        stopping = bool(self.steering.stops)
        if not stopping:
            self._stop_seen = None
        elif self._stop_seen is None:
            self._stop_seen = self._now
        turn = open_turn(self.conversation)
        if turn is None:
            return None
        id_, record = turn
        owner = record.owner
        key = self._key_of(owner.sub, owner.client) if owner else self._openers.get(id_)
        if key is None:
            return None
        parked = approvals.parked(self.conversation)
        return _TurnState(id_, record.index, owner, key, parked, stopping)

    def _lease_of(self, state: _TurnState) -> Lease:
        grace = self.config.turn_grace or 0
        expires = None if state.parked else self._now + grace
        seen = self._stop_seen
        stop = None if seen is None or not state.stopping else seen + self.config.stop_grace
        return Lease(self.id, state.index, state.key, expires, stop)

    def _connected_keys(self) -> set[str]:
        grants = self.grants
        return {
            self._mark_key(grants.get(conn, ANONYMOUS), client)
            for conn, client in self.subscribers.items()
        }

    def _owner_draft(self, state: _TurnState) -> Entry | None:
        """The text of the owner's open assistant draft, as an entry under the draft's id (so
        every UI's draft ends `committed` as its text lands)."""
        if state.owner is None or not self.drafts.drafts:
            return None
        owner = (state.owner.sub, state.owner.client)
        for draft in self.drafts.drafts.values():
            if draft.owner != owner or draft.role != "assistant":
                continue
            reasoning, text = draft.text("reasoning"), draft.text("text")
            content: list[Reasoning | Text] = []
            if reasoning:
                content.append(Reasoning(reasoning))
            if text:
                content.append(Text(text))
            if content:
                return Entry(Assistant(content), draft.id, draft.author)  # type: ignore[arg-type]
        return None

    def _turn_refusal(
        self, batch: PushBatch, key: str, grant: Grant, client: str
    ) -> tuple[RejectReason, str] | None:
        """Why `batch` may not land for turns (SPEC 10), or None: its pusher's turn was ended
        by a hub while it was away (until it opens a new turn), or a turn record names an
        owner other than the pushing connection (checked, never overwritten)."""
        if self._stale_owners and key in self._stale_owners and not _opens_turn(batch.records):
            return "turn_ended", "this client's turn ended while it was away; open a new turn"
        for record in batch.records:
            change = record.change
            if type(change) is not AsideChange or change.aside is None:
                continue
            aside = change.aside
            if aside.kind != TURN_KIND or not isinstance(aside.value, dict):
                continue
            owner = aside.value.get("owner")
            if owner is None:
                continue
            stored = self.conversation.aside(change.id)
            held = stored.value.get("owner") if stored and isinstance(stored.value, dict) else None
            if owner != held and owner != {"sub": grant.sub, "client": client}:
                return "forbidden", "a turn record names an owner other than this connection"
        return None

    def _turn_pushed(self, key: str | None, records: Sequence[ChangeRecord]) -> None:
        """`records` from `key` landed: remember who opened a turn record naming no owner; a
        client whose turn a hub ended is forgiven once it opens a new one."""
        for record in records:
            change = record.change
            if type(change) is not AsideChange or change.aside is None:
                continue
            value = change.aside.value
            if change.aside.kind != TURN_KIND or not isinstance(value, dict):
                continue
            if value.get("end") is None and key is not None:
                if value.get("owner") is None:
                    self._openers[change.id] = key
                self._stale_owners.pop(key, None)

    # ------------------------------------------------------------------ rewriting

    def rewrite(self, conversation: Conversation, lineage: int, now: int) -> list[Action[C]]:
        """Replace the log with one `reset` record holding `conversation`'s state under the
        fresh `lineage`; every subscriber is sent the new state and rereads."""
        record = ChangeRecord(Reset(conversation.state()), Author.rig(), now)
        # Always compare-and-set: a room that saw no log expects none (revision 0), so a log
        # another hub created meanwhile is never erased.
        base = (self.lineage, self.revision)
        call = RewriteLog(lineage, [encode(record)], base)
        return self._call(call, self._rewritten)

    def _rewritten(self, outcome: object) -> list[Action[C]]:
        if isinstance(outcome, LogMoved):
            # Another hub appended since this room last saw the log: bring everyone up to it,
            # then tell the caller; it may rewrite again from what it now sees.
            return self._forward_missing(lambda: [Raise(outcome)])
        if isinstance(outcome, Exception):
            raise outcome  # the caller of `Hub.rewrite` learns it; nothing changed here
        return self._call(
            LoadLog(), lambda loaded: self._reloaded_for_all(loaded, list, rewrite=True)
        )

    # ------------------------------------------------------------------ deleting (SPEC 15)

    def deleted(self) -> list[Action[C]]:
        """The conversation was deleted (by this hub, or another sharing the store): close
        every connection `deleted` (4410, never retried), drop the log, drafts and presence
        the room held; from now on a hello or a push on this room is closed the same way."""
        self.gone = True
        self.exists = False
        self._then = None
        conns = list(dict.fromkeys([*self.subscribers, *self.grants]))
        for conn in conns:
            self.leave(conn, self._now)
        self.conversation = Conversation()
        self.revision, self.marks, self._recent, self._recent_from = 0, {}, [], 0
        self.drafts.end_all("aborted")  # nobody is left to tell
        self._hellos.clear()
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
        if op.op == "open":
            refusal = self._open_refusal(conn, op)
            if refusal is not None:
                return [Send(conn, encode_message(refusal))]
        elif not self._may_write(conn):
            # Every op, not only `open`: an append or keep from a socket without `write`
            # (a downgrade, or a read-only socket of the same owner) would take the draft
            # over and be broadcast (issue 27).
            refusal = DraftEnd(op.id, "refused", "this connection may not write")
            return [Send(conn, encode_message(refusal))]
        actions = live_actions(self.drafts.receive(conn, owner, op, now))
        self.presence.set_drafting(self.drafts.owners())
        return actions + self.tick(now)

    def status(self, conn: C, update: StatusUpdate, now: int) -> list[Action[C]]:
        """`conn` set its presence status (checked by the hub session); ignored unless its
        grant holds `presence` or `write`."""
        self._now = now
        if conn in self.subscribers and self.grants.get(conn, ANONYMOUS).can_presence:
            self.presence.set_status(conn, update.status, update.detail)
        return self.tick(now)

    def tick(self, now: int) -> list[Action[C]]:
        """What is due at `now`: coalesced draft deltas, drafts that timed out, a presence
        diff. The shell calls it when `next_deadline()` comes."""
        self._now = now
        actions = live_actions(self.drafts.tick(now))
        if actions:
            self.presence.set_drafting(self.drafts.owners())
        for to, frame in self.presence.tick(now):
            actions.append(Broadcast(to, frame))
        return actions

    def next_deadline(self) -> int | None:
        """When `tick` next has something to do (ms, on the callers' clock), or None."""
        drafts, presence = self.drafts.next_deadline(), self.presence.next_deadline()
        if drafts is None or presence is None:
            return presence if drafts is None else drafts
        return min(drafts, presence)

    def _owner(self, conn: C) -> Owner:
        """Who `conn` is for draft ownership and presence: (principal, client)."""
        hello = self._hellos[conn]
        return (self._principal(conn), hello.client)

    def _principal(self, conn: C) -> str:
        """The token's `sub` (`anonymous` without auth)."""
        return self.grants.get(conn, ANONYMOUS).sub

    def _may_write(self, conn: C) -> bool:
        """Whether `conn`'s grant holds `write` on this conversation (drafts need it)."""
        grant = self.grants.get(conn, ANONYMOUS)
        return grant.can_write and grant.allows(self.id) and self._now < grant.exp * 1000

    def _open_refusal(self, conn: C, op: DraftOp) -> DraftEnd | None:
        """Why `open` may not start draft `op.id`, for the sender only; None: it may."""
        if not self._may_write(conn):
            return DraftEnd(op.id, "refused", "this connection may not write")
        if self.conversation.holds(op.id):
            return DraftEnd(op.id, "committed", "the log holds this id")
        if self.conversation.is_retired(op.id):
            return DraftEnd(op.id, "refused", "this id was taken out of the log")
        return None

    def _live_join(self, conn: C) -> list[Action[C]]:
        """A joined connection's presence entry, then the drafts and presence it sees."""
        hello = self._hellos.get(conn)
        if hello is None:
            return []
        principal, client = self._owner(conn)
        # With auth, presence shows what the token says (kind, name), not what the hello claims.
        grant = self.grants.get(conn, ANONYMOUS)
        kind = grant.kind if self.config.auth else hello.kind
        if hello.watch:  # watching is not joining (SPEC 17): counted, never shown
            if conn not in self.watching:
                self.watching.add(conn)
                self.metrics.watchers += 1
        else:
            self.presence.join(conn, principal, client, kind, grant.name, self._now)
        actions: list[Action[C]] = []
        if "drafts" in hello.features:
            actions.append(SendFrames(conn, self.drafts.subscribe(conn)))
        if "presence" in hello.features:
            actions.append(Send(conn, self.presence.subscribe(conn), True))
        return actions + self.tick(self._now)

    def _live_leave(self, conn: C, now: int) -> None:
        self._hellos.pop(conn, None)
        if conn in self.watching:
            self.watching.discard(conn)
            self.metrics.watchers -= 1
        self.drafts.unsubscribe(conn, now)
        self.presence.leave(conn)

    def _draft_clash(self, conn: C, records: Sequence[ChangeRecord]) -> str | None:
        """Why `records` from `conn` may not land: one would make another client's open
        draft's id held."""
        if not self.drafts.drafts:
            return None
        owner = self._owner(conn)
        for id_ in _entry_ids(records):
            holder = self.drafts.owner_of(id_)
            if holder is not None and holder != owner:
                return f"entry id {id_} is another client's open draft"
        return None

    def _drafts_refused(self, conn: C, records: Sequence[ChangeRecord]) -> list[Action[C]]:
        """The owner's push carrying a draft's id was rejected `invalid`: the draft ends."""
        if not self.drafts.drafts:
            return []
        owner = self._owner(conn)
        out: list[Out[C]] = []
        for id_ in _entry_ids(records):
            if self.drafts.owner_of(id_) == owner:
                out += self.drafts.end(id_, "aborted", "the push carrying it was rejected")
        self.presence.set_drafting(self.drafts.owners())
        return live_actions(out)

    def _drafts_landed(self, records: Sequence[ChangeRecord]) -> list[Action[C]]:
        """Records landed: drafts whose ids they made held end `committed`; a halt `stopped`
        ends every other one `stopped`; a stop request marks them `stopping`."""
        if not self.drafts.drafts:
            return []
        out = self.drafts.end_held(_entry_ids(records), lambda owner: True)
        if any(_halts_stopped(record) for record in records):
            out += self.drafts.end_all("stopped")
        elif any(_stops(record) for record in records):
            out += self.drafts.mark_stopping()  # shown until the turn ends (SPEC 10)
        self.presence.set_drafting(self.drafts.owners())
        return live_actions(out)

    # ------------------------------------------------------------------ reads

    def snapshot_json(self) -> bytes:
        """`{"lineage", "revision", "state"}` for `GET /v1/conversations/{id}`."""
        state = encode(self.conversation)
        return b'{"lineage":%d,"revision":%d,"state":%s}' % (self.lineage, self.revision, state)


def deliver(
    actions: list[Action[C]],
    send: Callable[[C, bytes, bool], None],
    close: Callable[[C, ErrorCode, str], None],
    send_draft: Callable[[C, SendDraft[C]], None] | None = None,
    broadcast: Callable[[list[C], bytes], None] | None = None,
    send_frames: Callable[[C, Iterator[bytes]], None] | None = None,
) -> StoreCall | None:
    """Carry out the frame actions of `actions` in order with `send(to, frame, catch_up)` and
    `close(to, code, detail)` (and `send_draft(to, action)` for draft deltas, if given; else
    they go through `send`; and `broadcast(to, frame)` for a frame to several, if given; else
    `send` to each; and `send_frames(to, frames)` for frames built as they are read, if
    given; else `send` each at once, as catch-up); return the store call that ends the
    list, if any (the caller awaits it and hands the outcome to `RoomCore.resume`). A
    `Raise` raises its error."""
    call: StoreCall | None = None
    for action in actions:  # `isinstance`, most frequent first: not `match`, which costs more
        if isinstance(action, Broadcast):
            if broadcast is not None:
                broadcast(action.to, action.frame)
                continue
            frame = action.frame
            for conn in action.to:
                send(conn, frame, False)
        elif isinstance(action, Send):
            send(action.to, action.frame, action.catch_up)
        elif isinstance(action, SendDraft):
            for conn in action.to:
                if send_draft is not None:
                    send_draft(conn, action)
                else:
                    send(conn, action.frame, False)
        elif isinstance(action, Close):
            close(action.to, action.code, action.detail)
        elif isinstance(action, SendFrames):
            if send_frames is not None:
                send_frames(action.to, action.frames)
            else:
                for frame in action.frames:
                    send(action.to, frame, True)
        elif isinstance(action, Raise):
            raise action.error
        else:
            call = action
    return call


def live_actions(out: list[Out[C]]) -> list[Action[C]]:
    """The actions that carry out what the drafts board sent (`Frame`s and `Delta`s)."""
    actions: list[Action[C]] = []
    for item in out:
        match item:
            case Frame(to, frame):
                actions.append(Send(to[0], frame) if len(to) == 1 else Broadcast(to, frame))
            case Delta(to, key, message, frame):
                actions.append(SendDraft(to, key, message, frame))
    return actions


def error_frame(code: ErrorCode, detail: str) -> bytes:
    """The `error` message sent before a close."""
    return encode_message(Error(code, detail))


def _scope_refusal(grant: Grant, records: Sequence[ChangeRecord], now: int) -> str | None:
    """Why `grant` may not push `records`, or None: deciding approvals needs `approve` and
    nothing else does; every other record needs `write` (SPEC 12: `write` does not decide)."""
    if now >= grant.exp * 1000:
        return "token expired"
    decisions = 0
    for record in records:  # a loop (no generator), and asides only: this runs every push
        if type(record.change) is AsideChange and approvals.is_decision(record):
            decisions += 1
    if decisions and not grant.can_approve:
        return "token lacks the approve scope"
    if (decisions < len(records) or not records) and not grant.can_write:
        return "token lacks the write scope"
    return None


def _owner_of_key(key: str, auth: bool) -> tuple[str, str]:
    """(principal, client) of a mark key (`RoomCore._mark_key`)."""
    if not auth:
        return ("anonymous", key)
    sub, _, client = key.partition("/")
    return (sub.replace("%2F", "/").replace("%25", "%"), client)


def _unchanged(landed: Sequence[ChangeRecord], sent: Sequence[ChangeRecord]) -> bool:
    """Whether `place` replayed every sent record as it was (none dropped or re-targeted)."""
    return len(landed) == len(sent) and all(a is b for a, b in zip(landed, sent, strict=True))


def _ack(seq: int, mark: ClientMark) -> bytes:
    return encode_message(Ack(seq, mark.ack_from, mark.ack_revision))


def _strict_check(
    conversation: Conversation, records: Sequence[ChangeRecord], since: int
) -> str | None:
    """Strict pairing over what `records` changed (`since` is the length before them)."""
    touches = False
    for record in records:
        change = record.change
        if isinstance(change, Push):
            touches = touches or any(_pairs(entry.message) for entry in change.entries)
        elif isinstance(change, Splice | Reset):
            since = min(since, change.start if isinstance(change, Splice) else 0)
            touches = True
    if not touches:
        return None
    violation = strict_violation(conversation, since)
    return None if violation is None else violation.message


def _both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    """Undo `then`, then `first` (two folds, the later one on top)."""

    def undo() -> None:
        then()
        first()

    return undo


def _stops(record: ChangeRecord) -> bool:
    """Whether `record` stops the turn: a halt `stopped`, or a stop request (SPEC 10: the
    worker's drafts end `stopped`, which cancels its model call within one round trip)."""
    change = record.change
    if type(change) is HaltChange:
        return change.halt is Halt.STOPPED
    return (
        type(change) is AsideChange and change.aside is not None and change.aside.kind == STOP_KIND
    )


def _halts_stopped(record: ChangeRecord) -> bool:
    change = record.change
    return type(change) is HaltChange and change.halt is Halt.STOPPED


def _pushes_assistant(records: Sequence[ChangeRecord]) -> bool:
    """Whether `records` push (or splice in) an assistant message."""
    for record in records:
        change = record.change
        if isinstance(change, Push | Splice):
            if any(type(entry.message) is Assistant for entry in change.entries):
                return True
    return False


def _stopper(aside: Aside) -> str | None:
    """Who a stop request says stopped: its `user` author's name (SPEC 10)."""
    author = aside.author
    return author.name if author.kind == "user" else None


def _turn_ended(conversation: Conversation, aside: Aside) -> bool:
    """Whether stop request `aside` names a turn whose record has ended."""
    value = aside.value
    turn = value.get("turn") if isinstance(value, dict) else None
    if type(turn) is not int:
        return False
    return any(
        record.index == turn and record.end is not None for _, record in conversation.turns()
    )


def _entry_ids(records: Sequence[ChangeRecord]) -> list[str]:
    """The ids of every entry `records` put in (pushed, spliced in or reset to)."""
    ids: list[str] = []
    for record in records:
        change = record.change
        if isinstance(change, Push | Splice):
            ids += [entry.id for entry in change.entries if entry.id is not None]
        elif isinstance(change, Reset):
            ids += [entry.id for entry in change.state.entries if entry.id is not None]
    return ids


def _pairs(message: object) -> bool:
    """Whether a pushed message takes part in pairing (an assistant turn or a result)."""
    if isinstance(message, Assistant):
        return True
    return isinstance(message, User) and any(isinstance(p, ToolResult) for p in message.content)


@dataclass(frozen=True, slots=True)
class _TurnState:
    """The open turn as its lease sees it (SPEC 10)."""

    turn_id: str
    index: int
    owner: TurnOwner | None
    key: str
    """The owner's mark key."""
    parked: bool
    stopping: bool


def _opens_turn(records: Sequence[ChangeRecord]) -> bool:
    """Whether `records` put a turn record that has not ended (open a turn)."""
    for record in records:
        change = record.change
        if type(change) is AsideChange and change.aside is not None:
            aside = change.aside
            if aside.kind == TURN_KIND and isinstance(aside.value, dict):
                if aside.value.get("end") is None:
                    return True
    return False


def _moves_calls(record: ChangeRecord) -> bool:
    """Whether `record` may change the calls pending (it brings a call or a result)."""
    change = record.change
    if isinstance(change, Push | Splice):
        return any(_pairs(entry.message) for entry in change.entries)
    return isinstance(change, Reset)
