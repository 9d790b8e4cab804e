"""`Follower`: keeps this hub's loaded rooms up to a store other hubs append to (SPEC 9).

How this works: on a store other hubs share (one with `watch()`: PostgreSQL), a loaded room
learns that its log moved in two ways: the store's notices (fast, may be lost) and a re-read of
its head every `head_check` seconds (the backstop). Both only schedule a catch-up; each room has
at most one under way, plus one more when asked again meanwhile, so a burst of notices costs one
read per room and a busy room never stalls the others. After a lost watch every loaded room is
checked (notices may have been missed) and the watch opened again, with capped backoff and full
jitter. Drafts and presence across hubs go over a bus, not the store's notices:
`server.bus.Relay`, started beside this.

Async API: anyio.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from .config import HubConfig
from .room import Room
from .store import LogStore, StoreError

__all__ = ["Follower"]

log = logging.getLogger("convsync.hub")


class Follower:
    """Follows a shared store for the rooms in `rooms` (the registry's dict).

    Args:
        store: a store with `watch()`.
        rooms: the loaded rooms, by conversation id.
        config: the hub's settings (`head_check`).
        touched: told a room that caught up with other hubs' records (summary rows follow).
    """

    def __init__(
        self,
        store: LogStore,
        rooms: dict[str, Room],
        config: HubConfig,
        touched: Callable[[Room], None],
    ) -> None:
        self._store = store
        self._rooms = rooms
        self._config = config
        self._touched = touched
        self._following: dict[Room, bool] = {}  # room -> check again once this one ends
        self._group: TaskGroup | None = None
        self._closing = False

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch the store's notices and check every head periodically, until cancelled;
        started at once (the first watch checks every room when it opens)."""
        async with anyio.create_task_group() as group:
            self._group = group
            group.start_soon(self._watch_store)
            group.start_soon(self._check_heads)
            task_status.started()

    def close(self) -> None:
        """The hub is shutting down: schedule no more catch-ups."""
        self._closing = True

    async def _watch_store(self) -> None:
        watch: Callable[[], AbstractAsyncContextManager[AsyncIterator[Any]]]
        watch = self._store.watch  # type: ignore[attr-defined]
        failures = 0
        while True:
            try:
                async with watch() as notices:
                    failures = 0
                    self.check_all()  # whatever moved while nobody listened
                    async for notice in notices:
                        self._heard(notice.conversation, notice.lineage, notice.revision)
                return  # the store closed
            except StoreError as exc:
                failures += 1
                log.warning("watching the store failed (%s); checking every room", exc)
            self.check_all()
            await anyio.sleep(random.uniform(0, min(5.0, 0.1 * 2 ** (failures - 1))))

    async def _check_heads(self) -> None:
        while True:
            await anyio.sleep(self._config.head_check)
            self.check_all()

    def _heard(self, conversation_id: str, lineage: int, revision: int) -> None:
        """A notice: the log is at (`lineage`, `revision`); catch up a room that lacks it."""
        room = self._rooms.get(conversation_id)
        if room is not None and (lineage != room.lineage or revision > room.revision):
            self.follow(room)

    def check_all(self) -> None:
        """Schedule a head check of every loaded room."""
        for room in list(self._rooms.values()):
            self.follow(room)

    def follow(self, room: Room) -> None:
        """Schedule a head check of `room` (at most one under way per room)."""
        if room in self._following:
            self._following[room] = True
            return
        if self._group is None or self._closing:
            return
        self._following[room] = False
        self._group.start_soon(self._catch_up, room)

    async def _catch_up(self, room: Room) -> None:
        try:
            while True:
                self._following[room] = False
                head = (room.lineage, room.revision)
                try:
                    await room.head_check()
                except Exception:  # a bug of ours: log it, the next check tries again
                    log.exception("checking the head of %s failed", room.id)
                if (room.lineage, room.revision) != head:
                    self._touched(room)  # another hub's records: summary rows follow
                if not self._following.get(room):
                    return
        finally:
            self._following.pop(room, None)
