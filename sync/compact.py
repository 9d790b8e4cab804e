"""Pins and compaction (SPEC §11, last bullet): context that fits, pins that hold.

Pins: one aside per pinned id (kind `rig.pin`, drawn after the entry, value `{"id": id}`), so
two people pinning at once both keep their pin. The old single `pins` aside (a list of ids) is
still read, and `migrate_pins` turns it into `rig.pin` asides.

`compact` replaces the oldest run of unpinned entries with one summary entry, in one splice:
never a pinned entry, never the open turn or the last `keep` entries, never a call without its
result or a result without its call. The originals go into a `rig.compacted` aside after the
summary, so `uncompact` puts them back exactly (`Conversation.restore` gives them their ids,
authors and made times back).

The hub refuses a compaction that would take a pinned entry out (`compaction_unpins`, reject
reason `pinned`): a pin that lands while a compaction is on its way wins over it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from .changes import AsideChange, ChangeRecord, Splice
from .conversation import Conversation, Spliced
from .entries import PINS_KIND, Aside, Author, Entry
from .errors import UsageError
from .ids import AsideId, MessageId
from .messages import AnyMessage, Assistant, User

__all__ = [
    "COMPACTED_KIND",
    "COMPACT_AUTHOR",
    "PIN_KIND",
    "compact",
    "compaction_unpins",
    "migrate_pins",
    "pin",
    "pinned",
    "uncompact",
    "unpin",
]

PIN_KIND = "rig.pin"
COMPACTED_KIND = "rig.compacted"
COMPACT_AUTHOR = Author.plugin("compact")
"""Who `compact` makes its splice as, unless told otherwise."""


def pinned(conversation: Conversation) -> set[MessageId]:
    """The pinned ids: every `rig.pin` aside's, and those of the latest old `pins` aside."""
    found: set[Any] = set()
    legacy: set[Any] = set()
    for _, aside in conversation.asides():
        if aside.kind == PIN_KIND and isinstance(aside.value, dict):
            found.add(aside.value.get("id"))
        elif aside.kind == PINS_KIND and isinstance(aside.value, list):
            legacy = set(aside.value)
    return {id_ for id_ in found | legacy if isinstance(id_, str)}


def pin(conversation: Conversation, id_: MessageId, by: Author | None = None) -> AsideId | None:
    """Pin entry `id_` (one `rig.pin` aside; None when it is pinned already).

    Raises:
        UsageError: `unknown_id` when the conversation holds no such entry.
    """
    if conversation.index_of(id_) is None:
        raise UsageError("unknown_id", f"no entry {id_} to pin")
    if id_ in pinned(conversation):
        return None
    return conversation.add_aside(Aside(PIN_KIND, id_, by or Author.user(), {"id": id_}))


def unpin(conversation: Conversation, id_: MessageId) -> bool:
    """Unpin `id_`: remove its `rig.pin` asides and take it out of an old `pins` list."""
    changed = False
    for aside_id, aside in conversation.asides():
        if aside.kind == PIN_KIND and isinstance(aside.value, dict):
            if aside.value.get("id") == id_:
                conversation.remove_aside(aside_id)
                changed = True
        elif aside.kind == PINS_KIND and isinstance(aside.value, list) and id_ in aside.value:
            rest = [other for other in aside.value if other != id_]
            conversation.replace_aside(aside_id, msgspec.structs.replace(aside, value=rest))
            changed = True
    return changed


def migrate_pins(conversation: Conversation, by: Author | None = None) -> int:
    """Turn old `pins` asides into one `rig.pin` aside per held id; how many it pinned."""
    ids = pinned(conversation)
    for aside_id, aside in conversation.asides():
        if aside.kind == PINS_KIND:
            conversation.remove_aside(aside_id)
    made = 0
    for id_ in sorted(ids):
        if conversation.index_of(id_) is not None and id_ not in pinned(conversation):
            pin(conversation, id_, by)
            made += 1
    return made


def _pairs(messages: list[AnyMessage]) -> list[tuple[int, int]]:
    """(call index, result index) of every call answered by a later user message."""
    pairs = []
    for at, message in enumerate(messages):
        if not isinstance(message, Assistant):
            continue
        for call in message.tool_calls():
            for later in range(at + 1, len(messages)):
                found = messages[later]
                if isinstance(found, User) and any(
                    r.call_id == call.id for r in found.tool_results()
                ):
                    pairs.append((at, later))
                    break
    return pairs


def _open_turn_start(conversation: Conversation) -> int:
    ends = len(conversation)
    for _, turn in conversation.turns():
        if turn.end is None:
            at = conversation.index_of(turn.start)
            if at is not None:
                ends = min(ends, at)
    return ends


def compact(
    conversation: Conversation,
    *,
    keep: int,
    summary: Entry | AnyMessage,
    by: Author | None = None,
) -> Spliced | None:
    """Replace the oldest run of unpinned entries (before the open turn and the last `keep`)
    with `summary`, in one splice by `by` (default `Author.plugin("compact")`), and keep the
    originals in a `rig.compacted` aside; None when no run of two or more entries can go.

    Raises:
        UsageError: `bad_argument` when `keep` is negative.
    """
    if keep < 0:
        raise UsageError("bad_argument", "keep must be >= 0")
    by = by or COMPACT_AUTHOR
    messages = conversation.messages()
    limit = min(len(messages) - keep, _open_turn_start(conversation))
    held = pinned(conversation)
    ids = [ref.id for ref in conversation.entries()]
    pairs = _pairs(messages)
    start = 0
    while start < limit:
        if ids[start] in held:
            start += 1
            continue
        stop = start
        while stop < limit and ids[stop] not in held:
            stop += 1
        for end in range(stop, start + 1, -1):  # the longest run that splits no pair
            if all((start <= c < end) == (start <= r < end) for c, r in pairs):
                originals = [conversation.entry(at) for at in range(start, end)]
                spliced = conversation.splice(slice(start, end), [summary], by)
                value = {
                    "summary": spliced.added[0] if spliced.added else None,
                    "originals": msgspec.to_builtins(originals),
                }
                after = spliced.added[0] if spliced.added else None
                conversation.add_aside(Aside(COMPACTED_KIND, after, by, value))
                return spliced
        start = stop
    return None


def uncompact(conversation: Conversation, aside_id: AsideId, by: Author | None = None) -> Spliced:
    """Undo a `compact`: put the originals its `rig.compacted` aside holds back in place of
    the summary (their ids, authors and made times restored), and remove the aside.

    Raises:
        UsageError: `unknown_id` when the aside or its summary is not there.
    """
    aside = conversation.aside(aside_id)
    if aside is None or aside.kind != COMPACTED_KIND or not isinstance(aside.value, dict):
        raise UsageError("unknown_id", f"no compaction {aside_id}")
    at = conversation.index_of(aside.value.get("summary"))  # type: ignore[arg-type]
    if at is None:
        raise UsageError("unknown_id", f"the summary of compaction {aside_id} is gone")
    originals = msgspec.convert(aside.value["originals"], list[Entry])
    conversation.remove_aside(aside_id)
    return conversation.restore(slice(at, at + 1), originals, by or aside.author)


def compaction_unpins(conversation: Conversation, records: Sequence[ChangeRecord]) -> list[str]:
    """The pinned ids a compaction among `records` took out of `conversation` (its value once
    `records` folded in), in log order; empty when there is none. The hub refuses such a push
    (`pinned`), so a pin racing a compaction wins.

    A compaction is a splice made by `Author.plugin("compact")` (`compact`'s default), or any
    splice of a push that also puts a `rig.compacted` aside: the aside names it whatever author
    `compact` was given, and the author names it when a large aside went in a push of its own.
    An entry a splice hands back under its id (an edit) is not taken out.
    """
    splices = []
    for record in records:  # a loop, not a comprehension (a call): the hub asks every push
        if type(record.change) is Splice:
            splices.append(record)
    if not splices:
        return []
    compacting = any(
        type(record.change) is AsideChange
        and record.change.aside is not None
        and record.change.aside.kind == COMPACTED_KIND
        for record in records
    )
    removed: dict[str, None] = {}
    for record in splices:
        change = record.change
        assert type(change) is Splice
        if compacting or record.by == COMPACT_AUTHOR:
            removed.update(dict.fromkeys(change.removed))
    if not removed:
        return []
    held = pinned(conversation)
    return [id_ for id_ in removed if id_ in held and not conversation.holds(id_)]
