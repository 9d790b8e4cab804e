"""`RoomTimer`: wakes each loaded room's core at its next deadline.

How this works: a room's core has deadlines of its own (draft coalescing and expiry, presence
diffs). The timer sleeps until the soonest of them, starts a tick of each room that is due, and
looks again. A room tells it its next deadline after every operation (`deadline`); the timer
wakes early only when that is sooner than what it sleeps until, so most pushes (which have none)
cost no task switch. Each tick is a task of its own: the timer never waits for a room. (It once
skipped a room whose lock was taken, but a lock just released to a waiting operation reads as
free, and the timer then waited behind that operation's store call, and every other room's
drafts and presence with it.)

Async API: anyio.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
from anyio.abc import TaskGroup, TaskStatus

from sync.ids import now_ms

from .room import Room
from .web import live_state

__all__ = ["RoomTimer"]

log = logging.getLogger("convsync.hub")


class RoomTimer:
    """The timer of one hub's rooms: give `deadline` to each room, then `run` it.

    Args:
        touched: told a room whose tick changed what a summary row shows (a draft, a status).
    """

    def __init__(self, touched: Callable[[Room], None]) -> None:
        self._touched = touched
        self._ticking: set[Room] = set()  # rooms with a tick under way
        self._moved: anyio.Event | None = None  # set: a room's next deadline may be sooner
        # What the timer sleeps until (ms); 0 while it looks at the rooms, when every deadline
        # a room reports must make it look again; None: no deadline at all.
        self._target: int | None = 0

    def deadline(self, deadline: int | None) -> None:
        """A room's next deadline after an operation: wake the timer only when it is sooner
        than what the timer sleeps until."""
        target = self._target
        if deadline is not None and (target is None or deadline < target):
            self._wake()

    def _wake(self) -> None:
        if self._moved is not None:
            self._moved.set()

    async def run(
        self,
        rooms: dict[str, Room],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Tick the rooms of `rooms` (the registry's dict, read as it changes) as they come
        due, until cancelled; started once it listens to `deadline`."""
        async with anyio.create_task_group() as ticks:
            self._moved = anyio.Event()
            task_status.started()
            await self._loop(rooms, ticks)

    async def _loop(self, rooms: dict[str, Room], ticks: TaskGroup) -> None:
        while True:
            # A fresh event each pass (an anyio event is set once): a deadline reported while
            # this pass looks at the rooms sets it, and the wait below returns at once.
            moved = self._moved = anyio.Event()
            self._target = 0
            soonest: int | None = None
            for room in list(rooms.values()):
                if room in self._ticking or room.lock.locked():
                    continue  # busy: the end of its tick or operation wakes us
                deadline = room.next_deadline()
                if deadline is not None and deadline <= now_ms():
                    self._ticking.add(room)
                    ticks.start_soon(self._tick, room)
                    continue
                if deadline is not None:
                    soonest = deadline if soonest is None else min(soonest, deadline)
            self._target = soonest
            if soonest is None:
                await moved.wait()
                continue
            with anyio.move_on_after(max(soonest - now_ms(), 0) / 1000):
                await moved.wait()

    async def _tick(self, room: Room) -> None:
        shown = live_state(room)
        try:
            await room.tick()
        except Exception:  # a bug of ours: log it; the timer keeps serving the others
            log.exception("tick of %s failed", room.id)
            return  # retried when the timer next wakes, not at once (no busy loop)
        finally:
            self._ticking.discard(room)
        if live_state(room) != shown:
            self._touched(room)  # it ended a draft or changed a status: a row shows them
        self._wake()  # its next deadline, in the timer's next pass
