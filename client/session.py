"""The replica's side of the protocol, pure: messages in, messages and events out.

How this works: the session holds `confirmed` (the log's state at the last revision seen, no
outbox) and `local` (what the application edits: `confirmed` plus pending records). Pending
records are the batch in flight (sent, not yet acked) followed by `local`'s outbox (made since,
on top of that batch). At most one batch is in flight.

- `hello()` opens each connection. On `welcome`, a batch in flight whose seq the hub already
  holds has landed (its records come in the catch-up); any other goes back to the outbox. The
  catch-up (`records` up to the welcome's revision, or a `state`) folds into `confirmed` only;
  once it is complete, `local` is rebased on it in one step.
- Afterwards, records from others fold into `confirmed`. With nothing pending they fold into
  `local` too; otherwise the batch in flight is doomed (the hub will reject it as `behind`:
  it handles pushes in log order) and every pending record is replayed on the new log by
  `sync.rebase`.
- `ack` folds the batch into `confirmed`; `reject invalid` reports each of its records as a
  `Conflict` and rebases what was made on top of it.

`receive` raises `ProtocolError` for a message that breaks the protocol; the caller then drops
the connection and resumes with a new `hello()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from sync import ApplyError, ChangeRecord, Conversation, Entry, Lineage, UsageError, encode
from sync.errors import ProtocolError
from sync.protocol import (
    Ack,
    Entries,
    Error,
    Hello,
    HubMessage,
    Records,
    Reject,
    State,
    Welcome,
    push_frame,
)
from sync.rebase import Conflict, needs_base, rebase

__all__ = [
    "Applied",
    "Conflict",
    "Connected",
    "Disconnected",
    "Event",
    "Rebased",
    "ReplicaSession",
    "Reset",
]


class Connected(msgspec.Struct, frozen=True):
    """The hub welcomed this replica; the log is at `lineage`/`revision`."""

    lineage: int
    revision: int


class Disconnected(msgspec.Struct, frozen=True):
    """The connection dropped; the replica reconnects by itself. `reason` says why."""

    reason: str


class Applied(msgspec.Struct, frozen=True):
    """Records from the log folded in, up to `revision`."""

    count: int
    revision: int


class Rebased(msgspec.Struct, frozen=True):
    """Pending records were replayed on a log that moved on (conflicts come as their own
    events)."""

    replayed: int
    revision: int


class Reset(msgspec.Struct, frozen=True):
    """The replica took the log's whole state (a new replica, or a log rewritten)."""

    lineage: int
    revision: int


Event = Connected | Disconnected | Applied | Rebased | Reset | Conflict


class _Batch:
    __slots__ = ("doomed", "records", "seq")

    def __init__(self, seq: int, records: list[ChangeRecord]) -> None:
        self.seq = seq
        self.records = records
        self.doomed = False  # the log moved under it: its records were re-pended by a rebase


class ReplicaSession:
    """One replica of one conversation, across any number of connections.

    Args:
        client: this replica's client id (its push seqs rise under it).
        local: the value the application edits; a new one when omitted. It may hold unsaved
            records made before connecting (they are pushed), but no saved ones.
        max_frame: the largest frame to send, in bytes.
        max_batch: the most records in one push.
        seq: the last seq this client used (to continue a client id across processes).
    """

    def __init__(
        self,
        client: str,
        local: Conversation | None = None,
        *,
        max_frame: int = 1 << 20,
        max_batch: int = 1000,
        seq: int = 0,
    ) -> None:
        local = local if local is not None else Conversation()
        if local.revision != len(local.unsaved()):
            raise UsageError("saved_value", "a replica starts from a value with no saved records")
        self.client = client
        self.local = local
        self.confirmed = Conversation()
        self.seq = seq
        self.max_frame = max_frame
        self.max_batch = max_batch
        self._inflight: _Batch | None = None
        self._landed: list[ChangeRecord] = []
        self._welcome: Welcome | None = None
        self._catching_up = False
        self._before_catch_up: Conversation | None = None
        self._partial: State | None = None
        self._partial_entries: list[Entry] = []
        self.on_landed: Callable[[int, list[ChangeRecord]], None] | None = None
        """Called with a batch's seq and records once the hub holds them (for observers)."""

    # ------------------------------------------------------------------ reads

    @property
    def pending(self) -> int:
        """Records made here that the hub has not acknowledged yet."""
        inflight = self._inflight
        sent = len(inflight.records) if inflight is not None and not inflight.doomed else 0
        return sent + len(self.local.unsaved())

    @property
    def ready(self) -> bool:
        """Welcomed and caught up: pushes can go."""
        return self._welcome is not None and not self._catching_up

    @property
    def settled(self) -> bool:
        """Caught up with nothing pending and nothing in flight."""
        return self.ready and self._inflight is None and not self.local.unsaved()

    # ------------------------------------------------------------------ sending

    def hello(self, token: str | None = None) -> Hello:
        """The first message of a new connection; forgets the previous connection's state."""
        self._welcome = None
        self._catching_up = False
        self._partial = None
        self._partial_entries = []
        return Hello(self.client, self.confirmed.lineage, self.confirmed.revision, token)

    def next_push(self) -> tuple[bytes | None, list[Conflict]]:
        """The next push frame to send, if one may go now, and records refused locally.

        A record whose push alone would exceed `max_frame` is refused before anything is
        sent: it is taken out of `local` (by a rebase) and reported as a `Conflict` with
        reason `too_large`.
        """
        if not self.ready or self._inflight is not None or not self.local.unsaved():
            return None, []
        records = self.local.unsaved()
        overhead = 128
        encoded: list[bytes] = []
        size = overhead
        for at, record in enumerate(records):  # encode only what this batch can carry
            if len(encoded) == self.max_batch:
                break
            data = encode(record)
            if len(data) + overhead > self.max_frame:
                return self._refuse(at, len(data))
            if size + len(data) + 1 > self.max_frame:
                break
            encoded.append(data)
            size += len(data) + 1
        count = len(encoded)
        taken = self.local.take_unsaved()
        self.local.return_unsaved(taken[count:])
        self.seq += 1
        self._inflight = _Batch(self.seq, taken[:count])
        frame = push_frame(self.seq, self.confirmed.lineage, self.confirmed.revision, encoded)
        return frame, []

    def _refuse(self, at: int, size: int) -> tuple[bytes | None, list[Conflict]]:
        """Take pending record `at` (too large to send) out of `local`; push the rest."""
        records = self.local.take_unsaved()
        conflicts = [Conflict(records[at], "too_large", f"{size} bytes over the frame limit")]
        keep = records[:at] + records[at + 1 :]
        conflicts += rebase(self.local, self.confirmed, keep, self.confirmed)
        frame, more = self.next_push()
        return frame, conflicts + more

    # ------------------------------------------------------------------ receiving

    def receive(self, message: HubMessage) -> list[Event]:
        """Handle one message from the hub; returns the events for the application.

        Raises:
            ProtocolError: the message breaks the protocol; drop the connection.
        """
        match message:
            case Welcome():
                return self._on_welcome(message)
            case Records():
                return self._on_records(message)
            case State():
                return self._on_state(message)
            case Entries():
                return self._on_entries(message)
            case Ack():
                return self._on_ack(message)
            case Reject():
                return self._on_reject(message)
            case Error(code, detail):
                raise ProtocolError(code, f"the hub closed the session: {detail}")
        raise ProtocolError("unexpected", f"unexpected {type(message).__name__}")

    def disconnected(self, reason: str) -> list[Event]:
        """The connection is gone; the session waits for the next `hello()`."""
        self._welcome = None
        return [Disconnected(reason)]

    def _on_welcome(self, welcome: Welcome) -> list[Event]:
        if self._welcome is not None:
            raise ProtocolError("unexpected", "a second welcome")
        self._welcome = welcome
        # A client id reused by a new process continues after the seqs the hub holds.
        self.seq = max(self.seq, welcome.acked)
        batch, self._inflight = self._inflight, None
        if batch is not None:
            if batch.seq <= welcome.acked:
                self._landed = batch.records  # its records come in the catch-up
                self._report_landed(batch)
            elif not batch.doomed:
                self.local.return_unsaved(batch.records)
        confirmed = self.confirmed
        if confirmed.lineage == Lineage.EMPTY and confirmed.revision == 0:
            # A value begun here continues any log from its start.
            confirmed.continue_log(welcome.lineage, 0)
        self._catching_up = True
        if self._before_catch_up is None:
            # What pending records were made on (kept if a catch-up is cut off and resumed).
            self._before_catch_up = confirmed.copy()
        events: list[Event] = [Connected(welcome.lineage, welcome.revision)]
        return events + self._maybe_caught_up()

    def _maybe_caught_up(self) -> list[Event]:
        welcome = self._welcome
        assert welcome is not None
        confirmed = self.confirmed
        if self._partial is not None or not (
            confirmed.lineage == welcome.lineage and confirmed.revision >= welcome.revision
        ):
            return []
        self._catching_up = False
        base = self._before_catch_up
        self._before_catch_up = None
        landed, self._landed = self._landed, []
        base = _folded(base, landed) if base is not None else None
        unmoved = base is not None and (base.lineage, base.revision) == (
            confirmed.lineage,
            confirmed.revision,
        )
        if unmoved and not landed and not self.local.unsaved():
            return []  # the log did not move: local already is confirmed plus nothing
        return self._rebase_local(base)

    def _rebase_local(self, base: Conversation | None) -> list[Event]:
        """Make `local` the confirmed value plus every pending record, replayed."""
        pending = self.local.take_unsaved()
        conflicts = rebase(self.local, self.confirmed, pending, base)
        events: list[Event] = list(conflicts)
        if pending:
            events.append(Rebased(len(pending) - len(conflicts), self.confirmed.revision))
        return events

    def _on_records(self, message: Records) -> list[Event]:
        if self._welcome is None:
            raise ProtocolError("unexpected", "records before welcome")
        confirmed = self.confirmed
        skip = confirmed.revision - message.from_
        if skip < 0:
            raise ProtocolError("gap", f"records from {message.from_}, at {confirmed.revision}")
        records = message.records[skip:]
        if not records:
            return []
        if self._catching_up:
            self._fold(confirmed, records)
            return [Applied(len(records), confirmed.revision), *self._maybe_caught_up()]
        inflight = self._inflight
        if inflight is None and not self.local.unsaved():
            self._fold(confirmed, records)
            for record in records:
                self.local.apply(record)
            return [Applied(len(records), confirmed.revision)]
        # The log moved under pending records: replay them on it.
        base = None
        pending = self.local.take_unsaved()
        if inflight is not None and not inflight.doomed:
            inflight.doomed = True
            pending = inflight.records + pending
        if needs_base(pending):
            base = confirmed.copy()
        self._fold(confirmed, records)
        self.local.return_unsaved(pending)
        events: list[Event] = [Applied(len(records), confirmed.revision)]
        return events + self._rebase_local(base)

    @staticmethod
    def _fold(conversation: Conversation, records: Sequence[ChangeRecord]) -> None:
        try:
            for record in records:
                conversation.apply(record)
        except Exception as exc:
            raise ProtocolError("diverged", f"a record from the hub does not fit: {exc}") from exc

    def _on_state(self, message: State) -> list[Event]:
        if self._welcome is None:
            raise ProtocolError("unexpected", "state before welcome")
        self._partial = message
        self._partial_entries = []
        return [] if message.more else self._take_state()

    def _on_entries(self, message: Entries) -> list[Event]:
        if self._partial is None:
            raise ProtocolError("unexpected", "entries without a state")
        self._partial_entries.extend(message.entries)
        return [] if message.more else self._take_state()

    def _take_state(self) -> list[Event]:
        message = self._partial
        assert message is not None
        self._partial = None
        state = message.state
        if self._partial_entries:
            entries = state.entries + self._partial_entries
            state = msgspec.structs.replace(state, entries=entries)
            self._partial_entries = []
        try:
            confirmed = Conversation.from_state(state)
        except Exception as exc:
            raise ProtocolError(
                "malformed", f"the hub sent a state that is not valid: {exc}"
            ) from exc
        confirmed.continue_log(message.lineage, message.revision)
        old, self.confirmed = self.confirmed, confirmed
        events: list[Event] = [Reset(message.lineage, message.revision)]
        if self._catching_up:
            return events + self._maybe_caught_up()
        inflight = self._inflight
        if inflight is not None and not inflight.doomed:
            inflight.doomed = True
            self.local.return_unsaved(inflight.records)
        return events + self._rebase_local(old)

    def _on_ack(self, ack: Ack) -> list[Event]:
        batch = self._inflight
        if batch is None or batch.seq != ack.seq:
            return []  # an ack for a batch settled already (a resend's duplicate answer)
        if batch.doomed:
            raise ProtocolError("unexpected", f"ack of push {ack.seq} after the log moved")
        if ack.from_ != self.confirmed.revision or ack.revision != ack.from_ + len(batch.records):
            raise ProtocolError(
                "gap",
                f"ack {ack.from_}..{ack.revision} for {len(batch.records)} records "
                f"at {self.confirmed.revision}",
            )
        self._inflight = None
        self._fold(self.confirmed, batch.records)
        self._report_landed(batch)
        return []

    def _report_landed(self, batch: _Batch) -> None:
        if self.on_landed is not None:
            self.on_landed(batch.seq, batch.records)

    def _on_reject(self, reject: Reject) -> list[Event]:
        batch = self._inflight
        if batch is None or batch.seq != reject.seq:
            return []
        self._inflight = None
        if batch.doomed:
            return []
        if reject.reason != "invalid":
            # The missing records (or a state) are on their way: send again after them.
            self.local.return_unsaved(batch.records)
            return []
        events: list[Event] = [
            Conflict(record, "invalid", reject.detail) for record in batch.records
        ]
        return events + self._rebase_local(_folded(self.confirmed.copy(), batch.records))


def _folded(base: Conversation, records: Sequence[ChangeRecord]) -> Conversation | None:
    """`base` with `records` applied, or None when they do not fit (no base for anchors)."""
    try:
        for record in records:
            base.apply(record)
    except ApplyError:
        return None
    return base
