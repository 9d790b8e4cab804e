"""`kinds_of`, read once per push, says what the rules it lets the hub skip would have found."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import Run, operations

from server.tally import Tally
from sync import (
    Aside,
    AsideChange,
    Assistant,
    Author,
    ChangeRecord,
    Conversation,
    HaltChange,
    Message,
    Push,
    Reset,
    Splice,
    Text,
    ToolResult,
    Usage,
    User,
)
from sync.entries import Halt
from sync.kinds import (
    ASIDES,
    ASSISTANT,
    HALT,
    MOVES_CALLS,
    PAIRS,
    RESET,
    SPLICE,
    TOUCHES,
    USER_TEXT,
    is_user_text,
    kinds_of,
)
from sync.steer import STEP_KIND, Steering, mid_step, step_value, user_text_push

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _entries(record: ChangeRecord) -> list[Any]:
    change = record.change
    return list(change.entries) if isinstance(change, Push | Splice) else []


def _expected(records: list[ChangeRecord]) -> int:
    """The kinds, each read by its own plain definition (a scan per kind)."""
    changes = [record.change for record in records]
    messages = [entry.message for record in records for entry in _entries(record)]
    pushed = [entry for c in changes if isinstance(c, Push) for entry in c.entries]

    def pairs(message: object) -> bool:
        return isinstance(message, Assistant) or (
            isinstance(message, User) and any(isinstance(p, ToolResult) for p in message.content)
        )

    flags = {
        ASIDES: any(isinstance(c, AsideChange) for c in changes),
        RESET: any(isinstance(c, Reset) for c in changes),
        SPLICE: any(isinstance(c, Splice) for c in changes),
        HALT: any(isinstance(c, HaltChange) for c in changes),
        USER_TEXT: any(is_user_text(entry) for entry in pushed),
        PAIRS: any(pairs(message) for message in messages),
        ASSISTANT: any(isinstance(message, Assistant) for message in messages),
    }
    return sum(flag for flag, held in flags.items() if held)


def _batches(records: list[ChangeRecord], cuts: list[int]) -> list[list[ChangeRecord]]:
    """`records` cut into consecutive batches at `cuts` (as pushes carry them)."""
    bounds = sorted({0, len(records), *(cut % (len(records) + 1) for cut in cuts)})
    return [records[lo:hi] for lo, hi in itertools.pairwise(bounds)]


REPLY = Assistant([Text("done")], usage=Usage(input_tokens=3, output_tokens=2))
"""A reply with usage (the shared strategies' replies report none): what the tally sums."""

# The shared edits, and the steering asides the hub follows: a step marker put (True) or the
# latest one taken back (False), and a reply with usage.
edits = st.one_of(
    operations,
    st.tuples(st.just("step"), st.booleans()),
    st.tuples(st.just("reply")),
)


def _run(ops: list[tuple[Any, ...]]) -> Conversation:
    run = Run()
    steps: list[str] = []
    for op in ops:
        if op[0] == "step":
            held = [id_ for id_ in steps if run.conversation.aside(id_) is not None]
            if op[1] or not held:
                aside = Aside(STEP_KIND, None, Author.rig(), step_value(None, len(steps)))
                steps.append(run.conversation.add_aside(aside))
            else:
                run.conversation.remove_aside(held[-1])
        elif op[0] == "reply":
            run.conversation.push(REPLY)
        else:
            run.do(op)
    return run.conversation


@SETTINGS
@given(st.lists(edits, max_size=25), st.lists(st.integers(0, 40), max_size=6))
def test_kinds_of_equals_each_kind_read_on_its_own(ops: list[Any], cuts: list[int]) -> None:
    """For every batch of random edits' records, each flag equals its own plain scan."""
    records = _run(ops).unsaved()
    for batch in [records, *_batches(records, cuts)]:
        assert kinds_of(batch) == _expected(batch)
        assert user_text_push(batch) == bool(_expected(batch) & USER_TEXT)
        assert Steering().touches(batch) == bool(_expected(batch) & (ASIDES | RESET))


def test_kinds_of_a_stopped_note_and_a_user_result() -> None:
    """The STOPPED note is not the user's text; a user's tool result pairs, and is not text."""
    conversation = Conversation.from_messages([Message.user("go")])
    conversation.take_unsaved()
    conversation.halt(Halt.STOPPED)
    conversation.push(Message.user("again"))  # puts the STOPPED note before it, in one push
    pushed = conversation.unsaved()[-1]
    assert isinstance(pushed.change, Push) and len(pushed.change.entries) == 2
    note = msgspec.structs.replace(pushed, change=Push(pushed.change.entries[:1]))
    assert kinds_of([note]) == 0 and kinds_of([pushed]) == USER_TEXT
    result = Conversation.from_messages([Message.tool_result("c1", "f", "ok")]).unsaved()
    assert kinds_of(result) == PAIRS and kinds_of(result) & MOVES_CALLS
    assert kinds_of([]) == 0


@SETTINGS
@given(st.lists(edits, max_size=25), st.lists(st.integers(0, 40), max_size=6))
def test_the_tally_skipped_for_other_kinds_would_change_nothing(
    ops: list[Any], cuts: list[int]
) -> None:
    """A batch holding none of `Tally.KINDS` leaves every total as it was when tracked."""
    conversation = Conversation()
    tally = Tally()
    for batch in _batches(_run(ops).unsaved(), cuts):
        for record in batch:
            conversation.apply(record)
        before = (tally.usage(), set(tally.queued), set(tally.approvals), tally.latest_turn)
        tally.track(conversation, batch)
        after = (tally.usage(), set(tally.queued), set(tally.approvals), tally.latest_turn)
        if not kinds_of(batch) & Tally.KINDS:
            assert after == before


@SETTINGS
@given(st.lists(edits, max_size=30), st.lists(st.integers(0, 40), max_size=6))
def test_the_steering_index_tracked_by_kinds_equals_the_recomputed_one(
    ops: list[Any], cuts: list[int]
) -> None:
    """Told only of batches that touch it (as the hub does), the index always equals one
    rebuilt from the conversation, and its mid-step answer equals `mid_step`."""
    conversation = Conversation()
    steering = Steering()
    for batch in _batches(_run(ops).unsaved(), cuts):
        for record in batch:
            conversation.apply(record)
        if kinds_of(batch) & TOUCHES:
            steering.track(conversation, batch)
        rebuilt = Steering()
        rebuilt.rebuild(conversation)
        assert (steering.steps, steering.stops, steering.queue) == (
            rebuilt.steps,
            rebuilt.stops,
            rebuilt.queue,
        )
        assert steering.mid_step(conversation) == mid_step(conversation)
