"""The log as a replica holds it: its value (`confirmed`) and the lag, in one object.

How this works: `ReplicaSession.local` is what the application edits. While nothing is pending
(the common case of a subscriber), records from the log fold into `local` alone and are kept
here as the *lag*: `confirmed` plus the lag is the log. `value()` (the session's `confirmed`)
catches up only when something reads it, by folding the lag: valid whatever `local` holds by
then. `revision` and `lineage` count the lag without folding it.

Once the lag outgrows `max(lag_floor, len(local) // 4)` records while nothing is pending,
`local` equals the log, so `confirmed` and the lag are dropped (`shares_local`): `local` alone
stands for the log, and each record costs one fold and nothing more. The log's value is set
apart again, as a copy of `local` (O(len(local))), right before the application's next edit
(`Conversation.before_edit`), or when something reads it. A pure subscriber (a viewer, a
dashboard) so holds one value, not two.

The session decides *when* records go where (its phase, what is pending); this object only
keeps the value and the lag consistent, so no handler of the session touches the lag itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sync import ChangeRecord, Conversation, Lineage
from sync.errors import RemoteProtocolError
from sync.protocol import Records

from .events import Applied, Event

__all__ = ["LogView", "fold", "unseen"]


class LogView:
    """The log's value at `revision` as one replica last saw it, and its lag.

    Args:
        local: the session's `local`, which the lag is folded into.
        idle: whether the session has nothing in flight (nor records held behind it): only
            then may `local` alone stand for the log.
        floor: the longest lag always allowed before `confirmed` is dropped (the session's
            `lag_floor`, read each time the lag passes its last limit).
    """

    __slots__ = (
        "_confirmed",
        "_floor",
        "_idle",
        "_lag",
        "_lag_limit",
        "_lineage",
        "_revision",
        "local",
    )

    def __init__(
        self, local: Conversation, idle: Callable[[], bool], floor: Callable[[], int]
    ) -> None:
        self.local = local
        self._idle = idle
        self._floor = floor
        # None: dropped, `local` is the log (at `_lineage`/`_revision`), nothing pending.
        self._confirmed: Conversation | None = Conversation()
        self._lineage = Lineage.EMPTY  # the log's, while `_confirmed` is None
        self._revision = 0
        self._lag: list[ChangeRecord] = []  # folded into `local` only, not yet into `_confirmed`
        self._lag_limit = 0  # the lag's length that makes `_bound_lag` look again

    # ------------------------------------------------------------------ reads

    def value(self) -> Conversation:
        """The log's value at `revision` (the session's `confirmed`): folds the lag in, or
        copies `local` when no separate value is kept."""
        confirmed = self._confirmed
        if confirmed is None:
            return self.set_apart()
        self.fold_lag()
        return confirmed

    @property
    def revision(self) -> int:
        """The log's revision, counting the lag (without folding or copying anything)."""
        confirmed = self._confirmed
        if confirmed is None:
            return self._revision
        return confirmed.revision + len(self._lag)

    @property
    def lineage(self) -> int:
        """The lineage of the log."""
        confirmed = self._confirmed
        return self._lineage if confirmed is None else confirmed.lineage

    @property
    def lagging(self) -> int:
        """Records folded into `local` alone so far: what `value()` would fold."""
        return len(self._lag)

    @property
    def shares_local(self) -> bool:
        """Whether `local` alone holds the log's value now (no separate `confirmed` kept)."""
        return self._confirmed is None

    # ------------------------------------------------------------------ records in

    def follow(self, message: Records) -> list[Event]:
        """Records for a session with nothing pending or in flight, caught up: fold them into
        `local` alone and keep them as the lag (or only count them, while `local` alone stands
        for the log). This is a subscriber's whole cost per record, so it stays lean.

        Raises:
            RemoteProtocolError: `gap` or `diverged`.
        """
        confirmed = self._confirmed
        lag = self._lag
        revision = self._revision if confirmed is None else confirmed.revision + len(lag)
        records = message.records
        if message.from_ != revision:
            records = unseen(message, revision)
            if not records:
                return []
        self.fold_into_local(records)
        if confirmed is not None and len(lag) > self._lag_limit:
            self._bound_lag()
        return [Applied(len(records), revision + len(records))]

    def fold_into_local(self, records: Sequence[ChangeRecord]) -> None:
        """Fold records of the log into `local` alone. What fitted counts toward the log: kept
        in the lag beside `confirmed`, or counted in `revision` while `local` alone stands for
        the log.

        Raises:
            RemoteProtocolError: `diverged`, at the first record that does not fit.
        """
        local = self.local
        before = local.revision
        try:
            if len(records) == 1:  # the common case: as cheap as it gets
                local.apply(records[0])
            else:
                apply = local.apply
                for record in records:
                    apply(record)
        except Exception as exc:
            raise RemoteProtocolError(
                "diverged", f"a record from the hub does not fit: {exc}"
            ) from exc
        finally:
            fitted = local.revision - before
            if self._confirmed is None:
                self._revision += fitted
            else:
                self._lag += records if fitted == len(records) else records[:fitted]

    def bound(self) -> None:
        """Look at the lag's length after `fold_into_local` (`follow` does it itself)."""
        if self._confirmed is not None and len(self._lag) > self._lag_limit:
            self._bound_lag()

    def fold(self, records: Sequence[ChangeRecord]) -> Conversation:
        """Fold records of the log into `confirmed` (the lag first); returns `confirmed`."""
        confirmed = self.value()
        fold(confirmed, records)
        return confirmed

    # ------------------------------------------------------------------ the value itself

    def replace(self, value: Conversation, *, pending: bool) -> Conversation | None:
        """Take `value` (the log's state from the hub) as `confirmed`. Returns the value it
        replaces when records are `pending` (a rebase needs their base), else None: then the
        lag is dropped unread and `local`'s hook taken off."""
        old: Conversation | None = None
        if not pending:
            self._lag = []  # nothing pending: no rebase needs the old value as a base
            self.local.before_edit(None)
        else:
            old = self.value()
        self._confirmed = value
        return old

    def unshare(self) -> None:
        """Keep `confirmed` apart from `local` again, if it was dropped (the lag is kept)."""
        if self._confirmed is None:
            self.set_apart()

    def set_apart(self) -> Conversation:
        """`local` alone stood for the log: copy it into `confirmed` again (O(len(local))),
        right before the application's first edit or whatever else needs the log's value."""
        local = self.local
        local.before_edit(None)
        lineage, revision = self._lineage, self._revision
        fresh = Conversation()
        if local.revision == revision and not local.has_unsaved:
            fresh.reread(local)  # its unsaved asides stay out
            # `local` may still carry the lineage it began with (EMPTY) when its log was empty.
            fresh.continue_log(lineage, revision)
        # Else `local` was changed outside the session (`apply`, `take_unsaved`...): which
        # part is the log's is unknown, so forget the log. The next push or catch-up starts
        # from an empty log, and the hub answers with the log's state; `local` is rebased on
        # it, as after any catch-up.
        self._confirmed = fresh
        self._lag_limit = 0  # the next record sets the lag's limit again
        return fresh

    def fold_lag(self) -> None:
        """Bring `confirmed` up to `revision`: valid whatever `local` holds by now."""
        lag = self._lag
        if lag:
            confirmed = self._confirmed
            assert confirmed is not None  # a lag is kept only beside a `confirmed`
            # These records fitted `local` when it equalled `confirmed` plus the lag before
            # them, so they fit here too.
            fold(confirmed, lag)
            self._lag = []

    def _bound_lag(self) -> None:
        """The lag passed its last limit: drop `confirmed` when it passes the current one,
        max(lag_floor, len(local) // 4), and note the limit for the next records."""
        limit = max(self._floor(), len(self.local) >> 2)
        if len(self._lag) > limit:
            self._drop_confirmed()
        self._lag_limit = limit

    def _drop_confirmed(self) -> None:
        """Nothing pending: `local` holds exactly `confirmed` plus the lag (and maybe unsaved
        asides, which are not the log's), so let `local` alone stand for the log until the
        application's next edit: no copy kept, no lag, one fold per record from now on."""
        old = self._confirmed
        assert old is not None
        revision = old.revision + len(self._lag)
        local = self.local
        if local.revision != revision or local.has_unsaved or not self._idle():
            self.fold_lag()  # `local` is not the log (an application misusing it): fold
            return
        self._lineage, self._revision = old.lineage, revision
        self._confirmed = None
        self._lag = []
        local.before_edit(self.set_apart)


def fold(conversation: Conversation, records: Sequence[ChangeRecord]) -> None:
    """Apply records from the hub to `conversation`.

    Raises:
        RemoteProtocolError: `diverged`, a record does not fit.
    """
    try:
        for record in records:
            conversation.apply(record)
    except Exception as exc:
        raise RemoteProtocolError("diverged", f"a record from the hub does not fit: {exc}") from exc


def unseen(message: Records, revision: int) -> list[ChangeRecord]:
    """The records of `message` past `revision`, the last one held (a catch-up may overlap
    what came live).

    Raises:
        RemoteProtocolError: `gap`, the message starts past `revision`.
    """
    skip = revision - message.from_
    if skip < 0:
        raise RemoteProtocolError("gap", f"records from {message.from_}, at {revision}")
    return message.records[skip:]
