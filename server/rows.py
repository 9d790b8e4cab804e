"""A conversation's summary row (SPEC 17), built from a loaded room: what a dashboard shows.

Pure reads of the room's conversation and core (no I/O, no await): `row_of` is called by
`server/web.py` with the room's lock free, once per change of the room whatever the number of
feeds showing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec

from sync.conversation import Conversation
from sync.entries import TURN_KIND, TurnRecord
from sync.ids import AsideId, is_message_id, made_ms
from sync.messages import (
    Assistant,
    Document,
    Image,
    Json,
    Reasoning,
    System,
    Text,
    ToolCall,
    ToolResult,
    User,
)

if TYPE_CHECKING:
    from .room import Room

__all__ = ["PREVIEW_CHARS", "ROW_LIST", "Row", "live_state", "preview_of", "row_of"]

PREVIEW_CHARS: Final = 160
ROW_LIST: Final = 16  # at most this many statuses and draft producers in a row: rows stay small

Row = dict[str, Any]


def preview_of(message: object) -> tuple[str, str]:
    """`(role, text)` of a message for a list row: its text, or what its parts are."""
    match message:
        case System(content=content):
            return "system", _cut(content)
        case User(content=parts) | Assistant(content=parts):
            role = "user" if isinstance(message, User) else "assistant"
            return role, _cut(" ".join(_part_text(part) for part in parts).strip())
    return "unknown", ""


def _part_text(part: object) -> str:
    match part:
        case Text(text=text):
            return text
        case ToolCall(name=name):
            return f"[call {name}]"
        case ToolResult(name=name, is_error=is_error):
            return f"[{'error from' if is_error else 'result of'} {name}]"
        case Reasoning():
            return ""
        case Image():
            return "[image]"
        case Document(name=name):
            return f"[document {name or ''}]".replace(" ]", "]")
        case Json():
            return "[json]"
    return ""


def _cut(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def row_of(room: Room) -> Row:
    """The summary row of a loaded room (read while its lock is free)."""
    conversation = room.conversation
    last: Row | None = None
    updated: int | None = None
    count = len(conversation)
    if count:
        entry = conversation.entry(count - 1)
        assert entry is not None
        role, text = preview_of(entry.message)
        last = {"id": entry.id, "role": role, "text": text}
        if entry.id is not None and is_message_id(entry.id):
            updated = made_ms(entry.id)
    core = room.core
    clients = sorted({c for conn, c in core.subscribers.items() if conn not in core.watching})
    # Presence statuses as others see them (`drafting` while drafting, or what was set).
    status = {e.client: e.shown for e in core.presence.entries.values() if e.shown is not None}
    producers = sorted({draft.owner[1] for draft in core.drafts.drafts.values()})
    return {
        "id": room.id,
        "lineage": room.lineage,
        "revision": room.revision,
        "updated": updated,
        "entries": count,
        "halt": conversation.halted(),
        "last": last,
        "online": clients,
        "status": dict(sorted(status.items())[:ROW_LIST]),
        "drafts": {"open": len(core.drafts.drafts), "producers": producers[:ROW_LIST]},
        "turn": _turn_of(conversation, core.tally.latest_turn),
        "queued": len(core.tally.queued),
        "approvals": len(core.tally.approvals),
        "usage": core.tally.usage(),
    }


def live_state(room: Room) -> tuple[object, ...]:
    """What of a row lives in memory only (open drafts, shown statuses), to compare before and
    after a room's tick: the hub touches the room only when a tick changed it."""
    core = room.core
    drafts = tuple(draft.owner[1] for draft in core.drafts.drafts.values())
    return drafts, tuple((e.client, e.shown) for e in core.presence.entries.values())


def _turn_of(conversation: Conversation, aside_id: AsideId | None) -> Row | None:
    """Turn record `aside_id` (the latest, from the room's tally) as `{index, state, owner}`:
    `running` until it ends, then how it ended (`answered`, `failed`, `stopped`); `owner` is
    who wrote the record (its author's name, else its kind). The one place a row reads a turn."""
    aside = None if aside_id is None else conversation.aside(aside_id)
    if aside is None or aside.kind != TURN_KIND:
        return None
    try:
        turn = msgspec.convert(aside.value, TurnRecord)
    except msgspec.ValidationError:
        return None
    owner = aside.author.name or aside.author.kind
    state = "running" if turn.end is None else turn.end.__struct_config__.tag
    return {"index": turn.index, "state": state, "owner": owner}
