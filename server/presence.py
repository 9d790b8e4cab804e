"""Who is connected to one conversation, pure: joins, statuses and leaves in, diffs out (SPEC 7).

How this works: a `PresenceBoard` holds one entry per live socket, under a connection id the
board assigns (so a late close of an old socket removes that socket's entry only, never the
entry of the connection that replaced it). Changes accumulate into one pending diff; `tick(now)`
sends it to every subscriber at most every `throttle` ms (the first change after a quiet spell
is due at once). While a client has an open draft and set no status of its own, its status
reads `drafting`. Nothing here awaits or reads a clock; times are milliseconds.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sync.protocol import (
    MAX_DETAIL,
    MAX_STATUS,
    PresenceDiff,
    PresenceEntry,
    PresenceSnapshot,
    encode_message,
    status_problem,
)

from .metrics import Metrics

__all__ = ["MAX_DETAIL", "MAX_STATUS", "PresenceBoard", "status_problem"]

C = TypeVar("C", bound=Hashable)


DRAFTING = "drafting"


@dataclass(slots=True)
class _Entry:
    connection: int
    principal: str
    client: str
    kind: str | None
    name: str | None
    since: int
    status: str | None = None  # as the client set it
    detail: Any = None
    shown: str | None = None  # what others see (`drafting` while drafting, unless set)
    socket: int | None = None  # the shared socket it is a channel of (`server.mux`)

    def wire(self) -> PresenceEntry:
        return PresenceEntry(
            self.connection, self.principal, self.client, self.since, self.kind, self.name,
            self.shown, self.detail, self.socket,
        )  # fmt: skip


class PresenceBoard(Generic[C]):
    """The live connections of one conversation.

    Args:
        metrics: the hub's counters (presence entries).
        throttle: the least time between two diffs, in ms.
    """

    def __init__(self, metrics: Metrics, throttle: int = 100) -> None:
        self.metrics = metrics
        self.throttle = throttle
        self.entries: dict[C, _Entry] = {}
        self._subs: set[C] = set()
        self._next_id = 1
        self._drafting: set[tuple[str, str]] = set()
        self._joined: dict[int, _Entry] = {}
        self._left: list[int] = []
        self._changed: dict[int, _Entry] = {}
        self._last_flush = -(1 << 62)
        # Sockets on other hubs (SPEC 9), under ids this board assigns: hub -> their id -> entry.
        self.foreign: dict[str, dict[int, _Entry]] = {}
        self.relay_pending = False  # this hub's own entries changed since `take_relay`

    def _pending(self) -> bool:
        return bool(self._joined or self._left or self._changed)

    def _touched(self) -> None:
        self.relay_pending = True

    def next_deadline(self) -> int | None:
        if not self._pending():
            return None
        return self._last_flush + self.throttle

    def join(
        self,
        conn: C,
        principal: str,
        client: str,
        kind: str | None,
        name: str | None,
        now: int,
        socket: int | None = None,
    ) -> int:
        """Add `conn`'s entry (a channel of shared socket `socket`, if given); returns its
        connection id."""
        entry = _Entry(self._next_id, principal, client, kind, name, now, socket=socket)
        self._next_id += 1
        entry.shown = DRAFTING if (principal, client) in self._drafting else None
        self.entries[conn] = entry
        self._joined[entry.connection] = entry
        self._touched()
        self.metrics.presence += 1
        return entry.connection

    def subscribe(self, conn: C) -> bytes:
        """`conn` gets diffs from now on; returns the `presence` frame with every entry."""
        self._subs.add(conn)
        return encode_message(PresenceSnapshot([e.wire() for e in self._all()]))

    def leave(self, conn: C) -> None:
        """`conn`'s socket closed: its entry (and only its own) goes."""
        self._subs.discard(conn)
        entry = self.entries.pop(conn, None)
        if entry is None:
            return
        self.metrics.presence -= 1
        self._touched()
        self._changed.pop(entry.connection, None)
        if self._joined.pop(entry.connection, None) is None:
            self._left.append(entry.connection)

    def set_status(self, conn: C, status: str | None, detail: Any) -> None:
        """`conn` set its status (checked with `status_problem` first)."""
        entry = self.entries.get(conn)
        if entry is None:
            return
        entry.status, entry.detail = status, detail
        self._show(entry)
        self._touched()
        if entry.connection not in self._joined:
            self._changed[entry.connection] = entry

    def set_drafting(self, owners: set[tuple[str, str]]) -> None:
        """The (principal, client) pairs with an open draft now."""
        if owners == self._drafting:
            return
        self._drafting = set(owners)
        for entry in self.entries.values():
            before = entry.shown
            self._show(entry)
            if entry.shown != before:
                self._touched()
            if entry.shown != before and entry.connection not in self._joined:
                self._changed[entry.connection] = entry

    def _show(self, entry: _Entry) -> None:
        drafting = (entry.principal, entry.client) in self._drafting
        entry.shown = entry.status if entry.status is not None else (DRAFTING if drafting else None)

    def _all(self) -> list[_Entry]:
        entries = list(self.entries.values())
        for by_id in self.foreign.values():
            entries += by_id.values()
        return entries

    def take_relay(self) -> list[PresenceEntry]:
        """This hub's own entries, for other hubs (clears `relay_pending`)."""
        self.relay_pending = False
        return [e.wire() for e in self.entries.values()]

    def set_foreign(self, hub: str, entries: list[PresenceEntry]) -> None:
        """Hub `hub` now has exactly `entries` on this conversation ([]: none, or it died)."""
        known = self.foreign.get(hub, {})
        fresh: dict[int, _Entry] = {}
        for wire in entries:
            entry = known.pop(wire.connection, None)
            if entry is None:
                entry = _Entry(
                    self._next_id,
                    wire.principal,
                    wire.client,
                    wire.kind,
                    wire.name,
                    wire.since,
                    socket=wire.socket,
                )
                self._next_id += 1
                entry.status = entry.shown = wire.status
                entry.detail = wire.detail
                self._joined[entry.connection] = entry
            elif (entry.shown, entry.detail, entry.name) != (wire.status, wire.detail, wire.name):
                entry.status = entry.shown = wire.status
                entry.detail, entry.name = wire.detail, wire.name
                if entry.connection not in self._joined:
                    self._changed[entry.connection] = entry
            fresh[wire.connection] = entry
        for entry in known.values():  # gone from that hub
            self._changed.pop(entry.connection, None)
            if self._joined.pop(entry.connection, None) is None:
                self._left.append(entry.connection)
        if fresh:
            self.foreign[hub] = fresh
        else:
            self.foreign.pop(hub, None)

    def tick(self, now: int) -> list[tuple[list[C], bytes]]:
        """The diff to send, when one is pending and due."""
        if not self._pending() or now < self._last_flush + self.throttle:
            return []
        diff = PresenceDiff(
            [e.wire() for e in self._joined.values()],
            list(self._left),
            [e.wire() for e in self._changed.values()],
        )
        self._joined, self._left, self._changed = {}, [], {}
        self._last_flush = now
        if not self._subs:
            return []
        return [(list(self._subs), encode_message(diff))]
