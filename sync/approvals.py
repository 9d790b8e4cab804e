"""Approvals, questions and frontend tools: a person in the loop (SPEC 12), pure.

How this works: an approval is an aside of kind `rig.approval`, drawn after the entry that
holds the call it is about, keyed by `(turn, key)` (`key` is the call id, or a name the
worker gives a question). Its value (`Approval`) moves through one small state machine:

    (absent) --ask--> open --decide--> approved | denied | answered
                          \\--cancel--> cancelled        (the asker, or the hub on a stop)

`check` is that machine for the hub core: it walks a push's records in order, over what the
log holds plus what the records before put, a `Reset` included (a reset is checked as the
aside changes it implies), and returns why the push may not land, or None. The rules:

- only the turn's owner asks, only `open`, only for the open turn, once per `(turn, key)`;
- a decision moves `open` to `approved`/`denied`/`answered` exactly once: a second decision,
  or a put or reset that would reopen, flip or remove a decided approval, is `decided`;
- `asked_by` / `decided_by` must be the pushing socket's `sub` (`forged` otherwise; the hub
  checks and never overwrites), and `asked_client` its client id;
- deciding needs the `approve` scope (`Actor.may_decide`), and the asker never decides its own
  approval: with auth no socket of the asking principal, without auth (every socket is
  `anonymous`) not the asking client;
- an answer must match the approval's JSON Schema (`answer_problem`, a documented subset:
  see `SCHEMA_KEYWORDS`), and a schema must stay within that subset.

A stop cancels the turn's open approvals in the push that carries it (`stop_cancels`, records
the hub makes). The replica side builds asks and decisions (`ask_value`, `decided_value`) and,
in a rebase, turns a pending decision on an approval the log decided meanwhile into a
`Conflict(decided)` (`decided_meanwhile`).

A frontend tool (SPEC 12) is a call a UI runs: the worker lists those tools in a `rig.tools`
aside (`frontend_tools`); the UI pushes the result and strict pairing refuses a second one.
A turn waiting only for a person (an open approval, or only frontend calls pending) is
*parked* (`parked`): its lease must not expire while its owner is away.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from .changes import AsideChange, ChangeRecord, Reset
from .entries import TURN_KIND, Aside, Author, TurnRecord
from .errors import UsageError
from .fold import Fold
from .ids import AsideId, MessageId
from .messages import Assistant, User
from .protocol import RejectReason
from .steer import STEP_KIND, open_turn

if TYPE_CHECKING:
    from .conversation import Conversation

__all__ = [
    "APPROVAL_KIND",
    "DECISIONS",
    "SCHEMA_KEYWORDS",
    "TOOLS_KIND",
    "Actor",
    "Approval",
    "ApprovalState",
    "Owner",
    "Refusal",
    "answer_problem",
    "approval_of",
    "approvals",
    "ask",
    "ask_value",
    "cancel",
    "cancelled_value",
    "check",
    "decide",
    "decided_meanwhile",
    "decided_value",
    "find",
    "frontend_tools",
    "is_decision",
    "open_turn",
    "parked",
    "schema_problem",
    "stop_cancels",
    "turn_owner",
]

APPROVAL_KIND: Final = "rig.approval"
"""An approval or a question: value an `Approval`."""
TOOLS_KIND: Final = "rig.tools"
"""The tools a UI runs (frontend tools): value `{"tools": [name, ...]}` (or a bare list)."""

ApprovalState = Literal["open", "approved", "denied", "answered", "cancelled"]
DECISIONS: Final[frozenset[str]] = frozenset({"approved", "denied", "answered"})
"""The states a person's decision moves an open approval to."""
MAX_REASON = 2000
"""Characters of a decision's or cancellation's `reason`."""
MAX_PROMPT = 10_000
"""Characters of a prompt (the question shown to the person)."""

Owner = tuple[str, str]
"""A turn's owner: (principal, client)."""
Refusal = tuple[RejectReason, str]
"""A reject reason (`sync.errors.REJECTS`) and a short detail."""


class Approval(msgspec.Struct, frozen=True, kw_only=True):
    """The value of a `rig.approval` aside (SPEC 12).

    `asked_client` goes past the spec's listing: the asker's client id, which the hub checks
    like `asked_by` when given, so that without auth (every socket `anonymous`) the asking
    client can still be told apart from the others and never decides its own approval (when
    it is left out, the turn owner's client stands for it, as far as the hub knows it)
    """

    turn: int
    key: str
    call: str | None = None
    prompt: str | None = None
    schema: Any = None
    state: ApprovalState = "open"
    answer: Any = None
    reason: str | None = None
    asked_by: str
    asked_client: str | None = None
    decided_by: str | None = None
    decided_at: int | None = None

    @property
    def is_open(self) -> bool:
        return self.state == "open"

    @property
    def approved(self) -> bool:
        """Whether the person said yes (approved, or answered a question)."""
        return self.state in ("approved", "answered")


_QUESTION_FIELDS = ("turn", "key", "call", "prompt", "schema", "asked_by", "asked_client")


class Actor(msgspec.Struct, frozen=True):
    """Who pushes: the socket's principal and client id; whether its grant holds `approve`;
    whether the hub checks tokens (identity by principal) or not (by client id)."""

    sub: str
    client: str
    may_decide: bool = True
    auth: bool = False

    @property
    def owner(self) -> Owner:
        return (self.sub, self.client)


def approval_of(aside: Aside | None) -> Approval | None:
    """The approval an aside holds; None when it is not a `rig.approval` or is malformed."""
    if aside is None or aside.kind != APPROVAL_KIND:
        return None
    try:
        return msgspec.convert(aside.value, Approval)
    except (msgspec.ValidationError, TypeError):
        return None


def approvals(conversation: Fold) -> Iterator[tuple[AsideId, Approval]]:
    """Every well-formed approval of `conversation`, in the order put."""
    for id_, aside in conversation._asides.items():
        if aside.kind == APPROVAL_KIND:
            approval = approval_of(aside)
            if approval is not None:
                yield id_, approval


def find(conversation: Fold, turn: int, key: str) -> tuple[AsideId, Approval] | None:
    """The approval keyed `(turn, key)`, if one was asked."""
    for id_, approval in approvals(conversation):
        if approval.turn == turn and approval.key == key:
            return id_, approval
    return None


def turn_owner(aside: Aside | None) -> Owner | None:
    """The owner a turn record names, `(sub, client)`, when it names one.

    Issue 26 makes turn records name their owner; until that lands, the log says nothing
    and this returns None (the hub core then falls back on who it saw put the record). The
    one place to align with `sync.steer`'s owner when it exists."""
    if aside is None or not isinstance(aside.value, dict):
        return None
    owner = aside.value.get("owner")
    if isinstance(owner, dict):
        sub, client = owner.get("sub"), owner.get("client")
        if isinstance(sub, str) and isinstance(client, str):
            return (sub, client)
    return None


def is_decision(record: ChangeRecord) -> bool:
    """Whether `record` puts an approval in a decided state (what the `approve` scope is
    for). The state machine (`check`) says whether it may."""
    change = record.change
    if type(change) is not AsideChange or change.aside is None:
        return False
    aside = change.aside
    if aside.kind != APPROVAL_KIND or not isinstance(aside.value, dict):
        return False
    return aside.value.get("state") in DECISIONS


# ------------------------------------------------------------------------- the machine


def check(
    conversation: Fold,
    records: Sequence[ChangeRecord],
    actor: Actor,
    owner_of: Callable[[AsideId], Owner | None] = lambda id_: None,
) -> Refusal | None:
    """Why `records`, pushed by `actor` onto `conversation`, may not land for the approval
    rules; None when they may. Nothing is changed.

    `owner_of(turn_aside_id)` gives who the hub saw open a turn, when the turn record does not
    name its owner itself (`turn_owner`); None: not known (then any writer may ask in it)."""
    base = conversation._asides
    overlay: dict[AsideId, Aside | None] = {}
    reset: dict[AsideId, Aside] | None = None
    opened: set[AsideId] = set()  # turn records this push puts: the actor owns them

    def current(id_: AsideId) -> Aside | None:
        if id_ in overlay:
            return overlay[id_]
        if reset is not None:
            return reset.get(id_)
        return base.get(id_)

    def view() -> Iterator[tuple[AsideId, Aside]]:
        start = base if reset is None else reset
        for id_, aside in start.items():
            if id_ not in overlay:
                yield id_, aside
        for id_, put in overlay.items():
            if put is not None:
                yield id_, put

    for record in records:
        change = record.change
        if type(change) is AsideChange:
            old = current(change.id)
            refusal = _transition(change.id, old, change.aside, actor, view, owner_of, opened)
            if refusal is not None:
                return refusal
            overlay[change.id] = change.aside
            if change.aside is not None and change.aside.kind == TURN_KIND:
                opened.add(change.id)
        elif type(change) is Reset:
            new = {saved.id: saved.aside for saved in change.state.asides}
            before = dict(view())

            def after_reset(new: dict[AsideId, Aside] = new) -> Iterator[tuple[AsideId, Aside]]:
                return iter(new.items())

            for id_ in [*before, *(id_ for id_ in new if id_ not in before)]:
                refusal = _transition(
                    id_, before.get(id_), new.get(id_), actor, after_reset, owner_of, opened
                )
                if refusal is not None:
                    return refusal
            reset, overlay = new, {}
    return None


def _transition(
    id_: AsideId,
    old: Aside | None,
    new: Aside | None,
    actor: Actor,
    view: Callable[[], Iterator[tuple[AsideId, Aside]]],
    owner_of: Callable[[AsideId], Owner | None],
    opened: set[AsideId],
) -> Refusal | None:
    was = old is not None and old.kind == APPROVAL_KIND
    now = new is not None and new.kind == APPROVAL_KIND
    if not was and not now:
        return None
    if was and old == new:
        return None  # put as it stands (a resend, a reset keeping it): no transition
    before = approval_of(old) if was else None
    after = approval_of(new) if now else None
    if now and after is None:
        return "invalid", "a rig.approval aside holds an approval (SPEC 12)"
    if before is not None and after is not None and before == after:
        return None  # moved (its `after`, as `normalize` moves asides), not changed
    if before is None:
        # Nothing, or a malformed approval put without these rules (a store from before
        # them): what goes in is an ask.
        assert after is not None
        return _ask(after, actor, view, owner_of, opened, id_)
    if after is None:
        if before.state == "open":
            return "invalid", "an open approval ends by a decision or a cancel, not a removal"
        return "decided", f"approval {before.key!r} was decided already ({before.state})"
    if before.state != "open":
        return "decided", f"approval {before.key!r} was decided already ({before.state})"
    if any(getattr(before, name) != getattr(after, name) for name in _QUESTION_FIELDS):
        return "invalid", "an approval's question never changes"
    if after.state == "open":
        return "invalid", "an open approval carries no decision"
    return _decide(before, after, actor, view, owner_of)


def _ask(
    approval: Approval,
    actor: Actor,
    view: Callable[[], Iterator[tuple[AsideId, Aside]]],
    owner_of: Callable[[AsideId], Owner | None],
    opened: set[AsideId],
    id_: AsideId,
) -> Refusal | None:
    if not approval.key or len(approval.key) > 256:
        return "invalid", "an approval's key is 1 to 256 characters"
    if approval.prompt is not None and len(approval.prompt) > MAX_PROMPT:
        return "invalid", f"a prompt is at most {MAX_PROMPT} characters"
    if approval.schema is not None:
        problem = schema_problem(approval.schema)
        if problem is not None:
            return "invalid", f"schema: {problem}"
    turn: tuple[AsideId, TurnRecord] | None = None  # the last turn record
    named: TurnRecord | None = None  # the one the approval names
    for other_id, aside in view():
        if aside.kind == TURN_KIND:
            record = _turn_of(aside)
            if record is not None:
                turn = (other_id, record)
                if record.index == approval.turn:
                    named = record
        elif aside.kind == APPROVAL_KIND and other_id != id_:
            other = approval_of(aside)
            if other is not None and (other.turn, other.key) == (approval.turn, approval.key):
                return "asked", f"an approval for turn {approval.turn}, {approval.key!r} exists"
    if approval.state != "open":
        # History: an ended turn's decided approval, as an import puts it back. Nobody can
        # wait on it (`ask` asks in the open turn), so nothing is forged by letting it in.
        if named is not None and named.end is not None:
            return None
        return "forged", "an approval is asked open, with no decision"
    if approval.decided_by is not None or approval.decided_at is not None:
        return "forged", "an approval is asked open, with no decision"
    if approval.answer is not None:
        return "forged", "an approval is asked open, with no decision"
    if approval.reason is not None:
        return "invalid", "an open approval has no reason yet"
    if approval.asked_by != actor.sub or approval.asked_client not in (None, actor.client):
        return "forged", "asked_by and asked_client must be the asking socket's"
    if turn is None or turn[1].index != approval.turn:
        return "turn_ended", f"turn {approval.turn} is not the open turn"
    if turn[1].end is not None:
        return "turn_ended", f"turn {approval.turn} has ended"
    if turn[0] in opened:
        return None  # this push opens the turn: its pusher owns it
    turn_aside = dict(view()).get(turn[0])
    owner = turn_owner(turn_aside) or owner_of(turn[0])
    if owner is not None and not _same(owner, actor):
        return "forbidden", "only the turn's owner asks in it"
    return None


def _decide(
    before: Approval,
    after: Approval,
    actor: Actor,
    view: Callable[[], Iterator[tuple[AsideId, Aside]]],
    owner_of: Callable[[AsideId], Owner | None],
) -> Refusal | None:
    if after.decided_by != actor.sub:
        return "forged", "decided_by must be the deciding socket's principal"
    if after.decided_at is not None and type(after.decided_at) is not int:
        return "invalid", "decided_at is a time in ms"
    if after.reason is not None and len(after.reason) > MAX_REASON:
        return "invalid", f"a reason is at most {MAX_REASON} characters"
    asked_client = before.asked_client
    if asked_client is None:  # left out (SPEC 12 does not list it): the turn's owner asked
        for turn_id, aside in view():
            record = _turn_of(aside) if aside.kind == TURN_KIND else None
            if record is not None and record.index == before.turn:
                owner = turn_owner(aside) or owner_of(turn_id)
                asked_client = owner[1] if owner is not None else None
    asker = (before.asked_by, asked_client)
    if after.state == "cancelled":
        if not _same(asker, actor):
            return "forbidden", "only the asker cancels an approval (a stop cancels it too)"
        return None
    if not actor.may_decide:
        return "forbidden", "deciding an approval needs the approve scope"
    if actor.sub == before.asked_by if actor.auth else actor.client == asked_client:
        return "forbidden", "the asker cannot decide its own approval"
    if after.state == "denied":
        if after.answer is not None:
            return "invalid", "a denial carries no answer"
    elif before.schema is not None:
        problem = answer_problem(before.schema, after.answer)
        if problem is not None:
            return "bad_answer", problem
    elif after.state == "answered" and after.answer is None:
        return "bad_answer", "a question is answered with a value"
    for _, aside in view():
        if aside.kind == TURN_KIND:
            record = _turn_of(aside)
            if record is not None and record.index == before.turn and record.end is not None:
                return "turn_ended", f"turn {before.turn} has ended"
    return None


def _same(owner: tuple[str, str | None], actor: Actor) -> bool:
    """Whether `actor` is `owner`: the same principal and client (without auth every
    principal is `anonymous`, so that is the client)."""
    return owner == actor.owner


def _turn_of(aside: Aside) -> TurnRecord | None:
    try:
        return msgspec.convert(aside.value, TurnRecord)
    except (msgspec.ValidationError, TypeError):
        return None


def stop_cancels(
    conversation: Fold, records: Sequence[ChangeRecord], at: int
) -> list[ChangeRecord]:
    """The records the hub adds when `records` (folded into `conversation` already) put a
    stop request (`rig.stop`): each open approval of the stopped turn (every open one when
    the stop names no turn) cancelled, reason `stopped`, authored `rig`, dated `at`. In the
    same append as the stop, so no decision can land between them."""
    turns: list[int | None] = []
    for record in records:
        change = record.change
        if type(change) is AsideChange and change.aside is not None:
            if change.aside.kind == "rig.stop":
                value = change.aside.value
                turn = value.get("turn") if isinstance(value, dict) else None
                turns.append(turn if type(turn) is int else None)
    if not turns:
        return []
    rig = Author.rig()
    cancels = []
    for id_, approval in approvals(conversation):
        if approval.is_open and (None in turns or approval.turn in turns):
            aside = conversation._asides[id_]
            value = cancelled_value(approval, None, at, "stopped")
            put = Aside(APPROVAL_KIND, aside.after, rig, value)
            cancels.append(ChangeRecord(AsideChange(id_, put), rig, at))
    return cancels


# ------------------------------------------------------------------------- building


def ask_value(
    *,
    turn: int,
    key: str,
    asked_by: str,
    asked_client: str,
    call: str | None = None,
    prompt: str | None = None,
    schema: Any = None,
) -> dict[str, Any]:
    """The value of a new (open) approval, as plain JSON."""
    approval = Approval(
        turn=turn,
        key=key,
        call=call,
        prompt=prompt,
        schema=schema,
        asked_by=asked_by,
        asked_client=asked_client,
    )
    return msgspec.to_builtins(approval)  # type: ignore[no-any-return]


def decided_value(
    approval: Approval,
    *,
    approve: bool,
    answer: Any,
    reason: str | None,
    decided_by: str,
    at: int,
) -> dict[str, Any]:
    """The value of `approval` decided by `decided_by` at `at` (ms): `denied`, `answered`
    (a question: one with a schema, or given an answer) or `approved`."""
    state: ApprovalState = "approved"
    if not approve:
        state, answer = "denied", None
    elif approval.call is None and (answer is not None or approval.schema is not None):
        state = "answered"
    decided = msgspec.structs.replace(
        approval, state=state, answer=answer, reason=reason, decided_by=decided_by, decided_at=at
    )
    return msgspec.to_builtins(decided)  # type: ignore[no-any-return]


def cancelled_value(
    approval: Approval, decided_by: str | None, at: int, reason: str
) -> dict[str, Any]:
    """The value of `approval` cancelled (by its asker, or by the hub on a stop: `None`)."""
    cancelled = msgspec.structs.replace(
        approval, state="cancelled", reason=reason, decided_by=decided_by, decided_at=at
    )
    return msgspec.to_builtins(cancelled)  # type: ignore[no-any-return]


def ask(
    conversation: Conversation,
    *,
    key: str,
    asked_by: str,
    asked_client: str,
    call: str | None = None,
    prompt: str | None = None,
    schema: Any = None,
) -> tuple[AsideId, Approval, bool]:
    """Ask in `conversation`'s open turn (an edit: one aside put), or find the approval
    asked already for `(turn, key)`: its id, the approval, and whether this call asked it.

    Raises:
        UsageError: `no_turn` when no turn record is open; `bad_schema` when `schema` is not
            in the supported subset; `bad_key` for an empty or over-long key.
    """
    turn = open_turn(conversation)
    if turn is None:
        raise UsageError("no_turn", "ask in an open turn: call conversation.open_turn() first")
    index = turn[1].index
    found = find(conversation, index, key)
    if found is not None:
        return found[0], found[1], False
    if not key or len(key) > 256:
        raise UsageError("bad_key", "an approval's key is 1 to 256 characters")
    if schema is not None:
        problem = schema_problem(schema)
        if problem is not None:
            raise UsageError("bad_schema", f"schema: {problem}")
    after = _holding(conversation, call) if call is not None else None
    if after is None and len(conversation):
        after = conversation.id(len(conversation) - 1)
    value = ask_value(
        turn=index,
        key=key,
        asked_by=asked_by,
        asked_client=asked_client,
        call=call,
        prompt=prompt,
        schema=schema,
    )
    id_ = conversation.add_aside(Aside(APPROVAL_KIND, after, Author.rig(), value))
    return id_, msgspec.convert(value, Approval), True


def decide(
    conversation: Conversation,
    id_: AsideId,
    *,
    approve: bool,
    decided_by: str,
    at: int,
    answer: Any = None,
    reason: str | None = None,
) -> Approval:
    """Decide approval `id_` in `conversation` (an edit: the aside replaced); returns the
    decided approval.

    Raises:
        UsageError: `no_approval` when `id_` is no approval here; `decided` when it is not
            open any more (someone decided first, or it was cancelled); `bad_answer` when
            the answer does not match the schema (nothing changed then).
    """
    aside = conversation.aside(id_)
    approval = approval_of(aside)
    if aside is None or approval is None:
        raise UsageError("no_approval", f"{id_} is not an approval here")
    if not approval.is_open:
        raise UsageError("decided", f"approval {approval.key!r} is {approval.state} already")
    value = decided_value(
        approval, approve=approve, answer=answer, reason=reason, decided_by=decided_by, at=at
    )
    decided = msgspec.convert(value, Approval)
    if decided.state != "denied" and approval.schema is not None:
        problem = answer_problem(approval.schema, decided.answer)
        if problem is not None:
            raise UsageError("bad_answer", problem)
    if reason is not None and len(reason) > MAX_REASON:
        raise UsageError("bad_reason", f"a reason is at most {MAX_REASON} characters")
    conversation.replace_aside(id_, Aside(APPROVAL_KIND, aside.after, Author.user(), value))
    return decided


def cancel(
    conversation: Conversation, id_: AsideId, *, decided_by: str, at: int, reason: str
) -> bool:
    """Cancel the open approval `id_` (its asker gives up: a timeout); whether it was open."""
    aside = conversation.aside(id_)
    approval = approval_of(aside)
    if aside is None or approval is None or not approval.is_open:
        return False
    value = cancelled_value(approval, decided_by, at, reason)
    conversation.replace_aside(id_, Aside(APPROVAL_KIND, aside.after, aside.author, value))
    return True


def _holding(conversation: Conversation, call: str) -> MessageId | None:
    """The id of the last entry holding tool call `call`."""
    for at in range(len(conversation) - 1, -1, -1):
        entry = conversation.entry(at)
        message = entry.message if entry is not None else None
        if type(message) is Assistant and any(c.id == call for c in message.tool_calls()):
            return conversation.id(at)
    return None


def decided_meanwhile(then: Aside | None, held: Aside | None, pending: Aside | None) -> bool:
    """The rebase rule (SPEC 12): whether a pending put of an approval, made on `then`, meets
    the log's `held` decided meanwhile (its state moved on from `then`'s): the pending record
    is a `Conflict(decided)`, and the log's decision stands."""
    if pending is None or pending.kind != APPROVAL_KIND or held is None or held == pending:
        return False
    logged = approval_of(held)
    if logged is None or logged.is_open:
        return False
    base = approval_of(then)
    return base is None or base.state != logged.state or base != logged


# ------------------------------------------------------------------------- frontend tools


def frontend_tools(conversation: Fold) -> set[str]:
    """The names of the tools a UI runs, from every `rig.tools` aside."""
    names: set[str] = set()
    for aside in conversation._asides.values():
        if aside.kind != TOOLS_KIND:
            continue
        value = aside.value
        tools = value.get("tools") if isinstance(value, dict) else value
        if isinstance(tools, list):
            for tool in tools:
                name = tool.get("name") if isinstance(tool, dict) else tool
                if isinstance(name, str):
                    names.add(name)
    return names


def parked(conversation: Fold, turn: int | None = None) -> bool:
    """Whether the turn (the open one when `turn` is None) waits only for a person: no model
    call is under way (no `rig.step` stands) and an open approval of it stands, or every call
    pending is a frontend tool's (SPEC 10, 12). The one place that says it. A parked
    turn's lease does not expire while its owner is away."""
    if any(aside.kind == STEP_KIND for aside in conversation._asides.values()):
        return False  # a model call is under way: not waiting for a person
    if turn is None:
        found = open_turn(conversation)
        if found is None:
            return False
        turn = found[1].index
    if any(a.is_open and a.turn == turn for _, a in approvals(conversation)):
        return True
    pending = _pending_names(conversation)
    return bool(pending) and pending <= frontend_tools(conversation)


def _pending_names(conversation: Fold) -> set[str]:
    """The tool names of the calls the last assistant message left unanswered."""
    answered: dict[str, int] = {}
    entries = conversation._entries
    for at in range(len(entries) - 1, -1, -1):
        message = entries[at].message
        if type(message) is User:
            for result in message.tool_results():
                answered[result.call_id] = answered.get(result.call_id, 0) + 1
        elif type(message) is Assistant:
            names = set()
            for call in message.tool_calls():
                if answered.get(call.id, 0) > 0:
                    answered[call.id] -= 1
                else:
                    names.add(call.name)
            return names
    return set()


# ------------------------------------------------------------------------- JSON Schema subset

SCHEMA_KEYWORDS: Final[frozenset[str]] = frozenset(
    {
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)
"""The JSON Schema keywords an approval's schema may use (what a form for a simple question
needs). A schema with any other validation keyword is refused when asked, so an answer is
never accepted against a rule that was silently skipped; `pattern` is left out on purpose
(Python's and JavaScript's regular expressions differ)."""
ANNOTATIONS: Final[frozenset[str]] = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated"}
)
"""Keywords that describe and do not validate: allowed, ignored."""
_TYPES: Final = ("null", "boolean", "integer", "number", "string", "array", "object")
MAX_DEPTH = 16
"""How deep a schema (and an answer checked against it) may nest."""


def schema_problem(schema: Any, depth: int = 0) -> str | None:
    """Why `schema` is not a schema of the supported subset (`SCHEMA_KEYWORDS`), or None."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return "a schema is an object or a boolean"
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH}"
    for word, value in schema.items():
        if word in ANNOTATIONS:
            continue
        if word not in SCHEMA_KEYWORDS:
            return f"unsupported keyword {word!r}"
        if word == "type":
            types = value if isinstance(value, list) else [value]
            if not types or not all(isinstance(t, str) and t in _TYPES for t in types):
                return "type names one or more of " + ", ".join(_TYPES)
        elif word == "enum":
            if not isinstance(value, list) or not value:
                return "enum is a non-empty array"
        elif word == "properties":
            if not isinstance(value, dict):
                return "properties is an object of schemas"
            for sub in value.values():
                problem = schema_problem(sub, depth + 1)
                if problem is not None:
                    return problem
        elif word == "required":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                return "required is an array of names"
        elif word in ("additionalProperties", "items"):
            problem = schema_problem(value, depth + 1)
            if problem is not None:
                return problem
        elif word in ("minItems", "maxItems", "minLength", "maxLength"):
            if type(value) is not int or value < 0:
                return f"{word} is a non-negative integer"
        elif word in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if not _is_number(value):
                return f"{word} is a number"
    return None


def answer_problem(schema: Any, value: Any, path: str = "answer", depth: int = 0) -> str | None:
    """Why `value` does not match `schema` (the supported subset), or None. The message says
    where (`answer.name`, `answer[2]`) and what was expected."""
    if schema is True:
        return None
    if schema is False or not isinstance(schema, dict):
        return f"{path}: no value is allowed here"
    if depth > MAX_DEPTH:
        return f"{path}: nested deeper than {MAX_DEPTH}"
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, t) for t in types):
            return f"{path}: expected {' or '.join(types)}"
    if "const" in schema and not _json_equal(value, schema["const"]):
        return f"{path}: expected {_show(schema['const'])}"
    if "enum" in schema and not any(_json_equal(value, v) for v in schema["enum"]):
        return f"{path}: expected one of {', '.join(_show(v) for v in schema['enum'])}"
    if isinstance(value, str):
        length = len(value)  # code points, as JSON Schema counts (the JS side uses for...of)
        if "minLength" in schema and length < schema["minLength"]:
            return f"{path}: at least {schema['minLength']} characters"
        if "maxLength" in schema and length > schema["maxLength"]:
            return f"{path}: at most {schema['maxLength']} characters"
    if _is_number(value):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: at least {_show(schema['minimum'])}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: at most {_show(schema['maximum'])}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return f"{path}: more than {_show(schema['exclusiveMinimum'])}"
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            return f"{path}: less than {_show(schema['exclusiveMaximum'])}"
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            return f"{path}: at least {schema['minItems']} items"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"{path}: at most {schema['maxItems']} items"
        if "items" in schema:
            for at, item in enumerate(value):
                problem = answer_problem(schema["items"], item, f"{path}[{at}]", depth + 1)
                if problem is not None:
                    return problem
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                return f"{path}: {name!r} is required"
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            sub = properties.get(name, extra)
            problem = answer_problem(sub, item, f"{path}.{name}", depth + 1)
            if problem is not None:
                if name not in properties and sub is False:
                    return f"{path}: {name!r} is not allowed"
                return problem
    return None


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _is_type(value: Any, name: str) -> bool:
    match name:
        case "null":
            return value is None
        case "boolean":
            return type(value) is bool
        case "integer":
            return type(value) is int or (type(value) is float and value.is_integer())
        case "number":
            return _is_number(value)
        case "string":
            return type(value) is str
        case "array":
            return type(value) is list
        case "object":
            return type(value) is dict
    return False


def _json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: `true` is not `1`, `1` is `1.0`."""
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if type(a) is list and type(b) is list:
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict and type(b) is dict:
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _show(value: Any) -> str:
    return msgspec.json.encode(value).decode()
