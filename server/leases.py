"""`keep_turns`: renews the leases of open turns held here and ends lapsed ones (SPEC 10).

How this works: a turn's owner is connected to one hub, which keeps a lease on the turn in the
store while it is. Every third of `turn_grace` this hub renews the leases of the open turns of
its loaded rooms; every quarter of the shorter grace (at least once a second) it asks the store
for the leases that lapsed, on any hub, and ends those turns through their rooms, loading a room
for the moment if need be (so a room that unloaded, or a hub that restarted, still ends them).

Async API: anyio.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from sync.errors import UsageError
from sync.ids import now_ms

from .config import HubConfig
from .room import Room
from .rooms import Rooms
from .store import LogStore, StoreError

__all__ = ["keep_turns"]

log = logging.getLogger("convsync.hub")


async def keep_turns(
    rooms: Rooms,
    store: LogStore,
    config: HubConfig,
    touched: Callable[[Room], None],
    closing: Callable[[], bool],
) -> None:
    """Renew and end turn leases until cancelled, or until `closing()` says the hub stops.

    Args:
        rooms: the hub's rooms (acquired and released for each lapsed turn).
        store: a store that keeps leases (`keeps_leases`).
        config: the hub's settings (`turn_grace`, `stop_grace`).
        touched: told a room whose turn was ended (summary rows show turns).
        closing: whether the hub is shutting down (no more turns are ended then).
    """
    period = min(1.0, max(0.02, min(config.turn_grace, config.stop_grace) / 4))
    renew_every = config.turn_grace / 3
    renewed = time.monotonic()
    while True:
        await anyio.sleep(period)
        if time.monotonic() - renewed >= renew_every:
            renewed = time.monotonic()
            for room in list(rooms.loaded.values()):
                if room.core.has_open_turn:
                    try:
                        await room.renew_lease()
                    except Exception:  # a bug of ours: log it, renew the others
                        log.exception("renewing the turn lease of %s failed", room.id)
        try:
            due = await store.leases_due(now_ms())
        except (StoreError, UsageError) as exc:
            log.warning("reading the turn leases failed: %s", exc)
            continue
        for lease in due:
            if closing():
                return
            room = await rooms.acquire(lease.conversation_id)
            try:
                await room.finish_expired(lease)
                touched(room)
            except Exception:  # a bug of ours: log it, the next pass tries again
                log.exception("ending turn %d of %s failed", lease.turn, room.id)
            finally:
                rooms.release(room)
