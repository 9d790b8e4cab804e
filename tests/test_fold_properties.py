"""Properties of the model over random edit sequences: the fold law, serde, atomic apply, ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sync import (
    ApplyError,
    Aside,
    AsideChange,
    Assistant,
    Author,
    ChangeRecord,
    Conversation,
    Entry,
    Halt,
    Message,
    Push,
    Splice,
    Stop,
    System,
    ToolCall,
    TurnEnd,
    decode_record,
    decode_state,
    encode,
)

MESSAGES = [
    Message.user("hi"),
    Message.user("again"),
    Message.assistant("hello"),
    Message.assistant("cut", stop=Stop("aborted")),
    Assistant([ToolCall("c1", "f", {"a": 1})], stop=Stop("tool_use")),
    Assistant([ToolCall("c1", "f", {}), ToolCall("c2", "g", {})]),
    Message.tool_result("c1", "f", "one"),
    Message.tool_result("c2", "g", "two", is_error=True),
    System("be brief"),
]
AUTHORS = [None, Author.user(), Author.plugin("p"), Author.agent("sub"), Author.rig()]

messages = st.sampled_from(MESSAGES)
authors = st.sampled_from(AUTHORS)
small = st.integers(min_value=0, max_value=12)

operations = st.one_of(
    st.tuples(st.just("push"), messages, authors),
    st.tuples(st.just("extend"), st.lists(messages, max_size=4)),
    st.tuples(st.just("splice"), small, small, st.lists(st.tuples(small, messages), max_size=4)),
    st.tuples(st.just("restore"), small, small, st.lists(small, max_size=3)),
    st.tuples(st.just("set_entries"), st.lists(small, max_size=6), messages),
    st.tuples(st.just("edit_each"), st.sets(small, max_size=3), messages),
    st.tuples(st.just("normalize")),
    st.tuples(st.just("halt"), st.sampled_from(list(Halt))),
    st.tuples(st.just("resume")),
    st.tuples(st.just("add_aside"), st.booleans(), small),
    st.tuples(st.just("replace_aside"), small, st.booleans()),
    st.tuples(st.just("remove_aside"), small),
    st.tuples(st.just("open_turn")),
    st.tuples(st.just("end_turn"), st.sampled_from(["answered", "failed", "stopped"])),
    st.tuples(st.just("reset"), st.lists(messages, max_size=3)),
    st.tuples(st.just("dated"), st.integers(min_value=1, max_value=2**44), messages),
)


@dataclass
class Run:
    """A conversation under random edits, with what the test saw along the way."""

    conversation: Conversation = field(default_factory=Conversation)
    seen: dict[str, Entry] = field(default_factory=dict)
    minted: list[str] = field(default_factory=list)

    def note_entries(self) -> None:
        for ref in self.conversation.entries():
            if ref.id not in self.seen:
                self.minted.append(ref.id)
            self.seen[ref.id] = ref.entry

    def aside_ids(self) -> list[str]:
        return [id_ for id_, _ in self.conversation.asides()]

    def do(self, op: tuple[Any, ...]) -> None:
        c = self.conversation
        n = len(c)
        match op:
            case ("push", message, author):
                c.push(Entry(message, author=author))
            case ("extend", items):
                c.extend(items)
            case ("splice", start, stop, picks):
                entries = [
                    c.entry(at) or Entry(message) if at % 3 else Entry(message)
                    for at, message in picks
                ]
                c.splice(slice(start, stop), entries, Author.plugin("s"))
            case ("restore", start, stop, picks):
                pool = [self.seen[id_] for id_ in sorted(self.seen)]
                entries = [pool[at % len(pool)] for at in picks] if pool else []
                c.restore(slice(start, stop), entries, Author.plugin("undo"))
            case ("set_entries", order, message):
                current = [ref.entry for ref in c.entries()]
                wanted = [current[at] for at in order if at < n] + [Entry(message)]
                c.set_entries(wanted, Author.user())
            case ("edit_each", indexes, message):
                c.edit_each(
                    Author.plugin("e"), lambda ref: message if ref.index in indexes else None
                )
            case ("normalize",):
                c.normalize(Author.rig())
                c.validate()
            case ("halt", halt):
                c.halt(halt)
            case ("resume",):
                c.resume()
            case ("add_aside", saved, at):
                after = c.id(at) if at < n else None
                c.add_aside(Aside("note", after, Author.user(), {"at": at}, saved=saved))
            case ("replace_aside", pick, saved):
                ids = self.aside_ids()
                if ids:
                    id_ = ids[pick % len(ids)]
                    c.replace_aside(id_, Aside("note", None, Author.user(), [pick], saved=saved))
            case ("remove_aside", pick):
                ids = self.aside_ids()
                if ids:
                    c.remove_aside(ids[pick % len(ids)])
            case ("open_turn",):
                c.open_turn()
            case ("end_turn", how):
                ends = {
                    "answered": TurnEnd.answered(c.id(n - 1)),
                    "failed": TurnEnd.failed("boom"),
                    "stopped": TurnEnd.stopped(),
                }
                c.end_turn(ends[how])
            case ("reset", items):
                c.reset(Conversation.from_messages(items))
            case ("dated", at, message):
                with c.dated(at):
                    c.push(message)
        self.note_entries()


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
