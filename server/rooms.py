"""`Rooms`: the hub's registry of loaded conversations.

How this works: a room loads on its first use (`acquire`) and is counted in use until its caller
gives it back (`release`); `unload_idle` drops the rooms nobody used for `idle_unload` seconds.
A load is one task per conversation, shared by every caller that asks meanwhile, and it is not
the first caller's task: a caller cancelled while it waits (an HTTP read past its handshake
timeout) must not cancel the load for the others. Callers waiting on a load are counted
(`awaiting`), so a room is not unloaded before each of them took it.

Async API: asyncio. A load is an `asyncio.Task` its callers await through `asyncio.shield`, which
says "wait for it, but my cancellation is not its cancellation" in one call; the sweep sleeps
with `asyncio.sleep`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from .config import HubConfig
from .metrics import Metrics
from .room import Room
from .store import LogStore
from .store.base import Deleted

__all__ = ["Rooms"]


class Rooms:
    """The conversations loaded on one hub, by id.

    Args:
        store: the store rooms load from.
        config: the hub's settings (`idle_unload`, and each room's own).
        metrics: where `conversations_loaded` is kept.
        on_deadline: told a room's next deadline after each of its operations (the timer).
        touched: told a room changed in a way the summary rows show (here: it was deleted).
        auth: whether the hub checks tokens now (rooms then check scopes); asked at each
            load, since the hub's keys may be set after it was made.
    """

    def __init__(
        self,
        store: LogStore,
        config: HubConfig,
        metrics: Metrics,
        *,
        on_deadline: Callable[[int | None], None],
        touched: Callable[[Room], None],
        auth: Callable[[], bool],
    ) -> None:
        self.loaded: dict[str, Room] = {}
        """The rooms loaded, by conversation id (read by the hub's other parts)."""
        self.awaiting: dict[str, int] = {}
        """Callers waiting for a room's load, by conversation id."""
        self.attach: Callable[[Room], None] | None = None
        """Called with each room once loaded, before anyone joins (the bus: other hubs'
        drafts and presence)."""
        self._loading: dict[str, asyncio.Task[Room]] = {}
        self._store = store
        self._config = config
        self._metrics = metrics
        self._on_deadline = on_deadline
        self._touched = touched
        self._auth = auth

    async def acquire(self, conversation_id: str) -> Room:
        """The room of `conversation_id`, loaded if need be, counted in use until `release`.

        Raises:
            Deleted: the conversation was deleted.
            StoreError: the store failed to load it.
        """
        room = self.loaded.get(conversation_id)
        if room is None:
            loading = self._loading.get(conversation_id)
            if loading is None:
                # A task of the hub's, not the caller's: a caller cancelled meanwhile (an HTTP
                # read past its handshake timeout) must not cancel the load for the others.
                loading = asyncio.get_running_loop().create_task(self._load(conversation_id))
                loading.add_done_callback(_retrieved)
                self._loading[conversation_id] = loading
            # Counted while it waits: the load wakes its callers one by one, and a read of a
            # conversation with no log must not unload the room before the others took it.
            self.awaiting[conversation_id] = self.awaiting.get(conversation_id, 0) + 1
            try:
                room = await asyncio.shield(loading)
            finally:
                left = self.awaiting.pop(conversation_id) - 1
                if left:
                    self.awaiting[conversation_id] = left
        room.users += 1
        return room

    async def _load(self, conversation_id: str) -> Room:
        try:
            room = Room(
                conversation_id,
                self._store,
                self._config,
                self._metrics,
                self._on_deadline,
                auth=self._auth(),
            )
            await room.load()
            room.on_gone = self.gone
            if self.attach is not None:
                self.attach(room)  # other hubs' drafts, before anyone joins
            self.loaded[conversation_id] = room
            self._metrics.conversations_loaded = len(self.loaded)
            return room
        finally:
            del self._loading[conversation_id]

    def release(self, room: Room) -> None:
        """A caller of `acquire` is done with `room`."""
        room.users -= 1
        if room.users == 0:
            room.idle_since = time.monotonic()

    async def unload_idle(self) -> None:
        """Forever: unload the rooms that may go (`may_unload`) once idle for `idle_unload`."""
        period = max(0.05, min(self._config.idle_unload / 2, 5.0))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conversation_id, room in list(self.loaded.items()):
                if now - room.idle_since >= self._config.idle_unload and self.may_unload(room):
                    del self.loaded[conversation_id]
            self._metrics.conversations_loaded = len(self.loaded)

    def may_unload(self, room: Room) -> bool:
        """Whether nobody holds `room`, is about to (a caller still waiting for its load), or
        needs it now (an operation under way, open drafts, kept until they end)."""
        return (
            room.users == 0
            and not self.awaiting.get(room.id)
            and not room.lock.locked()
            and not room.core.drafts.drafts
        )

    async def for_read(self, conversation_id: str) -> Room | None:
        """The room of `conversation_id` for a read, loading it for the moment if needed;
        None when the conversation has no log (or was deleted).

        Raises:
            StoreError: the store failed to load it.
        """
        try:
            room = await self.acquire(conversation_id)
        except Deleted:
            return None  # a deleted conversation reads as absent (SPEC 15)
        self.release(room)
        if room.exists:
            return room
        if self.may_unload(room) and self.loaded.get(room.id) is room:
            # Nothing to keep: a read of a name with no log must not hold a room for
            # `idle_unload` (reads of made-up names would pile rooms up).
            del self.loaded[room.id]
            self._metrics.conversations_loaded = len(self.loaded)
        return None

    async def if_loaded(self, conversation_id: str) -> Room | None:
        """The room of `conversation_id` if it is loaded, or once a load under way is done;
        None when there is none (a load that failed, a deleted log, counts as none)."""
        room = self.loaded.get(conversation_id)
        loading = self._loading.get(conversation_id)
        if room is None and loading is not None:
            with contextlib.suppress(Exception):
                room = await asyncio.shield(loading)
        return room if room is not None and not room.core.gone else None

    def gone(self, room: Room) -> None:
        """`room`'s conversation was deleted (here or by another hub): unload it now."""
        if self.loaded.get(room.id) is room:
            del self.loaded[room.id]
            self._metrics.conversations_loaded = len(self.loaded)
        self._touched(room)  # summary feeds read it as gone


def _retrieved(task: asyncio.Task[Room]) -> None:
    """Mark a room load's failure seen: its callers may all have gone (cancelled)."""
    if not task.cancelled():
        task.exception()
