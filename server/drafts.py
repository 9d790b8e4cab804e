"""Live drafts of one conversation, pure: draft ops and the time in, frames out (SPEC 7).

How this works: a `DraftBoard` holds the open drafts of one room (a message in progress, named
by the id its final entry will take) and, per subscriber that uses drafts, the deltas it still
owes it. The room's core calls `open`, `append`, `keep`, `abort` with a decoded op, the op's
owner (principal, client) and the time, and `end` / `end_all` when the log decides (a commit,
a stop, a rewrite). Each returns `Out` items: a frame for some connections, or a `Delta` (one
draft part grown) that the socket shell may merge with a delta still queued for a slow peer.

Deltas are coalesced per subscriber: the first after a quiet `interval` goes at once, later
ones merge (one pending delta per draft and part) until the subscriber's next flush, which
`tick(now)` sends when `next_deadline()` comes; subscribers due together with the same pending
deltas share one encoded frame. `interval == 0` sends every delta at once. `tick` also ends
drafts whose producer has been silent for `timeout` or whose socket closed `grace` ago.

Offsets count code points (Python `str` indexes), so an append at `offset` below the part's
length is applied from the overlap only: a resend after a reconnect changes nothing twice.
Nothing here awaits or reads a clock; times are milliseconds from the caller.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec

from sync.entries import Author
from sync.frames import FRAME_FILL
from sync.ids import is_message_id
from sync.protocol import (
    DraftEnd,
    DraftEndStatus,
    DraftInfo,
    DraftOp,
    DraftState,
    DraftUpdate,
    encode_message,
)
from sync.text import joined

from .metrics import Metrics
from .mirror import BusDraft, BusEnd, BusGrow, BusOp

__all__ = ["MAX_NAME", "Delta", "DraftBoard", "DraftConfig", "Frame", "Out", "Owner", "valid_part"]

C = TypeVar("C", bound=Hashable)

Owner = tuple[str, str]
"""Who produces a draft: (principal, client)."""

_json = msgspec.json.Encoder()
_FRAME_MARGIN = 1024  # room for a `drafts` message's own fields around the listed drafts
MAX_NAME = 128
"""The longest tool name a `call:<id>` part may carry (characters)."""


def _meta_bytes(author: Author | None, after: str | None) -> int:
    """The UTF-8 bytes of what a draft holds besides its parts' text: counted against its cap
    with the text, so no field of an `open` holds memory uncounted (issue 27)."""
    size = 0 if after is None else _encoded_bytes(after)
    if author is not None:
        for value in (author.name, author.request, author.title):
            if value is not None:
                size += _encoded_bytes(value)
    return size


def _encoded_bytes(text: str) -> int:
    """The bytes `text` takes in a JSON frame (its quotes left out): its UTF-8 bytes, more
    for what JSON escapes (a control character is six), so a draft at its cap still fits
    one `drafts` frame."""
    return len(_json.encode(text)) - 2


@dataclass(frozen=True, slots=True)
class DraftConfig:
    """The draft settings, in milliseconds and bytes.

    Attributes:
        interval: the least time between two delta messages to one subscriber (0: each at once;
            the socket shell merges the deltas of a subscriber that is behind).
        timeout: a draft whose producer sent nothing for this long ends `timeout`.
        grace: a draft whose producer's socket closed this long ago ends `timeout`.
        max_bytes: the UTF-8 bytes a draft's parts may hold together.
        max_per_owner: open drafts one (principal, client) may hold.
        max_parts: parts one draft may hold (`text`, `reasoning` and each `call:<id>`).
        max_per_conversation: open drafts one conversation may hold, whoever owns them.
    """

    interval: int = 0
    timeout: int = 30_000
    grace: int = 10_000
    max_bytes: int = 512 * 1024
    max_per_owner: int = 8
    max_parts: int = 64
    max_per_conversation: int = 64
    relay: bool = False
    """Keep what changed for other hubs (`take_relay`, SPEC 9): a bus is running."""


@dataclass(frozen=True, slots=True)
class Frame(Generic[C]):
    """Send `frame` to every connection of `to`."""

    to: list[C]
    frame: bytes


@dataclass(frozen=True, slots=True)
class Delta(Generic[C]):
    """Send `frame` (the encoded `message`, one draft part grown) to every connection of `to`;
    a shell may merge it into a delta for the same `key` (draft id, part) still queued."""

    to: list[C]
    key: tuple[str, str]
    message: DraftUpdate
    frame: bytes


Out = Frame[C] | Delta[C]


_DRAFTS_HEAD = b'{"type":"drafts","drafts":['
_DRAFTS_MORE = b'],"more":true}'
_DRAFTS_LAST = b"]}"


def _snapshot_frames(infos: collections.deque[DraftInfo], fill: int) -> Iterator[bytes]:
    """`drafts` frames holding `infos`, each filled to `fill` bytes of encoded drafts (a draft
    larger than that goes alone), built one at a time: each draft is encoded once, and let go
    of once its frame is built. The frame is `encode_message(Drafts(infos, more))`, assembled
    from the drafts' encodings (a test holds the two equal)."""
    pieces: list[bytes] = []
    size = 0
    while infos:
        piece = _json.encode(infos.popleft())
        # From what is encoded, not from the text's bytes: escapes (`\u0000` is six bytes
        # for one) made one `drafts` frame 52 times `max_frame` (issue 27).
        if pieces and size + len(piece) + 1 > fill:
            yield b"".join((_DRAFTS_HEAD, b",".join(pieces), _DRAFTS_MORE))
            pieces, size = [], 0
        pieces.append(piece)
        size += len(piece) + 1
    yield b"".join((_DRAFTS_HEAD, b",".join(pieces), _DRAFTS_LAST))


def valid_part(part: str) -> bool:
    """`text`, `reasoning` or `call:<id>` (an id of 1 to 128 characters)."""
    return part in ("text", "reasoning") or (part.startswith("call:") and 5 < len(part) <= 133)


class _Draft(Generic[C]):
    __slots__ = (
        "after",
        "author",
        "bytes",
        "conn",
        "epoch",
        "gone",
        "heard",
        "hub",
        "id",
        "lengths",
        "names",
        "owner",
        "parts",
        "role",
        "since",
        "stopping",
    )

    def __init__(self, op: DraftOp, owner: Owner, conn: C, now: int) -> None:
        self.id = op.id
        self.role = op.role
        self.owner = owner
        self.author: Author | None = op.author
        self.after = op.after
        self.epoch = op.epoch
        self.since = now
        self.parts: dict[str, list[str]] = {}  # chunks, joined lazily
        self.lengths: dict[str, int] = {}  # code points per part
        self.names: dict[str, str] = {}
        self.bytes = _meta_bytes(op.author, op.after)  # text, names, author and after
        self.conn: C | None = conn  # the producing socket; None once it closed
        self.heard = now
        self.gone: int | None = None
        self.hub: str | None = None  # the hub whose socket produces it; None: this one
        self.stopping = False  # its turn was asked to stop: shown, no more appends (SPEC 10)

    @classmethod
    def foreign(cls, hub: str, meta: BusDraft, now: int) -> _Draft[C]:
        op = DraftOp(meta.id, "open", meta.role, meta.after, meta.author)
        draft: _Draft[C] = cls(op, (meta.principal, meta.client), None, meta.since)  # type: ignore[arg-type]
        draft.conn, draft.hub, draft.heard = None, hub, now
        return draft

    def meta(self) -> BusDraft:
        principal, client = self.owner
        return BusDraft(self.id, self.role, principal, client, self.since, self.author, self.after)

    def text(self, part: str) -> str:
        return joined(self.parts, part)

    def info(self) -> DraftInfo:
        principal, client = self.owner
        parts = {part: self.text(part) for part in self.parts}
        return DraftInfo(
            self.id, self.role, principal, client, self.since, self.author, self.after, parts,
            dict(self.names),
        )  # fmt: skip


@dataclass(slots=True)
class _Pending:
    offset: int
    chunks: list[str]
    name: str | None


@dataclass(slots=True)
class _Subscriber:
    last_flush: int = -(1 << 62)
    pending: dict[tuple[str, str], _Pending] = field(default_factory=dict)


class DraftBoard(Generic[C]):
    """The open drafts of one conversation and what each subscriber is owed.

    Args:
        config: the draft settings.
        metrics: the hub's counters (open drafts, delta bytes relayed).
        max_frame: the largest frame to build (a `drafts` snapshot is chunked below it).
    """

    def __init__(self, config: DraftConfig, metrics: Metrics, max_frame: int) -> None:
        self.config = config
        self.metrics = metrics
        self.max_frame = max_frame
        self.drafts: dict[str, _Draft[C]] = {}
        self._subs: dict[C, _Subscriber] = {}
        # For other hubs (config.relay): drafts opened, parts grown (from which offset) and
        # drafts ended since the last `take_relay`.
        self._opened: set[str] = set()
        self._grown: dict[tuple[str, str], int] = {}
        self._ended: dict[str, BusEnd] = {}

    # ------------------------------------------------------------------ reads

    def __contains__(self, draft_id: object) -> bool:
        return draft_id in self.drafts

    def owner_of(self, draft_id: str) -> Owner | None:
        draft = self.drafts.get(draft_id)
        return None if draft is None else draft.owner

    def owners(self) -> set[Owner]:
        """Every (principal, client) with an open draft."""
        return {draft.owner for draft in self.drafts.values()}

    def text(self, draft_id: str, part: str = "text") -> str:
        """A part's text so far ('' when the draft or part is not there)."""
        draft = self.drafts.get(draft_id)
        return "" if draft is None else draft.text(part)

    def next_deadline(self) -> int | None:
        """When `tick` next has something to do (ms), or None."""
        if not self.drafts:
            return None  # deltas are owed only for open drafts (`end` drops the rest)
        interval = self.config.interval
        times = [sub.last_flush + interval for sub in self._subs.values() if sub.pending]
        for draft in self.drafts.values():
            if draft.hub is not None:
                continue  # its own hub times it out; heartbeats end it when that hub dies
            times.append(draft.heard + self.config.timeout)
            if draft.gone is not None:
                times.append(draft.gone + self.config.grace)
        return min(times, default=None)

    # ------------------------------------------------------------------ subscribers

    def subscribe(self, conn: C) -> Iterator[bytes]:
        """`conn` gets deltas from now on; returns the `drafts` frames with every open draft
        and its text as of now (several when large, all but the last with `more`), encoded
        one at a time as they are read: a shell that reads the next only once the last was
        sent holds one frame of the snapshot at a time, not all of them (issue 27: 64
        drafts at their caps built at once took a hub 50 MiB over its bar)."""
        self._subs[conn] = _Subscriber()
        # The drafts as they are now (their texts are the board's own strings, shared, not
        # copied): later appends reach `conn` as deltas after the snapshot's last frame.
        infos = collections.deque(draft.info() for draft in self.drafts.values())
        return _snapshot_frames(infos, min(self.max_frame, FRAME_FILL) - _FRAME_MARGIN)

    def unsubscribe(self, conn: C, now: int) -> None:
        """`conn` is gone: it gets nothing more; drafts it produced wait `grace` for it."""
        self._subs.pop(conn, None)
        for draft in self.drafts.values():
            if draft.conn == conn:
                draft.conn = None
                draft.gone = now

    # ------------------------------------------------------------------ ops

    def receive(self, conn: C, owner: Owner, op: DraftOp, now: int) -> list[Out[C]]:
        """Handle `op` from `conn` (owned by `owner`); the frames to send."""
        if op.op == "open":
            return self._open(conn, owner, op, now)
        draft = self.drafts.get(op.id)
        if draft is None:
            return self._answer(conn, op.id, "unknown", "no open draft with this id")
        if draft.owner != owner:
            return self._answer(conn, op.id, "refused", "the draft belongs to another client")
        if draft.hub is not None:  # held by another hub: `open` here first takes it over
            return self._answer(conn, op.id, "unknown", "the draft is held by another hub")
        draft.heard = now
        if draft.conn is None:  # the producer is back on a new socket
            draft.conn, draft.gone = conn, None
        match op.op:
            case "append":
                if draft.stopping:
                    return self._answer(conn, op.id, "stopping", "the turn was asked to stop")
                return self._append(conn, draft, op, now)
            case "abort":
                return self.end(op.id, "aborted")
        return []  # keep

    def _open(self, conn: C, owner: Owner, op: DraftOp, now: int) -> list[Out[C]]:
        draft = self.drafts.get(op.id)
        if draft is not None:
            if draft.owner != owner:
                return self._answer(conn, op.id, "refused", "the draft belongs to another client")
            if op.epoch < draft.epoch and draft.conn is not None and draft.conn != conn:
                return self._answer(conn, op.id, "refused", "a newer epoch holds the draft")
            draft.epoch = max(draft.epoch, op.epoch)
            if draft.hub is not None:
                # The producer came here from another hub: this hub holds the draft from now
                # on, and tells the others (they mirror it from this hub instead).
                draft.hub = None
                self._relay_opened(draft.id)
            draft.conn, draft.gone, draft.heard = conn, None, now
            return [Frame([conn], encode_message(DraftState(op.id, dict(draft.lengths))))]
        if not is_message_id(op.id):
            return self._answer(conn, op.id, "refused", "a draft id is a msg_ id")
        if op.after is not None and not is_message_id(op.after):
            return self._answer(conn, op.id, "refused", "a draft's after is a msg_ id")
        if _meta_bytes(op.author, op.after) > self.config.max_bytes:
            detail = f"author and after over {self.config.max_bytes} bytes"
            return self._answer(conn, op.id, "refused", detail)
        if len(self.drafts) >= self.config.max_per_conversation:
            detail = f"at most {self.config.max_per_conversation} open drafts per conversation"
            return self._answer(conn, op.id, "refused", detail)
        held = sum(1 for d in self.drafts.values() if d.owner == owner)
        if held >= self.config.max_per_owner:
            detail = f"at most {self.config.max_per_owner} open drafts per client"
            return self._answer(conn, op.id, "refused", detail)
        draft = _Draft(op, owner, conn, now)
        self.drafts[op.id] = draft
        self.metrics.drafts_open += 1
        self._relay_opened(op.id)
        out: list[Out[C]] = []
        if self._subs:
            update = DraftUpdate(op.id, "open", info=draft.info())
            out.append(Frame(list(self._subs), encode_message(update)))
        out.append(Frame([conn], encode_message(DraftState(op.id, {}))))
        return out

    def _append(self, conn: C, draft: _Draft[C], op: DraftOp, now: int) -> list[Out[C]]:
        part = op.part
        length = draft.lengths.get(part, 0)
        if op.offset > length:
            return self._answer(conn, draft.id, "gap", f"{part} holds {length} code points")
        new = op.text[length - op.offset :]
        if not new:
            return []  # a resend of what the hub holds
        size = _encoded_bytes(new)
        name = None
        if part not in draft.lengths:
            if len(draft.lengths) >= self.config.max_parts:
                return self.end(draft.id, "aborted", f"over {self.config.max_parts} parts")
            if op.name is not None and part.startswith("call:"):
                name = op.name
                size += _encoded_bytes(name)  # kept for the draft's life: counted like text
        if draft.bytes + size > self.config.max_bytes:
            return self.end(draft.id, "aborted", f"over {self.config.max_bytes} bytes")
        if name is not None:
            draft.names[part] = name
        draft.parts.setdefault(part, []).append(new)
        draft.lengths[part] = length + len(new)
        draft.bytes += size
        if self.config.relay:
            self._grown.setdefault((draft.id, part), length)
        return self._relay(draft.id, part, length, new, name, now)

    def _relay(
        self, draft_id: str, part: str, offset: int, text: str, name: str | None, now: int
    ) -> list[Out[C]]:
        """Send the delta at once to subscribers free to take it; merge it for the rest."""
        interval = self.config.interval
        key = (draft_id, part)
        direct: list[C] = []
        for conn, sub in self._subs.items():
            if not sub.pending and now >= sub.last_flush + interval:
                sub.last_flush = now
                direct.append(conn)
                continue
            pending = sub.pending.get(key)
            if pending is None:
                sub.pending[key] = _Pending(offset, [text], name)
            else:
                pending.chunks.append(text)
        if not direct:
            return []
        return [self._delta(direct, key, offset, text, name)]

    def _delta(
        self, to: list[C], key: tuple[str, str], offset: int, text: str, name: str | None
    ) -> Delta[C]:
        message = DraftUpdate(key[0], "append", key[1], offset, text, name)
        frame = encode_message(message)
        self.metrics.draft_deltas_relayed += len(to)
        self.metrics.draft_bytes_relayed += len(frame) * len(to)
        return Delta(to, key, message, frame)

    def _answer(self, conn: C, draft_id: str, status: DraftEndStatus, detail: str) -> list[Out[C]]:
        """Refuse an op to its sender only (the draft, if any, goes on)."""
        return [Frame([conn], encode_message(DraftEnd(draft_id, status, detail)))]

    # ------------------------------------------------------------------ ending

    def end(self, draft_id: str, status: DraftEndStatus, detail: str = "") -> list[Out[C]]:
        """End draft `draft_id` (if open) for everyone; deltas still owed for it are dropped."""
        draft = self.drafts.pop(draft_id, None)
        if draft is None:
            return []
        self.metrics.drafts_open -= 1
        if self.config.relay and draft.hub is None:
            self._opened.discard(draft_id)
            self._ended[draft_id] = BusEnd(draft_id, status, detail)
        for sub in self._subs.values():
            if sub.pending:
                for part in draft.parts:
                    sub.pending.pop((draft_id, part), None)
        to = list(self._subs)
        if draft.conn is not None and draft.conn not in self._subs:
            to.append(draft.conn)  # a producer not subscribed to drafts still learns it
        if not to:
            return []
        return [Frame(to, encode_message(DraftEnd(draft_id, status, detail)))]

    def end_all(self, status: DraftEndStatus) -> list[Out[C]]:
        """End every open draft (a stop landed, the log was rewritten)."""
        out: list[Out[C]] = []
        for draft_id in list(self.drafts):
            out += self.end(draft_id, status)
        return out

    def mark_stopping(self) -> list[Out[C]]:
        """A stop request landed (SPEC 10): every draft produced here stops growing and stays
        shown with its text until its turn ends; each producer is told `stopping` (so its
        model call is cancelled), nobody else (their UIs read the stop from the log)."""
        out: list[Out[C]] = []
        for draft in self.drafts.values():
            if draft.stopping or draft.hub is not None:
                continue  # a draft another hub produces is marked by that hub
            draft.stopping = True
            if draft.conn is not None:
                end = DraftEnd(draft.id, "stopping", "the turn was asked to stop")
                out.append(Frame([draft.conn], encode_message(end)))
        return out

    def end_produced_by(self, conn: C, status: DraftEndStatus) -> list[Out[C]]:
        """End every draft `conn` produces (it lost the right to write)."""
        out: list[Out[C]] = []
        for draft in list(self.drafts.values()):
            if draft.conn == conn and draft.hub is None:
                out += self.end(draft.id, status, "the producer may no longer write")
        return out

    def end_held(self, ids: Iterable[str], is_owner: Callable[[Owner], bool]) -> list[Out[C]]:
        """End `committed` each open draft among `ids` (entry ids a landed record made held)
        whose owner `is_owner` accepts."""
        out: list[Out[C]] = []
        for id_ in ids:
            draft = self.drafts.get(id_)
            if draft is not None and is_owner(draft.owner):
                out += self.end(id_, "committed")
        return out

    # ------------------------------------------------------------------ time

    def tick(self, now: int) -> list[Out[C]]:
        """Flush deltas that are due, then end drafts that timed out."""
        out: list[Out[C]] = []
        due_at = now - self.config.interval
        # Subscribers owed the same deltas share frames (they usually are: deltas reach every
        # subscriber at the same moments).
        groups: dict[tuple[tuple[str, str, int, int], ...], list[C]] = {}
        owed: dict[tuple[tuple[str, str, int, int], ...], dict[tuple[str, str], _Pending]] = {}
        for conn, sub in self._subs.items():
            if sub.pending and sub.last_flush <= due_at:
                shape = tuple(
                    (key[0], key[1], p.offset, sum(map(len, p.chunks)))
                    for key, p in sub.pending.items()
                )
                groups.setdefault(shape, []).append(conn)
                owed.setdefault(shape, sub.pending)
                sub.pending = {}
                # On the grid of intervals, not at `now`: a tick that wakes late must not
                # push the next flush later too (a producer throttling its own sends at the
                # same interval would then land just before each flush and wait a whole
                # interval more); a tick more than an interval late starts a new grid.
                sub.last_flush = max(sub.last_flush + self.config.interval, due_at)
        for shape, to in groups.items():
            for key, pending in owed[shape].items():
                text = "".join(pending.chunks)
                out.append(self._delta(to, key, pending.offset, text, pending.name))
        config = self.config
        for draft in list(self.drafts.values()):
            if draft.hub is not None:
                continue
            if draft.heard + config.timeout <= now:
                out += self.end(draft.id, "timeout", "the producer went silent")
            elif draft.gone is not None and draft.gone + config.grace <= now:
                out += self.end(draft.id, "timeout", "the producer disconnected")
        return out

    # ------------------------------------------------------------------ other hubs (SPEC 9)

    def _relay_opened(self, draft_id: str) -> None:
        if self.config.relay:
            self._opened.add(draft_id)
            self._ended.pop(draft_id, None)

    @property
    def relay_pending(self) -> bool:
        """Whether `take_relay` has something for other hubs."""
        return bool(self._opened or self._grown or self._ended)

    def take_relay(self) -> list[BusOp]:
        """What changed in this hub's own drafts since the last call, for other hubs: new
        drafts whole (meta, then each part from 0), the text each part gained, the ends."""
        ops: list[BusOp] = []
        for draft_id in self._opened:
            ops += self.snapshot_ops(draft_id)
        for (draft_id, part), offset in self._grown.items():
            draft = self.drafts.get(draft_id)
            if draft is None or draft_id in self._opened or draft.hub is not None:
                continue
            name = draft.names.get(part) if offset == 0 else None
            ops.append(BusGrow(draft_id, part, offset, draft.text(part)[offset:], name))
        ops += self._ended.values()
        self._opened, self._grown, self._ended = set(), {}, {}
        return ops

    def snapshot_ops(self, draft_id: str) -> list[BusOp]:
        """Draft `draft_id` whole for another hub, when this hub produces it (else [])."""
        draft = self.drafts.get(draft_id)
        if draft is None or draft.hub is not None:
            return []
        ops: list[BusOp] = [draft.meta()]
        for part in draft.parts:
            ops.append(BusGrow(draft_id, part, 0, draft.text(part), draft.names.get(part)))
        return ops

    def own_ids(self) -> list[str]:
        """The drafts this hub produces."""
        return [draft.id for draft in self.drafts.values() if draft.hub is None]

    def foreign_open(self, hub: str, meta: BusDraft, now: int) -> list[Out[C]]:
        """Another hub holds draft `meta.id`: show it here (its parts follow)."""
        draft = self.drafts.get(meta.id)
        if draft is not None:
            if (
                draft.hub is None
                and draft.conn is None
                and draft.owner
                == (
                    meta.principal,
                    meta.client,
                )
            ):
                draft.hub, draft.gone = hub, None  # its producer moved to that hub
            elif draft.hub is not None:
                draft.hub = hub
            return []
        draft = _Draft.foreign(hub, meta, now)
        self.drafts[meta.id] = draft
        self.metrics.drafts_open += 1
        if not self._subs:
            return []
        update = DraftUpdate(meta.id, "open", info=draft.info())
        return [Frame(list(self._subs), encode_message(update))]

    def foreign_grow(self, grow: BusGrow, now: int) -> list[Out[C]]:
        """A draft another hub holds grew (`grow.offset` is where the mirror had it)."""
        draft = self.drafts.get(grow.id)
        if draft is None or draft.hub is None:
            return []
        length = draft.lengths.get(grow.part, 0)
        if grow.offset > length:
            return []  # cannot happen while the board follows its mirror
        new = grow.text[length - grow.offset :]
        if not new:
            return []
        name = None
        if grow.part not in draft.lengths and grow.name is not None:
            name = draft.names[grow.part] = grow.name
            draft.bytes += _encoded_bytes(name)
        draft.parts.setdefault(grow.part, []).append(new)
        draft.lengths[grow.part] = length + len(new)
        draft.bytes += _encoded_bytes(new)
        draft.heard = now
        return self._relay(draft.id, grow.part, length, new, name, now)

    def foreign_end(self, end: BusEnd) -> list[Out[C]]:
        """A draft another hub held ended (or that hub stopped heartbeating)."""
        draft = self.drafts.get(end.id)
        if draft is None or draft.hub is None:
            return []
        return self.end(end.id, end.status, end.detail)
