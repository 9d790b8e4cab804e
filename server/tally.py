"""A conversation's running totals for its summary row (SPEC 17), kept from the records that land.

How this works: the hub's room core keeps one `Tally` beside its conversation. `rebuild` reads
the conversation once (after a load, a reload or a rewrite); `track` follows the records that
land, O(records): no change ever rereads the log. What it keeps:

- usage: the sum of the committed assistant messages' `usage`, over the entries the
  conversation holds now (a splice that takes a reply out takes its usage out; an edit in place
  replaces it), so the figure is exact whatever path the records took (a resend lands once, a
  placed or rebased push lands as it is appended, a restart rebuilds from the log). Each reply's
  usage is kept by entry id, so a splice, which names the ids it removes, can subtract them.
- the `rig.queued` asides standing (SPEC 10) and the open `rig.approval` asides (SPEC 12),
  by id;
- the turn records' indexes, so the row's turn is read from the latest one alone.

Pure: no I/O, like the core that holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from sync.changes import AsideChange, ChangeRecord, Push, Reset, Splice
from sync.conversation import Conversation
from sync.entries import TURN_KIND, Aside, Entry
from sync.ids import AsideId, MessageId
from sync.kinds import ASSISTANT, SPLICE, TOUCHES
from sync.messages import Assistant, Usage
from sync.steer import QUEUED_KIND

__all__ = ["APPROVAL_KIND", "USAGE_FIELDS", "Tally", "is_open_approval"]

APPROVAL_KIND: Final = "rig.approval"
USAGE_FIELDS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def is_open_approval(aside: Aside) -> bool:
    """Whether `aside` is an approval (or question) still waiting for a decision (SPEC 12:
    kind `rig.approval`, value `state == "open"`)."""
    value = aside.value
    return aside.kind == APPROVAL_KIND and isinstance(value, dict) and value.get("state") == "open"


class Tally:
    """The totals of one conversation's summary row: usage, queued input, open approvals, the
    latest turn record. Read `usage()`, `queued`, `approvals`, `latest_turn`."""

    __slots__ = ("_replies", "_sums", "_turns", "approvals", "latest_turn", "queued")

    KINDS: Final = ASSISTANT | SPLICE | TOUCHES
    """The kinds of record (`sync.kinds`) `track` looks at: records of no other kind (the
    user's text, a halt) change no total, and the hub skips `track` for them."""

    def __init__(self) -> None:
        self._replies: dict[MessageId, Usage] = {}  # entry id -> the usage its reply reported
        self._sums = [0] * len(USAGE_FIELDS)
        self.queued: set[AsideId] = set()
        self.approvals: set[AsideId] = set()  # the open ones
        self._turns: dict[AsideId, int] = {}  # turn record -> its index
        self.latest_turn: AsideId | None = None

    def usage(self) -> dict[str, int] | None:
        """The summed usage, field by field (a field a reply did not report counts 0); None
        when no committed reply reported any."""
        if not self._replies:
            return None
        return dict(zip(USAGE_FIELDS, self._sums, strict=True))

    def rebuild(self, conversation: Conversation) -> None:
        """Take the totals of `conversation` as it is now (one read of it)."""
        self.__init__()  # type: ignore[misc]
        held = (conversation.entry(at) for at in range(len(conversation)))
        self._add([entry for entry in held if entry is not None])
        for id_, aside in conversation.asides():
            self._put(id_, aside)

    def track(self, conversation: Conversation, records: Sequence[ChangeRecord]) -> None:
        """Follow `records`, folded into `conversation` already (a reset rereads it)."""
        for record in records:
            change = record.change
            if type(change) is Push:
                self._add(change.entries)
            elif type(change) is Splice:
                for id_ in change.removed:
                    self._subtract(id_)
                self._add(change.entries)
            elif type(change) is AsideChange:
                self._drop(change.id)
                if change.aside is not None:
                    self._put(change.id, change.aside)
            elif type(change) is Reset:
                self.rebuild(conversation)

    # ------------------------------------------------------------------ usage

    def _add(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            message = entry.message
            if type(message) is not Assistant or message.usage is None or entry.id is None:
                continue
            self._subtract(entry.id)  # never counted twice under one id
            self._replies[entry.id] = message.usage
            self._count(message.usage, 1)

    def _subtract(self, id_: MessageId) -> None:
        usage = self._replies.pop(id_, None)
        if usage is not None:
            self._count(usage, -1)

    def _count(self, usage: Usage, sign: int) -> None:
        sums = self._sums
        for at, name in enumerate(USAGE_FIELDS):
            value: Any = getattr(usage, name)
            if isinstance(value, int) and not isinstance(value, bool):
                sums[at] += sign * value

    # ------------------------------------------------------------------ asides

    def _put(self, id_: AsideId, aside: Aside) -> None:
        kind = aside.kind
        if kind == QUEUED_KIND:
            self.queued.add(id_)
        elif kind == TURN_KIND:
            value = aside.value
            index = value.get("index") if isinstance(value, dict) else None
            if isinstance(index, int) and not isinstance(index, bool):
                self._turns[id_] = index
                latest = self.latest_turn
                if latest is None or index >= self._turns.get(latest, -1):
                    self.latest_turn = id_
        elif is_open_approval(aside):
            self.approvals.add(id_)

    def _drop(self, id_: AsideId) -> None:
        self.queued.discard(id_)
        self.approvals.discard(id_)
        if self._turns.pop(id_, None) is not None and id_ == self.latest_turn:
            turns = self._turns
            self.latest_turn = max(turns, key=turns.__getitem__) if turns else None
