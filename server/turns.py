"""Turns end (SPEC 10): what one room knows of its open turn and its lease, pure.

How this works: an open turn whose record names an owner (or whose opener this room saw) has a
lease in the store beside the log: written when the turn opens, parks, unparks or is stopped
(`Turns.lease_change`, by every hub that folds the change: they write the same thing), renewed
by the owner's hub while the owner is connected, repaired when a room loads. Any hub that finds
a lapsed lease ends the turn by compare-and-append (the core's `finish_expired`), so of several
hubs exactly one does; the others fold its records. `Turns` holds the open turn as its lease was
last written and the few facts the log does not say (who opened a turn record naming no owner,
owners whose turn a hub ended); the core reads the log and asks it what follows.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sync import (
    AsideChange,
    Assistant,
    ChangeRecord,
    Conversation,
    Entry,
    approvals,
)
from sync.entries import TURN_KIND, TurnOwner
from sync.kinds import pairs
from sync.messages import Reasoning, Text
from sync.protocol import PushBatch, RejectReason
from sync.steer import open_turn

from .drafts import DraftBoard
from .store.base import Lease, LeaseChange

__all__ = ["TurnAfter", "TurnState", "Turns", "opens_turn", "owner_draft", "pairs"]

C = TypeVar("C", bound=Hashable)


@dataclass(frozen=True, slots=True)
class TurnState:
    """The open turn as its lease sees it (SPEC 10)."""

    turn_id: str
    index: int
    owner: TurnOwner | None
    key: str
    """The owner's mark key."""
    parked: bool
    stopping: bool


@dataclass(frozen=True, slots=True)
class TurnAfter:
    """The open turn once an append lands (`RoomLog._turn_after`): kept by the room only when
    the store took the append, whose transaction carries `change`."""

    state: TurnState | None
    stop_seen: int | None
    change: LeaseChange | None
    """The lease writes (None: the lease stays as it is)."""


class Turns:
    """The open turn of one room and the facts about turns the log does not hold.

    Args:
        conversation_id: the conversation's id (named in its leases).
        grace: ms an open turn's lease lasts past its owner's last renewal; None: the room
            keeps no leases.
        stop_grace: ms a worker has to finish a stopped turn before any hub finishes it.
        key_of: the mark key of identity (sub, client).
        auth: whether marks are keyed by principal too.
    """

    def __init__(
        self,
        conversation_id: str,
        grace: int | None,
        stop_grace: int,
        key_of: Callable[[str, str], str],
        auth: bool,
    ) -> None:
        self.id = conversation_id
        self.grace = grace
        self.stop_grace = stop_grace
        self._key_of = key_of
        self._auth = auth
        self.state: TurnState | None = None  # as its lease was last written
        self.stop_seen: int | None = None  # when this room first saw the standing stop
        self.openers: dict[str, str] = {}  # turn record naming no owner -> who opened it
        # Owners whose turn a hub finished (their pushes are refused `turn_ended` until they
        # open a new turn), by mark key, with the revision it ended.
        self.stale_owners: dict[str, int] = {}
        # Approvals (SPEC 12): who opened each turn record, as this room saw it land (the log
        # does not say it yet without auth; issue 26 puts the owner in the record).
        self.owners: dict[str, tuple[str, str]] = {}

    def reset(self) -> None:
        """A load: the lease state is read again from the log."""
        self.state, self.stop_seen = None, None

    def read(
        self,
        log: Conversation,
        stopping: bool,
        now: int,
        openers: Mapping[str, str] | None = None,
    ) -> tuple[TurnState | None, int | None]:
        """The open turn of `log` as the lease sees it (None when no turn is open or nobody is
        known to own it), and when the standing stop was first seen (`stopping`: one stands);
        `openers` adds openers of records not landed yet. Changes nothing (see `commit`)."""
        seen = (now if self.stop_seen is None else self.stop_seen) if stopping else None
        turn = open_turn(log)
        if turn is None:
            return None, seen
        id_, record = turn
        owner = record.owner
        if owner is not None:
            key: str | None = self._key_of(owner.sub, owner.client)
        else:
            key = self.openers.get(id_)
            if key is None and openers:
                key = openers.get(id_)
        if key is None:
            return None, seen
        parked = approvals.parked(log)
        return TurnState(id_, record.index, owner, key, parked, stopping), seen

    def lease_of(self, state: TurnState, now: int, stop_seen: int | None = None) -> Lease:
        """The lease of open turn `state` written at `now`."""
        grace = self.grace or 0
        expires = None if state.parked else now + grace
        seen = self.stop_seen if stop_seen is None else stop_seen
        stop = None if seen is None or not state.stopping else seen + self.stop_grace
        return Lease(self.id, state.index, state.key, expires, stop)

    def change(
        self, old: TurnState | None, new: TurnState | None, lease: Lease | None
    ) -> LeaseChange | None:
        """The lease writes that going from turn `old` to `new` (whose lease is `lease`) calls
        for: drop the old turn's when it ended or another opened, put the new one's."""
        if new == old:
            return None
        drop = old.index if old is not None and (new is None or new.index != old.index) else None
        return LeaseChange(lease if new is not None else None, drop)

    def landed(self, after: TurnAfter | None) -> None:
        """The append that `after` was read for landed: keep what it says."""
        if after is not None:
            self.stop_seen = after.stop_seen
            if after.change is not None:
                self.state = after.state

    def openers_of(self, key: str | None, records: Sequence[ChangeRecord]) -> dict[str, str]:
        """The turn records naming no owner that `records` from `key` open, and `key`."""
        if key is None:
            return {}
        opened: dict[str, str] = {}
        for record in records:
            value = _turn_value(record)
            if value is not None and value.get("end") is None and value.get("owner") is None:
                opened[record.change.id] = key  # type: ignore[union-attr]
        return opened

    def pushed(self, key: str | None, records: Sequence[ChangeRecord]) -> None:
        """`records` from `key` landed: remember who opened a turn record naming no owner; a
        client whose turn a hub ended is forgiven once it opens a new one."""
        for record in records:
            value = _turn_value(record)
            if value is not None and value.get("end") is None and key is not None:
                if value.get("owner") is None:
                    self.openers[record.change.id] = key  # type: ignore[union-attr]
                self.stale_owners.pop(key, None)

    def note_owners(self, records: Sequence[ChangeRecord], key: str) -> None:
        """Remember who put each turn record `records` open (the mark key split back into
        principal and client): the turn's owner, until turn records name it (issue 26)."""
        for record in records:
            change = record.change
            if type(change) is AsideChange and change.aside is not None:
                if change.aside.kind == TURN_KIND and change.id not in self.owners:
                    self.owners[change.id] = _owner_of_key(key, self._auth)

    def refusal(
        self, log: Conversation, batch: PushBatch, key: str, sub: str, client: str
    ) -> tuple[RejectReason, str] | None:
        """Why `batch` may not land for turns (SPEC 10), or None: its pusher's turn was ended
        by a hub while it was away (until it opens a new turn), or a turn record names an
        owner other than the pushing connection (checked, never overwritten)."""
        if self.stale_owners and key in self.stale_owners and not opens_turn(batch.records):
            return "turn_ended", "this client's turn ended while it was away; open a new turn"
        for record in batch.records:
            value = _turn_value(record)
            if value is None:
                continue
            owner = value.get("owner")
            if owner is None:
                continue
            stored = log.aside(record.change.id)  # type: ignore[union-attr]
            held = stored.value.get("owner") if stored and isinstance(stored.value, dict) else None
            if owner != held and owner != {"sub": sub, "client": client}:
                return "forbidden", "a turn record names an owner other than this connection"
        return None


def owner_draft(state: TurnState, drafts: DraftBoard[C]) -> Entry | None:
    """The text of the owner's open assistant draft, as an entry under the draft's id (so
    every UI's draft ends `committed` as its text lands)."""
    if state.owner is None or not drafts.drafts:
        return None
    owner = (state.owner.sub, state.owner.client)
    for draft in drafts.drafts.values():
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


def _turn_value(record: ChangeRecord) -> dict[str, object] | None:
    """The value of the turn record `record` puts, or None when it puts none."""
    change = record.change
    if type(change) is not AsideChange or change.aside is None:
        return None
    aside = change.aside
    if aside.kind != TURN_KIND or not isinstance(aside.value, dict):
        return None
    return aside.value


def opens_turn(records: Sequence[ChangeRecord]) -> bool:
    """Whether `records` put a turn record that has not ended (open a turn)."""
    for record in records:
        value = _turn_value(record)
        if value is not None and value.get("end") is None:
            return True
    return False


def _owner_of_key(key: str, auth: bool) -> tuple[str, str]:
    """(principal, client) of a mark key (`RoomCore._mark_key`)."""
    if not auth:
        return ("anonymous", key)
    sub, _, client = key.partition("/")
    return (sub.replace("%2F", "/").replace("%25", "%"), client)
