"""The fold: the part of a conversation a log decides, and the one function that changes it.

How this works: `Fold._fold` checks a change completely, then mutates, and hands back a closure
that undoes it, so a batch of records applies all or nothing (`apply_batch`). The hub, every
replica and every local edit fold records with this same code (`Conversation` builds on it).

The map `_index` holds every held id with its position: a push adds to it (O(1)); a splice
changes the keys at once but leaves the positions after it stale, refreshed in one pass when a
lookup next finds a stale one (`_position`). `_retired` remembers the ids splices took out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

from .changes import (
    AnyChange,
    AsideChange,
    ChangeRecord,
    ConversationState,
    HaltChange,
    Push,
    Reset,
    Splice,
)
from .entries import Aside, Entry, Halt
from .errors import ApplyError
from .ids import AsideId, MessageId, are_message_ids, is_aside_id, is_message_id
from .untrack import untrack_at

__all__ = ["Fold", "Undo", "entry_list"]

Undo = Callable[[], None]
"""Undoes one fold (or a batch); valid only until the next change of the value."""


def entry_list(entries: Iterable[Entry] = ()) -> list[Entry]:
    """A new list of `entries` for a fold to hold, out of the garbage collector's lists.

    A list is a tracked container, and a full collection visits every item of every tracked
    list: with 100,000 entries in `confirmed` and `local` that was most of a 13-17 ms pause
    (`bench/gc.py`). It holds only `Entry` structs, which are `gc=False`, so no cycle can run
    through it and the collector gains nothing by visiting it. CPython never tracks a list
    again once untracked, whatever goes in later, so each list is untracked once, here, and
    changed in place after (`extend`, slice assignment, `del`).
    """
    held = list(entries)
    untrack_at(id(held))
    return held


class Fold:
    """Entries, the id index, retired ids, asides, halt and revision, changed only by folding.

    `Conversation` is a `Fold` with the edit methods, the outbox and the log bookkeeping on
    top; this class holds no public surface of its own beyond `apply` and `apply_batch`.
    """

    __slots__ = ("_asides", "_entries", "_fresh_upto", "_halt", "_index", "_retired", "_revision")

    def __init__(self) -> None:
        self._entries: list[Entry] = entry_list()
        self._index: dict[MessageId, int] = {}
        self._fresh_upto = 0  # positions in `_index` below this are right; above, maybe stale
        self._retired: dict[MessageId, None] = {}
        self._asides: dict[AsideId, Aside] = {}
        self._halt: Halt | None = None
        self._revision = 0

    def apply(self, record: ChangeRecord) -> None:
        """Fold `record` (read from a log or sent by the hub) verbatim: not put in the outbox;
        counts one revision.

        Raises:
            ApplyError: the record does not fit; nothing changed.
        """
        change = record.change
        if type(change) is Push:  # the common case: no undo to build, no `match`
            self._add(change.entries)
        else:
            self._fold(change)
        self._revision += 1

    def apply_batch(self, records: Sequence[ChangeRecord]) -> Undo:
        """Apply `records` in order, all or nothing: when one does not fit, those before it
        are undone and its `ApplyError` raised. Counts one revision per record.

        Returns:
            A function that undoes the whole batch, revision included; valid only until the
            next change of this value (the hub uses it when a durable append fails).
        """
        undos: list[Undo] = []
        try:
            for record in records:
                undos.append(self._fold(record.change))
        except ApplyError:
            for undo in reversed(undos):
                undo()
            raise
        self._revision += len(undos)

        def undo_all() -> None:
            for undo in reversed(undos):
                undo()
            self._revision -= len(undos)

        return undo_all

    def take_back_pushes(self, records: Sequence[ChangeRecord]) -> bool:
        """Undo `records` when they are pushes whose entries are still the last entries held,
        in order (pushes folded last, nothing after them): the entries and their ids go, the
        revision drops by one per record. Returns whether it did; when not, nothing changed.

        O(entries pushed), where a reread of the value before them is O(conversation). The
        halt a push cleared is not restored: fold a push after this, or a halt change.
        """
        ids: list[MessageId | None] = []
        for record in records:
            change = record.change
            if type(change) is not Push:
                return False
            ids.extend(entry.id for entry in change.entries)
        held = self._entries
        start = len(held) - len(ids)
        if start < 0 or any(entry.id != id_ for entry, id_ in zip(held[start:], ids, strict=True)):
            return False
        index = self._index
        for id_ in ids:
            del index[id_]  # type: ignore[arg-type]
        del held[start:]
        self._fresh_upto = min(self._fresh_upto, start)
        self._revision -= len(records)
        return True

    # ------------------------------------------------------------------ the fold

    def _fold(self, change: AnyChange) -> Undo:
        """Check `change` completely, then apply it; return what undoes it (valid until the
        next change). Raises `ApplyError` changing nothing."""
        if type(change) is Push:  # the common case, before the `match`
            return self._fold_push(change.entries)
        match change:
            case Splice(start, stop, removed, entries):
                return self._fold_splice(start, stop, removed, entries)
            case HaltChange(halt):
                old = self._halt
                self._halt = halt
                return lambda: setattr(self, "_halt", old)
            case AsideChange(id_, aside):
                return self._fold_aside(id_, aside)
            case Reset(state):
                return self._fold_reset(state)
        raise ApplyError("unknown_change", f"unknown change {type(change).__name__}")

    def _check_new(
        self, entries: Sequence[Entry], removed: Collection[MessageId], *, allow_retired: bool
    ) -> None:
        """Entries going in must bring well-formed ids, none repeated, none held except those
        the change removes; only a splice may bring back a retired id."""
        ids = [entry.id for entry in entries]
        if not are_message_ids(ids):
            bad = next(id_ for id_ in ids if not is_message_id(id_))
            raise ApplyError("bad_id", f"entry id {bad!r} is not a message id")
        if len(set(ids)) != len(ids):
            raise ApplyError("repeated", f"entry id {_repeated(ids)} appears twice")
        index = self._index
        retired = self._retired
        for id_ in ids:
            if id_ in index and id_ not in removed:
                raise ApplyError("held", f"entry id {id_} is already held")
            if not allow_retired and id_ in retired:
                raise ApplyError("retired", f"entry id {id_} was taken out and cannot be pushed")

    def _fold_push(self, entries: list[Entry]) -> Undo:
        index = self._index
        held = self._entries
        length = len(held)
        halt = self._halt
        self._add(entries)

        def undo() -> None:
            for entry in held[length:]:
                del index[entry.id]  # type: ignore[arg-type]
            del held[length:]
            self._fresh_upto = min(self._fresh_upto, length)
            self._halt = halt

        return undo

    def _add(self, entries: list[Entry]) -> None:
        """Check `entries` as a push's, then append them (the halt is cleared)."""
        if len(entries) == 1:  # the common case, checked inline
            id_ = entries[0].id
            if not is_message_id(id_):
                raise ApplyError("bad_id", f"entry id {id_!r} is not a message id")
            if id_ in self._index:
                raise ApplyError("held", f"entry id {id_} is already held")
            if id_ in self._retired:
                raise ApplyError("retired", f"entry id {id_} was taken out and cannot be pushed")
        else:
            self._check_new(entries, (), allow_retired=False)
        index = self._index
        held = self._entries
        length = len(held)
        if len(entries) == 1:
            index[entries[0].id] = length  # type: ignore[index]
        else:
            ids = [entry.id for entry in entries]
            index.update(zip(ids, range(length, length + len(ids)), strict=True))  # type: ignore[arg-type]
        held.extend(entries)
        if self._fresh_upto == length:
            self._fresh_upto = len(held)
        self._halt = None

    def _fold_splice(
        self, start: int, stop: int, removed: list[MessageId], entries: list[Entry]
    ) -> Undo:
        held = self._entries
        if not 0 <= start <= stop <= len(held):
            raise ApplyError(
                "range", f"range {start}:{stop} is outside a conversation of {len(held)}"
            )
        old = held[start:stop]
        if removed != [entry.id for entry in old]:
            raise ApplyError("removed", f"the ids at {start}:{stop} are not the ones removed")
        self._check_new(entries, set(removed), allow_retired=True)
        put = {entry.id for entry in entries}
        retired_now = [id_ for id_ in removed if id_ not in put]
        unretired = [id_ for id_ in put if id_ in self._retired]
        halt = self._halt
        reaches_end = stop == len(held)
        self._replace_run(start, stop, old, entries)
        for id_ in retired_now:
            self._retired[id_] = None
        for id_ in unretired:
            del self._retired[id_]
        if reaches_end:
            self._halt = None

        def undo() -> None:
            self._replace_run(start, start + len(entries), entries, old)
            for id_ in retired_now:
                del self._retired[id_]
            for id_ in unretired:
                self._retired[id_] = None
            self._halt = halt

        return undo

    def _replace_run(self, start: int, stop: int, old: list[Entry], new: list[Entry]) -> None:
        """Put `new` in place of `old` (the entries at `start:stop`); the index keys follow at
        once, the positions after `start` are refreshed when next asked for."""
        index = self._index
        for entry in old:
            del index[entry.id]  # type: ignore[arg-type]
        for offset, entry in enumerate(new):
            index[entry.id] = start + offset  # type: ignore[index]
        self._entries[start:stop] = new
        if len(new) != len(old):
            self._fresh_upto = min(self._fresh_upto, start + len(new))

    def _position(self, id_: MessageId) -> int | None:
        """Where entry `id_` is, refreshing positions a splice left stale (O(1) amortised)."""
        at = self._index.get(id_)
        if at is None:
            return None
        held = self._entries
        if at < len(held) and held[at].id == id_:
            return at
        index = self._index
        for at in range(self._fresh_upto, len(held)):
            index[held[at].id] = at  # type: ignore[index]
        self._fresh_upto = len(held)
        return index[id_]

    def _fold_aside(self, id_: AsideId, aside: Aside | None) -> Undo:
        if not is_aside_id(id_):
            raise ApplyError("bad_id", f"aside id {id_!r} is not an aside id")
        asides = self._asides
        old = asides.get(id_)
        if aside is None:
            if old is None or not old.saved:
                raise ApplyError("no_aside", f"aside {id_} is not here to remove")
            order = list(asides)
            del asides[id_]

            def put_back() -> None:
                asides[id_] = old
                ordered = {key: asides[key] for key in order if key in asides}
                asides.clear()
                asides.update(ordered)

            return put_back
        if not aside.saved:
            raise ApplyError("unsaved", f"aside {id_} is unsaved and cannot be recorded")
        asides[id_] = aside

        def undo() -> None:
            if old is None:
                del asides[id_]
            else:
                asides[id_] = old

        return undo

    def _fold_reset(self, state: ConversationState) -> Undo:
        ids = [entry.id for entry in state.entries]
        if not are_message_ids(ids):
            bad = next(id_ for id_ in ids if not is_message_id(id_))
            raise ApplyError("bad_id", f"entry id {bad!r} is not a message id")
        index: dict[MessageId, int] = dict(zip(ids, range(len(ids)), strict=True))  # type: ignore[arg-type]
        if len(index) != len(ids):
            raise ApplyError("repeated", f"entry id {_repeated(ids)} appears twice")
        retired = dict.fromkeys(state.retired)
        if any(id_ in index for id_ in retired):
            raise ApplyError("retired", "a held entry id is also listed as retired")
        asides: dict[AsideId, Aside] = {}
        for saved in state.asides:
            if not is_aside_id(saved.id) or saved.id in asides or not saved.saved:
                raise ApplyError("bad_id", f"aside {saved.id!r} is malformed, repeated or unsaved")
            asides[saved.id] = saved.aside
        for id_, aside in self._asides.items():
            if not aside.saved and id_ not in asides:
                asides[id_] = aside
        before = (self._entries, self._index, self._retired, self._asides, self._halt)
        self._entries = entry_list(state.entries)
        self._index = index
        self._fresh_upto = len(self._entries)
        self._retired = retired
        self._asides = asides
        self._halt = state.halt

        def undo() -> None:
            self._entries, self._index, self._retired, self._asides, self._halt = before
            self._fresh_upto = 0

        return undo


def _repeated(ids: Sequence[MessageId | None]) -> MessageId | None:
    """The first id that appears twice."""
    seen: set[MessageId | None] = set()
    for id_ in ids:
        if id_ in seen:
            return id_
        seen.add(id_)
    return None
