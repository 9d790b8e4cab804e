"""A replica's outbox in a SQLite file: what it needs to go on after its process died (SPEC 14).

How this works: the file keeps the confirmed value (a state at a revision, and the log's
records past it), the pending records in order (the batch in flight first, under its seq),
the client id and the last seq used; `docs/design.md` ("The persisted outbox") gives the
layout, which the JS outbox shares. Every SQLite call runs on one dedicated thread, in the
order the loop asked for them; the loop never touches the file.

- An edit (`edited`, from the value's `on_edit`) appends its record and waits for the commit:
  the call that made it returns once the record is in the file (WAL, `synchronous=NORMAL`: in
  the OS when the commit returns, so a killed process loses nothing; a power cut may lose the
  last commits).
- A push (`sent`) writes the batch's seq on its records before the frame goes (awaited).
- Whatever else moved (`settle`, after each message from the hub): the confirmed value and
  the pending records are written in one transaction, without waiting. Those writes may lag;
  the file always holds a consistent pair (pending records that apply on the confirmed value),
  older at worst, and the catch-up after a restart brings the rest.

The loop keeps a mirror of what the file holds (`_Mirror`), so each write is the difference:
records appended to the log, rows appended to or dropped from the front of `pending`, seqs
set; a rebase rewrites `pending` whole.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from sync import ChangeRecord, Conversation, Lineage, encode
from sync.codec import decode_record, decode_state_value
from sync.errors import ConvsyncError, UsageError
from sync.protocol import Ack, HubMessage, Records, State

from .session import Event, ReplicaSession

__all__ = ["FORMAT", "VERSION", "Outbox"]

FORMAT = "convsync.outbox"
VERSION = 1
APPLICATION_ID = 0x63737962  # "csyb"
LOG_LIMIT = 1024
"""Log rows past the confirmed state that make the next settle fold them into a new state
(also when they pass half the conversation's entries, whichever is more)."""

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE confirmed (lineage INTEGER NOT NULL, revision INTEGER NOT NULL,"
    " state BLOB NOT NULL)",
    "CREATE TABLE log (revision INTEGER PRIMARY KEY, record BLOB NOT NULL)",
    "CREATE TABLE pending (pos INTEGER PRIMARY KEY, seq INTEGER, record BLOB NOT NULL)",
)

Row = tuple[int | None, ChangeRecord]
"""A pending record and the seq of the batch it went in (None: not sent yet)."""

Op = Callable[[sqlite3.Connection], object]


@dataclass
class Kept:
    """What an outbox file held when it was opened."""

    client: str
    seq: int
    confirmed: Conversation
    pending: list[Row]
    log_rows: int
    fresh: bool
    placed: list[ChangeRecord] | None = None


@dataclass
class _Mirror:
    """What the file holds, as the loop last wrote it (the rows by identity)."""

    lineage: int = Lineage.EMPTY
    revision: int = 0
    rows: list[Row] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    next_pos: int = 1
    seq: int = 0
    log_rows: int = 0
    placed: int = 0  # records of the meta `placed` (what the batch in flight landed as)


@dataclass
class _Job:
    fn: Callable[..., Any]
    future: concurrent.futures.Future[Any]
    alone: bool  # run outside any transaction (open, close); else a write


_STOP = _Job(lambda: None, concurrent.futures.Future(), alone=True)


class _Writer:
    """One thread that owns the SQLite connection and runs jobs in order. Writes waiting at
    the same moment commit in one transaction (group commit)."""

    def __init__(self, name: str) -> None:
        self.db: sqlite3.Connection | None = None
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run `fn` alone on the thread (opening, closing), outside any transaction."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put(_Job(fn, future, alone=True))
        return future

    def write(self, op: Op) -> concurrent.futures.Future[None]:
        """Run `op` in a transaction (shared with the other writes waiting then)."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._jobs.put(_Job(op, future, alone=False))
        return future

    def stop(self) -> None:
        """End the thread once the jobs queued so far ran."""
        self._jobs.put(_STOP)

    def _run(self) -> None:
        jobs = self._jobs
        next_job: _Job | None = None
        while True:
            job = next_job if next_job is not None else jobs.get()
            next_job = None
            if job is _STOP:
                return
            if job.alone:
                job.future.set_running_or_notify_cancel()  # no cancel from now on
                try:
                    _settle(job.future, job.fn(), None)
                except Exception as exc:
                    _settle(job.future, None, exc)
                continue
            batch = [job]
            while True:
                try:
                    more = jobs.get_nowait()
                except queue.Empty:
                    break
                if more.alone:
                    next_job = more  # keeps its turn, after this batch
                    break
                batch.append(more)
            self._commit(batch)

    def _commit(self, batch: list[_Job]) -> None:
        db = self.db
        for job in batch:
            job.future.set_running_or_notify_cancel()  # no cancel from now on
        try:
            if db is None:
                raise OSError("the outbox is closed")
            db.execute("BEGIN")
            try:
                for job in batch:
                    job.fn(db)
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
        except Exception as exc:  # the thread goes on: each waiter gets the failure
            for job in batch:
                _settle(job.future, None, OSError(f"the outbox could not be written: {exc}"))
            return
        for job in batch:
            _settle(job.future, None, None)


def _settle(
    future: concurrent.futures.Future[Any], result: Any, error: BaseException | None
) -> None:
    """Give `future` its outcome, unless its waiter cancelled it (the write was made anyway:
    a push loop cancelled while it waits must not stop the thread)."""
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _bad(path: str, what: str) -> UsageError:
    return UsageError("bad_outbox", f"outbox {path}: {what}; nothing was changed")


def _read_meta(db: sqlite3.Connection, path: str) -> dict[str, str]:
    """The meta rows of an outbox file, after checking it is one.

    Raises:
        UsageError: `bad_outbox`, the file is not an outbox of this layout.
    """
    (app,) = db.execute("PRAGMA application_id").fetchone()
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if app != APPLICATION_ID or not {"meta", "confirmed", "log", "pending"} <= tables:
        raise _bad(path, "not a convsync outbox (another SQLite database)")
    meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("format") != FORMAT:
        raise _bad(path, f"not a convsync outbox (format {meta.get('format')!r})")
    version = meta.get("version")
    if version != str(VERSION):
        raise _bad(path, f"layout version {version} (this convsync reads {VERSION})")
    return meta


def _open_file(
    path: str, conversation_id: str, client: str, records: Sequence[ChangeRecord]
) -> tuple[sqlite3.Connection, Kept]:
    """Open (or create) the outbox at `path` and lock it for this process.

    Raises:
        UsageError: `outbox_locked` (another live owner), `bad_outbox` (not an outbox, another
            conversation's, unreadable); nothing is changed then.
    """
    fresh = not os.path.exists(path) or os.path.getsize(path) == 0
    try:
        db = sqlite3.connect(path, isolation_level=None, timeout=0)
    except sqlite3.Error as exc:
        raise _bad(path, f"cannot be opened ({exc})") from exc
    try:
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        try:
            # Takes the lock now (held while this connection lives, dropped with the process):
            # a second owner fails here, before reading anything.
            db.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                raise UsageError(
                    "outbox_locked",
                    f"outbox {path} is in use by another live replica (a process or this one)",
                ) from None
            raise
        try:
            if fresh:
                kept = _create(db, conversation_id, client, records)
            else:
                kept = _load(db, path, conversation_id)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db, kept
    except sqlite3.DatabaseError as exc:
        db.close()
        raise _bad(path, f"not readable as a convsync outbox ({exc})") from exc
    except BaseException:
        db.close()
        raise


def _create(
    db: sqlite3.Connection, conversation_id: str, client: str, records: Sequence[ChangeRecord]
) -> Kept:
    db.execute(f"PRAGMA application_id={APPLICATION_ID}")
    db.execute(f"PRAGMA user_version={VERSION}")
    for statement in _SCHEMA:
        db.execute(statement)
    meta = {
        "format": FORMAT,
        "version": str(VERSION),
        "conversation": conversation_id,
        "client": client,
        "seq": "0",
    }
    db.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
    empty = Conversation()
    db.execute("INSERT INTO confirmed VALUES (?, ?, ?)", (Lineage.EMPTY, 0, encode(empty.state())))
    db.executemany(
        "INSERT INTO pending VALUES (?, NULL, ?)",
        [(at + 1, encode(record)) for at, record in enumerate(records)],
    )
    return Kept(client, 0, empty, [(None, record) for record in records], 0, fresh=True)


def _load(db: sqlite3.Connection, path: str, conversation_id: str) -> Kept:
    meta = _read_meta(db, path)
    if meta.get("conversation") != conversation_id:
        raise _bad(
            path,
            f"it keeps conversation {meta.get('conversation')!r}, not {conversation_id!r}",
        )
    try:
        client = meta["client"]
        seq = int(meta["seq"])
        rows = db.execute("SELECT lineage, revision, state FROM confirmed").fetchall()
        if len(rows) != 1:
            raise ValueError(f"{len(rows)} confirmed values")
        lineage, revision, state = rows[0]
        confirmed = Conversation.from_state(decode_state_value(state))
        confirmed.continue_log(lineage, revision)
        log = db.execute("SELECT revision, record FROM log ORDER BY revision").fetchall()
        for at, (row_revision, record) in enumerate(log):
            if row_revision != revision + at + 1:
                raise ValueError(f"log row {row_revision} where {revision + at + 1} was due")
            confirmed.apply(decode_record(record))
        pending = [
            (row_seq, decode_record(record))
            for row_seq, record in db.execute("SELECT seq, record FROM pending ORDER BY pos")
        ]
        placed = None
        if "placed" in meta:
            value = msgspec.json.decode(meta["placed"])
            if value["seq"] == seq:
                placed = [decode_record(encode(record)) for record in value["records"]]
    except (KeyError, ValueError, TypeError, msgspec.DecodeError, ConvsyncError) as exc:
        raise _bad(path, f"its contents do not hold together ({exc})") from exc
    return Kept(client, seq, confirmed, pending, len(log), fresh=False, placed=placed)


class Outbox:
    """The outbox file of one replica (`Replica(..., outbox=path)` makes and drives it).

    Args:
        path: the SQLite file (created when missing or empty).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._writer: _Writer | None = None
        self._mirror = _Mirror()
        self._session: ReplicaSession | None = None
        self._log: dict[int, ChangeRecord] = {}  # log records seen, by the revision they make
        self._quiet = False  # inside a session call: its replays are not the application's edits
        self.failed: BaseException | None = None
        """Why the last write that nobody awaited failed (it is raised by the next edit)."""
        self.offline_start = False
        """Whether the replica began from what this file kept (a restart)."""

    # ------------------------------------------------------------------ open and close

    async def open(
        self,
        session: ReplicaSession,
        conversation_id: str,
        *,
        client: str | None,
        fresh_value: bool,
    ) -> None:
        """Open the file and resume `session` from it (a fresh `session`, before its first
        hello): its client id, its last seq, the confirmed value, the pending records.

        Raises:
            UsageError: `outbox_locked`, `bad_outbox`; or `bad_outbox` for a `client` other
                than the one the file keeps, or a starting value (`fresh_value`) given with
                an outbox that keeps one already.
        """
        writer = self._writer = _Writer(f"convsync-outbox:{conversation_id}")
        records = session.local.unsaved()

        def opened() -> Kept:
            writer.db, kept = _open_file(self.path, conversation_id, session.client, records)
            return kept

        try:
            kept = await asyncio.wrap_future(writer.call(opened))
            if not kept.fresh:
                if client is not None and client != kept.client:
                    raise _bad(self.path, f"it keeps client {kept.client!r}, not {client!r}")
                if fresh_value:
                    raise _bad(self.path, "it keeps a value already: give no conversation=")
                sent = [record for seq, record in kept.pending if seq is not None]
                unsaved = [record for seq, record in kept.pending if seq is None]
                try:
                    session.client = kept.client
                    session.restore(kept.confirmed, kept.seq, sent, unsaved, kept.placed)
                except ConvsyncError as exc:
                    raise _bad(self.path, f"its pending records do not apply ({exc})") from exc
                self.offline_start = True
        except BaseException:
            await self.close()
            raise
        mirror = self._mirror
        mirror.lineage, mirror.revision = kept.confirmed.lineage, kept.confirmed.revision
        mirror.seq = kept.seq
        mirror.log_rows = kept.log_rows
        self._session = session
        # The file's rows are the records now in the session (restored, or the starting
        # value's): mirror them by identity, positions renumbered by one rewrite.
        self._rewrite_pending(self._rows_of(session), None)
        if kept.log_rows:
            self._snapshot(kept.confirmed.lineage, kept.confirmed.revision, kept.confirmed)

    async def close(self) -> None:
        """Write what is left and close the file (its lock goes with it)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if self._session is not None and self.failed is None:
            self.settle()
        db_closed = writer.call(lambda: writer.db.close() if writer.db is not None else None)
        writer.stop()
        await asyncio.wrap_future(db_closed)

    # ------------------------------------------------------------------ the session's moves

    def edited(self) -> None:
        """An edit of `local` was made (its `on_edit`): append its record, and return once it
        is in the file.

        Raises:
            OSError: the file could not be written (the edit stays in memory and is pushed,
                but a crash now would lose it).
        """
        if self._quiet or self._writer is None:
            return
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise OSError(f"outbox {self.path}: an earlier write failed: {failed}") from failed
        session = self._session
        assert session is not None
        record = session.local.unsaved()[-1]
        self._append_rows([(None, record)]).result()

    def receive(self, message: HubMessage) -> list[Event]:
        """`session.receive(message)`, noting the log records it brings and writing what moved
        (not awaited)."""
        session = self._session
        assert session is not None
        log = self._log
        if type(message) is Records:
            # By the revision each makes; only those past the file's are ever read.
            past = self._mirror.revision
            for at, record in enumerate(message.records, message.from_ + 1):
                if at > past:
                    log[at] = record
        elif type(message) is Ack:
            rows = self._mirror.rows
            if rows and rows[0][0] == message.seq and message.from_ + 1 not in log:
                # Not placed by the hub: the batch landed as sent, right after `from`.
                sent = [record for seq, record in rows if seq == message.seq]
                for at, record in enumerate(sent, message.from_ + 1):
                    log[at] = record
        elif type(message) is State:
            log.clear()  # a new log (or the same one): what was noted may be another's
        self._quiet = True
        try:
            return session.receive(message)
        finally:
            self._quiet = False
            self.settle()

    def next_push(
        self, now: float
    ) -> tuple[bytes | None, list[Any], concurrent.futures.Future[None] | None]:
        """`session.next_push(now)`, with the write of the batch's seq to await before the
        frame goes (None when nothing is to be sent)."""
        session = self._session
        assert session is not None
        self._quiet = True
        try:
            frame, conflicts = session.next_push(now)
        finally:
            self._quiet = False
        written = self.settle()
        return frame, conflicts, written if frame is not None else None

    def settle(self) -> concurrent.futures.Future[None] | None:
        """Write whatever moved since the last write: the confirmed value (while the session
        is live and it holds together with the pending records) and the pending rows."""
        session = self._session
        writer = self._writer
        if session is None or writer is None or session.phase != "live":
            # Connecting or catching up: the file keeps what it had, plus the edits made
            # meanwhile (`edited`), which is what `local` is until the catch-up rebases it.
            return None
        mirror = self._mirror
        ops: list[Op] = []
        in_flight = session.in_flight
        landed = in_flight[2] if in_flight is not None else None
        placed = landed is not None
        moved = (session.lineage, session.revision) != (mirror.lineage, mirror.revision)
        if moved and not placed:
            # (A batch the hub placed is folded into `confirmed` before its ack, while the
            # records made on it are not rebased yet: the file keeps the value before it.)
            ops += self._confirmed_ops(session)
        rows = self._rows_of(session)
        ops += self._pending_ops(rows)
        if (len(landed) if landed else 0) != mirror.placed:
            ops.append(self._placed_op(in_flight[0] if in_flight else 0, landed or []))
        if session.seq != mirror.seq:
            seq = mirror.seq = session.seq
            ops.append(lambda db: _set_meta(db, "seq", str(seq)))
        if not ops:
            return None
        future = writer.write(_all(ops))
        future.add_done_callback(self._note_failure)
        return future

    # ------------------------------------------------------------------ what to write

    def _placed_op(self, seq: int, landed: list[ChangeRecord]) -> Op:
        """Keep what the hub placed the batch in flight as (a `records` message with this
        replica's origin, SPEC 2.4.6), until its ack: a restart reports those as landed."""
        self._mirror.placed = len(landed)
        if not landed:
            return lambda db: db.execute("DELETE FROM meta WHERE key='placed'")
        value = encode({"seq": seq, "records": landed}).decode()
        return lambda db: db.execute("INSERT OR REPLACE INTO meta VALUES ('placed', ?)", (value,))

    def _rows_of(self, session: ReplicaSession) -> list[Row]:
        in_flight = session.in_flight
        rows: list[Row] = []
        if in_flight is not None:
            rows = [(in_flight[0], record) for record in in_flight[1]]
        return rows + [(None, record) for record in session.local.unsaved()]

    def _confirmed_ops(self, session: ReplicaSession) -> list[Op]:
        mirror = self._mirror
        lineage, revision = session.lineage, session.revision
        log = self._log
        wanted = range(mirror.revision + 1, revision + 1)
        entries = len(session.local)
        if (
            lineage == mirror.lineage
            and revision > mirror.revision
            and all(at in log for at in wanted)
            and mirror.log_rows + len(wanted) <= max(LOG_LIMIT, entries // 2)
        ):
            rows = [(at, encode(log[at])) for at in wanted]
            mirror.revision = revision
            mirror.log_rows += len(rows)
            self._forget_log(revision)
            return [lambda db: db.executemany("INSERT INTO log VALUES (?, ?)", rows)]
        return self._snapshot_ops(lineage, revision, session.confirmed)

    def _snapshot(self, lineage: int, revision: int, value: Conversation) -> None:
        assert self._writer is not None
        self._writer.write(_all(self._snapshot_ops(lineage, revision, value))).add_done_callback(
            self._note_failure
        )

    def _snapshot_ops(self, lineage: int, revision: int, value: Conversation) -> list[Op]:
        mirror = self._mirror
        mirror.lineage, mirror.revision, mirror.log_rows = lineage, revision, 0
        self._forget_log(revision)
        state = value.state()  # its lists are copies: the thread encodes them

        def write(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM log")
            db.execute(
                "UPDATE confirmed SET lineage=?, revision=?, state=?",
                (lineage, revision, encode(state)),
            )

        return [write]

    def _forget_log(self, upto: int) -> None:
        log = self._log
        for at in [at for at in log if at <= upto]:
            del log[at]

    def _pending_ops(self, rows: list[Row]) -> list[Op]:
        """The writes that make the file's pending rows `rows`: rows dropped from the front (a
        batch acked) or the end, seqs set (a batch sent), rows appended; else a rewrite."""
        mirror = self._mirror
        old = mirror.rows
        batch = len(old) - sum(1 for seq, _ in old if seq is None)  # the batch in flight's rows
        for drop in (0, batch) if batch else (0,):
            if _same_front(old, rows, drop):
                break
        else:
            return self._rewrite_pending(rows, [])
        ops: list[Op] = []
        positions = mirror.positions
        if drop:
            last = positions[drop - 1]
            ops.append(lambda db: db.execute("DELETE FROM pending WHERE pos <= ?", (last,)))
            del old[:drop], positions[:drop]
        if len(rows) < len(old):
            first = positions[len(rows)]
            ops.append(lambda db: db.execute("DELETE FROM pending WHERE pos >= ?", (first,)))
            del old[len(rows) :], positions[len(rows) :]
        changed = [
            (rows[at][0], positions[at]) for at in range(len(old)) if old[at][0] != rows[at][0]
        ]
        if changed:
            ops.append(lambda db: db.executemany("UPDATE pending SET seq=? WHERE pos=?", changed))
            old[:] = rows[: len(old)]
        if len(rows) > len(old):
            ops += self._appended(rows[len(old) :])
        return ops

    def _append_rows(self, rows: list[Row]) -> concurrent.futures.Future[None]:
        assert self._writer is not None
        return self._writer.write(_all(self._appended(rows)))

    def _appended(self, rows: list[Row]) -> list[Op]:
        mirror = self._mirror
        start = mirror.next_pos
        mirror.next_pos += len(rows)
        mirror.rows += rows
        mirror.positions += range(start, start + len(rows))
        values = [(start + at, seq, encode(record)) for at, (seq, record) in enumerate(rows)]
        return [lambda db: db.executemany("INSERT INTO pending VALUES (?, ?, ?)", values)]

    def _rewrite_pending(self, rows: list[Row], ops: list[Op] | None) -> list[Op]:
        """Replace every pending row (`ops` given: return the writes; else write them)."""
        mirror = self._mirror
        mirror.rows, mirror.positions = [], []
        writes: list[Op] = [lambda db: db.execute("DELETE FROM pending")]
        writes += self._appended(rows)
        if ops is None:
            assert self._writer is not None
            self._writer.write(_all(writes)).add_done_callback(self._note_failure)
            return []
        return writes

    def _note_failure(self, future: concurrent.futures.Future[None]) -> None:
        if future.cancelled():
            return  # its waiter went away; the write was made all the same
        error = future.exception()
        if error is not None and self.failed is None:
            self.failed = error


def _same_front(old: list[Row], rows: list[Row], drop: int) -> bool:
    """Whether `old[drop:]` and `rows` start with the same records (by identity)."""
    return all(a[1] is b[1] for a, b in zip(old[drop:], rows, strict=False))


def _set_meta(db: sqlite3.Connection, key: str, value: str) -> None:
    db.execute("UPDATE meta SET value=? WHERE key=?", (value, key))


def _all(ops: list[Op]) -> Op:
    def run(db: sqlite3.Connection) -> None:
        for op in ops:
            op(db)

    return run
