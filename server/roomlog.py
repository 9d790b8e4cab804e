"""The room's copy of the log, and how it follows the store: the base of `RoomCore`.

How this works: a `RoomLog` holds one conversation as the hub knows it (the folded log, its
lineage and revision, each client's last accepted push, the encoded tail of the log), the
connections subscribed to it, its drafts and presence (`server.live`) and what it knows of its
open turn (`server.turns`). It runs the core's operations: each operation that waits on the
store is a generator that yields its `StoreCall` and is sent the outcome, or thrown the error
the store raised (`outcome = yield ReadRecords(...)`, `except LogMoved:`); it may also yield a
list of actions to have them sent before it waits, and returns the actions that end it.
`_drive` runs one until it waits or ends; `resume` continues it with the outcome. Here too are
the steps several operations share: reloading after a failure, forwarding what other hubs
appended, keeping the turn's lease, snapshots. The rules for what connections send live in
the subclasses (`server.push.Pushing`, `server.core.RoomCore`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sync import (
    AsideChange,
    ChangeRecord,
    Conversation,
    Lineage,
    Push,
    Reset,
    Splice,
    decode_record,
    decode_state,
)
from sync.budget import Budget
from sync.frames import iter_state_frames, records_frames
from sync.ids import IdMinter
from sync.kinds import MOVES_CALLS, SPLICE, TOUCHES, USER_TEXT, kinds_of
from sync.protocol import (
    PushBatch,
    Reject,
    RejectReason,
    encode_message,
)
from sync.steer import (
    Steering,
    landing_records,
)

from .actions import (
    SNAPSHOT_SPAN,
    Action,
    Broadcast,
    Close,
    DropLease,
    LoadLog,
    PutLease,
    ReadRecords,
    Send,
    SendFrames,
    StoreCall,
    WriteSnapshot,
)
from .auth import ANONYMOUS, Grant
from .drafts import DraftBoard, DraftConfig, Owner
from .live import LiveRoom
from .metrics import Metrics
from .presence import PresenceBoard
from .store.base import ClientMark, Deleted, Lease, Loaded
from .tally import Tally
from .turns import TurnAfter, Turns, TurnState

__all__ = ["EDITS", "CoreConfig", "Op", "RoomLog", "Steps"]

log = logging.getLogger("convsync.hub")

DELETED = "the conversation was deleted"
"""The detail of a `deleted` close (SPEC 15)."""
_UNREADABLE = "the log cannot be read now; reconnect later"
EDITS = SPLICE | TOUCHES
"""The kinds (`sync.kinds`) of record that replace an entry or an aside (`_note_edits`)."""


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


STATE_CACHE_MS = 10_000
"""How long a room keeps the state frames it made for a fresh replica (ms): the replicas of a
burst (a hub restarted, a page shared) share them, those that join while the frames are still
being made too; a room gone idle lets them go."""


class RoomLog(Generic[C]):
    """The room's copy of the log and the driver of its operations (see the module).

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
        # The state's frames as last encoded, by format, with the value and revision they are
        # of: every fresh replica that catches up by the state until the log moves gets the
        # same bytes (10,000 messages: 5-8 ms to encode). Dropped when records land, and at
        # `_cache_until` (`STATE_CACHE_MS` after it was made), so an idle room does not hold a
        # second copy of its conversation.
        self._state_cache: tuple[Conversation, int, int, dict[str | None, _StateFrames]] | None
        self._state_cache = None
        self._cache_until = 0
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
        # Or the push waiting on its append (`server.push`): every push waits on one, so it
        # waits as a plain value, not a generator (fewer frames), and `resume` hands the
        # outcome to `_append_done`.
        self._pending: object | None = None
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
        return self._op is not None or self._pending is not None

    def resume(self, outcome: object) -> list[Action[C]]:
        """Continue the operation that asked for a store call, with its outcome: the value
        it returned, or the exception it raised (thrown into the operation)."""
        if self._pending is not None:
            return self._append_done(outcome)
        op, self._op = self._op, None
        assert op is not None, "resume without a store call"
        if isinstance(outcome, BaseException):  # one check for the common outcome, a value
            if isinstance(outcome, Deleted):  # whatever asked: the log is gone (SPEC 15)
                op.close()
                return self.deleted()
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
            while type(step) is list:  # not `isinstance`: a store call fails it, at a cost
                actions += step
                step = op.send(None)
        except StopIteration as end:
            if actions:
                actions += end.value
                return actions
            return end.value  # type: ignore[no-any-return]
        self._op = op
        actions.append(step)  # type: ignore[arg-type]  # a store call (the loop ended)
        return actions

    def _append_done(self, outcome: object) -> list[Action[C]]:
        """Continue the push waiting on its append (`_pending`) with the store's outcome."""
        raise NotImplementedError  # `server.push.Pushing`

    def _unavailable(self, conn: C) -> Close[C]:
        """Close `conn`: the room cannot match the store now."""
        return Close(conn, "unavailable", _UNREADABLE)

    # ------------------------------------------------------------------ loading

    def load(self, loaded: Loaded | None) -> None:
        """Take the store's log (`LogStore.load`'s answer) as the room's state."""
        self._stale = False
        self._state_cache = None  # the frames of the value this load replaces
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

    def _state_to(self, conn: C) -> list[Action[C]]:
        """The state for `conn`, in the format its hello asked for: the frames this revision
        already encoded, or frames encoded as they are written (the first goes while the next
        is encoded), kept for the next fresh replica once all are made."""
        hello = self.live.hellos.get(conn)
        state_format = hello.state_format if hello is not None else None
        making = self._making(state_format)
        if making.done:
            return [Send(conn, frame, True) for frame in making.frames]
        return [SendFrames(conn, making.reader())]

    def _state_frames(self, state_format: str | None = None) -> list[bytes]:
        """The state's frames in `state_format`, encoded once per revision of the log."""
        return list(self._making(state_format).reader())

    def _revision_cache(self) -> dict[str | None, _StateFrames]:
        """The state frames made at this revision, by format (a room's operations run one at
        a time, so the value is the revision's here)."""
        cache = self._state_cache
        value, lineage, revision = self.conversation, self.lineage, self.revision
        if cache is None or cache[0] is not value or cache[1:3] != (lineage, revision):
            cache = self._state_cache = (value, lineage, revision, {})
            self._cache_until = self._now + STATE_CACHE_MS
        return cache[3]

    def _expire_cache(self, now: int) -> None:
        """Drop the state's frames once `_cache_until` has come (`tick`)."""
        if self._state_cache is not None and now >= self._cache_until:
            self._state_cache = None

    def _cache_deadline(self) -> int | None:
        """When `_expire_cache` has something to do, or None."""
        return self._cache_until if self._state_cache is not None else None

    def _making(self, state_format: str | None) -> _StateFrames:
        """This revision's state frames in `state_format`: made already, being made (the
        replicas that joined meanwhile share them), or to be made from the state as of now
        (taken here, not when the first frame is), each encoded when first taken."""
        made = self._revision_cache()
        making = made.get(state_format)
        if making is None or making.failed is not None:
            source = iter_state_frames(
                self.lineage,
                self.revision,
                self.conversation.state(),
                self.config.max_frame,
                state_format,
            )
            making = made[state_format] = _StateFrames(source)
        return making

    def leave(self, conn: C, now: int | None = None) -> None:
        """`conn` is gone; it gets nothing more. Its presence entry goes at the next `tick`;
        drafts it produced wait `draft_grace` for their producer to come back."""
        self.subscribers.pop(conn, None)
        self._others.clear()
        self.grants.pop(conn, None)
        self._placing.discard(conn)
        self._answered.pop(conn, None)
        self.live.leave(conn, self._now if now is None else now)

    def _mark_key(self, grant: Grant, client: str) -> str:
        """The store's key for a client's mark: the client id without auth (so stores and
        marks from before auth stay valid); with auth, the principal too, so one principal
        can never spend or read another's seqs (`/` in `sub` escaped: the key splits once)."""
        return self._key_of(grant.sub, client) if self.config.auth else client

    def _key_of(self, sub: str, client: str) -> str:
        """The mark key of identity (`sub`, `client`) (see `_mark_key`)."""
        if not self.config.auth:
            return client
        sub = sub.replace("%", "%25").replace("/", "%2F")
        return f"{sub}/{client}"

    def _owner(self, conn: C) -> Owner:
        """Who `conn` is for draft ownership and presence: (principal, client)."""
        hello = self.live.hellos[conn]
        return (self.grants.get(conn, ANONYMOUS).sub, hello.client)

    def _may_write(self, conn: C) -> bool:
        """Whether `conn`'s grant holds `write` on this conversation (drafts need it)."""
        grant = self.grants.get(conn, ANONYMOUS)
        return grant.can_write and grant.allows(self.id) and self._now < grant.exp * 1000

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

    def _landing(self, steering: Steering, now: int) -> list[ChangeRecord]:
        """The records that land the queue after the push folded in already, when it leaves
        the log not mid-step with no stop standing (`Steering.lands`); else none."""
        if not steering.queue or not steering.lands(self.conversation):
            return []
        note = self._ids.message_id(now)  # taken only when the note goes in
        return landing_records(self.conversation, list(steering.queue), now, note)

    def _steered(
        self, records: Sequence[ChangeRecord], revision: int, kinds: int | None = None
    ) -> None:
        """`records` landed, the log now at `revision`: follow them in the tally and the
        steering index, and note when a user request landed. `kinds`: `kinds_of(records)`,
        when known (each index is told only of the kinds it follows)."""
        if kinds is None:
            kinds = kinds_of(records)
        if kinds & Tally.KINDS:
            self.tally.track(self.conversation, records)
        if kinds & TOUCHES:
            self.steering.track(self.conversation, records)
            queue = self.steering.queue
            for id_ in [id_ for id_ in self._queuers if id_ not in queue]:
                del self._queuers[id_]
        if kinds & USER_TEXT:
            self._request_revision = revision

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
        self._state_cache = None  # the log moved: those frames are of an older revision
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
        kinds = kinds_of(records)
        if not kinds & TOUCHES and (turns.state is None or not kinds & MOVES_CALLS):
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

    def _turn_after(
        self,
        steering: Steering,
        records: Sequence[ChangeRecord],
        key: str | None = None,
        pushed: Sequence[ChangeRecord] = (),
        kinds: int | None = None,
    ) -> TurnAfter | None:
        """What the open turn and its lease become once `records` (folded in already, with
        `steering` the steering index after them; `pushed` of them from `key`; `kinds`:
        `kinds_of(records)`, when known) land; None for records that cannot change a turn.
        Changes nothing: the room keeps it only once the append carrying its lease writes
        landed (`Turns.landed`)."""
        if self.config.turn_grace is None:
            return None
        turns = self.turns
        if kinds is None:
            kinds = kinds_of(records)
        if not kinds & TOUCHES and (turns.state is None or not kinds & MOVES_CALLS):
            return None
        now = self._now
        new, seen = turns.read(
            self.conversation, bool(steering.stops), now, turns.openers_of(key, pushed)
        )
        lease = turns.lease_of(new, now, seen) if new is not None else None
        return TurnAfter(new, seen, turns.change(turns.state, new, lease))

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

    # ------------------------------------------------------------------ deleting (SPEC 15)

    def deleted(self) -> list[Action[C]]:
        """The conversation was deleted (by this hub, or another sharing the store): close
        every connection `deleted` (4410, never retried), drop the log, drafts and presence
        the room held; from now on a hello or a push on this room is closed the same way."""
        self.gone = True
        self.exists = False
        self._op = self._pending = None
        conns = list(dict.fromkeys([*self.subscribers, *self.grants]))
        for conn in conns:
            self.leave(conn, self._now)
        self.conversation = Conversation()
        self.revision, self.marks, self._recent, self._recent_from = 0, {}, [], 0
        self.live.clear()
        return [Close(conn, "deleted", DELETED) for conn in conns]


def _loaded(outcome: object) -> Loaded | None:
    """`outcome` of a `LoadLog`, checked."""
    assert outcome is None or isinstance(outcome, Loaded)
    return outcome


class _StateFrames:
    """One revision's state frames in one format, encoded as the first reader takes them and
    kept: every reader (`reader()`) gets all of them in order, and each frame is encoded
    once, however many fresh replicas joined before the last one was made."""

    __slots__ = ("_source", "failed", "frames")

    def __init__(self, source: Iterator[bytes]) -> None:
        self._source: Iterator[bytes] | None = source
        self.frames: list[bytes] = []
        self.failed: BaseException | None = None  # the encoder raised: no reader gets more

    @property
    def done(self) -> bool:
        """Whether every frame is made (the state snapshot is let go of then)."""
        return self._source is None and self.failed is None

    def reader(self) -> Iterator[bytes]:
        at = 0
        while True:
            if at < len(self.frames):
                yield self.frames[at]
                at += 1
                continue
            if self.failed is not None:
                raise self.failed  # never a state cut short, sent as if whole
            if self._source is None:
                return
            try:
                frame = next(self._source, None)
            except BaseException as exc:
                self._source, self.failed = None, exc
                raise
            if frame is None:
                self._source = None
                return
            self.frames.append(frame)
