"""What a replica session tells the application: the events `ReplicaSession.receive` returns.

`client.session` re-exports every one of them; `steer_events` and `approval_events` name the
events a run of records from the log carries (SPEC 10, SPEC 12).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from sync import AsideChange, ChangeRecord
from sync.approvals import APPROVAL_KIND, Approval, approval_of
from sync.rebase import Conflict
from sync.steer import QUEUED_KIND, STOP_KIND

from .live import DraftChanged, DraftEnded, PresenceChanged

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
    "Reset",
    "StopRequested",
    "approval_events",
    "steer_events",
]


class Connected(msgspec.Struct, frozen=True):
    """The hub welcomed this replica; the log is at `lineage`/`revision`."""

    lineage: int
    revision: int


class Disconnected(msgspec.Struct, frozen=True):
    """The connection dropped; the replica reconnects by itself (unless `reason` starts with
    `refused:`: then it stopped for good). `reason` says why. One per lost connection, not
    one per failed attempt to reconnect."""

    reason: str


class Applied(msgspec.Struct, frozen=True):
    """Records from the log folded in, up to `revision`."""

    count: int
    revision: int


class Queued(msgspec.Struct, frozen=True):
    """User input was queued while a step runs (SPEC 10): `rig.queued` asides `ids` came in
    from the log (a worker may cut its step short). `mine`: this replica's own push was
    refused `queued` and is replayed as those asides."""

    ids: list[str]
    mine: bool = False


class StopRequested(msgspec.Struct, frozen=True):
    """Someone asked the running turn to stop (SPEC 10): `rig.stop` aside `id` came in from
    the log, naming `turn` (None: no turn record was open)."""

    id: str
    turn: int | None


class ApprovalAsked(msgspec.Struct, frozen=True):
    """A worker asks a person (SPEC 12): approval `id` came in from the log, open."""

    id: str
    approval: Approval


class ApprovalDecided(msgspec.Struct, frozen=True):
    """Approval `id` was decided (approved, denied, answered) or cancelled: it came in from
    the log so."""

    id: str
    approval: Approval


class Rebased(msgspec.Struct, frozen=True):
    """Pending records were replayed on a log that moved on (conflicts come as their own
    events)."""

    replayed: int
    revision: int


class Reset(msgspec.Struct, frozen=True):
    """The replica took the log's whole state (a new replica, or a log rewritten)."""

    lineage: int
    revision: int


Event = (
    Connected
    | Disconnected
    | Applied
    | Rebased
    | Reset
    | Conflict
    | DraftChanged
    | DraftEnded
    | PresenceChanged
    | Queued
    | StopRequested
    | ApprovalAsked
    | ApprovalDecided
)


def steer_events(records: Sequence[ChangeRecord]) -> list[Event]:
    """`Queued` and `StopRequested` for the steering asides `records` put (SPEC 10)."""
    queued: list[str] = []
    events: list[Event] = []
    for record in records:
        change = record.change
        if type(change) is AsideChange and change.aside is not None:
            kind = change.aside.kind
            if kind == QUEUED_KIND:
                queued.append(change.id)
            elif kind == STOP_KIND:
                value = change.aside.value
                turn = value.get("turn") if isinstance(value, dict) else None
                events.append(StopRequested(change.id, turn if type(turn) is int else None))
    if queued:
        events.insert(0, Queued(queued))
    return events


def approval_events(records: Sequence[ChangeRecord]) -> list[Event]:
    """`ApprovalAsked` and `ApprovalDecided` for the approvals `records` put (SPEC 12)."""
    events: list[Event] = []
    for record in records:
        change = record.change
        if type(change) is AsideChange and change.aside is not None:
            if change.aside.kind == APPROVAL_KIND:
                approval = approval_of(change.aside)
                if approval is not None:
                    event = ApprovalAsked if approval.is_open else ApprovalDecided
                    events.append(event(change.id, approval))
    return events
