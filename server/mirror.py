"""Drafts and presence of other hubs, pure: bus messages and the time in, changes out (SPEC 9).

How this works: every hub keeps its own drafts and presence in memory (`DraftBoard`,
`PresenceBoard`) and tells the other hubs what changed over a bus, one `BusMessage` per
conversation per `bus_interval` holding several `BusOp`s: `BusDraft` (a draft exists: who,
what it follows), `BusGrow` (a part grew at a code point offset), `BusEnd`, `BusPresence` (the
sender's whole list of sockets on that conversation) and `BusAsk` (send me draft `id` again,
or everything of a conversation). A `Mirror` holds what the other hubs said, for every
conversation, loaded here or not, so a room that loads mid-draft starts with the text so far.

Deltas apply by offset like a producer's appends: the overlap of a resend changes nothing, and
a delta past the mirror's length (a lost message, a draft this hub never saw open) is a gap:
the mirror asks the producer's hub for the draft again and ignores that draft's deltas until
the answer comes (asking again after `ask_again` ms). Each hub heartbeats somewhere with a TTL;
the shell hands `expire` the hubs alive, and the mirror ends the drafts (`timeout`) and drops
the presence of every other one. Nothing here awaits or reads a clock; times are milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from sync.protocol import DraftEndStatus, DraftHead, PresenceEntry
from sync.text import joined

__all__ = [
    "BusAsk",
    "BusDraft",
    "BusEnd",
    "BusGrow",
    "BusMessage",
    "BusOp",
    "BusPresence",
    "Change",
    "Heard",
    "Mirror",
    "decode_bus",
    "pack",
]


class BusDraft(DraftHead, frozen=True, tag="draft", omit_defaults=True):
    """Draft `id` is open on the sending hub (its parts follow as `BusGrow`s from 0)."""


class BusGrow(msgspec.Struct, frozen=True, tag="grow", omit_defaults=True):
    """`text` goes at code point `offset` of `part` of draft `id`."""

    id: str
    part: str
    offset: int
    text: str
    name: str | None = None


class BusEnd(msgspec.Struct, frozen=True, tag="end", omit_defaults=True):
    """Draft `id` ended."""

    id: str
    status: DraftEndStatus
    detail: str = ""


class BusPresence(msgspec.Struct, frozen=True, tag="presence"):
    """Every socket the sending hub has on the conversation now."""

    entries: list[PresenceEntry]


class BusAsk(msgspec.Struct, frozen=True, tag="ask", omit_defaults=True):
    """Send draft `id` again (None: every draft and the presence of the conversation)."""

    id: str | None = None


BusOp = BusDraft | BusGrow | BusEnd | BusPresence | BusAsk


class BusMessage(msgspec.Struct, frozen=True, omit_defaults=True):
    """What hub `hub` says about `conversation` ('' with a `BusAsk`: every conversation);
    `to` addresses one hub (an ask), None every hub."""

    hub: str
    conversation: str
    ops: list[BusOp]
    to: str | None = None


_encode = msgspec.json.Encoder().encode
_decoder = msgspec.json.Decoder(BusMessage)


def decode_bus(payload: bytes | str) -> BusMessage | None:
    """A bus payload, or None when it is not one of ours (it is then ignored)."""
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError:
        return None


_CHUNK = 1000  # code points per piece of a split delta: at most 6 bytes each once JSON-escaped


def pack(
    hub: str, conversation: str, ops: list[BusOp], limit: int, to: str | None = None
) -> list[bytes]:
    """`ops` as few encoded `BusMessage`s as fit `limit` bytes each (NOTIFY takes < 8000),
    in order; a long delta is split by offset into pieces that fit."""
    pieces: list[BusOp] = []
    for op in ops:
        if isinstance(op, BusGrow) and len(op.text) > _CHUNK:
            for at in range(0, len(op.text), _CHUNK):
                name = op.name if at == 0 else None
                pieces.append(
                    BusGrow(op.id, op.part, op.offset + at, op.text[at : at + _CHUNK], name)
                )
        else:
            pieces.append(op)
    payloads: list[bytes] = []
    batch: list[BusOp] = []
    size = len(_encode(BusMessage(hub, conversation, [], to)))
    used = size
    for op in pieces:
        weight = len(_encode(op)) + 1
        if batch and used + weight > limit:
            payloads.append(_encode(BusMessage(hub, conversation, batch, to)))
            batch, used = [], size
        batch.append(op)
        used += weight
    if batch:
        payloads.append(_encode(BusMessage(hub, conversation, batch, to)))
    return payloads


@dataclass(frozen=True, slots=True)
class Change:
    """What a room of `conversation` must show: `op` from hub `hub`, already applied to the
    mirror (a `BusGrow` carries only text the mirror did not hold, at the mirror's length)."""

    conversation: str
    hub: str
    op: BusDraft | BusGrow | BusEnd | BusPresence


@dataclass(slots=True)
class Heard:
    """The outcome of one bus message: room changes, messages to send, and asks to answer
    (conversation, draft id or None) from the hub's own state."""

    changes: list[Change] = field(default_factory=list)
    send: list[BusMessage] = field(default_factory=list)
    asked: list[tuple[str, str | None]] = field(default_factory=list)


@dataclass(slots=True)
class _Remote:
    hub: str
    meta: BusDraft
    heard: int
    parts: dict[str, list[str]] = field(default_factory=dict)
    lengths: dict[str, int] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)

    def text(self, part: str) -> str:
        return joined(self.parts, part)


class Mirror:
    """The open drafts and the presence of the other hubs, per conversation.

    Args:
        hub: this hub's id (its own messages, echoed by the bus, are ignored).
        ask_again: ms after which an unanswered ask for a draft is repeated.
    """

    def __init__(self, hub: str, ask_again: int = 1000) -> None:
        self.hub = hub
        self.ask_again = ask_again
        self.drafts: dict[str, dict[str, _Remote]] = {}  # conversation -> id -> draft
        self.presence: dict[
            str, dict[str, list[PresenceEntry]]
        ] = {}  # conversation -> hub -> entries
        self._asked: dict[tuple[str, str], int] = {}  # (conversation, id) -> when

    def text(self, conversation: str, draft_id: str, part: str = "text") -> str:
        """A remote draft's part as mirrored ('' when absent)."""
        draft = self.drafts.get(conversation, {}).get(draft_id)
        return "" if draft is None else draft.text(part)

    def hubs(self) -> set[str]:
        """Every other hub something is mirrored from."""
        found = {d.hub for drafts in self.drafts.values() for d in drafts.values()}
        for by_hub in self.presence.values():
            found.update(by_hub)
        return found

    def receive(self, message: BusMessage, now: int) -> Heard:
        """Apply one bus message; see `Heard` for what to do next."""
        heard = Heard()
        if message.hub == self.hub or message.to not in (None, self.hub):
            return heard
        conversation, hub = message.conversation, message.hub
        for op in message.ops:
            match op:
                case BusAsk(draft_id):
                    heard.asked.append((conversation, draft_id))
                case BusDraft():
                    self._opened(conversation, hub, op, now, heard)
                case BusGrow():
                    self._grew(conversation, hub, op, now, heard)
                case BusEnd(draft_id):
                    drafts = self.drafts.get(conversation, {})
                    self._asked.pop((conversation, draft_id), None)
                    if drafts.pop(draft_id, None) is not None:
                        heard.changes.append(Change(conversation, hub, op))
                        if not drafts:
                            del self.drafts[conversation]
                case BusPresence(entries):
                    by_hub = self.presence.setdefault(conversation, {})
                    if entries:
                        by_hub[hub] = entries
                    else:
                        by_hub.pop(hub, None)
                        if not by_hub:
                            del self.presence[conversation]
                    heard.changes.append(Change(conversation, hub, op))
        return heard

    def _opened(self, conversation: str, hub: str, op: BusDraft, now: int, heard: Heard) -> None:
        drafts = self.drafts.setdefault(conversation, {})
        draft = drafts.get(op.id)
        if draft is None:
            drafts[op.id] = _Remote(hub, op, now)
            heard.changes.append(Change(conversation, hub, op))
        else:
            draft.hub, draft.meta, draft.heard = hub, op, now  # maybe taken over elsewhere

    def _grew(self, conversation: str, hub: str, op: BusGrow, now: int, heard: Heard) -> None:
        draft = self.drafts.get(conversation, {}).get(op.id)
        length = 0 if draft is None else draft.lengths.get(op.part, 0)
        if draft is None or op.offset > length:
            # A gap: a lost message, or a draft opened before this hub listened.
            key = (conversation, op.id)
            asked = self._asked.get(key)
            if asked is None or now - asked >= self.ask_again:
                self._asked[key] = now
                heard.send.append(BusMessage(self.hub, conversation, [BusAsk(op.id)], hub))
            return
        self._asked.pop((conversation, op.id), None)
        draft.heard = now
        new = op.text[length - op.offset :]
        if not new:
            return  # a resend of what the mirror holds
        name = None
        if op.part not in draft.lengths and op.name is not None:
            name = draft.names[op.part] = op.name
        draft.parts.setdefault(op.part, []).append(new)
        draft.lengths[op.part] = length + len(new)
        heard.changes.append(Change(conversation, hub, BusGrow(op.id, op.part, length, new, name)))

    def expire(self, alive: set[str]) -> list[Change]:
        """Hubs not in `alive` stopped heartbeating: end their drafts (`timeout`) and drop
        their presence."""
        changes: list[Change] = []
        for conversation, drafts in list(self.drafts.items()):
            for draft_id, draft in list(drafts.items()):
                if draft.hub not in alive:
                    del drafts[draft_id]
                    self._asked.pop((conversation, draft_id), None)
                    end = BusEnd(draft_id, "timeout", "the producer's hub stopped")
                    changes.append(Change(conversation, draft.hub, end))
            if not drafts:
                del self.drafts[conversation]
        for conversation, by_hub in list(self.presence.items()):
            for hub in [hub for hub in by_hub if hub not in alive]:
                del by_hub[hub]
                changes.append(Change(conversation, hub, BusPresence([])))
            if not by_hub:
                del self.presence[conversation]
        return changes

    def silent(self, now: int, after: int) -> list[BusMessage]:
        """Asks for every draft nothing was heard of for `after` ms (its end may have been
        lost on the bus): its hub answers with the draft whole, or with its end."""
        asks: list[BusMessage] = []
        for conversation, drafts in self.drafts.items():
            for draft_id, draft in drafts.items():
                if now - draft.heard >= after:
                    draft.heard = now  # once per `after`
                    asks.append(BusMessage(self.hub, conversation, [BusAsk(draft_id)], draft.hub))
        return asks

    def changes_for(self, conversation: str) -> list[Change]:
        """Everything mirrored for `conversation`, as changes: for a room that just loaded."""
        changes: list[Change] = []
        for draft_id, draft in self.drafts.get(conversation, {}).items():
            changes.append(Change(conversation, draft.hub, draft.meta))
            for part, length in draft.lengths.items():
                grow = BusGrow(draft_id, part, 0, draft.text(part), draft.names.get(part))
                if length:
                    changes.append(Change(conversation, draft.hub, grow))
        for hub, entries in self.presence.get(conversation, {}).items():
            changes.append(Change(conversation, hub, BusPresence(entries)))
        return changes
