"""The replica's live state, pure: drafts it sees and produces, and who is online (SPEC 7).

How this works: `LiveState` belongs to a `ReplicaSession`, which hands it the hub's draft and
presence messages and tells it when a connection opens, is welcomed, and when the log folds
records. It keeps `drafts` (every open draft the hub reported, its text so far) and the hub's
presence entries, and returns events. As a producer it keeps each draft this replica writes
(the whole text, and how much of each part the hub holds) and says which ops to send now:
`open` once per connection, then the appends the hub lacks from the offsets it has (after a
reconnect, only once the hub answered `draft_state` with its lengths), and a `keep` for a draft
silent longer than `keep_every`. A gap or an unknown draft makes it open the draft again and
resend from what the hub holds, so no character goes twice and none is lost. Nothing here
sends, awaits or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from sync import Author, Conversation, UsageError
from sync.budget import TokenBucket, pacer_for
from sync.protocol import (
    DraftEnd,
    DraftInfo,
    DraftOp,
    Drafts,
    DraftState,
    DraftUpdate,
    PresenceDiff,
    PresenceEntry,
    PresenceSnapshot,
    StatusUpdate,
    Welcome,
    status_problem,
)
from sync.text import joined

__all__ = [
    "FEATURES",
    "Draft",
    "DraftChanged",
    "DraftEnded",
    "LiveState",
    "Presence",
    "PresenceChanged",
]

FEATURES = ["drafts", "presence"]
"""What a replica asks the hub for in its hello."""

LiveMessage = Drafts | DraftUpdate | DraftState | DraftEnd | PresenceSnapshot | PresenceDiff


class DraftChanged(msgspec.Struct, frozen=True):
    """Draft `id` opened or grew (read it in `replica.drafts[id]`)."""

    id: str


class DraftEnded(msgspec.Struct, frozen=True):
    """Draft `id` ended: `committed` (its entry is in the log), `aborted`, `timeout`, `stopped`,
    or `gone` (it was no longer open when this replica reconnected)."""

    id: str
    status: str


class PresenceChanged(msgspec.Struct, frozen=True):
    """Clients that came online, went offline, or changed status (client ids)."""

    joined: list[str]
    left: list[str]
    changed: list[str]


@dataclass
class Draft:
    """A message in progress, as this replica last heard it."""

    id: str
    role: str
    principal: str
    client: str
    since: int
    author: Author | None = None
    after: str | None = None
    parts: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.parts.get("text", "")

    @property
    def reasoning(self) -> str:
        return self.parts.get("reasoning", "")

    @staticmethod
    def of(info: DraftInfo) -> Draft:
        return Draft(
            info.id, info.role, info.principal, info.client, info.since, info.author,
            info.after, dict(info.parts), dict(info.names),
        )  # fmt: skip


@dataclass(frozen=True)
class Presence:
    """One client online: its live connections merged (the newest status wins)."""

    client: str
    principal: str
    kind: str | None
    name: str | None
    status: str | None
    detail: Any
    connections: tuple[int, ...]
    since: int


class _Own:
    """A draft this replica produces."""

    __slots__ = (
        "after",
        "author",
        "chunks",
        "ended",
        "epoch",
        "heard",
        "id",
        "lengths",
        "names",
        "opened",
        "sent",
        "waiting",
    )

    def __init__(self, id_: str, after: str | None, author: Author | None, now: float) -> None:
        self.id = id_
        self.after = after
        self.author = author
        self.epoch = 0
        self.chunks: dict[str, list[str]] = {}
        self.lengths: dict[str, int] = {}
        self.names: dict[str, str] = {}
        self.sent: dict[str, int] = {}  # code points of each part the hub holds (or will)
        self.opened = False  # `open` sent on this connection
        self.waiting = False  # for `draft_state` before sending appends
        self.heard = now  # when an op last went
        self.ended: str | None = None

    def text(self, part: str) -> str:
        return joined(self.chunks, part)


class LiveState:
    """Drafts and presence of one replica, across connections."""

    def __init__(self) -> None:
        self.drafts: dict[str, Draft] = {}
        self.connections: dict[int, PresenceEntry] = {}
        self.own: dict[str, _Own] = {}
        self.features: list[str] = []
        self.status: StatusUpdate | None = None
        self.status_due = False  # the status must be (re)sent
        self._snapshot: list[DraftInfo] | None = None  # a `drafts` snapshot being received
        self._aborts: list[str] = []  # own drafts aborted here, the `abort` not sent yet
        self._pacer: TokenBucket | None = None  # within the hub's draft budget, once welcomed
        self.paced_until: float | None = None
        """When `ops_to_send` held the ops back to stay within the hub's draft budget: the
        time (in its `now`'s clock) to ask again; None when it did not."""

    # ------------------------------------------------------------------ connections

    def connecting(self) -> None:
        """A new connection opens: every own draft is opened again on it, and a drafts
        snapshot cut off with the last connection is dropped (the new one sends its own)."""
        self.features = []
        self._snapshot = None
        for own in self.own.values():
            own.opened = False
            own.waiting = False

    def welcomed(self, welcome: Welcome) -> list[Any]:
        self.features = list(welcome.features)
        self._pacer = pacer_for((welcome.limits or {}).get("draft"))
        self.status_due = self.status is not None and "presence" in self.features
        events: list[Any] = []
        if "drafts" not in self.features:
            self._aborts = []
            events += self._drop_all("gone")
        if "presence" not in self.features and self.connections:
            events += self._take_presence([])
        return events

    # ------------------------------------------------------------------ receiving

    def receive(self, message: LiveMessage) -> list[Any]:
        match message:
            case Drafts(infos, more):
                self._snapshot = (self._snapshot or []) + infos
                return [] if more else self._take_snapshot()
            case DraftUpdate(id=id_, op="open", info=info):
                if info is None:
                    return []
                self.drafts[id_] = Draft.of(info)
                return [DraftChanged(id_)]
            case DraftUpdate(id=id_, part=part, offset=offset, text=text, name=name):
                draft = self.drafts.get(id_)
                if draft is None:
                    return []
                have = draft.parts.get(part, "")
                if offset > len(have):
                    return []  # cannot happen in order; the next snapshot repairs it
                draft.parts[part] = have + text[len(have) - offset :]
                if name is not None:
                    draft.names.setdefault(part, name)
                return [DraftChanged(id_)]
            case DraftState(id_, lengths):
                own = self.own.get(id_)
                if own is not None:
                    own.sent = {
                        part: min(n, own.lengths.get(part, 0)) for part, n in lengths.items()
                    }
                    own.waiting = False
                return []
            case DraftEnd(id_, status):
                return self._on_end(id_, status)
            case PresenceSnapshot(connections):
                return self._take_presence(connections)
            case PresenceDiff(joined, left, changed):
                return self._on_diff(joined, left, changed)
        return []

    def _on_end(self, id_: str, status: str) -> list[Any]:
        own = self.own.get(id_)
        if status in ("gap", "unknown"):
            if own is not None and own.ended is None:
                own.opened = False  # open it again, then resend from the hub's lengths
                own.epoch += 1
            return []
        if own is not None:
            # Ended for good: nothing more is sent for it. Its text stays readable (the writer
            # may still commit it) until the writer is done with it (`forget`).
            own.ended = status
        if status == "refused":  # to the sender only: the hub's draft (if any) goes on
            return [DraftEnded(id_, status)] if own is not None else []
        draft = self.drafts.pop(id_, None)
        return [DraftEnded(id_, status)] if draft is not None or own is not None else []

    def _take_snapshot(self) -> list[Any]:
        infos, self._snapshot = self._snapshot or [], None
        fresh = {info.id: Draft.of(info) for info in infos}
        events: list[Any] = [DraftEnded(id_, "gone") for id_ in self.drafts if id_ not in fresh]
        self.drafts = fresh
        return events + [DraftChanged(id_) for id_ in fresh]

    def _drop_all(self, status: str) -> list[Any]:
        events = [DraftEnded(id_, status) for id_ in self.drafts]
        self.drafts = {}
        return events

    def landed(self, confirmed: Conversation) -> list[Any]:
        """The log folded records: drafts whose id it now holds are done (`committed`)."""
        done = [id_ for id_ in self.drafts if confirmed.holds(id_)]
        for id_ in done:
            del self.drafts[id_]
        return [DraftEnded(id_, "committed") for id_ in done]

    # ------------------------------------------------------------------ presence

    @property
    def presence(self) -> dict[str, Presence]:
        """Client id -> its presence, its live connections merged."""
        by_client: dict[str, list[PresenceEntry]] = {}
        for entry in sorted(self.connections.values(), key=lambda e: e.connection):
            by_client.setdefault(entry.client, []).append(entry)
        out: dict[str, Presence] = {}
        for client, entries in by_client.items():
            newest = entries[-1]
            shown = next((e for e in reversed(entries) if e.status is not None), newest)
            out[client] = Presence(
                client, newest.principal, newest.kind, newest.name, shown.status,
                shown.detail, tuple(e.connection for e in entries), entries[0].since,
            )  # fmt: skip
        return out

    def _take_presence(self, connections: list[PresenceEntry]) -> list[Any]:
        before = self.presence
        self.connections = {entry.connection: entry for entry in connections}
        return self._presence_events(before)

    def _on_diff(
        self, joined: list[PresenceEntry], left: list[int], changed: list[PresenceEntry]
    ) -> list[Any]:
        before = self.presence
        for entry in [*joined, *changed]:
            self.connections[entry.connection] = entry
        for connection in left:
            self.connections.pop(connection, None)
        return self._presence_events(before)

    def _presence_events(self, before: dict[str, Presence]) -> list[Any]:
        after = self.presence
        joined = [c for c in after if c not in before]
        left = [c for c in before if c not in after]
        changed = [c for c in after if c in before and after[c] != before[c]]
        if not (joined or left or changed):
            return []
        return [PresenceChanged(joined, left, changed)]

    def set_status(self, status: str | None, detail: Any) -> None:
        """Set the status to send (and send again after each reconnect).

        Raises:
            UsageError: `bad_status`: a status or detail the hub would refuse (which would
                stop the replica for good); nothing changed.
        """
        problem = status_problem(status, detail)
        if problem is not None:
            raise UsageError("bad_status", problem)
        self.status = StatusUpdate(status, detail)
        self.status_due = "presence" in self.features

    @property
    def quiet(self) -> bool:
        """Nothing to send now or later without a new call here: no status due, no own draft,
        no abort unsent (the shell's sender need not wake)."""
        return not (
            self.status_due or self._aborts or any(own.ended is None for own in self.own.values())
        )

    def status_to_send(self) -> StatusUpdate | None:
        if not self.status_due:
            return None
        self.status_due = False
        return self.status

    # ------------------------------------------------------------------ producing

    def open(self, id_: str, after: str | None, author: Author | None, now: float) -> None:
        """Start producing draft `id_` (the `open` goes with the next `ops_to_send`)."""
        self.own[id_] = _Own(id_, after, author, now)

    def append(self, id_: str, text: str, part: str, name: str | None) -> None:
        own = self.own.get(id_)
        if own is None or own.ended is not None or not text:
            return
        own.chunks.setdefault(part, []).append(text)
        own.lengths[part] = own.lengths.get(part, 0) + len(text)
        if name is not None:
            own.names.setdefault(part, name)

    def text_of(self, id_: str, part: str = "text") -> str:
        own = self.own.get(id_)
        return "" if own is None else own.text(part)

    def forget(self, id_: str) -> None:
        """Stop producing `id_` (committed here: its record ends it on the hub)."""
        self.own.pop(id_, None)

    def abort(self, id_: str) -> None:
        """Stop producing `id_` and tell the hub (with the next `ops_to_send`)."""
        own = self.own.pop(id_, None)
        if own is not None and own.ended is None and own.opened:
            self._aborts.append(id_)

    def ops_to_send(self, now: float, keep_every: float) -> list[DraftOp]:
        """The draft ops to send now, in order (none unless the hub offers drafts).

        They are paced within the draft budget the hub's `welcome` gave: while it is spent
        nothing is sent (`paced_until` says until when) and appends made meanwhile go
        together in one op per draft part, so a model emitting 1,000 tokens a second never
        reaches the hub's limit while one emitting fewer has each token sent at once."""
        self.paced_until = None
        if "drafts" not in self.features:
            return []
        pacer = self._pacer
        if pacer is not None and pacer.available(now) < 1:
            self.paced_until = pacer.ready_at(now)
            return []
        ops = [DraftOp(id_, "abort") for id_ in self._aborts]
        self._aborts = []
        for own in self.own.values():
            if own.ended is not None:
                continue
            if not own.opened:
                own.opened = True
                # Anything sent before (another connection, a gap): resend only from the
                # lengths the hub answers with. A draft new to the hub starts at 0 at once.
                own.waiting = bool(own.sent) or own.epoch > 0
                ops.append(
                    DraftOp(own.id, "open", after=own.after, author=own.author, epoch=own.epoch)
                )
                own.heard = now
                if own.waiting:
                    continue
            if own.waiting:
                continue
            before = len(ops)
            for part, length in own.lengths.items():
                sent = own.sent.get(part, 0)
                if length > sent:
                    name = own.names.get(part) if sent == 0 else None
                    text = own.text(part)[sent:]
                    ops.append(
                        DraftOp(own.id, "append", part=part, offset=sent, text=text, name=name)
                    )
                    own.sent[part] = length
            if len(ops) > before:
                own.heard = now
            elif now - own.heard >= keep_every:
                ops.append(DraftOp(own.id, "keep"))
                own.heard = now
        if pacer is not None:
            for _ in ops:  # a debt of a few ops at most (one per draft part): the next wait
                pacer.spend(now)
        return ops
