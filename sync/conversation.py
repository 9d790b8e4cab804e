"""`Conversation`: entries, asides and a halt, edited through change records.

How this works: every edit builds one `Change`, folds it with `_fold` (the very code `apply`
runs for a record read from a log or sent by the hub; it lives in `sync/fold.py`), and keeps
the record in the outbox. So folding a value's outbox onto an empty conversation gives an equal
value (the fold law), and a record that does not fit is refused by `_fold` before anything
moves. This module holds the reads, the edits (which only build records), the turn and aside
helpers, and the outbox/revision/lineage bookkeeping a store and a replica use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import EllipsisType
from typing import Any, overload

import msgspec

from . import pairing
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
from .codec import decode_state_value, encode
from .entries import (
    TURN_KIND,
    Aside,
    Author,
    Entry,
    EntryRef,
    Halt,
    SavedAside,
    TurnOwner,
    TurnRecord,
    is_failed_reply,
    stopped_note,
)
from .errors import ApplyError, UsageError
from .fold import Fold, entry_list
from .ids import AsideId, IdMinter, MessageId, default_minter, is_message_id
from .lineage import Lineage
from .messages import AnyMessage, Message, ToolCall, User

__all__ = ["Conversation", "EntryLike", "Range", "Spliced", "decode_state"]

EntryLike = Entry | Message
Range = slice | range | EllipsisType

_replace = msgspec.structs.replace
_RIG = Author.rig()


class Spliced(msgspec.Struct, frozen=True):
    """What a splice did, each list in order.

    Attributes:
        removed: ids taken out (now retired).
        kept: ids of the range kept in place.
        restored: retired ids put back (`restore` only).
        added: new ids minted for the other entries.
    """

    removed: list[MessageId] = msgspec.field(default_factory=list)
    kept: list[MessageId] = msgspec.field(default_factory=list)
    restored: list[MessageId] = msgspec.field(default_factory=list)
    added: list[MessageId] = msgspec.field(default_factory=list)


class _Entries(Sequence[EntryRef]):
    """The entries as `EntryRef`s, built on access (no copy of the conversation)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: list[Entry]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, at: int) -> EntryRef: ...
    @overload
    def __getitem__(self, at: slice) -> list[EntryRef]: ...
    def __getitem__(self, at: int | slice) -> EntryRef | list[EntryRef]:
        if isinstance(at, slice):
            return [self[i] for i in range(*at.indices(len(self._entries)))]
        if at < 0:
            at += len(self._entries)
        return _ref(at, self._entries[at])

    def __iter__(self) -> Iterator[EntryRef]:
        for at, entry in enumerate(self._entries):
            yield _ref(at, entry)

    def __reversed__(self) -> Iterator[EntryRef]:
        entries = self._entries
        for at in range(len(entries) - 1, -1, -1):
            yield _ref(at, entries[at])


def _ref(at: int, entry: Entry) -> EntryRef:
    assert entry.id is not None
    return EntryRef(at, entry.id, entry.message, entry.author, entry.source_id)


def _as_entry(item: EntryLike) -> Entry:
    if isinstance(item, Entry):
        return item
    if isinstance(item, Message):
        return Entry(item)  # type: ignore[arg-type]
    raise UsageError("not_an_entry", f"expected an Entry or a Message, got {type(item).__name__}")


def _plain(aside: Aside) -> Aside:
    """The aside with its value as plain JSON data, so a value decoded from the wire equals it."""
    value = aside.value
    if value is None or isinstance(value, str | int | float | bool):
        return aside
    return _replace(aside, value=msgspec.to_builtins(value))


class Conversation(Fold):
    """A conversation: entries, asides, a halt, and the outbox of unsaved change records.

    Args:
        clock: milliseconds since the epoch for the ids this value mints (tests pass a fake).
        ids: the id minter; defaults to the process-wide one (or one on `clock`).
        record_limit: the most bytes one record made here may take, encoded (see
            `record_limit`); no limit when omitted.

    Equality compares entries, saved asides and halt; not the outbox, revision, lineage or
    unsaved asides.
    """

    # The entries, id index, retired ids, asides, halt and revision are `Fold`'s slots.
    __slots__ = (
        "_before_edit",
        "_dated",
        "_ids",
        "_limit",
        "_lineage",
        "_listener",
        "_outbox",
        "_reserved",
    )

    def __init__(
        self,
        *,
        clock: Callable[[], int] | None = None,
        ids: IdMinter | None = None,
        record_limit: int | None = None,
    ) -> None:
        super().__init__()
        self._limit: int | None = None
        self.record_limit = record_limit
        self._outbox: list[ChangeRecord] = []
        self._lineage: int = Lineage.EMPTY
        self._ids = ids or (IdMinter(clock) if clock is not None else default_minter)
        self._dated: int | None = None
        self._reserved: MessageId | None = None
        self._listener: Callable[[], None] | None = None
        self._before_edit: Callable[[], object] | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_messages(
        cls, messages: Iterable[EntryLike], *, ids: IdMinter | None = None
    ) -> Conversation:
        """A conversation of `messages`, each its own entry, in one push record (so saving it
        writes them)."""
        conversation = cls(ids=ids)
        conversation.extend(messages)
        return conversation

    @classmethod
    def from_state(cls, state: ConversationState, *, ids: IdMinter | None = None) -> Conversation:
        """A conversation holding `state`, with lineage `DETACHED`, revision 0, no outbox.

        Raises:
            ApplyError: the state is inconsistent (missing, malformed or repeated ids).
        """
        conversation = cls(ids=ids)
        conversation._fold(Reset(state))
        conversation._lineage = Lineage.DETACHED
        return conversation

    def copy(self) -> Conversation:
        """A full copy: entries, asides, halt, outbox, revision and lineage (messages shared)."""
        other = Conversation(ids=self._ids)
        other._entries = entry_list(self._entries)
        other._index = dict(self._index)
        other._fresh_upto = self._fresh_upto
        other._retired = dict(self._retired)
        other._asides = dict(self._asides)
        other._halt = self._halt
        other._outbox = list(self._outbox)
        other._revision = self._revision
        other._lineage = self._lineage
        return other

    def view(self) -> Conversation:
        """A copy with an empty outbox, for edits never saved (a preview, a reset's state).

        The view continues no log: its lineage is `DETACHED`.
        """
        other = self.copy()
        other._outbox = []
        other._lineage = Lineage.DETACHED
        return other

    def request_view(self) -> Conversation:
        """A view without the asides: what a model request's copy needs."""
        other = self.view()
        other._asides = {}
        return other

    # ------------------------------------------------------------------ reads

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Conversation):
            return NotImplemented
        return (
            self._halt == other._halt
            and self._entries == other._entries
            and self._saved_asides() == other._saved_asides()
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"<Conversation entries={len(self._entries)} asides={len(self._asides)} "
            f"halt={self._halt} revision={self._revision} unsaved={len(self._outbox)}>"
        )

    def messages(self) -> list[AnyMessage]:
        """The messages, oldest first: exactly what a model request sends."""
        return [entry.message for entry in self._entries]

    def entries(self) -> Sequence[EntryRef]:
        """The entries, oldest first, as `EntryRef`s (indexable, reversible, sized)."""
        return _Entries(self._entries)

    def entry(self, at: int) -> Entry | None:
        """Entry `at` with its id and author, to splice back changed; `None` out of range."""
        return self._entries[at] if 0 <= at < len(self._entries) else None

    def id(self, at: int) -> MessageId | None:
        """The id of entry `at`."""
        entry = self.entry(at)
        return None if entry is None else entry.id

    def key(self, at: int) -> MessageId | None:
        """Alias of `id(at)`, kept for API parity (SPEC 1.2): an entry's key is its id."""
        return self.id(at)

    def author(self, at: int) -> Author | None:
        """Who wrote entry `at`; `None` for the user's own, the model's, a result or no entry."""
        entry = self.entry(at)
        return None if entry is None else entry.author

    def index_of(self, id_: MessageId) -> int | None:
        """Where entry `id_` is now; `None` once an edit took it out (or before it is made)."""
        return self._position(id_)

    def index_of_key(self, key: MessageId) -> int | None:
        """Alias of `index_of(key)`, kept for API parity (SPEC 1.2): an id is its own key."""
        return self._position(key)

    def start_of(self, id_: MessageId) -> int:
        """Where a span that began at `id_` begins now: its index while held, 0 once retired
        (what stands there now summarises it), the end for an id not made yet."""
        at = self._position(id_)
        if at is not None:
            return at
        return 0 if id_ in self._retired else len(self._entries)

    def is_retired(self, id_: MessageId) -> bool:
        """Whether an edit took entry `id_` out of this conversation."""
        return id_ in self._retired

    def holds(self, id_: MessageId) -> bool:
        """Whether entry `id_` is here now."""
        return id_ in self._index

    def _read_end(self) -> int:
        """The end of what a model reads: trailing failed replies are never read."""
        at = len(self._entries)
        while at > 0 and is_failed_reply(self._entries[at - 1].message):
            at -= 1
        return at

    def turn_start(self) -> MessageId:
        """Where a turn starting now begins: the first of the user messages at the end (before
        any failed replies), else the id the next new entry will take (reserved now)."""
        end = self._read_end()
        at = end
        while at > 0 and isinstance(self._entries[at - 1].message, User):
            at -= 1
        if at < end:
            start = self._entries[at].id
            assert start is not None
            return start
        if self._reserved is None:
            self._reserved = self._ids.message_id()
        return self._reserved

    def asked(self, start: MessageId) -> Iterator[EntryRef]:
        """The user entries in a row from where the turn that began at `start` begins now."""
        at = self.start_of(start)
        entries = self._entries
        while at < len(entries) and isinstance(entries[at].message, User):
            yield _ref(at, entries[at])
            at += 1

    def request(self, start: MessageId) -> EntryRef | None:
        """The first entry the turn that began at `start` answers that is a request."""
        return next((ref for ref in self.asked(start) if ref.is_request()), None)

    def halted(self) -> Halt | None:
        """Why the user's last message is left unanswered, if it was halted."""
        return self._halt

    def awaits_model(self) -> bool:
        """Whether the model owes an answer: the last message it reads is the user's, unhalted."""
        end = self._read_end()
        return end > 0 and isinstance(self._entries[end - 1].message, User) and self._halt is None

    def pending_calls(self) -> list[ToolCall]:
        """The calls of the last assistant message nothing answers yet (`pairing.pending_calls`)."""
        return pairing.pending_calls(self.messages())

    def validate(self) -> None:
        """Raise the first `PairingError` of the messages, if any (`pairing.validate`)."""
        pairing.validate(self.messages())

    def asides(self) -> list[tuple[AsideId, Aside]]:
        """The asides, saved and unsaved, in the order put."""
        return list(self._asides.items())

    def aside(self, id_: AsideId) -> Aside | None:
        """Aside `id_`."""
        return self._asides.get(id_)

    def aside_position(self, aside: Aside) -> int:
        """Where `aside` is drawn: before entry `position`. While the entry it follows is out,
        after what stands for it now (`start_of`)."""
        if aside.after is None:
            return 0
        at = self._position(aside.after)
        return at + 1 if at is not None else self.start_of(aside.after)

    def turns(self) -> list[tuple[AsideId, TurnRecord]]:
        """The turn records, oldest first, with their aside ids (malformed ones skipped)."""
        turns = []
        for id_, aside in self._asides.items():
            if aside.kind == TURN_KIND:
                try:
                    turns.append((id_, msgspec.convert(aside.value, TurnRecord)))
                except msgspec.ValidationError:
                    continue
        return turns

    def unsaved(self) -> list[ChangeRecord]:
        """The records made that nobody saved yet, oldest first."""
        return list(self._outbox)

    @property
    def has_unsaved(self) -> bool:
        """Whether any record made here is unsaved (`unsaved()` without the copy)."""
        return bool(self._outbox)

    @property
    def revision(self) -> int:
        """The records behind this value: the log's count when last loaded or saved, plus each
        record applied or made since."""
        return self._revision

    @property
    def lineage(self) -> int:
        """The saved log this value continues (`Lineage.EMPTY`, `Lineage.DETACHED`, or a log's)."""
        return self._lineage

    def continues(self, lineage: int, changes: int) -> bool:
        """Whether this value's unsaved records, appended to the log `lineage` of `changes`
        records, give this value."""
        unsaved = len(self._outbox)
        if self._lineage == lineage and self._revision - unsaved == changes:
            return True
        return self._lineage == Lineage.EMPTY and self._revision == unsaved and changes == 0

    def state(self) -> ConversationState:
        """The serde form: entries, saved asides, halt and retired ids."""
        return ConversationState(
            list(self._entries), self._saved_asides(), self._halt, list(self._retired)
        )

    def _saved_asides(self) -> list[SavedAside]:
        return [SavedAside.of(id_, aside) for id_, aside in self._asides.items() if aside.saved]

    # ------------------------------------------------------------------ sync

    def replay(self, record: ChangeRecord) -> None:
        """Fold `record` as an edit made here: unlike `apply`, it goes into the outbox. A rebase
        replays pending records this way.

        Raises:
            ApplyError: the record does not fit; nothing changed.
        """
        if self._before_edit is not None:
            hook, self._before_edit = self._before_edit, None
            hook()
        self._fold(record.change)
        self._revision += 1
        self._outbox.append(record)
        if self._listener is not None:
            self._listener()

    @property
    def record_limit(self) -> int | None:
        """The most bytes one record made here may take, encoded as it is sent; `None`: no
        limit (the default).

        An edit whose record is larger raises `UsageError` with reason `too_large` and changes
        nothing. A replica sets this from its `max_frame`, so an edit it could never send fails
        at the call that makes it rather than after. Records folded by `apply` or `replay`
        (from a log, or replayed by a rebase) are not measured. Copies and views have no limit.
        """
        return self._limit

    @record_limit.setter
    def record_limit(self, limit: int | None) -> None:
        if limit is not None and (type(limit) is not int or limit < 1):
            raise UsageError(
                "bad_setting", f"record_limit must be a positive number of bytes, got {limit!r}"
            )
        self._limit = limit

    def on_edit(self, listener: Callable[[], None] | None) -> None:
        """Call `listener` after each record this value makes (not after `apply`): how a
        replica learns there is something to push. `None` removes it."""
        self._listener = listener

    def before_edit(self, hook: Callable[[], object] | None) -> None:
        """Call `hook` once, right before the next record this value makes (or replays) is
        folded, then forget it; `None` removes it. How a replica that keeps no copy of the
        log while nothing is pending (this value then is the log) sets the log's value apart
        before the value moves away from it. One slot, like `on_edit`'s: the replica owns
        both for the value it holds (`Replica.conversation`), so do not set them there."""
        self._before_edit = hook

    def return_unsaved(self, records: Sequence[ChangeRecord]) -> None:
        """Put `records`, taken with `take_unsaved` and not saved after all, back at the front
        of the outbox. The value already holds them, so nothing is folded and the revision
        stays."""
        self._outbox[0:0] = records

    def take_unsaved(self) -> list[ChangeRecord]:
        """Take the unsaved records, to save them; the revision stays."""
        outbox, self._outbox = self._outbox, []
        return outbox

    def continue_log(self, lineage: int, changes: int) -> None:
        """Mark this value as holding the `changes` records of log `lineage`, then its unsaved
        ones: what a store does once it loaded this value from that log or saved it there."""
        self._lineage = lineage
        self._revision = changes + len(self._outbox)

    def reread(self, from_log: Conversation) -> None:
        """Take everything a log holds from `from_log` (entries, saved asides, halt, retired
        ids, lineage, revision); this value's unsaved asides stay.

        Raises:
            ApplyError: `mismatch`, changing nothing, while either value has unsaved records or
                an unsaved aside's id is a saved aside's id in `from_log`.
        """
        if self._outbox or from_log._outbox:
            raise ApplyError("mismatch", "cannot reread while records are unsaved")
        unsaved = {id_: aside for id_, aside in self._asides.items() if not aside.saved}
        if any(id_ in from_log._asides for id_ in unsaved):
            raise ApplyError("mismatch", "an unsaved aside's id is saved in the log")
        self._entries = entry_list(from_log._entries)
        self._index = dict(from_log._index)
        self._fresh_upto = from_log._fresh_upto
        self._retired = dict(from_log._retired)
        self._asides = {id_: a for id_, a in from_log._asides.items() if a.saved} | unsaved
        self._halt = from_log._halt
        self._lineage = from_log._lineage
        self._revision = from_log._revision

    @contextlib.contextmanager
    def dated(self, at: int) -> Iterator[Conversation]:
        """Make the edits inside as made at `at` (ms since the epoch): their records carry that
        time and the entries they make take ids of that time. The innermost `dated` wins."""
        outer, self._dated = self._dated, at
        try:
            yield self
        finally:
            self._dated = outer

    # ------------------------------------------------------------------ edits

    def _mint(self) -> MessageId:
        reserved = self._reserved
        if reserved is not None:
            self._reserved = None
            return reserved
        return self._ids.message_id(self._dated)

    def _fresh_id(self, wanted: MessageId | None, taken: set[MessageId]) -> MessageId:
        """`wanted` when it is well formed and new here, else a minted id."""
        if (
            wanted is not None
            and wanted not in taken
            and wanted not in self._index
            and wanted not in self._retired
            and is_message_id(wanted)
        ):
            if wanted == self._reserved:
                self._reserved = None
            return wanted
        return self._mint()

    def _made(self, change: AnyChange, by: Author | None) -> ChangeRecord:
        """The record of an edit made here now, measured against `record_limit`.

        Raises:
            UsageError: `too_large`, the record is over the limit; nothing changed.
        """
        record = ChangeRecord(change, by, self._dated)
        limit = self._limit
        if limit is not None:
            size = len(encode(record))
            if size > limit:
                raise UsageError(
                    "too_large",
                    f"this edit's record is {size:,} bytes, over the record_limit of "
                    f"{limit:,} bytes (a replica's max_frame less its push header); nothing "
                    "was changed",
                )
        return record

    def _record(self, change: AnyChange, by: Author | None) -> None:
        self.replay(self._made(change, by))

    def _pushed(self, items: Iterable[EntryLike]) -> list[Entry]:
        """The entries a push adds for `items`, after a STOPPED note when the user stopped.
        The note takes a new id, never the one `turn_start` reserved: that is the start of the
        turn, the user's text (queued mid-step, the note is dropped and the text lands under
        its own id, SPEC 10)."""
        entries: list[Entry] = []
        taken: set[MessageId] = set()
        if self._halt is Halt.STOPPED:
            entries.append(_replace(stopped_note(), id=self._ids.message_id(self._dated)))
        for item in items:
            entry = _as_entry(item)
            id_ = self._fresh_id(entry.id, taken)
            taken.add(id_)
            entries.append(entry if id_ == entry.id else _replace(entry, id=id_))
        return entries

    def push(self, entry: EntryLike) -> MessageId:
        """Push `entry` (after a STOPPED note in the same record when the user stopped the last
        request); the halt is cleared. Returns the entry's id: its own when it brings a
        well-formed id new here, else a new one.

        Raises:
            UsageError: `too_large` (see `record_limit`); nothing changed.
        """
        reserved = self._reserved
        entries = self._pushed([entry])
        try:
            self._record(Push(entries), entries[-1].author)
        except UsageError:
            self._reserved = reserved  # the refused push took no id
            raise
        id_ = entries[-1].id
        assert id_ is not None
        return id_

    def extend(self, messages: Iterable[EntryLike]) -> list[MessageId]:
        """Push each of `messages` as its own entry, in one record, as `push` does. Returns
        their ids; nothing is recorded for no messages."""
        items = list(messages)
        if not items:
            return []
        reserved = self._reserved
        entries = self._pushed(items)
        try:
            self._record(Push(entries), entries[-1].author)
        except UsageError:
            self._reserved = reserved  # the refused push took no id
            raise
        return [entry.id for entry in entries[len(entries) - len(items) :]]  # type: ignore[misc]

    def _clamp(self, where: Range) -> tuple[int, int]:
        if where is Ellipsis:
            return 0, len(self._entries)
        if isinstance(where, range):
            where = slice(where.start, where.stop, where.step)
        if not isinstance(where, slice):
            raise UsageError("bad_range", f"expected a slice or a range, got {where!r}")
        if where.step not in (None, 1):
            raise UsageError("bad_range", "ranges take step 1 only")
        start, stop, _ = where.indices(len(self._entries))
        return start, max(start, stop)

    def splice(self, where: Range, entries: Iterable[EntryLike], by: Author | None) -> Spliced:
        """Replace the entries in `where` (clamped; a slice, a range or `...`) with `entries`,
        as made by `by`.

        An entry keeps its id when that id is in the range and no earlier entry of `entries`
        kept it; any other entry gets a new id. A kept entry handed back with its message
        unchanged keeps its author; a changed or new one takes `by` (a new entry that names an
        author keeps it). Nothing merges. A splice reaching the end clears the halt; an empty
        range replaced by nothing records nothing.
        """
        start, stop = self._clamp(where)
        return self._splice(start, stop, entries, by, restore=False, keep_authors=False)

    def restore(self, where: Range, entries: Iterable[EntryLike], by: Author | None) -> Spliced:
        """As `splice`, and an entry whose id an edit took out of this conversation (retired)
        gets it back, with its author and made time: entries put back as they were, such as a
        summary's originals or an edit undone. Asides that followed it follow it again."""
        start, stop = self._clamp(where)
        return self._splice(start, stop, entries, by, restore=True, keep_authors=False)

    def _splice(
        self,
        start: int,
        stop: int,
        items: Iterable[EntryLike],
        by: Author | None,
        *,
        restore: bool,
        keep_authors: bool,
    ) -> Spliced:
        old = self._entries[start:stop]
        in_range = {entry.id: entry for entry in old}
        reserved = self._reserved
        taken: set[MessageId] = set()
        new: list[Entry] = []
        done = Spliced()
        for item in items:
            entry = _as_entry(item)
            id_ = entry.id
            author = entry.author
            if id_ is not None and id_ not in taken and id_ in in_range:
                if not keep_authors and entry.message != in_range[id_].message:
                    author = by
                done.kept.append(id_)
            elif restore and id_ is not None and id_ not in taken and id_ in self._retired:
                done.restored.append(id_)
            else:
                id_ = self._mint()
                author = entry.author if entry.author is not None else by
                done.added.append(id_)
            taken.add(id_)
            if id_ != entry.id or author != entry.author:
                entry = Entry(entry.message, id_, author, entry.source_id)
            new.append(entry)
        if start == stop and not new:
            return done
        removed = [entry.id for entry in old]
        try:
            self._record(Splice(start, stop, removed, new), by)  # type: ignore[arg-type]
        except UsageError:
            self._reserved = reserved  # the refused splice took no id
            raise
        done.removed.extend(id_ for id_ in removed if id_ not in taken)  # type: ignore[misc]
        return done

    def set_entries(self, entries: Iterable[EntryLike], by: Author | None) -> Spliced:
        """Make the conversation hold `entries`, as made by `by`: one `restore` of the range
        between the longest start and end it shares with them, so entries taken from it keep
        their ids and the authors they carry. Nothing is recorded when they are equal."""
        new = [_as_entry(item) for item in entries]
        old = self._entries
        shortest = min(len(old), len(new))
        head = 0
        while head < shortest and old[head] == new[head]:
            head += 1
        tail = 0
        while tail < shortest - head and old[-1 - tail] == new[-1 - tail]:
            tail += 1
        return self._splice(
            head,
            len(old) - tail,
            new[head : len(new) - tail],
            by,
            restore=True,
            keep_authors=True,
        )

    def edit_each(
        self, by: Author | None, edit: Callable[[EntryRef], AnyMessage | None]
    ) -> list[MessageId]:
        """Rewrite entries in place: `edit` sees each entry, oldest first, and returns the
        message to put in its place or `None` to leave it. Rewritten entries keep their ids
        and authors; the whole edit is one splice from the first rewritten entry to the last,
        recorded only when something changed. Returns the ids rewritten."""
        rewritten: dict[int, AnyMessage] = {}
        for ref in self.entries():
            message = edit(ref)
            if message is not None and message != ref.message:
                rewritten[ref.index] = message
        if not rewritten:
            return []
        first, last = min(rewritten), max(rewritten)
        old = self._entries[first : last + 1]
        new = [
            _replace(entry, message=rewritten[first + offset])
            if first + offset in rewritten
            else entry
            for offset, entry in enumerate(old)
        ]
        removed = [entry.id for entry in old]
        self._record(Splice(first, last + 1, removed, new), by)  # type: ignore[arg-type]
        return [self._entries[at].id for at in sorted(rewritten)]  # type: ignore[misc]

    def normalize(self, by: Author | None) -> pairing.Normalized:
        """Repair the entries as `pairing.normalize` does, saved with `set_entries` by `by`.

        An aside that followed an entry merged away or dropped follows the nearest earlier
        entry that stays (the one it merged into, or the one before it); each move is one aside
        record by `by`. Returns the entries held afterwards and the repairs.
        """
        before = list(self._entries)
        result = pairing.normalize(before)
        if not result.repairs:
            return result
        self.set_entries(result.entries, by)
        position = {entry.id: at for at, entry in enumerate(before)}
        for id_, aside in list(self._asides.items()):
            at = position.get(aside.after) if aside.after is not None else None
            if at is None or aside.after in self._index:
                continue
            while at > 0 and before[at - 1].id not in self._index:
                at -= 1
            after = before[at - 1].id if at > 0 else None
            self._put_aside(id_, _replace(aside, after=after), by)
        return pairing.Normalized(list(self._entries), result.repairs)

    def halt(self, halt: Halt | str) -> bool:
        """Leave the user's last message unanswered, for `halt`. Whether it was halted now:
        not when the model owes no answer."""
        halt = Halt(halt)
        if not self.awaits_model():
            return False
        self._record(HaltChange(halt), None)
        return True

    def resume(self) -> bool:
        """Ask the model again for an answer to the user's last message, also a halted one
        (the halt is cleared). Whether the last message a model reads is the user's."""
        if self._halt is not None:
            self._record(HaltChange(None), None)
        end = self._read_end()
        return end > 0 and isinstance(self._entries[end - 1].message, User)

    def reset(self, to: Conversation | ConversationState, by: Author | None = None) -> None:
        """Replace the whole value (entries, saved asides, halt, retired ids) with `to`'s, in
        one record. Unsaved asides here stay.

        Raises:
            UsageError: `too_large`, the whole state is over `record_limit`; nothing changed.
        """
        state = to.state() if isinstance(to, Conversation) else to
        self._record(Reset(state), by)

    def add_aside(self, aside: Aside) -> AsideId:
        """Put `aside` after the asides already put; returns its new id. An unsaved aside is
        not recorded."""
        id_ = self._ids.aside_id(self._dated)
        self._put_aside(id_, aside, aside.author)
        return id_

    def replace_aside(self, id_: AsideId, aside: Aside) -> bool:
        """Replace aside `id_` with `aside`, in its place; whether there was one. Replacing a
        saved aside with an unsaved one records its removal."""
        if id_ not in self._asides:
            return False
        self._put_aside(id_, aside, aside.author)
        return True

    def remove_aside(self, id_: AsideId) -> Aside | None:
        """Remove aside `id_` and return it, or `None` if there was none."""
        aside = self._asides.get(id_)
        if aside is None:
            return None
        if aside.saved:
            self._record(AsideChange(id_, None), aside.author)
        else:
            del self._asides[id_]
        return aside

    def _put_aside(self, id_: AsideId, aside: Aside, by: Author | None) -> None:
        aside = _plain(aside)
        old = self._asides.get(id_)
        if aside.saved:
            record = self._made(AsideChange(id_, aside), by)  # measured before anything moves
            if old is not None and not old.saved:
                # The log never had it: it goes in at the end there, so here too.
                del self._asides[id_]
            self.replay(record)
            return
        if old is not None and old.saved:
            # The log forgets it; this value keeps it, unsaved, in its place.
            order = list(self._asides)
            self._record(AsideChange(id_, None), by)
            self._asides[id_] = aside
            self._asides = {key: self._asides[key] for key in order}
        else:
            self._asides[id_] = aside

    def open_turn(self, owner: TurnOwner | None = None) -> TurnRecord:
        """Record a turn beginning now, numbered after the last record and starting at
        `turn_start()`; drawn before its first entry; run by `owner` (SPEC 10; a replica's
        `open_turn()` names itself). Returns the record."""
        turns = self.turns()
        index = turns[-1][1].index + 1 if turns else 0
        start = self.turn_start()
        at = self.start_of(start)
        after = self._entries[at - 1].id if at > 0 else None
        record = TurnRecord(index, start, None, owner)
        self.add_aside(Aside(TURN_KIND, after, _RIG, record.value()))
        return record

    def end_turn(self, end: Any) -> bool:
        """End the last turn record, when it is open, with `end` (a `TurnEnd`). Whether it
        was open."""
        turns = self.turns()
        if not turns or turns[-1][1].end is not None:
            return False
        id_, record = turns[-1]
        aside = self._asides[id_]
        ended = _replace(record, end=end)
        self._put_aside(id_, _replace(aside, value=ended.value()), aside.author)
        return True


def decode_state(data: bytes | str) -> Conversation:
    """A `Conversation` from its state JSON, with lineage `DETACHED` and revision 0.

    Raises:
        DecodeError: the JSON is malformed or is not a state.
        ApplyError: the state is well-typed but inconsistent (repeated or bad ids).
    """
    return Conversation.from_state(decode_state_value(data))
