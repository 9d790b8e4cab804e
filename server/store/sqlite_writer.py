"""The SQLite store's writes: group commit on the event loop, the disk on the store's thread.

`_Committer` is the loop's side (writes queue, at most one batch is under way, the next one
carries what queued meanwhile); `_Writer` is the store's thread and its one writing
connection (it opens the file, commits the batches the loop does not run itself, syncs the
WAL, checkpoints and scrubs). See `server/store/sqlite.py` "How this works" for the whole.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from sync.errors import UsageError

from .base import StoreError
from .sqlite_files import (
    closed_error,
    connect,
    create_schema,
    fresh,
    hold,
    lock_path,
    open_error,
    path_problem,
    release,
    remove_created,
    store_error,
)

log = logging.getLogger("convsync.store")

# The writes: statements on the event loop, fsync and heavy work on the store's thread.

CHECKPOINT_EVERY = 64
"""Commits between two checkpoints of the WAL into the database, run on the store's thread
(SQLite's automatic checkpoint would run inside a commit, on the event loop)."""


class _Job:
    """One write: a function run in a transaction, and the future its caller awaits."""

    __slots__ = ("future", "is_append", "run", "scrubs")

    def __init__(
        self,
        run: Callable[[sqlite3.Cursor], Any],
        future: asyncio.Future[Any],
        *,
        is_append: bool,
        scrubs: bool = False,
    ) -> None:
        self.run = run
        self.future = future
        self.is_append = is_append
        self.scrubs = scrubs  # a delete: once it returns True, the file is scrubbed


Outcomes = list[tuple[Any, BaseException | None]]


class _Turn:
    """A batch handed to the store's thread: to run and commit there when `outcomes` is None,
    then to sync; its outcome goes back to `committer` on `loop`."""

    __slots__ = ("batch", "committer", "loop", "outcomes")

    def __init__(
        self,
        batch: list[_Job],
        outcomes: Outcomes | None,
        loop: asyncio.AbstractEventLoop,
        committer: _Committer,
    ) -> None:
        self.batch = batch
        self.outcomes = outcomes
        self.loop = loop
        self.committer = committer


def _call_back(turn: _Turn, outcomes: Outcomes | None, failure: BaseException | None) -> None:
    """Hand `turn`'s outcome back to its event loop (from the store's thread)."""
    turn.committer.returned()
    try:
        turn.loop.call_soon_threadsafe(turn.committer.done, turn, outcomes, failure)
    except RuntimeError:  # the loop is closed: nobody waits, but the store must go on
        turn.committer.abandon()


def _transact(conn: sqlite3.Connection, cursor: sqlite3.Cursor, batch: list[_Job]) -> Outcomes:
    """Run `batch` in the transaction just begun, each job under its own savepoint, and commit.

    Returns each job's outcome: a refused job (`LogMoved`, `SeqTaken`, a database error) is
    rolled back to its savepoint and fails alone. Raises what made the whole transaction fail
    (disk full, I/O error), after rolling it back.
    """
    outcomes: Outcomes = []
    alone = len(batch) == 1  # a job alone needs no savepoint: its transaction is its own
    try:
        for job in batch:
            if not alone:
                cursor.execute("SAVEPOINT job")
            try:
                result = job.run(cursor)
            except Exception as exc:
                # Some errors (disk full, I/O) end the whole transaction: then the whole batch
                # fails with that error (a ROLLBACK TO would only say there is no transaction).
                if not conn.in_transaction:
                    raise
                cursor.execute("ROLLBACK" if alone else "ROLLBACK TO job")
                if isinstance(exc, sqlite3.Error):
                    outcomes.append((None, store_error("write failed", exc)))
                else:  # LogMoved, SeqTaken, UsageError: the caller's to handle
                    outcomes.append((None, exc))
            else:
                outcomes.append((result, None))
            if not alone:
                cursor.execute("RELEASE job")
        if conn.in_transaction:
            cursor.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            try:
                cursor.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        raise
    return outcomes


def _is_busy(exc: sqlite3.Error) -> bool:
    """Whether `exc` says another connection holds the lock asked for."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:  # an extended code (SQLITE_BUSY_RECOVERY, ...) in its low byte
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc)


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _fsync(fd: int) -> None:
    """`fdatasync` where the system has it (Linux), else `fsync` (macOS)."""
    sync = getattr(os, "fdatasync", None) or os.fsync
    sync(fd)


class _Writer:
    """The store's thread and the one connection that writes.

    The thread opens the file (and holds its lock), then carries out the `_Turn`s the event
    loop hands it: it commits the batches the loop does not run itself, `fdatasync`s the WAL
    after every commit when the store is durable, and checkpoints the WAL. At most one batch
    is under way (`_Committer.busy`), so the loop and the thread take turns on the connection;
    `lock` makes that hold when the store shuts down under a batch too.

    It holds no reference to the store, so a store dropped without `close` can still be
    collected; the store's finalizer then stops this thread.
    """

    def __init__(self, path: str, synchronous: str, busy_timeout: float, max_batch: int) -> None:
        self.path = path
        self.synchronous = synchronous
        # FULL and EXTRA: the connection runs at NORMAL (a commit writes the WAL and returns)
        # and this thread syncs the WAL before any write of the commit resolves.
        self.syncs = synchronous in ("FULL", "EXTRA")
        self.busy_timeout = busy_timeout
        self.max_batch = max_batch
        self.turns: queue.SimpleQueue[_Turn | None] = queue.SimpleQueue()
        self.ready = threading.Event()
        self.lock = threading.Lock()  # held while statements run on `conn`, and to close it
        self.stopping = False  # set (under the committer's lock) before the stop request
        self.error: StoreError | None = None
        self.broken: StoreError | None = None  # a failed fsync: no write may resolve again
        self.conn: sqlite3.Connection | None = None
        self.cursor: sqlite3.Cursor | None = None
        # Batches that began a transaction: counted before `BEGIN`, so a commit a reader can
        # see is always counted (`_Committer.synced` says how many of them are synced).
        self.begun = 0
        self.commits = 0
        self.appends = 0
        self.since_checkpoint = 0
        # A delete committed: VACUUM, then empty the WAL (`_scrub`); the WAL only, when the
        # VACUUM was done but a reader kept the checkpoint from truncating it.
        self.vacuum_due = False
        self.truncate_due = False
        self._wal = -1
        self.thread = threading.Thread(target=self._main, name="convsync-sqlite-disk", daemon=True)
        self._start_lock = threading.Lock()
        self._shut = False  # the store stopped: the thread may no longer start

    def start(self) -> None:
        """Start the thread (it opens the file) unless it was started already; once the store
        has stopped, a thread that never started never will (`shut`)."""
        with self._start_lock:
            if self.thread.ident is None:
                if self._shut:
                    raise closed_error()
                self.thread.start()

    def shut(self) -> None:
        """No thread starts from now on: one that started is joined by `close`, and none can
        start behind its back (a read's worker thread starts it too)."""
        with self._start_lock:
            self._shut = True

    @property
    def started(self) -> bool:
        return self.thread.ident is not None

    def committed(self, batch: list[_Job], outcomes: Outcomes) -> None:
        """Count a batch committed (by the loop or by this thread); a refused write alone was
        rolled back, not committed (`_transact`)."""
        if len(batch) == 1 and outcomes[0][1] is not None:
            return
        self.commits += 1
        self.appends += sum(job.is_append for job in batch)
        self.since_checkpoint += 1

    def _main(self) -> None:
        path = self.path
        problem = path_problem(path)
        if problem is not None:
            self._fail_until_stopped(StoreError(problem))
            return
        # What this open creates, it removes again if it fails: the lock file if it was not
        # there, the database files if the database was not there once the lock is held (no
        # other store makes them meanwhile).
        made = [] if os.path.exists(lock_path(path)) else [lock_path(path)]
        try:
            held = hold(path)  # before the database is touched at all
        except Exception as exc:
            self._fail_until_stopped(open_error(path, exc))
            return
        if not os.path.exists(path):
            made += [path + suffix for suffix in ("", "-wal", "-shm", "-journal")]
        synchronous = "NORMAL" if self.syncs else self.synchronous
        try:
            conn = connect(path, synchronous, self.busy_timeout, reader=False)
        except Exception as exc:
            remove_created(made)  # while the lock is still held: nobody else made them
            release(held)
            self._fail_until_stopped(open_error(path, exc))
            return
        try:
            create_schema(conn, path)
            # The loop never waits for a lock: a batch that finds the write lock taken (by a
            # process outside the store) comes here, which waits `busy_timeout` for it.
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # this thread checkpoints
            wal = os.open(path + "-wal", os.O_RDWR | os.O_CLOEXEC) if self.syncs else -1
        except Exception as exc:
            conn.close()
            remove_created(made)
            release(held)
            self._fail_until_stopped(open_error(path, exc))
            return
        # Every statement of the writer runs on this one cursor: `Connection.execute` would
        # make (and free) a cursor per statement, about a fifth of a statement's Python cost.
        self.conn, self.cursor, self._wal = conn, conn.cursor(), wal
        self.ready.set()
        try:
            while (turn := self.turns.get()) is not None:
                try:
                    self._carry_out(turn)
                except Exception as exc:  # a bug: fail the turn, keep serving the others
                    log.exception("the SQLite store's thread failed a batch")
                    self.broken = store_error("the store's thread failed; reopen the store", exc)
                    _call_back(turn, None, fresh(self.broken))
        finally:
            with self.lock:  # not under a batch the loop is running
                if wal >= 0:
                    os.close(wal)
                conn.close()
                self.conn = self.cursor = None
            release(held)
            self._fail_until_empty(closed_error())

    def _carry_out(self, turn: _Turn) -> None:
        outcomes = turn.outcomes
        failure: BaseException | None = None if self.broken is None else fresh(self.broken)
        if failure is None and outcomes is None:
            outcomes, failure = self._commit(turn.batch)
        if failure is None and self.syncs:
            try:
                _fsync(self._wal)
            except OSError as exc:
                # The commit is in the WAL but may not be on the disk, and after a failed
                # fsync the kernel may have dropped the pages: nothing written from now on can
                # be promised either. The store refuses every write until it is reopened.
                self.broken = store_error("the disk failed to sync the WAL; reopen the store", exc)
                failure = fresh(self.broken)
        if failure is None and (self.vacuum_due or self.truncate_due):
            self._scrub()
        if failure is None and self.since_checkpoint >= CHECKPOINT_EVERY:
            self._checkpoint()
        _call_back(turn, outcomes, failure)

    def _commit(self, batch: list[_Job]) -> tuple[Outcomes | None, BaseException | None]:
        with self.lock:
            conn, cursor = self.conn, self.cursor
            assert conn is not None and cursor is not None
            self.begun += 1
            try:
                cursor.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                try:
                    cursor.execute("BEGIN IMMEDIATE")
                finally:
                    cursor.execute("PRAGMA busy_timeout = 0")
            except sqlite3.Error as exc:
                return None, store_error("cannot begin a write", exc)
            try:
                outcomes = _transact(conn, cursor, batch)
            except Exception as exc:
                return None, store_error("commit failed", exc)
        self.committed(batch, outcomes)
        if any(not job.is_append for job in batch):
            self.since_checkpoint = CHECKPOINT_EVERY  # a snapshot or a rewrite: a large WAL
        pairs = zip(batch, outcomes, strict=True)
        if any(job.scrubs and outcome == (True, None) for job, outcome in pairs):
            self.vacuum_due = True
        return outcomes, None

    def _scrub(self) -> None:
        """After a delete (SPEC 15): leave nothing of the deleted conversation in the files.

        A deleted row's bytes stay in its page, and pages freed earlier (old snapshots, a
        rewrite's records) keep theirs until reused; `VACUUM` rebuilds the database without
        them, and a `TRUNCATE` checkpoint copies that into the file and empties the WAL,
        whose old frames held them too. It waits up to `busy_timeout` for readers; when one
        still holds an old snapshot, the checkpoint (not the VACUUM) is tried again at the
        thread's next turn. The cost is a rewrite of the whole file (deletes committed in one
        batch share one)."""
        with self.lock:
            assert self.cursor is not None
            cursor = self.cursor
            try:
                if self.vacuum_due:
                    self.vacuum_due = False  # failed or not: not once per turn
                    cursor.execute("VACUUM")
                    if self.syncs:
                        _fsync(self._wal)
                cursor.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                try:
                    (busy, _, _) = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                finally:
                    cursor.execute("PRAGMA busy_timeout = 0")
            except (sqlite3.Error, OSError) as exc:
                self.truncate_due = False  # the next delete tries again
                log.error("scrubbing %s after a delete failed: %s", self.path, exc)
                return
        self.since_checkpoint = 0
        self.truncate_due = bool(busy)  # then the next batch goes to the thread (`flush`)

    def _checkpoint(self) -> None:
        """Copy the WAL into the database (PASSIVE: readers are not waited for), so that the
        next commit starts the WAL over; what it cannot copy now, a later one does."""
        self.since_checkpoint = 0
        with self.lock:
            assert self.cursor is not None
            try:
                self.cursor.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error:
                log.warning(
                    "a checkpoint of %s failed; the WAL grows until one succeeds", self.path
                )

    def _fail_until_stopped(self, exc: Exception) -> None:
        self.error = exc if isinstance(exc, StoreError) else store_error("cannot open", exc)
        self.ready.set()
        while (turn := self.turns.get()) is not None:
            _call_back(turn, None, fresh(self.error))  # none is made: the open failed

    def _fail_until_empty(self, error: BaseException) -> None:
        while True:
            try:
                turn = self.turns.get_nowait()
            except queue.Empty:
                return
            if turn is not None:
                _call_back(turn, None, error)


class _Committer:
    """The event loop's side of the writes.

    Writes queue here. At most one batch is under way: while it is, the writes that come
    queue behind it and go together in the next (group commit). A batch of appends runs on
    the loop (a few statements each and a commit that writes the WAL, tens of microseconds)
    and goes to the store's thread to be synced; a batch holding a snapshot or a rewrite (large
    writes), or one that finds the write lock taken, runs on the thread. Its writes resolve
    once the thread has synced the commit.

    Its state is guarded by `_lock`, since a store may serve another event loop (in another
    thread) once the writes of the first are done. Holds no reference to the store.
    """

    def __init__(self, writer: _Writer) -> None:
        self.writer = writer
        self.pending: list[_Job] = []
        self.busy = False
        # The thread is done with the batch under way, which waits for its loop to take it
        # back (`done`): a loop that stops and closes in between never does.
        self.back = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.synced = 0  # every batch begun up to this count is synced, or failed
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiters: list[asyncio.Future[None]] = []  # on `loop`, for the batch under way

    def add(self, job: _Job, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self.writer.stopping:
                raise closed_error()
            if loop is not self.loop:
                gone = self.loop is None or self.loop.is_closed()
                if gone and self.busy and self.back:
                    self._settle()  # nobody is left to take it back: it is over
                if self.busy or (self.pending and not gone):
                    raise UsageError(
                        "wrong_loop", "this SqliteStore has writes under way on another event loop"
                    )
                self.pending.clear()  # queued on a loop that closed: nobody awaits them
                self.loop = loop
            self.pending.append(job)
            start = len(self.pending) == 1 and not self.busy
        if start:
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Start the next batch (on the loop), unless one is under way."""
        w = self.writer
        with self._lock:
            if self.busy or not self.pending:
                return
            batch = self.pending[: w.max_batch]
            del self.pending[: w.max_batch]
            self.busy = True
            loop = self.loop
        assert loop is not None
        if w.broken is not None or w.stopping:
            self._finish(batch, None, closed_error() if w.broken is None else fresh(w.broken))
            return
        outcomes: Outcomes | None = None
        if all(job.is_append for job in batch):
            ran = self._commit_here(batch)
            if isinstance(ran, BaseException):
                self._finish(batch, None, ran)
                return
            outcomes = ran
            settled = w.since_checkpoint < CHECKPOINT_EVERY and not w.truncate_due
            if outcomes is not None and not w.syncs and settled:
                self._finish(batch, outcomes, None)  # durable as the level makes it
                return
        with self._lock:  # a turn is never queued behind the thread's stop request
            handed = not w.stopping
            if handed:
                w.turns.put(_Turn(batch, outcomes, loop, self))
        if not handed:
            self._finish(batch, None, closed_error())

    def _commit_here(self, batch: list[_Job]) -> Outcomes | BaseException | None:
        """Run and commit `batch` on the loop: its outcomes, the error that failed it whole,
        or None when another connection holds the write lock (the thread waits for it)."""
        w = self.writer
        with w.lock:  # never contended: the batch under way is ours (see `_Writer`)
            conn, cursor = w.conn, w.cursor
            if conn is None or cursor is None:
                return closed_error()
            w.begun += 1
            try:
                cursor.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                return None if _is_busy(exc) else store_error("cannot begin a write", exc)
            try:
                outcomes = _transact(conn, cursor, batch)
            except Exception as exc:
                return store_error("commit failed", exc)
        w.committed(batch, outcomes)
        return outcomes

    def done(self, turn: _Turn, outcomes: Outcomes | None, failure: BaseException | None) -> None:
        """The store's thread is done with `turn` (called on the loop)."""
        self._finish(turn.batch, outcomes, failure)

    def _finish(
        self, batch: list[_Job], outcomes: Outcomes | None, failure: BaseException | None
    ) -> None:
        if failure is not None or outcomes is None:
            # A commit that failed, or one whose sync failed: none of its writes resolves.
            for job in batch:  # one exception each: each caller raises its own
                _resolve(job.future, None, closed_error() if failure is None else fresh(failure))
        else:
            for job, (result, error) in zip(batch, outcomes, strict=True):
                _resolve(job.future, result, error)
        with self._lock:
            waiters, start, loop = self._settle()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        if start and loop is not None:
            loop.call_soon(self.flush)

    def returned(self) -> None:
        """The thread is done with the batch under way: synced, or failed (on the thread).
        Reads stop waiting for it now, whether or not its loop ever takes it back."""
        with self._lock:
            self.back = True
            self.synced = self.writer.begun
            self._changed.notify_all()

    def abandon(self) -> None:
        """The batch under way belongs to a loop that closed (called on the store's thread):
        nobody awaits it; let the store serve another loop."""
        with self._lock:
            self._settle()

    def _settle(self) -> tuple[list[asyncio.Future[None]], bool, asyncio.AbstractEventLoop | None]:
        """The batch under way is over (under `_lock`)."""
        self.busy = False
        self.back = False
        self.synced = self.writer.begun  # no other batch began meanwhile: it was the one
        self._changed.notify_all()
        waiters, self._waiters = self._waiters, []
        loop = self.loop
        start = bool(self.pending) and loop is not None and not loop.is_closed()
        return waiters, start, loop

    def stop(self) -> None:
        """No write is started or handed to the thread from now on."""
        with self._lock:
            self.writer.stopping = True
            self._changed.notify_all()

    async def synced_to(self, target: int) -> None:
        """Wait until every batch begun up to `target` (a `_Writer.begun`) is synced."""
        loop = asyncio.get_running_loop()
        while self.synced < target and not self.writer.stopping:
            if loop is self.loop:
                with self._lock:
                    if self.synced >= target:
                        return
                    waiter = loop.create_future()
                    self._waiters.append(waiter)
                await waiter
            else:
                await asyncio.to_thread(self._wait_synced, target)

    def _wait_synced(self, target: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self.synced >= target or self.writer.stopping)

    async def drained(self) -> None:
        """Wait until every write queued on this loop has resolved."""
        loop = asyncio.get_running_loop()
        while loop is self.loop and (self.busy or self.pending) and not self.writer.stopping:
            if not self.busy:
                self.flush()
            with self._lock:
                if not self.busy:
                    continue
                # Until the batch under way is over: a batch at the thread is only counted in
                # `begun` once the thread begins it, so waiting on that count would spin.
                waiter = loop.create_future()
                self._waiters.append(waiter)
            await waiter
