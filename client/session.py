"""The replica's side of the protocol, pure: messages in, messages and events out.

How this works: the session holds the log as it last saw it (`log`, a `LogView`: `confirmed`,
the log's value, and the lag of records folded into `local` alone) and `local` (what the
application edits: the log plus pending records). Pending records are the batch in flight
(sent, not yet acked) followed by `local`'s outbox (made since, on top of that batch). At most
one batch is in flight. Which message or call is legal when is one table, `client.phases`:
`connecting` -> `catching_up` -> `live`, and `closed` for good.

- `hello()` opens each connection (`connecting`). On `welcome` (`catching_up`), a batch in
  flight whose seq the hub already holds has landed (its records come in the catch-up); any
  other goes back to the outbox. The catch-up (`records` up to the welcome's revision, or a
  `state`) folds into `confirmed` only; once it is complete (`live`), `local` is rebased on it
  in one step.
- Live, with nothing pending (the common case of a subscriber), records from others fold into
  `local` alone (`LogView.follow`: the lag, and `local` alone standing for the log once the
  lag grows; see `client.logview`). `revision` and `lineage` (what `hello` and a push carry)
  count the lag without folding it; reading `confirmed` folds it.
- Records that arrive while something is pending fold into `confirmed`; the batch in flight
  is doomed (the hub will reject it as `behind`: it handles pushes in log order) and every
  pending record is replayed on the new log by `sync.rebase`.
- `ack` folds the batch into `confirmed`; `reject invalid` (or `forbidden`, a token without
  `write`) reports each of its records as a `Conflict` and rebases what was made on top of it.

`receive` raises `ProtocolError` for a message that breaks the protocol (one its phase does not
accept among them, refused before it changes anything); the caller then drops the connection
and resumes with a new `hello()`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import msgspec

from sync import (
    ApplyError,
    AsideChange,
    ChangeRecord,
    Conversation,
    Entry,
    Lineage,
    Push,
    UsageError,
    encode,
)
from sync.approvals import is_decision
from sync.budget import TokenBucket, pacer_for
from sync.errors import Refused, RemoteProtocolError, Unavailable, reject_rule, retry_of
from sync.frames import MAX_FRAME, PUSH_OVERHEAD, fill_budget, push_frame, runs
from sync.protocol import (
    Ack,
    AuthOk,
    DraftEnd,
    Drafts,
    DraftState,
    DraftUpdate,
    Entries,
    Error,
    Hello,
    HubMessage,
    Pong,
    PresenceDiff,
    PresenceSnapshot,
    Records,
    Reject,
    State,
    Welcome,
)
from sync.rebase import Conflict, needs_base, rebase, replay_pushes
from sync.steer import QUEUED_KIND, is_stop_request, queue_records

from .events import (
    Applied,
    ApprovalAsked,
    ApprovalDecided,
    Connected,
    Disconnected,
    DraftChanged,
    DraftEnded,
    Event,
    PresenceChanged,
    Queued,
    Rebased,
    Reset,
    StopRequested,
    approval_events,
    steer_events,
)
from .live import LiveState
from .logview import LogView, fold, unseen
from .phases import (
    CATCHING_UP,
    CAUGHT_UP,
    CLOSED,
    CONNECTING,
    DISCONNECTED,
    HELLO,
    LIVE,
    RELEASE,
    TABLE,
    Step,
)

HUB_REBASE = "hub_rebase"
"""The feature this session lists: it takes a placed push's records as its batch."""

__all__ = [
    "Applied",
    "ApprovalAsked",
    "ApprovalDecided",
    "Conflict",
    "Connected",
    "Disconnected",
    "DraftChanged",
    "DraftEnded",
    "Event",
    "PresenceChanged",
    "Queued",
    "Rebased",
    "ReplicaSession",
    "Reset",
    "StopRequested",
]


class _Batch:
    __slots__ = ("base", "doomed", "landed", "overtook", "records", "reported", "seq")

    def __init__(self, seq: int, records: list[ChangeRecord]) -> None:
        self.seq = seq
        self.records = records
        self.doomed = False  # a state replaced the log under it: its records were re-pended
        self.landed: list[ChangeRecord] | None = None  # what the hub placed, when it did
        self.overtook: list[ChangeRecord] = []  # log records before it, when it was placed
        self.base: Conversation | None = None  # what it was made on, kept once it is placed
        self.reported: list[ChangeRecord] | None = None  # as placed, told by an outbox


class ReplicaSession:
    """One replica of one conversation, across any number of connections.

    Args:
        client: this replica's client id (its push seqs rise under it).
        local: the value the application edits; a new one when omitted. It may hold unsaved
            records made before connecting (they are pushed), but no saved ones.
        max_frame: the largest frame to send, in bytes. It also sets `local.record_limit`
            (`max_frame - PUSH_OVERHEAD`): an edit whose record could never go in a push
            raises `UsageError` (`too_large`) at the call that makes it.
        max_batch: the most records in one push.
        seq: the last seq this client used (to continue a client id across processes).
        features: the optional capabilities to ask the hub for (`drafts`, `presence`: SPEC 7);
            none by default, all of them (`client.live.FEATURES`) from a `Replica`.
    """

    lag_floor = 64
    """The longest lag (records folded into `local` alone) always allowed before `confirmed`
    is dropped and `local` alone stands for the log; a conversation of n entries allows
    n // 4 when that is more."""

    def __init__(
        self,
        client: str,
        local: Conversation | None = None,
        *,
        max_frame: int = MAX_FRAME,
        max_batch: int = 1000,
        seq: int = 0,
        features: Sequence[str] = (),
    ) -> None:
        local = local if local is not None else Conversation()
        if local.revision != len(local.unsaved()):
            raise UsageError("saved_value", "a replica starts from a value with no saved records")
        self.client = client
        self.local = local
        self._phase: str = CONNECTING
        self.log = LogView(local, self._idle, lambda: self.lag_floor)
        """The log as this replica last saw it: `confirmed` and the lag (`client.logview`)."""
        self.seq = seq
        self._max_frame = 0
        self.max_frame = max_frame
        self.max_batch = max_batch
        self._inflight: _Batch | None = None
        self._held: list[ChangeRecord] = []  # log records that overtook the batch in flight
        self._landed: list[ChangeRecord] = []
        self._welcome: Welcome | None = None  # this connection's, from `welcome` to its end
        self.superseded: list[ChangeRecord] = []
        """Records of pushes refused `superseded` (SPEC 10), until taken (`Replica.answer`)."""
        self._last_welcome: Welcome | None = None  # kept over a disconnect: who we are
        self._before_catch_up: Conversation | None = None
        self._rebase_due = False  # rebase `local` at the end of the catch-up, moved or not
        # The revision the last ack said this replica will hold: a queue the hub landed with
        # the push follows its ack (SPEC 10); no push goes until those records are in.
        self._owed = 0
        self._partial: State | None = None  # a state arriving in pieces (`Entries` follow)
        self._partial_entries: list[Entry] = []
        self.on_landed: Callable[[int, list[ChangeRecord]], None] | None = None
        """Called with a batch's seq and records once the hub holds them (for observers)."""
        self.live = LiveState()
        """Drafts and presence (SPEC 7): what the hub reports, and the drafts made here."""
        self.features = list(features)
        """What this session asks the hub for in its hello."""
        self.kind: str | None = None
        self.watch = False  # watching without presence (SPEC 17): sent in the hello
        """What this replica is (`user`, `agent`), for presence without a token."""
        self._pacer: TokenBucket | None = None  # within the hub's push budget, once welcomed
        self.paced_until: float | None = None
        """When `next_push` held a push back to stay within the hub's budget: the time (in the
        clock `next_push` was given) to call it again; None when it held nothing back."""

    # ------------------------------------------------------------------ the phase

    @property
    def phase(self) -> str:
        """Where this session is: `connecting`, `catching_up`, `live` or `closed`
        (`client.phases.TABLE` says what each accepts)."""
        return self._phase

    def _step(self, step: Step) -> None:
        """Move to the phase `TABLE` gives for `step` (a call or the session's own step)."""
        after = TABLE[self._phase].get(step)
        if after is None:
            raise UsageError("closed", f"{step} while the replica session is {self._phase}")
        self._phase = after

    def _refusal(self, message: HubMessage) -> Exception:
        """What a message its phase does not accept raises: the hub broke the protocol, or
        (`closed`) the caller fed a session it released."""
        name = type(message).__name__
        if self._phase is CLOSED:
            return UsageError("closed", f"{name} for a released replica session")
        when = "before welcome" if self._phase is CONNECTING else f"while {self._phase}"
        return RemoteProtocolError("unexpected", f"{name} {when}")

    def _idle(self) -> bool:
        """Nothing in flight, no records held behind it (`LogView` may share `local`)."""
        return self._inflight is None and not self._held

    # ------------------------------------------------------------------ reads

    @property
    def max_frame(self) -> int:
        """The largest frame this session sends, in bytes; setting it also sets
        `local.record_limit` to what one push can carry (`max_frame - PUSH_OVERHEAD`)."""
        return self._max_frame

    @max_frame.setter
    def max_frame(self, max_frame: int) -> None:
        if type(max_frame) is not int or max_frame <= PUSH_OVERHEAD:
            raise UsageError(
                "bad_setting",
                f"max_frame must be more than {PUSH_OVERHEAD} bytes, got {max_frame!r}",
            )
        self._max_frame = max_frame
        self.local.record_limit = max_frame - PUSH_OVERHEAD

    @property
    def confirmed(self) -> Conversation:
        """The log's value at `revision`, as this replica last saw it (no outbox).

        Reading it folds in the records that so far went into `local` alone, or copies
        `local` when no separate value is kept (`client.logview`); read `revision` and
        `lineage` instead when they are all you need.
        """
        return self.log.value()

    @property
    def revision(self) -> int:
        """The log's revision as this replica last saw it (`confirmed.revision`, without
        folding or copying anything)."""
        return self.log.revision

    @property
    def lineage(self) -> int:
        """The lineage of the log this replica follows (`confirmed.lineage`)."""
        return self.log.lineage

    @property
    def lagging(self) -> int:
        """Records folded into `local` alone so far: what reading `confirmed` would fold."""
        return self.log.lagging

    @property
    def shares_local(self) -> bool:
        """Whether `local` alone holds the log's value now (no separate `confirmed` kept)."""
        return self.log.shares_local

    @property
    def pending(self) -> int:
        """Records made here that the hub has not acknowledged yet."""
        inflight = self._inflight
        sent = len(inflight.records) if inflight is not None and not inflight.doomed else 0
        return sent + len(self.local.unsaved())

    @property
    def in_flight(self) -> tuple[int, list[ChangeRecord], list[ChangeRecord] | None] | None:
        """The batch sent and not answered yet: its seq, its records as sent, and the records
        it landed as when the hub placed it already (`confirmed` then holds those); None when
        none is, or its records went back to the outbox."""
        batch = self._inflight
        if batch is None or batch.doomed:
            return None
        return batch.seq, batch.records, batch.landed

    @property
    def sub(self) -> str | None:
        """This connection's principal as the hub's `welcome` said (`anonymous` without
        auth); None before the first welcome."""
        welcome = self._welcome or self._last_welcome
        if welcome is None:
            return None
        return welcome.sub if welcome.sub is not None else "anonymous"

    @property
    def scopes(self) -> list[str] | None:
        """What the hub grants this connection (`welcome.scopes`); None: everything (no auth)
        or not welcomed yet."""
        welcome = self._welcome or self._last_welcome
        return None if welcome is None else welcome.scopes

    @property
    def ready(self) -> bool:
        """Welcomed and caught up (`live`): pushes can go."""
        return self._phase is LIVE and self.log.revision >= self._owed

    @property
    def settled(self) -> bool:
        """Caught up with nothing pending and nothing in flight."""
        return self.ready and self._inflight is None and not self.local.unsaved()

    # ------------------------------------------------------------------ sending

    def hello(self, token: str | None = None) -> Hello:
        """The first message of a new connection; forgets the previous connection's state.

        Raises:
            UsageError: `closed`, the session was released.
        """
        self._step(HELLO)
        self._welcome = None
        self._partial = None
        self._partial_entries = []
        self._held = []  # the hub sends them again in the catch-up
        self._owed = 0  # the catch-up brings them
        self.live.connecting()
        features = [HUB_REBASE, *self.features]
        log = self.log
        return Hello(self.client, log.lineage, log.revision, token, features, self.kind, self.watch)

    def restore(
        self,
        confirmed: Conversation,
        seq: int,
        sent: list[ChangeRecord],
        unsaved: list[ChangeRecord],
        placed: list[ChangeRecord] | None = None,
    ) -> None:
        """Go on from what an outbox kept (`client.outbox`): the log's value as last confirmed,
        the last seq used, the batch sent under it (its fate is the next welcome's `acked`),
        and the records made after it (`placed`: what the hub placed it as, if it said so
        before the process stopped; `on_landed` reports those). `local` becomes `confirmed`
        with them on top. Only for a session that holds nothing yet, before its first hello.

        Raises:
            UsageError: `saved_value`, the session holds something already.
            ApplyError: a record does not apply in order; nothing changed.
        """
        local = self.local
        if self._phase is not CONNECTING or self.seq or self._inflight or local.revision:
            raise UsageError("saved_value", "only a session that holds nothing is restored")
        trial = confirmed.copy()
        for record in sent + unsaved:
            trial.replay(record)  # validate before anything changes
        local.reread(confirmed)
        for record in sent + unsaved:
            local.replay(record)
        taken = local.take_unsaved()
        local.return_unsaved(taken[len(sent) :])
        self.seq = seq
        self._inflight = _Batch(seq, taken[: len(sent)]) if sent else None
        if self._inflight is not None:
            self._inflight.reported = placed
        self.log.replace(confirmed, pending=False)

    def next_push(self, now: float | None = None) -> tuple[bytes | None, list[Conflict]]:
        """The next push frame to send, if one may go now, and records refused locally.

        Given `now` (monotonic seconds), pushes are paced within the budget the hub's
        `welcome` gave: a push that would go over it is held back (`paced_until` says until
        when), and the records made meanwhile go out together in the next push.

        An edit too large to push is refused when it is made (`local.record_limit`). A record
        that still outgrows a push here (one made before this session measured `local`, or
        a splice a rebase re-targeted) is refused before anything is sent: it is taken out
        of `local` (by a rebase) and reported as a `Conflict` with reason `too_large`.
        """
        self.paced_until = None
        if not self.ready or self._inflight is not None or not self.local.unsaved():
            return None, []
        pacer = self._pacer
        if pacer is not None and now is not None and not pacer.take(now):
            self.paced_until = pacer.ready_at(now)
            return None, []
        records = self.local.unsaved()
        budget = self.max_frame - PUSH_OVERHEAD
        # Encode only what this batch can carry (and one more record). A batch is filled to
        # FRAME_FILL; a record larger than that goes alone, up to the frame limit.
        fill = fill_budget(self.max_frame, PUSH_OVERHEAD)
        encoded = next(runs((encode(r) for r in records), fill, max_items=self.max_batch))
        if len(encoded[0]) > budget:
            return self._refuse(0, len(encoded[0]), budget)
        count = len(encoded)
        taken = self.local.take_unsaved()
        self.local.return_unsaved(taken[count:])
        self.seq += 1
        self._inflight = _Batch(self.seq, taken[:count])
        frame = push_frame(self.seq, self.lineage, self.revision, encoded)
        return frame, []

    def _refuse(self, at: int, size: int, budget: int) -> tuple[bytes | None, list[Conflict]]:
        """Take pending record `at` (`size` bytes, over the `budget` a push can carry) out of
        `local`; push the rest."""
        records = self.local.take_unsaved()
        detail = (
            f"record of {size:,} bytes is {size - budget:,} bytes over the {budget:,} a push "
            f"can carry (max_frame {self.max_frame:,})"
        )
        conflicts = [Conflict(records[at], "too_large", detail)]
        keep = records[:at] + records[at + 1 :]
        confirmed = self.confirmed
        conflicts += rebase(self.local, confirmed, keep, confirmed)
        frame, more = self.next_push()
        return frame, conflicts + more

    # ------------------------------------------------------------------ receiving

    def receive(self, message: HubMessage) -> list[Event]:
        """Handle one message from the hub; returns the events for the application.

        Raises:
            ProtocolError: the message breaks the protocol; drop the connection.
        """
        if type(message) is Records:  # first: by far the most frequent
            if self._phase is LIVE and self._inflight is None and not self.local.has_unsaved:
                events = self.log.follow(message)  # a subscriber's records: the lag
            elif Records in TABLE[self._phase]:
                events = self._on_records(message)
            else:
                raise self._refusal(message)
            steer = steer_events(message.records) + approval_events(message.records)
            if steer:
                events = events + steer
            return events + self._drafts_landed() if self.live.drafts else events
        if type(message) not in TABLE[self._phase]:
            raise self._refusal(message)  # before anything changes
        match message:
            case Welcome():
                return self._on_welcome(message)
            case State():
                return self._on_state(message) + self._drafts_landed()
            case Entries():
                return self._on_entries(message) + self._drafts_landed()
            case Ack():
                return self._on_ack(message) + self._drafts_landed()
            case Reject():
                return self._on_reject(message)
            case AuthOk():
                return []  # a refreshed token was taken; the shell schedules the next one
            case Pong():
                return []  # the hub is alive (the shell's keepalive looks at that)
            case Error(code, detail):
                if retry_of(code) in ("never", "new_token"):
                    raise Refused(code, detail)
                raise Unavailable(code, detail)
            case Drafts() | DraftUpdate() | DraftState() | DraftEnd():
                return self.live.receive(message)
            case PresenceSnapshot() | PresenceDiff():
                return self.live.receive(message)
        raise RemoteProtocolError("unexpected", f"unexpected {type(message).__name__}")

    def _drafts_landed(self) -> list[Event]:
        """Drafts whose ids the log now holds are done: a UI never shows both."""
        # `local` (not `confirmed`, which may have records to fold): no other client can hold
        # an open draft's id pending, and the producer's own commit ends its draft anyway.
        return self.live.landed(self.local) if self.live.drafts else []

    def release(self) -> None:
        """The replica stopped for good: take the session's hook off `local`, which the
        application keeps (an edit there then copies nothing for a session nobody runs)."""
        self._step(RELEASE)
        self.local.before_edit(None)

    def disconnected(self, reason: str) -> list[Event]:
        """The connection is gone; the session waits for the next `hello()`.

        Returns `[Disconnected(reason)]` when a welcomed connection ended, and nothing for an
        attempt that never got its welcome: events mark changes of state (one `Disconnected`
        after each `Connected`), not every failed attempt to reconnect.
        """
        self._step(DISCONNECTED)
        welcomed, self._welcome = self._welcome, None
        return [Disconnected(reason)] if welcomed is not None else []

    def _on_welcome(self, welcome: Welcome) -> list[Event]:
        self._step(Welcome)
        self._welcome = self._last_welcome = welcome
        budget = (welcome.limits or {}).get("push")
        self._pacer = pacer_for(budget)
        # A client id reused by a new process continues after the seqs the hub holds.
        self.seq = max(self.seq, welcome.acked)
        batch, self._inflight = self._inflight, None
        if batch is not None:
            if batch.seq <= welcome.acked and batch.landed is not None:
                # Placed by the hub, its ack lost: `confirmed` holds it as it landed (and the
                # catch-up goes on from there). `local` holds it as sent, and what was made on
                # top of that is replayed from the batch's base, as the ack would have; with
                # nothing made on top, `local` is that base. Either way `local` is rebased.
                self._report(batch.seq, batch.landed)
                self.local.before_edit(None)  # `_keep_base`'s hook, if it is still armed
                if self._before_catch_up is None:
                    self._before_catch_up = (
                        batch.base if batch.base is not None else self.local.copy()
                    )
                self._rebase_due = True
            elif batch.seq <= welcome.acked:
                self._landed = batch.records  # its records come in the catch-up
                self._report_landed(batch)
            elif not batch.doomed:
                self.local.return_unsaved(batch.records)
        confirmed = self.confirmed
        if confirmed.lineage == Lineage.EMPTY and confirmed.revision == 0:
            # A value begun here continues any log from its start.
            confirmed.continue_log(welcome.lineage, 0)
        if self._before_catch_up is None:
            # What pending records were made on (kept if a catch-up is cut off and resumed).
            self._before_catch_up = confirmed.copy()
        events: list[Event] = [Connected(welcome.lineage, welcome.revision)]
        return events + self.live.welcomed(welcome) + self._maybe_caught_up()

    def _keep_base(self, batch: _Batch) -> None:
        """The first edit on top of a placed `batch`: keep what it is made on (`local` as it
        is, the batch as sent on top of what the batch was made on)."""
        if self._inflight is batch and batch.base is None:
            batch.base = self.local.copy()

    def _maybe_caught_up(self) -> list[Event]:
        welcome = self._welcome
        assert welcome is not None
        confirmed = self.confirmed
        if self._partial is not None or not (
            confirmed.lineage == welcome.lineage and confirmed.revision >= welcome.revision
        ):
            return []
        self._step(CAUGHT_UP)
        base = self._before_catch_up
        self._before_catch_up = None
        landed, self._landed = self._landed, []
        base = _folded(base, landed) if base is not None else None
        unmoved = base is not None and (base.lineage, base.revision) == (
            confirmed.lineage,
            confirmed.revision,
        )
        due, self._rebase_due = self._rebase_due, False
        if unmoved and not landed and not self.local.unsaved() and not due:
            return []  # the log did not move: local already is confirmed plus nothing
        return self._rebase_local(base)

    def _rebase_local(self, base: Conversation | None) -> list[Event]:
        """Make `local` the confirmed value plus every pending record, replayed."""
        pending = self.local.take_unsaved()
        conflicts = rebase(self.local, self.confirmed, pending, base)
        events: list[Event] = list(conflicts)
        if pending:
            events.append(Rebased(len(pending) - len(conflicts), self.confirmed.revision))
        return events

    def _on_records(self, message: Records) -> list[Event]:
        self.log.unshare()  # `local` may have moved away from the log outside our sight
        revision = self.revision + len(self._held)
        records = message.records if message.from_ == revision else unseen(message, revision)
        if not records:
            return []
        if self._phase is CATCHING_UP:
            confirmed = self.log.fold(records)
            return [Applied(len(records), confirmed.revision), *self._maybe_caught_up()]
        inflight = self._inflight
        if inflight is not None and not inflight.doomed:
            origin = message.origin
            if origin is not None and (origin.client, origin.seq) == (self.client, inflight.seq):
                # The hub placed our stale batch (SPEC 2.4.6): these records are it, as it
                # landed; its ack follows. Fold what overtook it, then these.
                if inflight.landed is None:
                    inflight.landed = []
                    inflight.overtook = self._held
                    # What is made on top of the batch as sent is replayed onto the batch as
                    # it landed, from this base (the pure insertions need it).
                    if self.local.has_unsaved:
                        inflight.base = _folded(self.confirmed.copy(), inflight.records)
                    else:
                        # `local` is that base now (the batch as sent on what it was made
                        # on): copy it before the next edit, if one comes before the ack (a
                        # writer that awaits its flush makes none: no copy).
                        self.local.before_edit(functools.partial(self._keep_base, inflight))
                overtaken = self._fold_held()
                self.log.fold(records)
                inflight.landed += records
                return overtaken
            # The log moved under the batch in flight, which the hub may still place: hold
            # these records until its ack or reject says what became of it.
            self._held.extend(records)
            return []
        # The log moved under pending records: replay them on it.
        if inflight is None:
            rebased = self._replay_pushes_over(records, revision)
            if rebased is not None:
                return rebased
        confirmed = self.confirmed
        base = None
        pending = self.local.take_unsaved()
        if needs_base(pending):
            base = confirmed.copy()
        fold(confirmed, records)
        self.local.return_unsaved(pending)
        events: list[Event] = [Applied(len(records), confirmed.revision)]
        return events + self._rebase_local(base)

    def _replay_pushes_over(self, records: list[ChangeRecord], revision: int) -> list[Event] | None:
        """The rebase below in O(records + pending) instead of a reread of the conversation,
        for its common case: nothing in flight, and the records and every pending record are
        pushes still at the end of `local` (an agent or a user appending while others do).
        The pending pushes come off `local`, which is then the log's value at `revision`; the
        records are folded in as a subscriber folds them (into the lag), and the pending
        pushes replayed on top by the rebase's own rules. None when the case does not apply
        (nothing changed then)."""
        if not all(type(record.change) is Push for record in records):
            return None
        local = self.local
        pending = local.take_unsaved()
        if not all(type(record.change) is Push for record in pending) or not (
            local.take_back_pushes(pending)
        ):
            local.return_unsaved(pending)
            return None
        try:
            self.log.fold_into_local(records)
        except RemoteProtocolError:
            # What fitted stays folded; the pending pushes go back on top as unsaved records,
            # for the rebase after the reconnect to replay (a bad record loses no edit).
            replay_pushes(local, pending)
            raise
        self.log.bound()  # `local` is exactly the log here: `confirmed` may be dropped
        now = revision + len(records)
        conflicts = replay_pushes(local, pending)
        return [Applied(len(records), now), *conflicts, Rebased(len(pending) - len(conflicts), now)]

    def _fold_held(self) -> list[Event]:
        """Fold the records that overtook the batch in flight into `confirmed`."""
        held, self._held = self._held, []
        if not held:
            return []
        confirmed = self.log.fold(held)
        return [Applied(len(held), confirmed.revision)]

    def _on_state(self, message: State) -> list[Event]:
        self._partial = message
        self._partial_entries = []
        return [] if message.more else self._take_state()

    def _on_entries(self, message: Entries) -> list[Event]:
        if self._partial is None:
            raise RemoteProtocolError("unexpected", "entries without a state")
        self._partial_entries.extend(message.entries)
        return [] if message.more else self._take_state()

    def _take_state(self) -> list[Event]:
        message = self._partial
        assert message is not None
        self._partial = None
        state = message.state
        if self._partial_entries:
            entries = state.entries + self._partial_entries
            state = msgspec.structs.replace(state, entries=entries)
            self._partial_entries = []
        if (
            self._phase is not CATCHING_UP
            and not self._held
            and (message.lineage, message.revision) == (self.lineage, self.revision)
            and message.lineage not in (Lineage.EMPTY, Lineage.DETACHED)
        ):
            # The state of the very log this replica holds (a hub answering an older push
            # `lineage` sends it once more): nothing moved, and a batch made on it since is
            # still good.
            return []
        try:
            confirmed = Conversation.from_state(state)
        except Exception as exc:
            raise RemoteProtocolError(
                "malformed", f"the hub sent a state that is not valid: {exc}"
            ) from exc
        confirmed.continue_log(message.lineage, message.revision)
        self._held = []  # the state holds them
        self._owed = 0  # a state holds whatever an ack said would follow, or replaces it
        pending = self._inflight is not None or bool(self.local.unsaved())
        old = self.log.replace(confirmed, pending=pending)
        events: list[Event] = [Reset(message.lineage, message.revision)]
        if self._phase is CATCHING_UP:
            return events + self._maybe_caught_up()
        inflight = self._inflight
        if inflight is not None and not inflight.doomed:
            inflight.doomed = True
            self.local.return_unsaved(inflight.records)
        return events + self._rebase_local(old)

    def _on_ack(self, ack: Ack) -> list[Event]:
        batch = self._inflight
        if batch is None or batch.seq != ack.seq:
            return []  # an ack for a batch settled already (a resend's duplicate answer)
        if batch.doomed:
            raise RemoteProtocolError("unexpected", f"ack of push {ack.seq} after the log moved")
        confirmed = self.confirmed
        landed = batch.landed
        if landed is not None:
            # Placed by the hub: `confirmed` holds it already, as it landed. Replay what was
            # made on top of the batch as sent onto the log as it is.
            if ack.revision < confirmed.revision or ack.from_ != confirmed.revision - len(landed):
                raise RemoteProtocolError(
                    "gap",
                    f"ack {ack.from_}..{ack.revision} for {len(landed)} placed records "
                    f"at {confirmed.revision}",
                )
            self._inflight = None
            self._owed = ack.revision
            self.local.before_edit(None)  # `_keep_base`'s hook, if it is still armed
            self._report(batch.seq, landed)
            events: list[Event] = [Applied(len(landed), confirmed.revision)]
            local = self.local
            if not local.has_unsaved and local.take_back_pushes(batch.records):
                # Nothing made on top of a batch of pushes (a writer awaiting its flush): put
                # what overtook it under it in `local`, as in the log, in O(records) where a
                # rebase rereads the whole conversation.
                fold(local, batch.overtook + landed)
                return events
            return events + self._rebase_local(batch.base)
        if ack.from_ != confirmed.revision or ack.revision < ack.from_ + len(batch.records):
            raise RemoteProtocolError(
                "gap",
                f"ack {ack.from_}..{ack.revision} for {len(batch.records)} records "
                f"at {confirmed.revision}",
            )
        self._inflight = None
        self._owed = ack.revision  # more than the batch: a queue landed with it, and follows
        fold(confirmed, batch.records)
        self._report_landed(batch)
        return []

    def _report_landed(self, batch: _Batch) -> None:
        reported = batch.reported
        self._report(batch.seq, batch.records if reported is None else reported)

    def _report(self, seq: int, records: list[ChangeRecord]) -> None:
        if self.on_landed is not None:
            self.on_landed(seq, records)

    def _on_reject(self, reject: Reject) -> list[Event]:
        if reject.lineage == self.lineage and reject.revision < self.revision:
            # The hub says its log is behind what this replica holds (a hub that lost records,
            # or one of several hubs serving a stale copy): resending would spin. Drop the
            # connection; the next hello, ahead of the log, gets the log's state.
            raise RemoteProtocolError(
                "ahead",
                f"the hub's log is at {reject.revision}, this replica at {self.revision}",
            )
        batch = self._inflight
        if batch is None or batch.seq != reject.seq:
            return []
        self._inflight = None
        if batch.doomed:
            return []
        # What the batch (and what was made on top of it) was made on: `confirmed` before the
        # records that overtook it, copied only when a pure insertion needs it.
        # `forbidden` (a token without `write`) is final like `invalid`: resending cannot help.
        rule = reject_rule(reject.reason)
        if rule == "queue":
            return self._queue(batch.records)
        if reject.reason == "turn_ended":
            dropped = self._drop_late_stops(batch.records, reject)
            if dropped is not None:
                return dropped
        if reject.reason == "decided":
            dropped = self._drop_refused(batch.records, reject, is_decision)
            if dropped is not None:
                return dropped
        final = rule == "final"
        pending = batch.records + self.local.unsaved()
        base = self.confirmed.copy() if needs_base(pending) or final else None
        events = self._fold_held()
        if not final:
            # The hub could not place it: the records it missed came first (held, or on
            # their way); replay the batch and what followed it on the log.
            self.local.return_unsaved(batch.records)
            if not events:
                return []  # nothing overtook it here yet: they are on their way
            return events + self._rebase_local(base)
        events += [Conflict(record, reject.reason, reject.detail) for record in batch.records]
        if reject.reason == "superseded":
            self.superseded += batch.records  # for `Replica.answer` to keep and call again
        assert base is not None
        return events + self._rebase_local(_folded(base, batch.records))

    def _drop_late_stops(self, records: list[ChangeRecord], reject: Reject) -> list[Event] | None:
        """A batch refused `turn_ended` that holds stop requests and other records (a stop
        pressed as the turn ended, with a message typed next): the stops are the conflict,
        the rest is replayed on the log, never lost with them (SPEC 10). A batch with no stop
        but a decision was refused for the decision (the approval's turn ended, SPEC 12):
        the decisions are the conflict, the rest replays. The hub checks stops before
        decisions, so stops go first; a rest still refused for a decision splits again on
        its resend. None when the batch is only such records, or holds none (a stale
        owner's push): final as a whole."""
        refused = is_stop_request if any(map(is_stop_request, records)) else is_decision
        return self._drop_refused(records, reject, refused)

    def _drop_refused(
        self, records: list[ChangeRecord], reject: Reject, refused: Callable[[ChangeRecord], bool]
    ) -> list[Event] | None:
        """A batch refused for what only its `refused` records can be refused for: those are
        the conflict, the rest is replayed on the log, never lost with them. `turn_ended`: the
        late stops, or the decisions of an ended turn (`_drop_late_stops`); `decided`: the
        decisions of an approval another decided first (SPEC 12), so a message typed beside a
        losing click still lands. None when every record, or none, is such: final as a
        whole."""
        dropped = [record for record in records if refused(record)]
        if not dropped or len(dropped) == len(records):
            return None
        rest = [record for record in records if not refused(record)]
        before = self.confirmed.copy()
        events = self._fold_held()
        events += [Conflict(record, reject.reason, reject.detail) for record in dropped]
        self.local.return_unsaved(rest)
        return events + self._rebase_local(before)

    def _queue(self, records: list[ChangeRecord]) -> list[Event]:
        """The batch of user text `records` was refused `queued` (SPEC 10): replay it as
        `rig.queued` asides (`sync.steer.queue_records`) ahead of what was made on top, on
        the log as it is (the records it missed folded first).

        The rebase's base is `confirmed` before those records: what the batch and what was
        made on top of it were made on. Taken after them, an edit made on the older text
        found its entry "unchanged since its base" and was replayed over an edit it never
        saw, with no merge and no conflict (chaos, issue 33's checker)."""
        before = self.confirmed.copy()
        events = self._fold_held()
        confirmed = self.confirmed
        last = confirmed.id(len(confirmed) - 1) if len(confirmed) else None
        queued = queue_records(records, last)
        if queued is None:  # not user text after all (a hub's bug): nothing to replay as queued
            detail = "refused queued, but not the user's own text"
            return [*events, *(Conflict(r, "queued", detail) for r in records)]
        pending = queued + self.local.unsaved()
        base = before if needs_base(pending) else None
        self.local.return_unsaved(queued)
        ids = [
            record.change.id
            for record in queued
            if type(record.change) is AsideChange
            and record.change.aside is not None
            and record.change.aside.kind == QUEUED_KIND
        ]
        return [*events, Queued(ids, mine=True), *self._rebase_local(base)]


def _folded(base: Conversation, records: Sequence[ChangeRecord]) -> Conversation | None:
    """`base` with `records` applied, or None when they do not fit (no base for anchors)."""
    try:
        for record in records:
            base.apply(record)
    except ApplyError:
        return None
    return base
