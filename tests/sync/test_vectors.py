"""The shared vectors (`tests/vectors/`) hold for the Python model and are not stale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gen_vectors
import pytest

from sync import Conversation, encode
from sync.codec import decode_message, decode_record
from sync.errors import REJECTS, ApplyError, DecodeError, reject_rule
from sync.ids import is_aside_id, is_message_id, made_ms
from sync.merge import diff, merge_message, merge_text
from sync.rebase import rebase
from sync.steer import mid_step, queue_records

VECTORS = Path(__file__).resolve().parents[1] / "vectors"


def _load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def _plain(value: object) -> Any:
    return json.loads(encode(value))


def test_committed_vectors_match_the_generator() -> None:
    """The committed vector files are exactly what `tests/support/gen_vectors.py` writes now."""
    for name, text in gen_vectors.build().items():
        path = VECTORS / name
        regenerate = "run PYTHONPATH=. python tests/support/gen_vectors.py"
        assert path.exists(), f"{name} is missing: {regenerate}"
        assert path.read_text(encoding="utf-8") == text, f"{name} is stale: {regenerate} and commit"
    assert sorted(p.name for p in VECTORS.glob("*.json")) == sorted(gen_vectors.build())


def test_id_vectors() -> None:
    """Every id vector is (or is not) a message or aside id, carrying the time it says."""
    vectors = _load("ids.json")
    for case in vectors["message_ids"]:
        assert is_message_id(case["id"]) is case["valid"], case
        if case["valid"]:
            assert made_ms(case["id"]) == case["made"]
    for case in vectors["aside_ids"]:
        assert is_aside_id(case["id"]) is case["valid"], case
        if case["valid"]:
            assert made_ms(case["id"]) == case["made"]


@pytest.mark.parametrize("case", _load("fold.json")["cases"], ids=lambda case: case["name"])
def test_fold_vector(case: Any) -> None:
    """Folding the records gives the expected state, or fails at the expected record."""
    conversation = Conversation()
    error = None
    for at, data in enumerate(case["records"]):
        before = _plain(conversation.state())
        try:
            conversation.apply(decode_record(json.dumps(data)))
        except (ApplyError, DecodeError) as exc:
            error = {"at": at, "reason": exc.reason}
            assert _plain(conversation.state()) == before
            break
    expect = case["expect"]
    assert error == expect.get("error")
    assert _plain(conversation.state()) == expect["state"]
    assert conversation.revision == expect["revision"]
    assert conversation.halted() == expect["halt"]
    assert conversation.awaits_model() is expect["awaits_model"]
    assert [[id_, _plain(turn.value())] for id_, turn in conversation.turns()] == expect["turns"]


@pytest.mark.parametrize("case", _load("rebase.json")["cases"], ids=lambda case: case["name"])
def test_rebase_vector(case: Any) -> None:
    """Rebasing the pending records on the log gives the expected value and conflicts."""
    records = {key: [decode_record(json.dumps(r)) for r in case[key]] for key in ("base", "log")}
    base = Conversation()
    for record in records["base"]:
        base.apply(record)
    onto = base.copy()
    for record in records["log"]:
        onto.apply(record)
    local = base.copy()
    for data in case["pending"]:
        local.replay(decode_record(json.dumps(data)))
    pending = local.take_unsaved()
    conflicts = rebase(local, onto, pending, None if case["no_base"] else base)
    expect = case["expect"]
    assert _plain(local.state()) == expect["state"]
    assert local.revision == expect["revision"]
    assert [_plain(r) for r in local.unsaved()] == expect["unsaved"]
    found = [
        {"at": next(i for i, r in enumerate(pending) if r is c.record), "reason": c.reason}
        for c in conflicts
    ]
    assert found == expect["conflicts"]


@pytest.mark.parametrize("case", _load("session.json")["cases"], ids=lambda case: case["name"])
def test_session_vector(case: Any) -> None:
    """Each step of a session script gives the expected frame, events or error."""
    session = gen_vectors.new_session(case["options"])
    for at, step in enumerate(case["steps"]):
        assert gen_vectors.observe(session, step) == step["expect"], f"step {at}: {step['op']}"
    assert gen_vectors.final_of(session) == case["final"]


def test_merge_vectors() -> None:
    """The diff's hunks and the three-way merges of texts and messages are as pinned."""
    vectors = _load("merge.json")
    for case in vectors["diffs"]:
        assert [list(h) for h in diff(case["base"], case["other"])] == case["hunks"], case
    for case in vectors["texts"]:
        merged = merge_text(case["base"], case["ours"], case["theirs"])
        assert merged == case["merged"], case["name"]
    for case in vectors["messages"]:
        base, ours, theirs = (
            decode_message(json.dumps(case[k])) for k in ("base", "ours", "theirs")
        )
        merged = merge_message(base, ours, theirs)
        assert (None if merged is None else _plain(merged)) == case["merged"], case["name"]


@pytest.mark.parametrize("case", _load("steer.json")["queue"], ids=lambda case: case["name"])
def test_queue_vector(case: Any) -> None:
    """A push refused `queued` replays as the `rig.queued` aside puts the vector lists."""
    records = [decode_record(json.dumps(data)) for data in case["records"]]
    replayed = queue_records(records, case["after"])
    expect = case["expect"]
    assert (None if replayed is None else [_plain(r) for r in replayed]) == expect


@pytest.mark.parametrize("case", _load("steer.json")["mid_step"], ids=lambda case: case["name"])
def test_mid_step_vector(case: Any) -> None:
    conversation = Conversation()
    for data in case["records"]:
        conversation.apply(decode_record(json.dumps(data)))
    assert mid_step(conversation) is case["mid_step"]


def test_reject_table_vector() -> None:
    vectors = _load("steer.json")
    assert REJECTS == vectors["rejects"]
    assert reject_rule("some_newer_reason") == vectors["unknown_reject"]


def test_approval_schema_vectors() -> None:
    """Answers and schemas are judged as the committed vectors say (the JS side reads them)."""
    from sync.approvals import answer_problem, schema_problem

    vectors = _load("approvals.json")
    for case in vectors["answers"]:
        assert answer_problem(case["schema"], case["value"]) == case["problem"]
    for case in vectors["schemas"]:
        assert schema_problem(case["schema"]) == case["problem"]
