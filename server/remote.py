"""Between one room's core and the bus, pure: what to tell other hubs, and showing what they said.

How this works: `relay_ops` takes what changed in the room's own drafts and presence since the
last call (the boards keep it when a bus runs), `answer_ask` builds the answer to another hub's
`BusAsk`, and `show_changes` puts the `Change`s a `Mirror` returned onto the room's boards as
foreign drafts and presence entries, returning the frames for the room's subscribers. These
touch the live boards only, never the log or a store call in progress, so the shell may call
them between any two steps of the core.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

from .core import Action, RoomCore, live_actions
from .drafts import Out
from .mirror import BusDraft, BusEnd, BusGrow, BusOp, BusPresence, Change

__all__ = ["answer_ask", "relay_ops", "relay_pending", "show_changes"]

C = TypeVar("C", bound=Hashable)


def relay_pending(core: RoomCore[C]) -> bool:
    """Whether the room has news for other hubs."""
    return core.drafts.relay_pending or core.presence.relay_pending


def relay_ops(core: RoomCore[C]) -> list[BusOp]:
    """What changed in the room's own drafts and presence since the last call."""
    ops = core.drafts.take_relay()
    if core.presence.relay_pending:
        ops.append(BusPresence(core.presence.take_relay()))
    return ops


def answer_ask(core: RoomCore[C], draft_id: str | None) -> list[BusOp]:
    """Another hub asks for draft `draft_id` whole (None: every own draft and the presence);
    a draft this hub does not produce (any more) is answered with its end."""
    if draft_id is not None:
        ops = core.drafts.snapshot_ops(draft_id)
        return ops or [BusEnd(draft_id, "aborted", "the producer's hub does not hold it")]
    ops = []
    for own in core.drafts.own_ids():
        ops += core.drafts.snapshot_ops(own)
    if core.presence.entries:
        ops.append(BusPresence(core.presence.take_relay()))
    return ops


def show_changes(core: RoomCore[C], changes: list[Change], now: int) -> list[Action[C]]:
    """Show other hubs' `changes` (of this room's conversation) to the room's subscribers:
    the frames due now; what is coalesced goes at the core's next deadline (`tick`, which
    this does not run, so no rule of the room's own runs outside its operations)."""
    out: list[Out[C]] = []
    for change in changes:
        match change.op:
            case BusDraft(draft_id) as meta:
                if core.conversation.holds(draft_id) or core.conversation.is_retired(draft_id):
                    continue  # committed (or gone) already: the log said so first
                out += core.drafts.foreign_open(change.hub, meta, now)
            case BusGrow() as grow:
                out += core.drafts.foreign_grow(grow, now)
            case BusEnd() as end:
                out += core.drafts.foreign_end(end)
            case BusPresence(entries):
                core.presence.set_foreign(change.hub, entries)
    core.presence.set_drafting(core.drafts.owners())
    return live_actions(out)  # merged deltas and presence diffs wait for the room's next `tick`
