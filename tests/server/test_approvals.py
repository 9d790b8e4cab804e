"""Approvals and questions (SPEC 12) on the hub's real core without sockets: asked by the
turn's owner, decided exactly once by someone else, every identity checked, answers checked
against their schema, cancelled by a stop; and the `approve` scope."""

from __future__ import annotations

import math
from typing import Any

import pytest
from fakelink import NOW, FakeHub, Link, settle

from client.session import ApprovalAsked, ApprovalDecided, Conflict, ReplicaSession
from server.auth import Grant
from sync import (
    Aside,
    AsideChange,
    Assistant,
    ChangeRecord,
    Conversation,
    Halt,
    Message,
    Text,
    ToolCall,
    TurnEnd,
)
from sync import approvals as ap
from sync.changes import HaltChange, Reset
from sync.errors import REJECTS, UsageError
from sync.protocol import DraftOp

CALL = Assistant([Text("may I?"), ToolCall("c1", "delete", {"path": "build/"})])


def _grant(sub: str, scopes: str) -> Grant:
    return Grant(sub, frozenset(scopes.split()), ("*",), exp=math.inf)  # type: ignore[arg-type]


def _asked(
    *, auth: bool = False, uis: int = 2, ui_scopes: str = "read approve", schema: Any = None
) -> tuple[FakeHub, Link, list[Link], str]:
    """A worker in an open turn that asked about its call `c1`; `uis` UIs watching."""
    hub = FakeHub(auth=auth)
    worker = hub.link(ReplicaSession("worker"), _grant("worker", "read write"))
    ui_links = [
        hub.link(ReplicaSession(f"ui{k}"), _grant(f"person{k}", ui_scopes)) for k in range(uis)
    ]
    links = [worker, *ui_links]
    settle(links)
    local = worker.session.local
    local.push(Message.user("clean up"))
    local.open_turn()
    local.push(CALL)
    settle(links)
    assert worker.session.sub is not None
    id_, approval, made = ap.ask(
        local,
        key="c1",
        call="c1",
        prompt="delete build/?",
        schema=schema,
        asked_by=worker.session.sub,
        asked_client="worker",
    )
    assert made and approval.is_open
    settle(links)
    assert _state(hub, id_) == "open", hub.rejected
    return hub, worker, ui_links, id_


def _state(hub: FakeHub, id_: str) -> str | None:
    approval = ap.approval_of(hub.conversation.aside(id_))
    return None if approval is None else approval.state


def _decide(link: Link, id_: str, approve: bool = True, **kwargs: Any) -> ap.Approval:
    sub = link.session.sub
    assert sub is not None
    return ap.decide(link.session.local, id_, approve=approve, decided_by=sub, at=NOW, **kwargs)


def _replace(link: Link, id_: str, **fields: Any) -> None:
    """Put approval `id_` with `fields` changed, past every local check (a hostile client)."""
    local = link.session.local
    aside = local.aside(id_)
    assert aside is not None
    local.replace_aside(id_, Aside(aside.kind, aside.after, aside.author, aside.value | fields))


def _conflicts(link: Link) -> list[str]:
    return [event.reason for event in link.events if isinstance(event, Conflict)]


def _records(hub: FakeHub, kind: str = ap.APPROVAL_KIND) -> list[ChangeRecord]:
    return [
        r
        for r in hub.log
        if isinstance(r.change, AsideChange)
        and r.change.aside is not None
        and r.change.aside.kind == kind
    ]


# ---------------------------------------------------------------------- once only


def test_a_decision_lands_once_and_everyone_sees_who_made_it() -> None:
    """The worker asks, a UI approves: everyone holds the decision and its author."""
    hub, worker, (ui, other), id_ = _asked(auth=True)
    assert any(isinstance(e, ApprovalAsked) and e.id == id_ for e in ui.events)
    _decide(ui, id_, reason="fine")
    settle([worker, ui, other])
    held = ap.approval_of(hub.conversation.aside(id_))
    assert held is not None and held.state == "approved" and held.decided_by == "person0"
    assert held.reason == "fine" and held.asked_by == "worker"
    decided = [e for e in worker.events if isinstance(e, ApprovalDecided)]
    assert [e.approval.state for e in decided] == ["approved"]
    for link in (worker, ui, other):
        assert link.session.local == hub.conversation


def test_two_racing_decisions_one_lands_the_other_is_a_conflict_decided() -> None:
    """Two UIs decide from the same revision, both pushes reach the hub: the first lands,
    the second is rejected `decided` and comes back as a `Conflict(decided)`."""
    hub, worker, (a, b), id_ = _asked()
    _decide(a, id_, approve=True)
    _decide(b, id_, approve=False)
    assert a.pump() and b.pump()
    assert a.deliver_to_hub() and b.deliver_to_hub()
    settle([worker, a, b])
    assert _state(hub, id_) == "approved"
    assert "decided" in hub.rejected
    assert _conflicts(b) == ["decided"] and _conflicts(a) == []
    assert len(_records(hub)) == 2  # the ask and one decision
    for link in (worker, a, b):
        assert link.session.local == hub.conversation


def test_a_losing_decision_is_the_only_conflict_and_the_message_typed_with_it_lands() -> None:
    """A UI decides and types a message, one push; another UI decided first: the hub refuses
    the batch `decided`, the decision comes back as the conflict, the message still lands
    (the steering chaos lost such messages, `tests/chaos/steering.py --seeds 115:116`). The
    call is pending, so the message waits queued, and lands after the tool's result."""
    hub, worker, (a, b), id_ = _asked(ui_scopes="read write approve")
    typed = b.session.local.push(Message.user("and clean the cache too"))
    assert b.pump() and b.deliver_to_hub()  # refused `queued`: the call is pending
    _decide(b, id_, approve=False)  # clicked meanwhile
    _decide(a, id_, approve=True)
    assert a.pump() and a.deliver_to_hub()  # lands first
    assert b.deliver_to_replica()  # the `queued` reject only: `a`'s decision is on its way
    assert b.pump() and b.deliver_to_hub()  # the queued aside and the decision, one batch
    settle([worker, a, b])
    assert "decided" in hub.rejected
    assert _conflicts(b) == ["decided"]
    assert _state(hub, id_) == "approved"
    worker.session.local.push(Message.tool_result("c1", "rm", "done"))
    settle([worker, a, b])
    assert hub.conversation.holds(typed)
    for link in (worker, a, b):
        assert link.session.local == hub.conversation


def test_a_decision_refused_turn_ended_is_the_only_conflict_and_the_message_lands() -> None:
    """A UI decides and types a message, one push, while the worker ends the turn with the
    approval still open: the hub refuses the batch `turn_ended` for the decision (SPEC 12: no
    decision once its turn ended), which comes back as the conflict; the message lands. The
    batch holds no stop, so the split of late stops alone took the message with it (found by
    random interleavings over `FakeHub`, `/tmp/ifix/fuzz.py`, for issue 29)."""
    hub, worker, (a, b), id_ = _asked(ui_scopes="read write approve")
    local = worker.session.local
    local.push(Message.tool_result("c1", "delete", "skipped"))
    local.push(Assistant([Text("left it")]))
    assert local.end_turn(TurnEnd.answered(None))
    settle([worker])  # `b` has not seen the turn end yet
    assert _state(hub, id_) == "open"
    _decide(b, id_, approve=True)
    typed = b.session.local.push(Message.user("and clean the cache too"))
    assert b.pump() and b.deliver_to_hub()  # one batch: the decision and the message
    settle([worker, a, b])
    assert hub.rejected == ["turn_ended"]
    assert _conflicts(b) == ["turn_ended"]
    assert _state(hub, id_) == "open"
    assert hub.conversation.holds(typed)
    for link in (worker, a, b):
        assert link.session.local == hub.conversation


def test_a_decision_pending_when_another_lands_is_a_conflict_decided_in_the_rebase() -> None:
    """A UI whose decision is still local when another's arrives rebases it into a
    `Conflict(decided)`, never into a merge or an overwrite."""
    hub, worker, (a, b), id_ = _asked()
    _decide(b, id_, approve=False)  # not sent yet
    _decide(a, id_, approve=True)
    settle([worker, a])
    while b.deliver_to_replica():
        pass
    assert _conflicts(b) == ["decided"]
    settle([worker, a, b])
    assert _state(hub, id_) == "approved"
    assert b.session.local == hub.conversation


def test_two_decisions_in_one_batch_one_is_made_the_other_refused() -> None:
    """`decide` twice before a push: the second is refused locally (`decided`), the first
    lands; a hostile batch deciding twice is rejected whole and leaves the approval open."""
    hub, worker, (a, b), id_ = _asked()
    _decide(a, id_, approve=True)
    with pytest.raises(UsageError) as refused:
        _decide(a, id_, approve=False)
    assert refused.value.reason == "decided"
    settle([worker, a, b])
    assert _state(hub, id_) == "approved"

    hub, worker, (a, b), id_ = _asked()
    _replace(a, id_, state="approved", decided_by="anonymous", decided_at=NOW)
    _replace(a, id_, state="denied", decided_by="anonymous", decided_at=NOW)
    settle([worker, a, b])
    assert hub.rejected == ["decided"] and _state(hub, id_) == "open"
    assert _conflicts(a) == ["decided", "decided"]


def test_a_resent_decision_is_acknowledged_not_refused() -> None:
    """A lost ack and a resend of the decision land it once (the mark answers the resend)."""
    hub, worker, (a, b), id_ = _asked()
    _decide(a, id_)
    a.pump()
    a.deliver_to_hub()
    a.cut()  # the ack is lost
    settle([worker, a, b])
    assert _state(hub, id_) == "approved" and len(_records(hub)) == 2
    assert _conflicts(a) == [] and hub.rejected == []


# ---------------------------------------------------------------------- identities


def test_a_forged_decided_by_is_rejected_and_nothing_is_overwritten() -> None:
    """`decided_by` must be the socket's principal: checked, never rewritten."""
    hub, worker, (a, b), id_ = _asked(auth=True)
    _replace(a, id_, state="approved", decided_by="person1", decided_at=NOW)
    settle([worker, a, b])
    assert hub.rejected == ["forged"] and _state(hub, id_) == "open"
    assert _conflicts(a) == ["forged"]


def test_a_forged_asked_by_is_rejected() -> None:
    """An ask must name the asking socket's principal and client."""
    hub = FakeHub(auth=True)
    worker = hub.link(ReplicaSession("worker"), _grant("worker", "read write"))
    settle([worker])
    local = worker.session.local
    local.push(Message.user("go"))
    local.open_turn()
    settle([worker])
    ap.ask(local, key="k", prompt="?", asked_by="someone-else", asked_client="worker")
    settle([worker])
    assert hub.rejected == ["forged"]
    ap.ask(local, key="k", prompt="?", asked_by="worker", asked_client="another")
    settle([worker])
    assert hub.rejected == ["forged", "forged"] and list(ap.approvals(hub.conversation)) == []


@pytest.mark.parametrize("auth", [False, True])
def test_the_asker_cannot_decide_its_own_approval(auth: bool) -> None:
    """Not even with the approve scope, and without auth not the asking client."""
    hub = FakeHub(auth=auth)
    worker = hub.link(ReplicaSession("worker"), _grant("worker", "read write approve"))
    settle([worker])
    local = worker.session.local
    local.push(Message.user("go"))
    local.open_turn()
    sub = worker.session.sub
    assert sub is not None
    id_, _, _ = ap.ask(local, key="k", prompt="sure?", asked_by=sub, asked_client="worker")
    settle([worker])
    ap.decide(local, id_, approve=True, decided_by=sub, at=NOW)
    settle([worker])
    assert hub.rejected == ["forbidden"] and _state(hub, id_) == "open"


def test_only_the_turns_owner_asks_once_per_key_in_the_open_turn() -> None:
    """Another writer cannot ask in the worker's turn; a second ask for the same key is
    `asked`; an ask for a turn that is not open is `turn_ended`."""
    hub, worker, (a, b), id_ = _asked(ui_scopes="read write")
    ap.ask(a.session.local, key="other", prompt="?", asked_by="anonymous", asked_client="ui0")
    settle([worker, a, b])
    assert hub.rejected == ["forbidden"]
    local = worker.session.local
    # Asked again through a raw put (`ask` would find it): the key is taken.
    value = ap.ask_value(turn=0, key="c1", asked_by="anonymous", asked_client="worker")
    local.add_aside(Aside(ap.APPROVAL_KIND, None, local.aside(id_).author, value))  # type: ignore[union-attr]
    settle([worker, a, b])
    assert hub.rejected[-1] == "asked"
    value = ap.ask_value(turn=5, key="late", asked_by="anonymous", asked_client="worker")
    local.add_aside(Aside(ap.APPROVAL_KIND, None, local.aside(id_).author, value))  # type: ignore[union-attr]
    settle([worker, a, b])
    assert hub.rejected[-1] == "turn_ended"
    assert [approval.key for _, approval in ap.approvals(hub.conversation)] == ["c1"]


def test_asking_again_for_the_same_turn_and_key_returns_the_existing_approval() -> None:
    """`ask` is idempotent per (turn, key): a restarted worker finds its card."""
    hub, _worker, _uis, id_ = _asked()
    restarted = hub.link(ReplicaSession("worker-2"))
    settle([restarted])
    again, approval, made = ap.ask(
        restarted.session.local, key="c1", call="c1", asked_by="anonymous", asked_client="x"
    )
    assert (again, made, approval.is_open) == (id_, False, True)
    assert not restarted.session.local.has_unsaved


# ---------------------------------------------------------------------- decided stays decided


def test_a_replace_that_flips_reopens_or_removes_a_decision_is_rejected() -> None:
    """Once decided, an approval never changes: no flip, no reopen, no removal."""
    hub, worker, (a, b), id_ = _asked(ui_scopes="read write approve")
    _decide(a, id_)
    settle([worker, a, b])
    _replace(b, id_, state="denied", decided_by="anonymous")
    settle([worker, a, b])
    _replace(worker, id_, state="open", decided_by=None, decided_at=None)
    settle([worker, a, b])
    b.session.local.remove_aside(id_)
    settle([worker, a, b])
    assert hub.rejected == ["decided", "decided", "decided"]
    assert _state(hub, id_) == "approved"


def test_a_reset_that_would_reopen_flip_or_forge_an_approval_is_rejected() -> None:
    """A reset is checked as the aside changes it implies."""
    hub, worker, (a, b), id_ = _asked(ui_scopes="read write approve")
    _decide(a, id_)
    settle([worker, a, b])

    def reset_with(**fields: Any) -> None:
        local = worker.session.local
        state = local.copy()
        aside = state.aside(id_)
        assert aside is not None
        if fields:
            state.replace_aside(
                id_, Aside(aside.kind, aside.after, aside.author, aside.value | fields)
            )
        else:
            state.remove_aside(id_)
        local.reset(state, by=None)
        settle([worker, a, b])

    reset_with(state="open", decided_by=None, decided_at=None)
    reset_with(state="denied")
    reset_with()  # dropped
    assert hub.rejected == ["decided", "decided", "decided"]
    # A reset that forges a decided approval under a new id.
    local = worker.session.local
    state = local.copy()
    forged = ap.ask_value(turn=0, key="c9", asked_by="anonymous", asked_client="worker")
    forged |= {"state": "approved", "decided_by": "anonymous", "decided_at": NOW}
    state.add_aside(Aside(ap.APPROVAL_KIND, None, local.aside(id_).author, forged))  # type: ignore[union-attr]
    local.reset(state, by=None)
    settle([worker, a, b])
    assert hub.rejected[-1] == "forged"
    # A reset that keeps every approval as it is lands.
    local.reset(local.copy(), by=None)
    settle([worker, a, b])
    assert isinstance(hub.log[-1].change, Reset) and _state(hub, id_) == "approved"


# ---------------------------------------------------------------------- schemas


QUESTION = {
    "type": "object",
    "properties": {"account": {"enum": ["ops", "dev"]}, "days": {"type": "integer", "minimum": 1}},
    "required": ["account"],
    "additionalProperties": False,
}


def test_an_answer_its_schema_refuses_is_rejected_bad_answer() -> None:
    """The hub checks the answer against the schema; the replica refuses it first."""
    hub, worker, (a, b), id_ = _asked(schema=QUESTION)
    with pytest.raises(UsageError) as refused:
        _decide(a, id_, answer={"account": "prod"})
    assert refused.value.reason == "bad_answer" and "answer.account" in refused.value.message
    for answer in ({"account": "prod"}, {"days": 3}, {"account": "ops", "extra": 1}, None):
        _replace(a, id_, state="approved", answer=answer, decided_by="anonymous", decided_at=NOW)
        settle([worker, a, b])
    assert hub.rejected == ["bad_answer"] * 4 and _state(hub, id_) == "open"
    _decide(a, id_, answer={"account": "ops", "days": 2})
    settle([worker, a, b])
    held = ap.approval_of(hub.conversation.aside(id_))
    assert held is not None and held.answer == {"account": "ops", "days": 2}


def test_an_ask_with_a_schema_outside_the_subset_is_refused() -> None:
    """`pattern`, `$ref`, `oneOf`...: refused when asked, never silently skipped."""
    hub = FakeHub()
    worker = hub.link(ReplicaSession("worker"))
    settle([worker])
    local = worker.session.local
    local.push(Message.user("go"))
    local.open_turn()
    with pytest.raises(UsageError) as refused:
        ap.ask(
            local,
            key="q",
            schema={"type": "string", "pattern": "^a"},
            asked_by="a",
            asked_client="b",
        )
    assert refused.value.reason == "bad_schema"
    value = ap.ask_value(turn=0, key="q", asked_by="anonymous", asked_client="worker")
    local.add_aside(Aside(ap.APPROVAL_KIND, None, CALL_AUTHOR, value | {"schema": {"$ref": "#"}}))
    settle([worker])
    assert hub.rejected == ["invalid"]


CALL_AUTHOR = ap.Author.rig()


@pytest.mark.parametrize(
    ("schema", "value", "problem"),
    [
        ({"type": "string", "minLength": 2}, "é", "answer: at least 2 characters"),
        ({"type": "string", "maxLength": 1}, "😀", None),  # one code point
        ({"type": "integer"}, 2.0, None),
        ({"type": "integer"}, True, "answer: expected integer"),
        ({"type": "number", "exclusiveMaximum": 1}, 1, "answer: less than 1"),
        ({"enum": [1, "a"]}, True, 'answer: expected one of 1, "a"'),
        ({"const": 1}, 1.0, None),
        (
            {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
            [True, 0],
            "answer[1]: expected boolean",
        ),
        ({"type": ["string", "null"]}, None, None),
        (True, {"any": "thing"}, None),
        (False, 1, "answer: no value is allowed here"),
        ({"type": "object", "required": ["a"]}, {}, "answer: 'a' is required"),
    ],
)
def test_answer_problem_follows_json_schema_for_the_subset(
    schema: Any, value: Any, problem: str | None
) -> None:
    """The subset's rules as JSON Schema states them (code points, `true` is no number)."""
    assert ap.schema_problem(schema) is None
    assert ap.answer_problem(schema, value) == problem


# ---------------------------------------------------------------------- stop and park


def test_a_stop_cancels_the_turns_open_approvals_in_its_own_append() -> None:
    """The cancel lands right after the stop request, in the same append; a decision after
    it is `decided`; the waiting turn was parked until then."""
    hub, worker, (a, b), id_ = _asked(ui_scopes="read write approve")
    assert ap.parked(hub.conversation)
    revision = hub.core.revision
    a.session.local.add_aside(Aside("rig.stop", None, ap.Author.user(), {"turn": 0, "at": NOW}))
    settle([worker, a, b])
    assert _state(hub, id_) == "cancelled"
    assert hub.core.revision == revision + 2  # the stop and its cancel, one append
    assert hub.log[-1].by == ap.Author.rig()
    assert not ap.parked(hub.conversation)
    _replace(b, id_, state="approved", decided_by="anonymous", decided_at=NOW)
    settle([worker, a, b])
    assert hub.rejected == ["decided"] and _state(hub, id_) == "cancelled"
    for link in (worker, a, b):
        assert link.session.local == hub.conversation


def test_a_turn_waiting_only_for_a_frontend_tool_is_parked() -> None:
    """Pending calls all to tools a UI runs park the turn; a backend call does not."""
    conversation = Conversation.from_messages([Message.user("pick a file")])
    conversation.open_turn()
    conversation.add_aside(Aside(ap.TOOLS_KIND, None, CALL_AUTHOR, {"tools": ["pick_file"]}))
    conversation.push(Assistant([ToolCall("f1", "pick_file", {})]))
    assert ap.parked(conversation)
    conversation.push(Message.tool_result("f1", "pick_file", "a.txt"))
    conversation.push(Assistant([ToolCall("f2", "pick_file", {}), ToolCall("s1", "search", {})]))
    assert not ap.parked(conversation)


# ---------------------------------------------------------------------- the approve scope


def test_approve_decides_but_cannot_push_splice_halt_or_draft() -> None:
    """A token with `approve` (and `read`) decides approvals and does nothing else."""
    hub, worker, (a, b), id_ = _asked(auth=True, ui_scopes="read approve")
    local = a.session.local
    local.push(Message.user("sneaky"))
    settle([worker, a, b])
    local.splice(range(0, 1), [], by=None)
    settle([worker, a, b])
    local._record(HaltChange(Halt.STOPPED), None)  # a halt record, whatever the value says
    settle([worker, a, b])
    # A decision together with anything else needs write too.
    _decide(a, id_)
    local.push(Message.user("and this"))
    settle([worker, a, b])
    assert hub.rejected == ["forbidden"] * 4 and _state(hub, id_) == "open"
    draft = DraftOp("msg_0190b0a0000070008000000000000042", "open", role="assistant")
    a.to_hub.append(draft_frame(draft))
    settle([worker, a, b])
    assert hub.core.drafts.drafts == {}
    _decide(a, id_)
    settle([worker, a, b])
    assert _state(hub, id_) == "approved"


def draft_frame(op: DraftOp) -> bytes:
    from sync.protocol import encode_message

    return encode_message(op)


@pytest.mark.parametrize("scopes", ["read", "read write", "read write presence"])
def test_write_and_read_cannot_decide(scopes: str) -> None:
    """`write` does not include `approve`: a worker's token never approves anything."""
    hub, worker, (a, b), id_ = _asked(auth=True, ui_scopes=scopes)
    _decide(a, id_)
    settle([worker, a, b])
    assert hub.rejected == ["forbidden"] and _state(hub, id_) == "open"
    assert _conflicts(a) == ["forbidden"]


def test_the_new_reasons_are_final_in_the_one_table() -> None:
    """Every approval reason is final: resending the same decision can only fail again."""
    for reason in ("decided", "asked", "forged", "bad_answer"):
        assert REJECTS[reason] == "final"


def test_a_token_for_approve_reads_and_decides_but_does_not_write() -> None:
    """`convsync token --scope approve` mints what the hub reads as read + approve."""
    from server.auth import Key, KeyRing, mint_token, verify

    secret = "s" * 32
    token = mint_token(secret, "alice", ["approve"], ["*"], 60, now=1000.0)
    grant = verify(token, KeyRing.of(Key.secret(secret)), now=1001.0)
    assert (grant.can_read, grant.can_approve, grant.can_write) == (True, True, False)
    writer = verify(
        mint_token(secret, "w", ["write"], ["*"], 60, now=1000.0),
        KeyRing.of(Key.secret(secret)),
        now=1001.0,
    )
    assert not writer.can_approve


def test_a_decided_approval_may_move_but_never_change() -> None:
    """Drawn after another entry (as `normalize` moves asides), a decision stands as it was."""
    hub, worker, (a, b), id_ = _asked(ui_scopes="read write approve")
    _decide(a, id_)
    settle([worker, a, b])
    local = worker.session.local
    aside = local.aside(id_)
    assert aside is not None
    local.replace_aside(id_, Aside(aside.kind, local.id(0), aside.author, aside.value))
    settle([worker, a, b])
    assert hub.rejected == [] and hub.conversation.aside(id_).after == local.id(0)  # type: ignore[union-attr]
    assert _state(hub, id_) == "approved"


def test_an_approval_as_the_spec_lists_it_without_asked_client_is_taken() -> None:
    """`asked_client` may be left out (SPEC 12 does not list it), and `decided_at` too: the
    turn owner's client then stands for the asker and still cannot decide it."""
    hub = FakeHub()
    worker = hub.link(ReplicaSession("worker"))
    ui = hub.link(ReplicaSession("ui"))
    settle([worker, ui])
    local = worker.session.local
    local.push(Message.user("go"))
    local.open_turn()
    settle([worker, ui])
    value = ap.ask_value(turn=0, key="k", asked_by="anonymous", asked_client="worker")
    del value["asked_client"]
    id_ = local.add_aside(Aside(ap.APPROVAL_KIND, None, CALL_AUTHOR, value))
    settle([worker, ui])
    assert _state(hub, id_) == "open", hub.rejected
    decided = value | {"state": "approved", "decided_by": "anonymous"}
    local.replace_aside(id_, Aside(ap.APPROVAL_KIND, None, CALL_AUTHOR, decided))
    settle([worker, ui])
    assert hub.rejected == ["forbidden"] and _state(hub, id_) == "open"
    ui.session.local.replace_aside(id_, Aside(ap.APPROVAL_KIND, None, CALL_AUTHOR, decided))
    settle([worker, ui])
    assert _state(hub, id_) == "approved"
