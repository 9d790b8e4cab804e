"""Properties of the model over random edit sequences: the fold law, serde, atomic apply, ids."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import Run, operations

from sync import (
    ApplyError,
    AsideChange,
    ChangeRecord,
    Conversation,
    Entry,
    Message,
    Push,
    Splice,
    decode_record,
    decode_state,
    encode,
)


def folded(records: list[ChangeRecord]) -> Conversation:
    conversation = Conversation()
    for record in records:
        conversation.apply(record)
    return conversation


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.lists(operations, max_size=25))
def test_folding_the_outbox_gives_the_live_value(ops: list[tuple[Any, ...]]) -> None:
    """Folding a value's outbox onto an empty conversation gives an equal value, same revision."""
    run = Run()
    for op in ops:
        run.do(op)
    live = run.conversation
    copy = folded(live.unsaved())
    assert copy == live
    assert copy.revision == live.revision
    assert encode(copy) == encode(live)


@SETTINGS
@given(st.lists(operations, max_size=25))
def test_records_survive_the_wire(ops: list[tuple[Any, ...]]) -> None:
    """Records encoded to JSON and decoded fold to the same value (what a replica sees)."""
    run = Run()
    for op in ops:
        run.do(op)
    records = [decode_record(encode(record)) for record in run.conversation.unsaved()]
    assert folded(records) == run.conversation


@SETTINGS
@given(st.lists(operations, max_size=25))
def test_serde_round_trip(ops: list[tuple[Any, ...]]) -> None:
    """A value read back from its serde form equals the live value."""
    run = Run()
    for op in ops:
        run.do(op)
    assert decode_state(encode(run.conversation)) == run.conversation


@SETTINGS
@given(st.lists(operations, max_size=20), st.integers(min_value=0, max_value=5))
def test_apply_of_a_misfit_changes_nothing(ops: list[tuple[Any, ...]], kind: int) -> None:
    """A record that does not fit raises `ApplyError`; the value and its revision stay."""
    run = Run()
    for op in ops:
        run.do(op)
    c = run.conversation
    n = len(c)
    held = [ref.entry for ref in c.entries()]
    retired = [id_ for id_ in run.seen if c.is_retired(id_)]
    missing_aside = "aside_" + "0" * 12 + "7" + "0" * 3 + "8" + "0" * 15
    misfits: list[Any] = [
        Splice(0, n + 1, [], []),
        Splice(0, n, ["msg_wrong"] * n, []) if n else Splice(1, 0, [], []),
        AsideChange(missing_aside, None),
        Push([Entry(Message.user("x"))]),  # no id
        Push([held[0]]) if held else Splice(0, 1, [], []),
        Push([run.seen[retired[0]]]) if retired else Push([Entry(Message.user("y"), id="msg_")]),
    ]
    before = encode(c)
    revision = c.revision
    outbox = c.unsaved()
    try:
        c.apply(ChangeRecord(misfits[kind]))
    except ApplyError as error:
        assert error.reason
    else:
        raise AssertionError(f"{misfits[kind]!r} should not fit")
    assert encode(c) == before
    assert c.revision == revision and c.unsaved() == outbox


@SETTINGS
@given(st.lists(operations, max_size=30))
def test_ids_never_repeat_and_never_change(ops: list[tuple[Any, ...]]) -> None:
    """Every id made is new; an entry untouched by an edit keeps its id and message."""
    run = Run()
    for op in ops:
        before = {ref.id: ref.message for ref in run.conversation.entries()}
        run.do(op)
        after = run.conversation
        ids = [ref.id for ref in after.entries()]
        assert len(ids) == len(set(ids))
        for ref in after.entries():
            if ref.id in before and op[0] not in ("edit_each", "normalize", "splice", "reset"):
                if op[0] != "set_entries":
                    assert before[ref.id] == ref.message
    assert len(run.minted) == len(set(run.minted))


@SETTINGS
@given(st.lists(operations, max_size=20), st.integers(min_value=1, max_value=6))
def test_saving_in_chunks_continues_the_log(ops: list[tuple[Any, ...]], every: int) -> None:
    """Taking the outbox every few edits and folding the chunks in order gives the live value."""
    run = Run()
    log: list[ChangeRecord] = []
    for step, op in enumerate(ops):
        run.do(op)
        if step % every == 0:
            assert run.conversation.continues(run.conversation.lineage, len(log))
            saved = run.conversation.take_unsaved()
            log.extend(saved)
            run.conversation.continue_log(42, len(log))
    log.extend(run.conversation.take_unsaved())
    assert folded(log) == run.conversation
    assert folded(log).revision == run.conversation.revision


def test_misfit_list_is_checked_against_msgspec_types() -> None:
    """Records built in these tests are valid wire values (they encode and decode)."""
    record = ChangeRecord(Push([Entry(Message.user("x"), id="msg_" + "0" * 32)]))
    assert msgspec.json.decode(encode(record))["change"]["type"] == "push"


@SETTINGS
@given(st.lists(operations, max_size=20), st.lists(operations, min_size=1, max_size=8))
def test_apply_batch_is_all_or_nothing_and_undoable(
    ops: list[tuple[Any, ...]], more: list[tuple[Any, ...]]
) -> None:
    """`apply_batch` of records then `undo` leaves the value exactly as it was; a batch whose
    last record does not fit changes nothing."""
    run = Run()
    for op in ops:
        run.do(op)
    target = run.conversation
    records = target.take_unsaved()
    follower = folded(records)
    source = target.copy()
    ahead = Run(conversation=source)
    for op in more:
        ahead.do(op)
    batch = source.take_unsaved()
    before = encode(follower)
    revision = follower.revision
    undo = follower.apply_batch(batch)
    assert follower == source
    undo()
    assert encode(follower) == before and follower.revision == revision
    assert [ref.id for ref in follower.entries()] == [ref.id for ref in target.entries()]
    for ref in target.entries():
        assert follower.index_of(ref.id) == ref.index
    bad = ChangeRecord(Splice(0, len(source) + 5, [], []))
    try:
        follower.apply_batch([*batch, bad])
    except ApplyError:
        pass
    else:
        raise AssertionError("a batch ending in a misfit must not apply")
    assert encode(follower) == before and follower.revision == revision


@SETTINGS
@given(st.lists(operations, max_size=30))
def test_index_of_agrees_with_entries_after_any_edits(ops: list[tuple[Any, ...]]) -> None:
    """Positions stay right through splices (the index is refreshed lazily, never wrong)."""
    run = Run()
    for op in ops:
        run.do(op)
        for ref in run.conversation.entries():
            assert run.conversation.index_of(ref.id) == ref.index
