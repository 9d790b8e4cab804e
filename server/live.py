"""Live drafts and presence of one conversation on the hub (SPEC 7), pure, kept in memory only.

How this works: a `LiveRoom` holds one room's `DraftBoard` (messages in progress) and its
`PresenceBoard` (who is here, doing what), and the hello of every connection that joined, which
says the live features it asked for. The room's core (`server.core.RoomCore`) hands it the draft
ops and statuses that arrive, the records that land or are refused (a draft ends when the log
decides), and the time; it answers with the actions to carry out. It never touches the log:
what it needs to know about it (an id held, who a connection is, whether it may write) the core
passes in.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

from sync import AsideChange, ChangeRecord, Conversation, Halt, HaltChange, Push, Reset, Splice
from sync.protocol import DraftEnd, DraftOp, Hello, encode_message
from sync.steer import STOP_KIND

from .actions import Action, Broadcast, Send, SendFrames, live_actions
from .drafts import DraftBoard, DraftConfig, Out, Owner
from .metrics import Metrics
from .presence import PresenceBoard

__all__ = ["LIVE_FEATURES", "LiveRoom"]

C = TypeVar("C", bound=Hashable)

LIVE_FEATURES = ("drafts", "presence")
"""Live drafts and presence (SPEC 7): a welcome lists those the hello asked for, and the core
uses them only with that connection."""

_MAY_NOT_WRITE = "this connection may not write"


class LiveRoom(Generic[C]):
    """The drafts and presence of one room, and the hellos of its connections.

    Args:
        config: the drafts' limits and timing.
        metrics: the hub's counters (drafts, watchers).
        max_frame: the largest frame a subscriber takes.
        presence_throttle: least ms between two presence diffs.
    """

    def __init__(
        self, config: DraftConfig, metrics: Metrics, max_frame: int, presence_throttle: int
    ) -> None:
        self.metrics = metrics
        self.drafts: DraftBoard[C] = DraftBoard(config, metrics, max_frame)
        self.presence: PresenceBoard[C] = PresenceBoard(metrics, presence_throttle)
        self.hellos: dict[C, Hello] = {}
        self.watching: set[C] = set()  # subscribers that watch: in no presence, not `online`

    # ------------------------------------------------------------------ from connections

    def draft(
        self, conn: C, owner: Owner, may_write: bool, op: DraftOp, log: Conversation, now: int
    ) -> list[Action[C]]:
        """Handle draft op `op` from `conn` (joined, known as `owner`, allowed to write or not)
        against the log `log`: open, append, keep, abort (SPEC 7)."""
        if op.op == "open":
            refusal = _open_refusal(may_write, log, op)
            if refusal is not None:
                return [Send(conn, encode_message(refusal))]
        elif not may_write:
            # Every op, not only `open`: an append or keep from a socket without `write`
            # (a downgrade, or a read-only socket of the same owner) would take the draft
            # over and be broadcast (issue 27).
            return [Send(conn, encode_message(DraftEnd(op.id, "refused", _MAY_NOT_WRITE)))]
        actions = live_actions(self.drafts.receive(conn, owner, op, now))
        self.presence.set_drafting(self.drafts.owners())
        return actions + self.tick(now)

    def status(self, conn: C, status: str | None, detail: object, now: int) -> list[Action[C]]:
        """`conn` (allowed to) set its presence status."""
        self.presence.set_status(conn, status, detail)
        return self.tick(now)

    def tick(self, now: int) -> list[Action[C]]:
        """What is due at `now`: coalesced draft deltas, drafts that timed out, a presence
        diff."""
        actions = live_actions(self.drafts.tick(now))
        if actions:
            self.presence.set_drafting(self.drafts.owners())
        for to, frame in self.presence.tick(now):
            actions.append(Broadcast(to, frame))
        return actions

    def next_deadline(self) -> int | None:
        """When `tick` next has something to do (ms), or None."""
        drafts, presence = self.drafts.next_deadline(), self.presence.next_deadline()
        if drafts is None or presence is None:
            return presence if drafts is None else drafts
        return min(drafts, presence)

    def join(
        self, conn: C, owner: Owner, kind: str | None, name: str | None, now: int
    ) -> list[Action[C]]:
        """`conn` (known as `owner`, shown as `kind`/`name`) joined: its presence entry (none
        for a watcher), then the drafts and presence it asked to see."""
        hello = self.hellos.get(conn)
        if hello is None:
            return []
        if hello.watch:  # watching is not joining (SPEC 17): counted, never shown
            if conn not in self.watching:
                self.watching.add(conn)
                self.metrics.watchers += 1
        else:
            principal, client = owner
            socket = getattr(conn, "shared_socket", None)  # a channel of one (`server.mux`)
            self.presence.join(conn, principal, client, kind, name, now, socket)
        actions: list[Action[C]] = []
        if "drafts" in hello.features:
            actions.append(SendFrames(conn, self.drafts.subscribe(conn)))
        if "presence" in hello.features:
            actions.append(Send(conn, self.presence.subscribe(conn), True))
        return actions + self.tick(now)

    def leave(self, conn: C, now: int) -> None:
        """`conn` is gone: no more drafts or presence for it; its presence entry goes at the
        next `tick`, drafts it produced wait `draft_grace` for it to come back."""
        self.hellos.pop(conn, None)
        if conn in self.watching:
            self.watching.discard(conn)
            self.metrics.watchers -= 1
        self.drafts.unsubscribe(conn, now)
        self.presence.leave(conn)

    def lost_write(self, conn: C) -> list[Action[C]]:
        """`conn` lost `write`: the drafts it produces end now, for everyone (issue 27)."""
        actions = live_actions(self.drafts.end_produced_by(conn, "aborted"))
        self.presence.set_drafting(self.drafts.owners())
        return actions

    # ------------------------------------------------------------------ from the log

    def clash(self, owner: Owner, records: Sequence[ChangeRecord]) -> str | None:
        """Why `records` from `owner` may not land: one would make another client's open
        draft's id held."""
        if not self.drafts.drafts:
            return None
        for id_ in _entry_ids(records):
            holder = self.drafts.owner_of(id_)
            if holder is not None and holder != owner:
                return f"entry id {id_} is another client's open draft"
        return None

    def refused(self, owner: Owner, records: Sequence[ChangeRecord]) -> list[Action[C]]:
        """`owner`'s push carrying a draft's id was rejected `invalid`: the draft ends."""
        if not self.drafts.drafts:
            return []
        out: list[Out[C]] = []
        for id_ in _entry_ids(records):
            if self.drafts.owner_of(id_) == owner:
                out += self.drafts.end(id_, "aborted", "the push carrying it was rejected")
        self.presence.set_drafting(self.drafts.owners())
        return live_actions(out)

    def landed(self, records: Sequence[ChangeRecord]) -> list[Action[C]]:
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

    def rewritten(self) -> list[Action[C]]:
        """The log was rewritten: every draft ends `aborted`."""
        return live_actions(self.drafts.end_all("aborted"))

    def clear(self) -> None:
        """The conversation was deleted: drop every draft (nobody is left to tell) and hello."""
        self.drafts.end_all("aborted")
        self.hellos.clear()


def _open_refusal(may_write: bool, log: Conversation, op: DraftOp) -> DraftEnd | None:
    """Why `open` may not start draft `op.id`, for the sender only; None: it may."""
    if not may_write:
        return DraftEnd(op.id, "refused", _MAY_NOT_WRITE)
    if log.holds(op.id):
        return DraftEnd(op.id, "committed", "the log holds this id")
    if log.is_retired(op.id):
        return DraftEnd(op.id, "refused", "this id was taken out of the log")
    return None


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
