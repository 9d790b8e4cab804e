"""`Retention`: deleting conversations, one, many, or those idle for days (SPEC 15).

How this works: a delete goes through the conversation's room when one is loaded (or loading),
under its lock, so an append under way lands or fails before the log goes and every socket is
closed `deleted`; the store keeps a tombstone, which answers `Deleted` to every later load,
append and rewrite of the id, here and on every hub sharing the store. Another hub's room learns
it from the store's notice or its periodic head check (its re-read finds the tombstone) and
closes its sockets the same way. Idleness is the `at` of a conversation's last record; a
retention sweep deletes the idle ones in chunks, so SQLite commits (and scrubs its file for)
many deletes together.

Async API: anyio.
"""

from __future__ import annotations

import logging
import time

import anyio
import msgspec

from .config import HubConfig
from .rooms import Rooms
from .store import LogStore, StoreError

__all__ = ["Retention"]

log = logging.getLogger("convsync.hub")

_IDLE_PAGE = 500
"""Conversations read per store call when looking for idle ones."""
_DELETE_CHUNK = 100
"""Deletes a retention sweep runs at once (SQLite commits those queued together in one
transaction, and rewrites its file once for them)."""


class _Stamp(msgspec.Struct):
    """The one field of a record retention reads (msgspec skips the rest unparsed)."""

    at: int | None = None


_decode_stamp = msgspec.json.Decoder(_Stamp).decode


def _stamped_at(record: bytes | None) -> int | None:
    """When `record` was stamped (ms since the epoch), or None when it cannot say."""
    if record is None:
        return None
    try:
        return _decode_stamp(record).at
    except msgspec.DecodeError:
        return None


class Retention:
    """Deletes the conversations of one hub's store, through the hub's rooms.

    The `Hub` methods of the same names call these; see them for the contracts.
    """

    def __init__(self, rooms: Rooms, store: LogStore, config: HubConfig) -> None:
        self._rooms = rooms
        self._store = store
        self._config = config

    async def delete(self, conversation_id: str, now: float | None = None) -> bool:
        """`Hub.delete`."""
        when = time.time() if now is None else now
        room = await self._rooms.if_loaded(conversation_id)
        if room is not None:
            deleted = await room.delete(when)
        else:
            deleted = await self._store.delete(conversation_id, when)
        # A load that began while the store deleted may have read the log before it went.
        late = await self._rooms.if_loaded(conversation_id)
        if late is not None and deleted:
            await late.forget()
        if deleted:
            log.info("deleted conversation %s", conversation_id)
        return deleted

    async def delete_all(self, ids: list[str], now: float | None = None) -> list[str]:
        """`Hub.delete_all`: up to `_DELETE_CHUNK` deletes at once."""
        when = time.time() if now is None else now
        found: set[str] = set()
        failures: list[StoreError] = []

        async def one(conversation_id: str) -> None:
            try:
                if await self.delete(conversation_id, when):
                    found.add(conversation_id)
            except StoreError as exc:
                failures.append(exc)

        for start in range(0, len(ids), _DELETE_CHUNK):
            async with anyio.create_task_group() as group:
                for conversation_id in ids[start : start + _DELETE_CHUNK]:
                    group.start_soon(one, conversation_id)
            if failures:
                raise failures[0]
        return [cid for cid in ids if cid in found]

    async def idle_conversations(
        self, days: float, now: float | None = None, prefix: str = ""
    ) -> list[tuple[str, float]]:
        """`Hub.idle_conversations`."""
        when = time.time() if now is None else now
        before_ms = (when - days * 86400) * 1000
        idle: list[tuple[str, float]] = []
        after: str | None = None
        while True:
            page = await self._store.last_records(prefix, after=after, limit=_IDLE_PAGE)
            for conversation_id, last in page:
                at = _stamped_at(last)
                room = self._rooms.loaded.get(conversation_id)
                if at is None or at >= before_ms or (room is not None and room.core.subscribers):
                    continue
                idle.append((conversation_id, at / 1000))
            if len(page) < _IDLE_PAGE:
                return idle
            after = page[-1][0]

    async def retain(
        self, days: float, now: float | None = None, *, dry_run: bool = False
    ) -> list[str]:
        """`Hub.retain`."""
        when = time.time() if now is None else now
        ids = [cid for cid, _ in await self.idle_conversations(days, when)]
        if dry_run:
            return ids
        gone = await self.delete_all(ids, when)
        keep = self._config.keep_tombstones_days
        if keep is not None:
            await self._store.forget_deleted(when - keep * 86400)
        return gone

    async def run(self) -> None:
        """`--retain DAYS` and `--keep-tombstones DAYS`: a sweep at start, then every
        `retain_every` seconds, until cancelled."""
        days, keep = self._config.retain_days, self._config.keep_tombstones_days
        while True:
            try:
                if days is not None:
                    gone = await self.retain(days)
                    if gone:
                        log.info("retention deleted %d idle conversation(s)", len(gone))
                elif keep is not None:
                    await self._store.forget_deleted(time.time() - keep * 86400)
            except StoreError as exc:
                log.warning("a retention sweep failed (%s); the next one tries again", exc)
            except Exception:  # a bug of ours: log it; the hub serves on, the next sweep runs
                log.exception("a retention sweep failed")
            await anyio.sleep(self._config.retain_every)
