"""Rebase: replay pending records, by intent, on a log that moved on.

How this works: a replica's pending records were made, in order, on `base` (the log's state it
last confirmed). The log has since become `onto`. `rebase` rereads the application's value from
`onto` and replays each pending record by what it meant, not where it pointed:

- push: entries the log already holds or retired are dropped (they made it); the rest go in
  with their ids.
- splice: re-targeted by the ids it removed (they must still stand together, in order) or, for
  a pure insertion, after the entry it followed in `base` (or first, if it was first). An edit
  (a splice that puts entries in place of others) is replayed only on the content it was made
  on: each entry it replaces that the log changed since `base` is merged three ways with
  `sync.merge` (the base's, the log's and the pending version); a clash is a conflict
  (`edited`, carrying both versions) and the log's version stays.
- halt: set again only while the model still owes an answer; a clear with nothing to clear is
  dropped.
- aside put: replayed; one that replaces an aside the log changed since `base` is merged the
  same way (a note's text at character level); removal of an aside already gone: dropped
  silently.
- reset: replayed.

A record that cannot be replayed comes back as a `Conflict`; nothing is dropped silently and no
id changes. The hub places a stale push with `place`, by the same rules (SPEC 2.4.6); having
no base, it declines what needs one (pure insertions, edits of entries and asides).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from .approvals import decided_meanwhile
from .changes import AsideChange, ChangeRecord, HaltChange, Push, Reset, Splice
from .conversation import Conversation
from .entries import Aside, Entry
from .errors import ApplyError, UsageError
from .ids import MessageId
from .merge import merge_aside, merge_entry
from .steer import QUEUED_KIND, queued_entry_id

__all__ = ["Conflict", "needs_base", "place", "rebase", "replay_pushes"]


class Conflict(msgspec.Struct, frozen=True):
    """A pending record that could not be replayed on the log, and why.

    For reason `edited` (the record replaced an entry or an aside that the log changed since
    the record's base, and the two edits clash), `theirs` is the log's version, which stays,
    and `ours` the record's version of it, which did not land (`None` when the record put
    nothing in its place one to one); both `None` for every other reason.
    """

    record: ChangeRecord
    reason: str
    detail: str = ""
    theirs: Entry | Aside | None = None
    ours: Entry | Aside | None = None


def needs_base(pending: Sequence[ChangeRecord]) -> bool:
    """Whether `rebase` needs the base `pending` was made on: a pure insertion (a splice
    removing nothing) is placed by its neighbour there, and an edit (a splice that puts
    entries in place of others, or an aside put) is merged with what the log changed since."""
    return any(_based(record.change) for record in pending)


def _based(change: object) -> bool:
    """Whether replaying `change` needs its base."""
    if isinstance(change, Splice):
        return not change.removed or bool(change.entries)
    return isinstance(change, AsideChange) and change.aside is not None


def rebase(
    local: Conversation,
    onto: Conversation,
    pending: Sequence[ChangeRecord],
    base: Conversation | None = None,
) -> list[Conflict]:
    """Make `local` hold `onto` plus `pending` replayed by intent; return the conflicts.

    Args:
        local: the application's value. Its outbox must be empty (the caller took its records
            into `pending`); its unsaved asides stay.
        onto: the log's value now (no outbox). Not changed.
        pending: the records to replay.
        base: the value `pending` was made on, in order; needed only when `needs_base`.
            Not changed.

    Afterwards `local.unsaved()` holds the replayed records, ready to push on `onto`.

    Raises:
        ApplyError: `mismatch` when `local` still has unsaved records.
    """
    walk = base.copy() if base is not None and needs_base(pending) else None
    # An unsaved aside may stand where the log still has a saved one that a pending record
    # removes (a saved aside replaced by an unsaved one): set it aside over the reread.
    shadowing = [
        (id_, aside)
        for id_, aside in local.asides()
        if not aside.saved and (held := onto.aside(id_)) is not None and held.saved
    ]
    for id_, _ in shadowing:
        local.remove_aside(id_)  # unsaved: records nothing
    local.reread(onto)  # reread copies what it takes
    conflicts = _replay(local, pending, walk)
    for id_, aside in shadowing:
        if local.aside(id_) is None:  # its saved twin is gone again: it stands once more
            local._put_aside(id_, aside, aside.author)
    return conflicts


def replay_pushes(local: Conversation, pending: Sequence[ChangeRecord]) -> list[Conflict]:
    """Replay push records `pending` on `local`, which holds the log's value already (what
    `rebase` does after its reread, without the reread); return the conflicts.

    Raises:
        UsageError: `not_pushes` when a record of `pending` is not a push (others may need
            the base they were made on, or the reread's handling of asides: use `rebase`).
    """
    if not all(type(record.change) is Push for record in pending):
        raise UsageError("not_pushes", "replay_pushes replays push records only")
    return _replay(local, pending, None)


def _replay(
    local: Conversation, pending: Sequence[ChangeRecord], walk: Conversation | None
) -> list[Conflict]:
    """Replay each of `pending` by intent on `local`, following `walk` (a copy of the base
    they were made on, when anchors are needed); the conflicts."""
    conflicts: list[Conflict] = []
    for record in pending:
        anchor: MessageId | None = _NO_ANCHOR
        merged: ChangeRecord | Conflict = record
        if walk is not None:
            anchor = _anchor(walk, record)
            merged = _merged(local, walk, record)
            try:
                walk.apply(record)
            except ApplyError as error:  # the caller broke the contract; report, not guess
                conflicts.append(Conflict(record, error.reason, "does not fit the base"))
                continue
        elif _edits(local, record.change):
            # Without the base there is no telling what the log changed under the edit.
            conflicts.append(Conflict(record, "base_unknown", "no base to merge the edit"))
            continue
        if isinstance(merged, Conflict):
            conflicts.append(merged)
            continue
        replayed = _retarget(local, merged, anchor)
        if isinstance(replayed, Conflict):
            conflicts.append(msgspec.structs.replace(replayed, record=record))
        elif replayed is not None:
            try:
                local.replay(replayed)
            except ApplyError as error:
                conflicts.append(Conflict(record, error.reason, error.message))
    return conflicts


_NO_ANCHOR = ""


def _edits(log: Conversation, change: object) -> bool:
    """Whether `change` replaces content of `log` (entries put in place of others, or an
    aside put over one the log holds): what only its base can tell was changed under it."""
    if isinstance(change, Splice):
        return bool(change.removed) and bool(change.entries)
    if isinstance(change, AsideChange) and change.aside is not None:
        held = log.aside(change.id)
        return held is not None and held.saved
    return False


def _replaces(change: object) -> list[str]:
    """The ids of the entries or the aside an edit replaces."""
    if isinstance(change, Splice):
        return list(change.removed)
    assert isinstance(change, AsideChange)
    return [change.id]


def _merged(
    local: Conversation, walk: Conversation, record: ChangeRecord
) -> ChangeRecord | Conflict:
    """`record` (made on `walk`) with each entry or aside it replaces that `local` (the log,
    plus what was replayed before it) changed since `walk` merged three ways; a `Conflict`
    (`edited`) when two edits clash; `record` itself when nothing changed under it."""
    change = record.change
    if isinstance(change, AsideChange):
        if change.aside is None:
            return record
        then, held = walk.aside(change.id), local.aside(change.id)
        if held is None or not held.saved or held == then:
            return record  # removed by the log (put again), or unchanged under it
        if decided_meanwhile(then, held, change.aside):  # SPEC 12: one decision stands
            detail = "the approval was decided meanwhile"
            return Conflict(record, "decided", detail, held, change.aside)
        if then is None:
            # Not in its base, yet the log put one under that id since (another replica put
            # a removed aside again too): two versions with no common one, the same only
            # when equal.
            if held == change.aside:
                return record
            detail = "the aside was put again meanwhile"
            return Conflict(record, "edited", detail, held, change.aside)
        aside = merge_aside(then, held, change.aside)
        if aside is None:
            detail = "the aside was edited meanwhile"
            return Conflict(record, "edited", detail, held, change.aside)
        if aside == change.aside:
            return record
        return msgspec.structs.replace(record, change=AsideChange(change.id, aside))
    if not isinstance(change, Splice) or not change.removed or not change.entries:
        return record  # a pure removal takes out what stands, edited or not
    entries = change.entries
    new: list[Entry] | None = None
    keyed = {entry.id: k for k, entry in enumerate(entries)}
    removed = set(change.removed)
    one_to_one = len(entries) == len(change.removed)
    for offset, id_ in enumerate(change.removed):
        at = local.index_of(id_)
        was = walk.index_of(id_)
        if at is None or was is None:
            return record  # gone from the log: the re-targeting reports it
        now, base = local.entry(at), walk.entry(was)
        assert now is not None and base is not None
        if now == base:
            continue
        k = keyed.get(id_)
        if k is None and one_to_one and entries[offset].id not in removed:
            k = offset  # put in its place with a new id: the same edit
        if k is None:
            return Conflict(
                record, "edited", "an entry it replaces was edited meanwhile", now, None
            )
        mine = entries[k] if new is None else new[k]
        entry = merge_entry(base, now, mine)
        if entry is None:
            return Conflict(record, "edited", "an entry it edits was edited meanwhile", now, mine)
        if entry != mine:
            if new is None:
                new = list(entries)
            new[k] = entry
    if new is None:
        return record
    return msgspec.structs.replace(
        record, change=Splice(change.start, change.stop, change.removed, new)
    )


def place(
    log: Conversation,
    records: Sequence[ChangeRecord],
    edited_after: Callable[[str], bool] | None = None,
) -> tuple[list[ChangeRecord], Callable[[], None]] | Conflict:
    """Replay `records`, made on an earlier revision of `log`, by intent onto `log` as it is
    now, with the rules of `rebase` (the hub's rebase of a stale push, SPEC 2.4.6).

    There is no base: a pure insertion (placed by its neighbour in the base) cannot be placed;
    nor can an edit (entries put in place of others, an aside put over one the log holds)
    that replaces an entry or aside the log changed after the records' base, since such an
    edit must merge with that change and only the base tells how. `edited_after(id)` says
    whether the log replaced that entry or aside after the base; without it every edit
    counts as made on changed content. Each is a conflict (`anchor_unknown`, `edited`), and
    the pusher, told `behind`, merges on its side. All or nothing: on a conflict `log` is
    unchanged.

    Returns:
        The records that landed (entries the log already holds dropped, splices re-targeted,
        moot records left out; possibly none) and a function that undoes them, or the first
        record's `Conflict`.
    """
    landed: list[ChangeRecord] = []
    undos: list[Callable[[], None]] = []

    def undo_all() -> None:
        for undo in reversed(undos):
            undo()

    for record in records:
        if _edits(log, record.change) and (
            edited_after is None or any(edited_after(id_) for id_ in _replaces(record.change))
        ):
            detail = "what it replaces changed since its base"
            replayed: ChangeRecord | Conflict | None = Conflict(record, "edited", detail)
        else:
            replayed = _retarget(log, record, _NO_ANCHOR)
        if replayed is None:
            continue
        if not isinstance(replayed, Conflict):
            try:
                undos.append(log.apply_batch([replayed]))
                landed.append(replayed)
                continue
            except ApplyError as error:
                replayed = Conflict(record, error.reason, error.message)
        undo_all()
        return replayed
    return landed, undo_all


def _anchor(walk: Conversation, record: ChangeRecord) -> MessageId | None:
    """For a pure insertion, the id of the entry it went after in `walk` (None: first)."""
    change = record.change
    if isinstance(change, Splice) and change.start == change.stop:
        return walk.id(change.start - 1) if change.start > 0 else None
    return _NO_ANCHOR


def _retarget(
    local: Conversation, record: ChangeRecord, anchor: MessageId | None
) -> ChangeRecord | Conflict | None:
    """The record to replay on `local` now, a conflict, or None when it is moot."""
    change = record.change
    match change:
        case Push(entries):
            fresh = [e for e in entries if not (local.holds(e.id) or local.is_retired(e.id))]  # type: ignore[arg-type]
            if not fresh:
                return None
            if len(fresh) == len(entries):
                return record
            return msgspec.structs.replace(record, change=Push(fresh))
        case Splice(start, stop, removed, entries):
            if removed:
                at = local.index_of(removed[0])
                if at is None or [local.id(at + k) for k in range(len(removed))] != removed:
                    return Conflict(record, "removed_moved", "the entries it replaced changed")
            elif anchor is None:
                at = 0
            elif anchor == _NO_ANCHOR:
                return Conflict(record, "anchor_unknown", "no base to place the insertion")
            else:
                held = local.index_of(anchor)
                if held is None:
                    return Conflict(record, "anchor_gone", "the entry it followed is gone")
                at = held + 1
            if at == start and (not removed or stop - start == len(removed)):
                return record
            return msgspec.structs.replace(
                record, change=Splice(at, at + len(removed), removed, entries)
            )
        case HaltChange(halt):
            if halt is None:
                return record if local.halted() is not None else None
            if not local.awaits_model():
                return Conflict(record, "answered", "the model no longer owes an answer")
            return record
        case AsideChange(id_, aside):
            if aside is None:
                current = local.aside(id_)
                if current is not None and current.saved:
                    return record
                if local.holds(queued_entry_id(id_)):  # SPEC 10: too late to withdraw
                    return Conflict(record, "landed", "the queued entry has landed")
                return None
            if aside.kind == QUEUED_KIND:
                entry_id = queued_entry_id(id_)
                if local.holds(entry_id) or local.is_retired(entry_id):
                    # Put again (moved, say) after its queue landed: landing it twice.
                    return Conflict(record, "landed", "the queued entry has landed")
            return record
        case Reset():
            return record
    return Conflict(record, "unknown_change", type(change).__name__)
