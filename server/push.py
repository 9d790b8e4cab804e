"""Pushes (SPEC 2.4): the part of `RoomCore` that takes a batch, step by step.

How this works: `Pushing.push` reads as the push goes. `_admit` takes the steps that wait on
nothing: refused without folding (`_refusal`: token, resend, copy, lineage, drafts, turns,
steering, approvals), folded into the room or placed by intent (`_fold`), stamped
(`_stamped`), followed by the records the hub lands with it in the same append (`_append_of`).
A push refused or resent is answered there, with no operation to wait on. Otherwise the
push waits on its append as a plain value (`_pending`, an `_Append`: every push waits on one,
and a generator costs frames), and once the store took it, `_append_done` answers it
(`_appended`: the ack, the records to every other subscriber) and writes a snapshot if one is
due; a failed append is undone and explained (`_not_appended`, an operation of the room's
driver). The functions at the end read nothing but their arguments.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

import msgspec

from sync import (
    Aside,
    AsideChange,
    ChangeRecord,
    Conversation,
    Lineage,
    Reset,
    Splice,
    Via,
    approvals,
    encode,
)
from sync.compact import compaction_unpins
from sync.errors import ApplyError, LocalProtocolError
from sync.frames import records_frames
from sync.kinds import (
    ASIDES,
    ASSISTANT,
    MOVES_CALLS,
    PAIRS,
    RESET,
    SPLICE,
    TOUCHES,
    USER_TEXT,
    kinds_of,
)
from sync.protocol import (
    Ack,
    PushBatch,
    PushOrigin,
    RejectReason,
    encode_message,
)
from sync.rebase import place
from sync.steer import (
    QUEUED_KIND,
    STOP_KIND,
    Steering,
    queued_entry,
    queued_id,
)
from sync.strict import strict_violation

from .actions import (
    Action,
    AppendRecords,
    Broadcast,
    Close,
    Send,
)
from .auth import ANONYMOUS, Grant
from .roomlog import DELETED, EDITS, Op, RoomLog
from .store.base import ClientMark, Deleted, LogMoved, SeqTaken
from .turns import TurnAfter

__all__ = [
    "Pushing",
    "ack",
    "both",
    "pushes_assistant",
    "scope_refusal",
    "stopper",
    "strict_check",
    "turn_ended",
    "unchanged",
]

log = logging.getLogger("convsync.hub")
_replace = msgspec.structs.replace


C = TypeVar("C", bound=Hashable)
"""A connection, as the shell names it (the core only compares and hashes it)."""


class _Append(msgspec.Struct, Generic[C]):
    """A push folded into the room, waiting for the store to append it (a struct: built in
    C, on every push)."""

    conn: C
    batch: PushBatch
    placed: bool
    """Whether the push was placed by intent (made on an older revision, SPEC 2.4.6)."""
    call: AppendRecords
    records: list[ChangeRecord]
    """The pushed records as they land (placed, stamped)."""
    queue: list[ChangeRecord]
    """Queued input the hub lands right after them, in the same append (SPEC 10)."""
    steering: Steering
    """The steering index once both landed."""
    undo: Callable[[], None]
    """Takes both out of the room again (the append failed)."""
    turn: TurnAfter | None
    """The open turn once both landed; its lease writes go in the same append."""
    kinds: int
    """The kinds the pushed records hold (`sync.kinds`): most pushes hold no aside change
    and no reset, and then the approval, turn-owner and queue bookkeeping has nothing to
    look at."""
    queue_kinds: int
    """The kinds `queue` holds (0: no queue)."""


class Pushing(RoomLog[C]):
    """The push rules of one room (see the module); `RoomCore` adds the rest."""

    # ------------------------------------------------------------------ pushing

    def push(self, conn: C, batch: PushBatch, now: int) -> list[Action[C]]:
        """Handle `batch` from `conn` (joined); `now` stamps records without a time (ms)."""
        if self._stale:
            return self._drive(self._pushing(conn, batch, now))
        # Admitted or answered without waiting on anything (a reject, a resend's ack): only
        # an append needs an operation that waits.
        admitted = self._admit(conn, batch, now)
        if not isinstance(admitted, _Append):  # (the common case passes `isinstance` at once)
            return admitted
        self._pending = admitted  # `resume` hands its outcome to `_append_done`
        return [admitted.call]

    def _pushing(self, conn: C, batch: PushBatch, now: int) -> Op[C]:
        """A push after a store failure: reload the room first, then as `push` (the
        operation ends handing the append over to `_pending`, as `push` does)."""
        if not (yield from self._reload_if_stale()):
            return []
        admitted = self._admit(conn, batch, now)
        if not isinstance(admitted, _Append):
            return admitted
        self._pending = admitted
        return [admitted.call]

    def _admit(self, conn: C, batch: PushBatch, now: int) -> _Append[C] | list[Action[C]]:
        """The steps of a push before its append: refuse it, fold it into the room, stamp
        it, land queued input behind it. Returns the append to make, or the answer when
        there is nothing to append."""
        self._now = now
        if self.gone or self.closing or self._stale:
            return [self._closed_to_pushes(conn)]
        client = self.subscribers.get(conn)
        if client is None:
            raise LocalProtocolError("no_join", "a push from a connection that has not joined")
        grant = self.grants.get(conn, ANONYMOUS)
        key = self._mark_key(grant, client)
        # Read once: which kinds of record the batch holds. Each rule below looks only at some
        # kinds, and is skipped for a batch that holds none of them (docs/design.md, "The push
        # path's per-record checks"). Placed pushes land unchanged, so these are the kinds of
        # what lands too.
        kinds = kinds_of(batch.records)
        refused = self._refusal(conn, batch, grant, client, key, now, kinds)
        if refused is not None:
            return refused
        folded = self._fold(conn, batch, kinds)
        if not isinstance(folded, tuple):
            return folded
        landed, undo, placed = folded
        stamped = self._stamped(landed, grant, client, now)
        return self._append_of(conn, batch, placed, key, stamped, undo, kinds)

    def _append_done(self, outcome: object) -> list[Action[C]]:
        """The store's outcome of the pending push's append (with the turn's lease writes):
        answer and broadcast the push and write a snapshot if one is due; a failed append is
        undone and explained."""
        append = self._pending
        assert isinstance(append, _Append)
        self._pending = None
        # An append that landed returns the log's revision: `type` first, as `isinstance`
        # costs more when it fails.
        if type(outcome) is not int and isinstance(outcome, BaseException):
            if isinstance(outcome, Deleted):  # the log is gone (SPEC 15), as `resume` says
                return self.deleted()
            if not isinstance(outcome, Exception):
                raise outcome
            append.undo()
            return self._drive(self._not_appended(append.conn, append.batch, append.call, outcome))
        actions = self._appended(append)
        if self._snapshot_due():
            return actions + self._drive(self._snapshot())
        return actions

    def _closed_to_pushes(self, conn: C) -> Close[C]:
        """How the room answers any push when it takes none: deleted, shutting down, stale."""
        if self.gone:
            return Close(conn, "deleted", DELETED)
        if self.closing:
            return Close(conn, "shutting_down", "the hub is shutting down; reconnect later")
        return self._unavailable(conn)

    def _refusal(
        self, conn: C, batch: PushBatch, grant: Grant, client: str, key: str, now: int, kinds: int
    ) -> list[Action[C]] | None:
        """How to answer `batch` without folding it, or None: it may be folded. Refused by the
        token, a resend (its ack again), a copy of a push refused, the wrong lineage, another
        client's draft id, a turn rule, a steering or approval rule."""
        why = scope_refusal(grant, batch.records, now, kinds)
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
        live = self.live
        clash = live.clash(self._owner(conn), batch.records) if live.drafts.drafts else None
        if clash is not None:
            return [Send(conn, self._reject(batch, "invalid", clash))]
        turns = self.turns
        if kinds & ASIDES or turns.stale_owners:  # what the turn rules look at
            turn = turns.refusal(self.conversation, batch, key, grant.sub, client)
            if turn is not None:
                return [Send(conn, self._reject(batch, *turn))]
        steer = self._steer_refusal(batch, key, grant.sub, kinds)
        if steer is None and kinds & TOUCHES:  # no aside change, no reset: no approval rule
            steer = self._approval_refusal(conn, batch, grant)
        if steer is not None:
            return [Send(conn, self._reject(batch, *steer))]
        return None

    def _fold(
        self, conn: C, batch: PushBatch, kinds: int
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
        if self.config.strict_pairing and kinds & STRICT_KINDS:
            violation = strict_check(self.conversation, landed, since, kinds)
            if violation is not None:
                undo()
                if placed:  # judged at its own base, as before: the replica resends it there
                    return [Send(conn, self._reject(batch, "behind", "the log moved"))]
                return self._invalid(conn, batch, f"strict pairing: {violation}")
        unpins = self._pins_refusal(landed) if kinds & SPLICE else None  # compactions splice
        if unpins is not None:
            undo()
            return [Send(conn, self._reject(batch, "pinned", unpins))]
        return landed, undo, placed

    def _invalid(self, conn: C, batch: PushBatch, detail: str) -> list[Action[C]]:
        """Reject `batch` `invalid`; drafts its records carry end."""
        rejected = Send(conn, self._reject(batch, "invalid", detail))
        if not self.live.drafts.drafts:
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
        stamped = []
        for record in landed:  # a loop, not a comprehension (a frame): this runs every push
            stamped.append(record if record.at is not None else _replace(record, at=now))
        return stamped

    def _append_of(
        self,
        conn: C,
        batch: PushBatch,
        placed: bool,
        key: str,
        records: list[ChangeRecord],
        undo: Callable[[], None],
        kinds: int,
    ) -> _Append[C]:
        """The append of `records` (folded in already, undone by `undo`; `kinds` what they
        hold) with the records that follow them in the same append: approvals a stop
        cancels, queued input that lands once the step ends."""
        now = self._now
        steering = self.steering
        asides = kinds & TOUCHES
        if asides:
            steering = steering.copy()
            steering.track(self.conversation, records)
        queue = self._landing(steering, now) if steering.queue else []
        if asides:  # only a stop (an aside) cancels approvals
            queue = approvals.stop_cancels(self.conversation, records, now) + queue
        queue_kinds = 0
        if queue:
            undo = both(undo, self.conversation.apply_batch(queue))
            queue_kinds = kinds_of(queue)
        turn = None
        # A room that keeps leases, and records that may move a turn (`_turn_after` decides).
        if self.config.turn_grace is not None and (kinds | queue_kinds) & (TOUCHES | MOVES_CALLS):
            turn = self._turn_after(steering, [*records, *queue], key, records, kinds | queue_kinds)
        encoded = list(map(encode, records))  # (`map` of a C function: no frame, as a
        if queue:  # comprehension costs one)
            encoded += map(encode, queue)
        from_ = self.revision
        mark = ClientMark(batch.seq, from_, from_ + len(encoded))
        lease = None if turn is None else turn.change
        call = AppendRecords(self.lineage, from_, encoded, key, mark, lease)
        return _Append(
            conn, batch, placed, call, records, queue, steering, undo, turn, kinds, queue_kinds
        )

    def _appended(self, append: _Append[C]) -> list[Action[C]]:
        """The store appended `append`: the room follows, the pusher gets its ack, every
        other subscriber the records."""
        conn, batch, placed = append.conn, append.batch, append.placed
        call, records, queue, steering = append.call, append.records, append.queue, append.steering
        key, mark = call.client, call.mark
        assert key is not None and mark is not None  # a client's push
        pushed = len(records)
        self.exists = True
        from_ = call.from_
        self.revision = mark.ack_revision
        self.marks[key] = mark
        self._remember(call.records)
        kinds = append.kinds
        asides = kinds & TOUCHES
        if asides:  # turn records and queued entries are asides
            self.turns.note_owners(records, key)
        if (kinds | append.queue_kinds) & EDITS:
            self._note_edits(from_, [*records, *queue] if queue else records)
        self.steering = steering
        self._steered(records, from_ + pushed, kinds)
        if asides:
            for record in records:
                change = record.change
                if type(change) is AsideChange and change.id in steering.queue:
                    self._queuers[change.id] = key
        if queue:
            self._steered(queue, self.revision, append.queue_kinds)
        if asides:
            self.turns.pushed(key, records)
        if append.turn is not None:
            self.turns.landed(append.turn)
        # The bare client id (a replica knows its own pushes by it), not the mark's store key.
        origin = PushOrigin(self.subscribers.get(conn, key), batch.seq)
        max_frame = self.config.max_frame
        frames = records_frames(
            from_, call.records[:pushed] if queue else call.records, origin, max_frame
        )
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
            for frame in frames:  # a loop, not a comprehension (a frame): most pushes send one
                actions.append(Broadcast(others, frame))
        if queue:
            # A queue landed in the same append: made by the hub (no origin), sent to everyone
            # right after the pusher's ack, which counts them (SPEC 10).
            landed = records_frames(from_ + pushed, call.records[pushed:], None, max_frame)
            actions += [Broadcast(list(self.subscribers), frame) for frame in landed]
        live = self.live
        if live.drafts.drafts:
            actions += live.landed(batch.records)  # in the same step as the records
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

    def _steer_refusal(
        self, batch: PushBatch, key: str, sub: str, kinds: int
    ) -> tuple[RejectReason, str] | None:
        """Why `batch` may not land as sent for steering (SPEC 10), or None: user text
        mid-step (or while a stop stands) waits as queued input; an assistant message made on
        a base older than a user request that landed since is superseded; a stop naming a
        turn that ended is refused, and so is one (with auth) whose author is not the user
        the token names (`sub`: checked, never overwritten); a queued entry is put only as
        `queue_records` makes it,
        and withdrawn only by whoever queued it (`key`). `kinds`: what `batch` holds."""
        steering = self.steering
        conversation = self.conversation
        # The steering asides first: a stop too late must be refused `turn_ended` also when
        # a message was typed with it (the replica then replays the message alone).
        for record in batch.records if kinds & ASIDES else ():
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
        if kinds & USER_TEXT:
            if steering.stops or steering.mid_step(conversation):
                return "queued", "mid-step: the hub lands it once the step ends"
            return None
        if kinds & ASSISTANT and batch.revision < self._request_revision:
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
        the pusher is the socket's principal and client, may decide with `approve`. Asked
        only of a batch that holds an aside change or a reset (the rules look at nothing
        else)."""
        actor = approvals.Actor(
            grant.sub, self.subscribers.get(conn, ""), grant.can_approve, self.config.auth
        )
        return approvals.check(self.conversation, batch.records, actor, self.turns.owners.get)


def scope_refusal(
    grant: Grant, records: Sequence[ChangeRecord], now: int, kinds: int = ASIDES
) -> str | None:
    """Why `grant` may not push `records`, or None: deciding approvals needs `approve` and
    nothing else does; every other record needs `write` (SPEC 12: `write` does not decide).
    `kinds` (`kinds_of(records)`, when known): decisions are asides, looked for only then."""
    if now >= grant.exp * 1000:
        return "token expired"
    decisions = 0
    for record in records if kinds & ASIDES else ():  # a loop: this runs every push
        if type(record.change) is AsideChange and approvals.is_decision(record):
            decisions += 1
    if decisions and not grant.can_approve:
        return "token lacks the approve scope"
    if (decisions < len(records) or not records) and not grant.can_write:
        return "token lacks the write scope"
    return None


def unchanged(landed: Sequence[ChangeRecord], sent: Sequence[ChangeRecord]) -> bool:
    """Whether `place` replayed every sent record as it was (none dropped or re-targeted)."""
    return len(landed) == len(sent) and all(a is b for a, b in zip(landed, sent, strict=True))


def ack(seq: int, mark: ClientMark) -> bytes:
    """The `ack` frame of push `seq`, from the mark the store holds for it."""
    return encode_message(Ack(seq, mark.ack_from, mark.ack_revision))


STRICT_KINDS = PAIRS | SPLICE | RESET
"""What strict pairing looks at: a batch holding none of these kinds pairs as before."""


def strict_check(
    conversation: Conversation,
    records: Sequence[ChangeRecord],
    since: int,
    kinds: int | None = None,
) -> str | None:
    """Strict pairing over what `records` changed (`since` is the length before them;
    `kinds`: `kinds_of(records)`, when known)."""
    if not (kinds_of(records) if kinds is None else kinds) & STRICT_KINDS:
        return None
    for record in records:
        change = record.change
        if isinstance(change, Splice | Reset):
            since = min(since, change.start if isinstance(change, Splice) else 0)
    violation = strict_violation(conversation, since)
    return None if violation is None else violation.message


def both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    """Undo `then`, then `first` (two folds, the later one on top)."""

    def undo() -> None:
        then()
        first()

    return undo


def pushes_assistant(records: Sequence[ChangeRecord]) -> bool:
    """Whether `records` push (or splice in) an assistant message."""
    return bool(kinds_of(records) & ASSISTANT)


def stopper(aside: Aside) -> str | None:
    """Who a stop request says stopped: its `user` author's name (SPEC 10)."""
    author = aside.author
    return author.name if author.kind == "user" else None


def turn_ended(conversation: Conversation, aside: Aside) -> bool:
    """Whether stop request `aside` names a turn whose record has ended."""
    value = aside.value
    turn = value.get("turn") if isinstance(value, dict) else None
    if type(turn) is not int:
        return False
    return any(
        record.index == turn and record.end is not None for _, record in conversation.turns()
    )
