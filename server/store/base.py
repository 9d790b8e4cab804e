"""The `LogStore` interface every storage backend of the hub implements, and its value types.

A store keeps, per conversation, an append-only log of encoded change records (the bytes the
codec produced; the store never decodes them), the log's lineage and revision (its record
count), at most one snapshot (an encoded state at some revision of the current lineage) and,
per client, the last push it accepted (`ClientMark`).

Several hubs may share one store, so nothing here trusts a hub's idea of the log: every write
that depends on the log's position names the lineage and revision it expects and fails with
`LogMoved`, changing nothing, when the log is elsewhere (compare-and-append). A hub that gets
`LogMoved` reloads or reads the records it missed; it never overwrites.

The pure checks both backends run (`check_*`) live here, so the in-memory and the durable
store enforce the same rules by the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Protocol, Self

import msgspec

from sync.errors import ConvsyncError, UsageError

__all__ = [
    "MAX_LINEAGE",
    "NO_LINEAGE",
    "TOMBSTONE",
    "ClientMark",
    "Closable",
    "Counted",
    "Deleted",
    "Lease",
    "LeaseChange",
    "Loaded",
    "LogMoved",
    "LogStore",
    "SeqTaken",
    "StoreError",
    "StoreLocked",
    "check_append_args",
    "check_base",
    "check_delete_args",
    "check_list_args",
    "check_live",
    "check_mark",
    "check_new_lineage",
    "check_read_args",
    "check_records",
    "check_rewrite",
    "check_rewrite_args",
    "check_snapshot_revision",
    "closed_error",
    "held_tail",
    "loaded",
    "merge_lease",
    "prefix_range",
    "readable",
]

NO_LINEAGE = 0
"""The lineage `LogMoved` reports for a conversation that has no log (equals `Lineage.EMPTY`)."""

MAX_LINEAGE = 2**53 - 1
"""Lineages must stay below this (`Lineage.DETACHED`) so they survive JSON in a browser."""

TOMBSTONE = MAX_LINEAGE
"""The lineage of a deleted conversation's head row (SPEC 15): no log can have it (`append`
and `rewrite` refuse it), so every compare-and-set on the id fails against the tombstone,
which then raises `Deleted`. Its revision column holds the time of the delete (epoch
seconds) instead of a record count."""


class ClientMark(msgspec.Struct, frozen=True):
    """The last push a store accepted from one client of one conversation, and its ack.

    Attributes:
        seq: the push's batch sequence number (strictly increasing per client).
        ack_from: the first revision of the ack that push got.
        ack_revision: the log's revision right after that push was appended.
    """

    seq: int
    ack_from: int
    ack_revision: int


class Loaded(msgspec.Struct, frozen=True):
    """What `LogStore.load` hands back: everything needed to rebuild a conversation.

    Fold `records` onto `snapshot` (or onto an empty conversation when it is None) to get the
    state at `revision`.

    Attributes:
        lineage: the log's lineage.
        revision: the log's revision (how many records it has).
        snapshot: the latest snapshot of this lineage, or None when there is none.
        snapshot_revision: the revision the snapshot was taken at (0 without a snapshot).
        records: the encoded records after the snapshot, revisions
            `snapshot_revision + 1 .. revision`, in order.
        clients: each client's last accepted push, by client id.
    """

    lineage: int
    revision: int
    snapshot: bytes | None
    snapshot_revision: int
    records: list[bytes]
    clients: dict[str, ClientMark]


class Lease(msgspec.Struct, frozen=True):
    """An open turn's lease (SPEC 10), kept beside the log, never in it: a hint that tells
    any hub when to look at a turn; the log says whether the turn is still open.

    Attributes:
        conversation_id: the conversation the turn is in.
        turn: the turn record's index.
        owner: the owner's mark key (as `ClientMark`s are keyed: the client id without auth,
            `sub/client` with it).
        expires: when the turn lapses unless the owner's hub renews it (ms since the epoch);
            None while the turn is parked (it waits only for a person).
        stop_expires: when a stop request lapses unless the turn finished (ms); None while
            no stop stands. Never moved later once set.
    """

    conversation_id: str
    turn: int
    owner: str
    expires: int | None
    stop_expires: int | None = None

    def due(self, now: int) -> bool:
        """Whether a hub should look at the turn at `now` (ms)."""
        return (self.expires is not None and self.expires <= now) or (
            self.stop_expires is not None and self.stop_expires <= now
        )


class LeaseChange(msgspec.Struct, frozen=True):
    """The lease writes an append carries in its own transaction (SPEC 10): the records that
    open, renew or end a turn and its lease commit together or not at all, so a crash between
    the two never leaves an open turn without a lease, or a lease for a turn that ended.

    Attributes:
        put: a lease to keep, put as `put_lease(put)` would (replacing the stored one, with
            the sooner stop deadline); None: none.
        drop: the index of a turn whose lease to forget, as `drop_lease` would (done before
            `put`); None: none.
    """

    put: Lease | None = None
    drop: int | None = None


def merge_lease(stored: Lease | None, lease: Lease, replace: bool) -> Lease:
    """The lease a store keeps when `lease` is put over `stored` (SPEC 10): `lease` when none
    is stored; the stored one when not `replace` (a hub that loads a room repairs a missing
    lease, never extends one); else `lease` with the sooner of the two stop deadlines (a stop's
    deadline never moves later, whichever hub renews the turn)."""
    if stored is None:
        return lease
    if not replace:
        return stored
    stops = [t for t in (stored.stop_expires, lease.stop_expires) if t is not None]
    return msgspec.structs.replace(lease, stop_expires=min(stops) if stops else None)


class LogMoved(ConvsyncError):
    """The log is not at the lineage and revision the caller expected; nothing was written.

    Attributes:
        conversation_id: the conversation concerned.
        lineage: the log's actual lineage (`NO_LINEAGE` when there is no log).
        revision: the log's actual revision (0 when there is no log).
    """

    def __init__(self, conversation_id: str, lineage: int, revision: int) -> None:
        super().__init__(
            "moved", f"{conversation_id!r} is at lineage {lineage} revision {revision}"
        )
        self.conversation_id = conversation_id
        self.lineage = lineage
        self.revision = revision


class SeqTaken(ConvsyncError):
    """The client's push seq is at or below one the store already accepted; nothing was written.

    Another hub (or this one before a restart) appended that push already. Answer the push with
    the ack in `mark` instead of appending it again.

    Attributes:
        conversation_id: the conversation concerned.
        client: the client whose seq it is.
        mark: the client's stored mark (its last accepted seq and ack).
    """

    def __init__(self, conversation_id: str, client: str, mark: ClientMark) -> None:
        super().__init__(
            "seq_taken",
            f"{client!r} already has push {mark.seq} accepted in {conversation_id!r}",
        )
        self.conversation_id = conversation_id
        self.client = client
        self.mark = mark


class Deleted(ConvsyncError):
    """The conversation was deleted (SPEC 15): its tombstone refuses every read and write of
    its log, so no hub mistakes it for a rewritten log and no replica brings it back. The hub
    answers `deleted` (close 4410, never retried).

    Attributes:
        conversation_id: the conversation concerned.
        deleted_at: when it was deleted (seconds since the epoch).
    """

    def __init__(self, conversation_id: str, deleted_at: float) -> None:
        super().__init__("deleted", f"conversation {conversation_id!r} was deleted")
        self.conversation_id = conversation_id
        self.deleted_at = deleted_at


class StoreError(ConvsyncError):
    """The storage backend failed (disk, lock timeout, corrupt file); the cause is chained.

    The write was most likely not made, but a disk error during the commit can leave that
    uncertain: reload the conversation before trusting an in-memory copy of its log.

    `reason` is `storage` by default; `unavailable` when a database server cannot be reached
    (retry later), `schema` when the stored schema is one this code cannot use.
    """

    def __init__(self, message: str, reason: str = "storage") -> None:
        super().__init__(reason, message)


class StoreLocked(StoreError):
    """Another process holds the store's file, so this one refused to open it (reason `locked`).

    A backend that cannot tell other hubs that a log moved (SQLite) lets one hub at a time use
    it; a second one would keep serving rooms that no longer match the log.

    Attributes:
        path: the database file.
        holder: who holds it, as `pid@host` (empty when the holder has not written it yet).
    """

    def __init__(self, path: str, holder: str) -> None:
        who = holder or "another process"
        ConvsyncError.__init__(
            self,
            "locked",
            f"{path!r} is in use by {who}: one hub per SQLite file "
            "(stop that hub first, or give this one another --db)",
        )
        self.path = path
        self.holder = holder


def closed_error() -> UsageError:
    """What every call on a closed store raises."""
    return UsageError("closed", "the store is closed")


class Closable:
    """What every store shares: after `close`, each call raises `UsageError` (`closed`)."""

    _closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise closed_error()


class Counted(Closable):
    """A store that counts its own commits and appends (`LogStore.commits`, `.appends`)."""

    _commits = 0
    _appends = 0

    @property
    def commits(self) -> int:
        """How many write transactions the store has committed."""
        return self._commits

    @property
    def appends(self) -> int:
        """How many `append` calls the store has run to an outcome."""
        return self._appends


class LogStore(Protocol):
    """Durable logs of change records, shared safely by any number of hubs.

    Every method is a coroutine that never blocks the event loop. A store is an async context
    manager: `async with store:` closes it on the way out. After `close`, every method raises
    `UsageError` (reason `closed`).

    `appends` counts append calls that were committed or rejected, `commits` the transactions
    that carried them; `appends / commits` is the group-commit factor.
    """

    @property
    def commits(self) -> int:
        """How many write transactions the store has committed."""
        ...

    @property
    def appends(self) -> int:
        """How many `append` calls the store has run to an outcome."""
        ...

    async def load(self, conversation_id: str) -> Loaded | None:
        """Read a conversation's log: lineage, revision, latest snapshot, the tail after it.

        Returns:
            The conversation, or None when it has no log. Reading costs time proportional to
            the records after the latest snapshot, not to the whole log.
        """
        ...

    async def append(
        self,
        conversation_id: str,
        lineage: int,
        revision: int,
        records: Sequence[bytes],
        client: str | None = None,
        mark: ClientMark | None = None,
        *,
        lease: LeaseChange | None = None,
    ) -> int:
        """Append records to the log only if it is at exactly `lineage` and `revision`.

        A conversation without a log counts as being at revision 0 of any lineage: appending at
        revision 0 creates it with the lineage given. `client` and `mark` go together: the
        client's new mark is stored in the same transaction as the records, so either both are
        durable or neither is. So is `lease` (SPEC 10): the lease writes of records that open,
        renew, park or end a turn, done as `drop_lease` and then `put_lease` would, in the same
        transaction (a refused or failed append writes no lease). When this returns, the
        records are durable (an ack may be sent).

        Returns:
            The log's new revision (`revision + len(records)`).

        Raises:
            SeqTaken: `mark.seq` is at or below the client's stored seq; nothing was written.
                Checked first: a push that already landed is answered with its stored ack.
            LogMoved: the log is at another lineage or revision; nothing was written.
            UsageError: bad arguments (one of `client`/`mark` without the other, a negative
                revision, a record that is not bytes, a lineage not strictly between
                `NO_LINEAGE` and `MAX_LINEAGE`).
            StoreError: the backend failed.
        """
        ...

    async def read(
        self, conversation_id: str, lineage: int, from_revision: int, limit: int | None = None
    ) -> list[bytes] | None:
        """Read the records after `from_revision` (revisions `from_revision + 1 ..`), in order.

        Args:
            limit: at most this many records (all of them when None).

        Returns:
            The records (empty when `from_revision` is the log's revision), or None when the
            conversation has no log, its lineage is not `lineage`, `from_revision` is past the
            log's revision, or the store no longer holds the first record asked for. None
            means: send the reader a whole state instead.
        """
        ...

    async def write_snapshot(
        self, conversation_id: str, lineage: int, revision: int, state: bytes
    ) -> None:
        """Keep `state` as the conversation's snapshot at `revision` of `lineage`.

        Only the latest snapshot is kept. Ignored (no error) when the log is no longer at
        `lineage`, or the store already holds a snapshot at `revision` or later.

        Raises:
            UsageError: `revision` is negative or past the log's revision.
        """
        ...

    async def rewrite(
        self,
        conversation_id: str,
        lineage: int,
        records: Sequence[bytes],
        *,
        base: tuple[int, int] | None = None,
    ) -> None:
        """Replace the whole log with `records` under the fresh `lineage`.

        Old records and snapshots are dropped; client marks are kept (push seqs stay
        strictly increasing across a rewrite). Creates the conversation when it has no log.
        The log's revision becomes `len(records)`.

        Args:
            base: when given, the `(lineage, revision)` the log must be at; compare-and-swap.

        Raises:
            LogMoved: `base` was given and the log is elsewhere; nothing was written.
            UsageError: `lineage` is the log's current lineage or out of range.
        """
        ...

    async def list_conversations(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> list[str]:
        """The ids of conversations that have a log, sorted (by code point).

        Args:
            prefix: only ids that start with it (a range over the ids, see `prefix_range`).
            after: only ids sorted after it (for paging: pass the last id of the page before).
            limit: at most this many ids (all of them when None).

        Raises:
            UsageError: a negative limit.
        """
        ...

    async def client_mark(self, conversation_id: str, client: str) -> ClientMark | None:
        """The client's last accepted push in this conversation, or None if it has none."""
        ...

    async def delete(self, conversation_id: str, now: float) -> bool:
        """Delete a conversation (SPEC 15): its records, snapshot and client marks go, and a
        tombstone dated `now` (epoch seconds) stays in their place.

        From then on `load`, `append` and `rewrite` of the id raise `Deleted`, `read` returns
        None and `list_conversations` leaves it out, on every hub sharing the store. Durable
        (and, on SQLite, scrubbed from the file) when this returns.

        Returns:
            Whether there was a log to delete (False: no log, or deleted already; nothing
            was written).
        """
        ...

    async def last_records(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> list[tuple[str, bytes | None]]:
        """Each conversation's id and its last record (None when its log is empty), sorted
        by id, paged like `list_conversations`: what `--retain` dates idleness by."""
        ...

    async def forget_deleted(self, before: float) -> int:
        """Drop the tombstones of conversations deleted before `before` (epoch seconds);
        returns how many. An id whose tombstone went may be created again."""
        ...

    # Turn leases (SPEC 10): rows beside the log, one per open turn; hints, never log records.

    async def put_lease(self, lease: Lease, *, replace: bool = True) -> None:
        """Keep `lease` for its turn, merged with the one stored as `merge_lease` says."""
        ...

    async def drop_lease(self, conversation_id: str, turn: int) -> None:
        """Forget the lease of that turn (it ended); nothing when there is none."""
        ...

    async def leases_due(self, now: int, limit: int = 100) -> list[Lease]:
        """At most `limit` leases due at `now` (ms; `Lease.due`), soonest first."""
        ...

    async def close(self) -> None:
        """Finish every write already started, then release files and threads. Idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


# Pure checks shared by every backend. Argument checks run on the caller's side before anything
# is queued; position checks run inside the backend's transaction.


def check_records(records: Sequence[bytes]) -> tuple[bytes, ...]:
    """Freeze `records` into a tuple, raising `UsageError` if one is not `bytes`."""
    frozen = tuple(records)
    for record in frozen:
        if not isinstance(record, bytes):
            raise UsageError("not_bytes", f"a record must be bytes, not {type(record).__name__}")
    return frozen


def check_new_lineage(lineage: int) -> None:
    """Raise `UsageError` unless `lineage` may name a stored log (strictly between the ends)."""
    if not NO_LINEAGE < lineage < MAX_LINEAGE:
        raise UsageError("bad_lineage", f"lineage {lineage} is not a fresh lineage")


def check_append_args(
    lineage: int,
    revision: int,
    records: Sequence[bytes],
    client: str | None,
    mark: ClientMark | None,
) -> tuple[bytes, ...]:
    """Validate `append`'s arguments; return the records frozen."""
    check_new_lineage(lineage)
    if revision < 0:
        raise UsageError("bad_revision", f"revision {revision} is negative")
    if (client is None) != (mark is None):
        raise UsageError("bad_mark", "client and mark go together")
    return check_records(records)


def check_rewrite_args(lineage: int, records: Sequence[bytes]) -> tuple[bytes, ...]:
    """Validate `rewrite`'s arguments; return the records frozen."""
    frozen = check_records(records)
    check_new_lineage(lineage)
    return frozen


def check_read_args(from_revision: int, limit: int | None) -> None:
    """Validate `read`'s arguments."""
    if from_revision < 0:
        raise UsageError("bad_revision", f"revision {from_revision} is negative")
    if limit is not None and limit < 0:
        raise UsageError("bad_limit", f"limit {limit} is negative")


def check_list_args(limit: int | None) -> None:
    """Validate `list_conversations`'s arguments."""
    if limit is not None and limit < 0:
        raise UsageError("bad_limit", f"limit {limit} is negative")


def prefix_range(prefix: str) -> tuple[str, str | None]:
    """The ids starting with `prefix` are exactly those `>= low` and `< high` (no bound if None).

    Ids are compared by code point (Python's `str` order, SQLite's `BINARY`, PostgreSQL's
    `COLLATE "C"` on UTF-8), so a store can list a prefix with an index range scan instead of a
    pattern match. `high` is `prefix` with its last character moved up by one code point
    (characters already at the top are dropped first); surrogates, which UTF-8 cannot hold,
    are stepped over.
    """
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            step = 0xE000 if 0xD800 <= last + 1 <= 0xDFFF else last + 1
            return prefix, "".join(chars) + chr(step)
    return prefix, None


def check_delete_args(now: float) -> None:
    """Validate `delete`'s arguments: a time, in seconds since the epoch."""
    if isinstance(now, bool) or not isinstance(now, int | float) or not 0 <= now < 2**53:
        raise UsageError("bad_time", f"{now!r} is not a time in seconds since the epoch")


def check_live(conversation_id: str, current: tuple[int, int] | None) -> None:
    """Raise `Deleted` when the head at `current` (None: no log) is a tombstone."""
    if current is not None and current[0] == TOMBSTONE:
        raise Deleted(conversation_id, current[1])


def check_snapshot_revision(revision: int, log_revision: int) -> None:
    """Raise `UsageError` unless a snapshot at `revision` fits a log of `log_revision`."""
    if not 0 <= revision <= log_revision:
        raise UsageError(
            "bad_revision", f"no revision {revision} in a log of {log_revision} records"
        )


def readable(current: tuple[int, int] | None, lineage: int, from_revision: int) -> bool:
    """Whether `read` of `lineage` after `from_revision` can be answered from a log at
    `current` (None: no log): the log is there, at that lineage, and not behind the reader."""
    return current is not None and current[0] == lineage and from_revision <= current[1]


def held_tail(
    revision: int, from_revision: int, limit: int | None, rows: Sequence[tuple[int, bytes]]
) -> list[bytes] | None:
    """What `read` returns of a log at `revision` given `rows`, the `(revision, data)` a
    store found after `from_revision` (in order, at most `limit`): their data, or None
    when the store no longer holds the first record asked for."""
    if from_revision < revision and limit != 0 and (not rows or rows[0][0] != from_revision + 1):
        return None
    return [data for _, data in rows]


def loaded(
    conversation_id: str,
    lineage: int,
    revision: int,
    snapshot: tuple[int, bytes] | None,
    records: list[bytes],
    clients: dict[str, ClientMark],
) -> Loaded:
    """What `load` returns of a log at `lineage`, `revision` with `snapshot` (its revision
    and state, None without one) and `records`, those a store found after the snapshot.

    Raises:
        StoreError: `records` are not all of those (a damaged store).
    """
    snapshot_revision, state = (0, None) if snapshot is None else snapshot
    if len(records) != revision - snapshot_revision:
        raise StoreError(
            f"{conversation_id!r} holds {len(records)} records after revision"
            f" {snapshot_revision}, expected {revision - snapshot_revision}"
        )
    return Loaded(
        lineage=lineage,
        revision=revision,
        snapshot=state,
        snapshot_revision=snapshot_revision,
        records=records,
        clients=clients,
    )


def check_base(
    conversation_id: str, current: tuple[int, int] | None, lineage: int, revision: int
) -> None:
    """Raise `LogMoved` unless a log at `current` (None: no log) is at `lineage`, `revision`.

    A missing log is at revision 0 of every lineage; a tombstone (`TOMBSTONE`) raises
    `Deleted` instead.
    """
    check_live(conversation_id, current)
    if current is None:
        if revision != 0:
            raise LogMoved(conversation_id, NO_LINEAGE, 0)
    elif current != (lineage, revision):
        raise LogMoved(conversation_id, *current)


def check_rewrite(
    conversation_id: str,
    current: tuple[int, int] | None,
    lineage: int,
    base: tuple[int, int] | None,
) -> None:
    """Raise unless a log at `current` may be rewritten under `lineage` (see `rewrite`); a
    tombstone raises `Deleted`, with a `base` or without (a rewrite never revives one)."""
    check_live(conversation_id, current)
    if base is not None:
        check_base(conversation_id, current, *base)
    if current is not None and current[0] == lineage:
        raise UsageError("same_lineage", f"{conversation_id!r} is already at lineage {lineage}")


def check_mark(
    conversation_id: str, client: str, stored: ClientMark | None, mark: ClientMark
) -> None:
    """Raise `SeqTaken` when `mark.seq` does not come after the client's stored seq."""
    if stored is not None and mark.seq <= stored.seq:
        raise SeqTaken(conversation_id, client, stored)
