"""The chaos checkers' approval and duplicate checks, on logs made by hand: each names the
fault it is for, and passes the same log without it (so neither check is one that cannot
fail)."""

from __future__ import annotations

import checker
import steering
from strategies import Run

from sync import ChangeRecord, Conversation, Halt, Message, approvals, encode
from sync.entries import is_stopped_note


def _asked() -> tuple[Conversation, str, list[ChangeRecord]]:
    """A conversation where r0 opened a turn and asked; the approval's id; the records."""
    conversation = Conversation()
    conversation.push(Message.user("clean up"))
    conversation.open_turn()
    id_, _, _ = approvals.ask(
        conversation, key="k", prompt="may I?", asked_by="anonymous", asked_client="r0"
    )
    return conversation, id_, conversation.take_unsaved()


def _decided(conversation: Conversation, id_: str, approve: bool) -> list[ChangeRecord]:
    approvals.decide(conversation, id_, approve=approve, decided_by="anonymous", at=1)
    return conversation.take_unsaved()


def _answer(conversation: Conversation, id_: str, state: str) -> list[ChangeRecord]:
    conversation.push(Message.assistant(f"after {id_}: {state}"))
    return conversation.take_unsaved()


def _approvals_report(records: list[ChangeRecord]) -> checker.Report:
    report = checker.Report()
    checker._check_approvals(report, records)
    return report


def test_an_answer_after_a_decision_pushed_once_passes() -> None:
    conversation, id_, asked = _asked()
    records = asked + _decided(conversation, id_, True) + _answer(conversation, id_, "approved")
    report = _approvals_report(records)
    assert report.problems == []
    assert (report.approvals_asked, report.approvals_decided, report.answers) == (1, 1, 1)


def test_an_answer_pushed_again_after_a_decision_is_a_duplicate_after_an_approval() -> None:
    conversation, id_, asked = _asked()
    decided = _decided(conversation, id_, True)
    again = _answer(conversation, id_, "approved") + _answer(conversation, id_, "approved")
    report = _approvals_report(asked + decided + again)
    assert report.answers_duplicated == 1
    assert report.problems == [f"after approval: the answer after {id_} landed twice"]


def test_an_answer_before_its_decision_or_naming_another_state_is_named() -> None:
    conversation, id_, asked = _asked()
    answer = _answer(conversation, id_, "approved")
    report = _approvals_report(asked + answer + _decided(conversation, id_, True))
    assert report.problems == [f"after approval: {id_} answered before its decision"]
    conversation, id_, asked = _asked()
    denied = _decided(conversation, id_, False)
    report = _approvals_report(asked + denied + _answer(conversation, id_, "approved"))
    assert report.problems == [f"after approval: {id_} answered as approved, decided denied"]


def test_an_approval_decided_twice_is_counted() -> None:
    conversation, id_, asked = _asked()
    fork = conversation.copy()
    records = asked + _decided(conversation, id_, True) + _decided(fork, id_, False)
    report = _approvals_report(records)
    assert report.decided_twice == 1
    assert report.problems == [f"approval {id_} decided twice: approved then denied"]


def test_steering_names_an_assistant_answer_landed_twice() -> None:
    conversation = Conversation()
    conversation.push(Message.user("hello"))
    conversation.push(Message.assistant("the answer to turn 1 (step 1)"))
    once = [encode(record) for record in conversation.take_unsaved()]
    report = steering.Report(seed=0)
    steering._check(once, {}, [], report)
    assert report.problems == [] and report.duplicated == 0
    conversation.push(Message.user("and?"))  # two in a row strict pairing refuses already
    conversation.push(Message.assistant("the answer to turn 1 (step 1)"))
    twice = once + [encode(record) for record in conversation.take_unsaved()]
    report = steering.Report(seed=0)
    steering._check(twice, {}, [], report)
    assert report.duplicated == 1
    assert report.problems == [
        "duplicated: the assistant's 'the answer to turn 1 (step 1)' landed 2 times"
    ]


def test_a_stopped_note_is_not_an_entry_the_replica_made() -> None:
    """`vanished` (run.py chaos, seeds 96 and 9 of issue 29): a push after a stop puts a
    STOPPED note before the user's text, and a push refused `queued` drops that note (the
    hub puts its own when the queue lands, SPEC 10). The worker's `made` names the replica's
    own entries only, so the note dropped is not one that vanished; the text still is."""
    run = Run()
    run.conversation.push(Message.user("q"))
    assert run.conversation.halt(Halt.STOPPED)
    run.note_entries()
    before = len(run.minted)
    run.do(("extend", [Message.assistant("hello"), Message.user("hi")]))
    note, *made = run.minted[before:]
    assert is_stopped_note(run.seen[note].message, run.seen[note].author)
    assert run.made_since(before) == made and len(made) == 2
