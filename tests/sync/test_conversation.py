"""The `Conversation` operations, one behaviour per test (the seed examples first)."""

from __future__ import annotations

import pytest

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
    HaltChange,
    Lineage,
    Message,
    Push,
    Splice,
    Stop,
    Text,
    ToolCall,
    TurnEnd,
    UsageError,
    User,
    decode_state,
    encode,
)
from sync.ids import is_message_id, made_ms
from sync.steer import queue_records, queued_id


def ids_of(conversation: Conversation) -> list[str]:
    return [ref.id for ref in conversation.entries()]


def folded(conversation: Conversation) -> Conversation:
    """A conversation built by applying `conversation`'s outbox to an empty one."""
    copy = Conversation()
    for record in conversation.unsaved():
        copy.apply(record)
    return copy


# ---------------------------------------------------------------- the seed examples


def test_seed_restore_undoes_a_summary() -> None:
    """Restoring the originals over a summary puts back their very ids."""
    conversation = Conversation.from_messages([Message.user("one"), Message.assistant("two")])
    ids = ids_of(conversation)
    originals = [conversation.entry(at) for at in range(2)]
    summary = Entry(Message.user("a summary"))
    conversation.splice(..., [summary], Author.plugin("compact"))
    undone = conversation.restore(..., [e for e in originals if e], Author.plugin("undo"))
    assert undone.restored == ids
    assert ids_of(conversation) == ids


def test_seed_edit_each_rewrites_in_place() -> None:
    """`edit_each` rewrites one entry, keeping its id, and reports it."""
    conversation = Conversation.from_messages([Message.user("one"), Message.user("two")])
    before = conversation.id(1)
    changed = conversation.edit_each(
        Author.plugin("shout"),
        lambda entry: Message.user("TWO") if entry.index == 1 else None,
    )
    assert changed == [before]
    assert conversation.messages()[1] == Message.user("TWO")
    assert conversation.id(1) == before


def test_seed_dated_stamps_records_and_ids() -> None:
    """Edits inside `dated` carry its time on their record and in their ids."""
    conversation = Conversation()
    with conversation.dated(1_790_848_800_000):
        conversation.push(Message.user("Imported"))
    assert conversation.unsaved()[0].at == 1_790_848_800_000
    entry = conversation.entry(0)
    assert entry is not None and entry.made == 1_790_848_800_000


def test_seed_module_example_messages_are_the_payload() -> None:
    """A conversation's messages are exactly the messages put in, with no ids in them."""
    conversation = Conversation.from_messages([Message.user("Hello"), Message.assistant("Hi")])
    assert conversation.messages() == [Message.user("Hello"), Message.assistant("Hi")]
    assert all(is_message_id(id_) for id_ in ids_of(conversation))
    conversation.validate()


# ---------------------------------------------------------------- ids


def test_ids_rise_and_never_repeat() -> None:
    """Ids minted by one process rise strictly, even within one millisecond."""
    conversation = Conversation.from_messages([Message.user(str(n)) for n in range(2_000)])
    ids = ids_of(conversation)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_fixed_clock_ids_still_rise() -> None:
    """A frozen clock still gives strictly rising ids carrying that time."""
    conversation = Conversation(clock=lambda: 1_700_000_000_000)
    conversation.extend([Message.user("a"), Message.user("b"), Message.user("c")])
    ids = ids_of(conversation)
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert {made_ms(id_) for id_ in ids} == {1_700_000_000_000}


def test_push_keeps_a_well_formed_new_id() -> None:
    """An imported entry keeps its id when it is well formed and new here."""
    source = Conversation.from_messages([Message.user("imported")])
    entry = source.entry(0)
    assert entry is not None
    target = Conversation()
    assert target.push(entry) == entry.id


def test_push_replaces_held_retired_or_malformed_ids() -> None:
    """A pushed id that is held, retired or malformed is replaced with a fresh one."""
    conversation = Conversation.from_messages([Message.user("a"), Message.user("b")])
    held = conversation.id(0)
    assert held is not None
    conversation.splice(range(1, 2), [], Author.user())
    retired = conversation.unsaved()[-1].change
    assert isinstance(retired, Splice)
    for bad in (held, retired.removed[0], "msg_not-an-id"):
        new = conversation.push(Entry(Message.user("x"), id=bad))
        assert new != bad and is_message_id(new)


# ---------------------------------------------------------------- reads


def test_index_of_start_of_and_retired() -> None:
    """`start_of` is the index while held, 0 once retired, the end when not made yet."""
    conversation = Conversation.from_messages([Message.user("a"), Message.assistant("b")])
    first, second = ids_of(conversation)
    assert conversation.index_of(second) == 1
    conversation.splice(range(0, 1), [Entry(Message.user("summary"))], Author.plugin("compact"))
    assert conversation.index_of(first) is None
    assert conversation.start_of(first) == 0
    assert conversation.start_of(second) == 1
    assert conversation.start_of(Conversation().turn_start()) == len(conversation)


def test_key_and_index_of_key_are_the_id_and_index_of() -> None:
    """`key(at)` and `index_of_key(key)` (SPEC 1.2 API parity) answer as `id` and `index_of`."""
    conversation = Conversation.from_messages([Message.user("a"), Message.assistant("b")])
    first, second = ids_of(conversation)
    assert [conversation.key(0), conversation.key(1), conversation.key(2)] == [first, second, None]
    assert conversation.index_of_key(second) == 1
    conversation.splice(range(0, 1), [], None)
    assert conversation.key(0) == second and conversation.index_of_key(second) == 0
    assert conversation.index_of_key(first) is None


def test_turn_start_is_first_trailing_user_message() -> None:
    """A turn starts at the first user message of the trailing run."""
    conversation = Conversation.from_messages(
        [Message.user("q"), Message.assistant("a"), Message.user("q2"), Message.user("q3")]
    )
    start = conversation.turn_start()
    assert start == conversation.id(2)
    assert [ref.message for ref in conversation.asked(start)] == [
        Message.user("q2"),
        Message.user("q3"),
    ]
    request = conversation.request(start)
    assert request is not None and request.index == 2


def test_turn_start_reserves_the_next_id() -> None:
    """With no user message at the end, `turn_start` is the id the next entry takes."""
    conversation = Conversation.from_messages([Message.user("q"), Message.assistant("a")])
    start = conversation.turn_start()
    assert conversation.turn_start() == start
    assert conversation.push(Message.user("next")) == start


def test_a_stopped_note_never_takes_the_reserved_turn_start() -> None:
    """`turn_start` reserved the next entry's id, then a stop landed: the STOPPED note goes
    first under an id of its own and the user's text takes the reservation, so the turn
    begins at the text. Queued mid-step, the note is dropped (the hub puts its own when the
    queue lands, SPEC 10) and the text lands under the reserved id; a note under it left the
    turn starting at an entry that never lands (`run.py` chaos `vanished`, issue 29)."""
    conversation = Conversation.from_messages([Message.user("q"), Message.assistant("a")])
    start = conversation.turn_start()
    conversation.apply(ChangeRecord(HaltChange(Halt.STOPPED), Author.user(), None))
    assert conversation.push(Message.user("next")) == start
    note = list(conversation.entries())[2]
    assert note.is_stop_marker() and note.id != start
    queued = queue_records(conversation.unsaved()[-1:], conversation.id(1))
    assert queued is not None
    assert [record.change for record in queued if isinstance(record.change, Push)] == []
    assert [getattr(record.change, "id", None) for record in queued] == [queued_id(start)]


def test_awaits_model_skips_failed_replies_and_respects_halt() -> None:
    """A failed reply is never read: the answer is still owed, unless halted."""
    conversation = Conversation.from_messages(
        [Message.user("q"), Message.assistant("partial", stop=Stop("aborted"))]
    )
    assert conversation.awaits_model()
    assert conversation.halt(Halt.KEPT)
    assert not conversation.awaits_model()
    assert conversation.halted() is Halt.KEPT
    assert not conversation.halt(Halt.STOPPED)
    assert conversation.resume()
    assert conversation.awaits_model()


def test_halt_refused_when_no_answer_is_owed() -> None:
    """Halting a conversation that ends with the model's answer records nothing."""
    conversation = Conversation.from_messages([Message.user("q"), Message.assistant("a")])
    assert not conversation.halt("stopped")
    assert len(conversation.unsaved()) == 1


def test_push_after_stop_adds_stopped_note() -> None:
    """Pushing after the user stopped puts a STOPPED note first, in the same record."""
    conversation = Conversation.from_messages([Message.user("q")])
    conversation.halt(Halt.STOPPED)
    conversation.push(Message.user("something else"))
    refs = list(conversation.entries())
    assert refs[1].is_stop_marker() and refs[1].author == Author.rig()
    assert not refs[1].is_request()
    assert refs[2].is_request() and refs[2].is_users_own()
    assert conversation.halted() is None
    record = conversation.unsaved()[-1]
    assert isinstance(record.change, Push) and len(record.change.entries) == 2


def test_pending_calls_and_aside_position() -> None:
    """Pending calls come from the last assistant message; asides are drawn after their entry."""
    call = ToolCall("c1", "search", {"q": "x"})
    conversation = Conversation.from_messages([Message.user("q"), Assistant([call])])
    assert conversation.pending_calls() == [call]
    note = Aside.note("n", "text", conversation.id(0))
    id_ = conversation.add_aside(note)
    assert conversation.aside_position(note) == 1
    assert conversation.aside(id_) == note
    assert conversation.aside_position(Aside.note("n", "t", None)) == 0


# ---------------------------------------------------------------- edits


def test_splice_keeps_ids_in_range_and_mints_others() -> None:
    """A spliced entry keeps its id when it was in the range, once; others get new ids."""
    conversation = Conversation.from_messages([Message.user(c) for c in "abcd"])
    a, b, c, d = ids_of(conversation)
    kept = conversation.entry(1)
    outside = conversation.entry(3)
    assert kept and outside
    done = conversation.splice(range(1, 3), [kept, kept, outside], Author.plugin("p"))
    assert done.kept == [b]
    assert done.removed == [c]
    assert len(done.added) == 2
    assert ids_of(conversation)[:2] == [a, b]
    assert ids_of(conversation)[-1] == d
    assert conversation.is_retired(c)


def test_splice_authors_changed_entries_by_the_editor() -> None:
    """A changed or new entry takes the splice's author; an unchanged one keeps its own."""
    conversation = Conversation.from_messages([Message.user("a"), Message.user("b")])
    first, second = conversation.entry(0), conversation.entry(1)
    assert first and second
    edited = Entry(Message.user("B!"), id=second.id)
    conversation.splice(..., [first, edited], Author.plugin("fix"))
    assert conversation.author(0) is None
    assert conversation.author(1) == Author.plugin("fix")
    assert conversation.id(1) == second.id


def test_empty_splice_records_nothing() -> None:
    """An empty range replaced by nothing records nothing."""
    conversation = Conversation.from_messages([Message.user("a")])
    before = conversation.revision
    assert conversation.splice(range(1, 1), [], Author.user()) == conversation.splice(
        slice(0, 0), [], None
    )
    assert conversation.revision == before


def test_splice_rejects_a_stepped_range() -> None:
    """Ranges take step 1 only: a stepped slice is a usage error and changes nothing."""
    conversation = Conversation.from_messages([Message.user("a"), Message.user("b")])
    with pytest.raises(UsageError):
        conversation.splice(slice(0, 2, 2), [], None)
    assert len(conversation) == 2


def test_splice_to_end_clears_halt() -> None:
    """A splice reaching the end clears the halt."""
    conversation = Conversation.from_messages([Message.user("q")])
    conversation.halt(Halt.KEPT)
    conversation.splice(range(0, 1), [Message.user("q, edited")], Author.user())
    assert conversation.halted() is None


def test_restore_brings_asides_back_to_their_entry() -> None:
    """An aside drawn after a restored entry follows it again."""
    conversation = Conversation.from_messages([Message.user("a"), Message.assistant("b")])
    originals = [e for e in (conversation.entry(0), conversation.entry(1)) if e]
    note = Aside.note("n", "t", originals[1].id)
    conversation.add_aside(note)
    conversation.splice(..., [Message.user("summary")], Author.plugin("compact"))
    assert conversation.aside_position(note) == 0
    conversation.restore(..., originals, Author.plugin("undo"))
    assert conversation.aside_position(note) == 2


def test_set_entries_equal_records_nothing_and_changes_keep_ids() -> None:
    """`set_entries` records nothing for equal entries; it keeps ids of entries it keeps."""
    conversation = Conversation.from_messages([Message.user(c) for c in "abc"])
    entries = [ref.entry for ref in conversation.entries()]
    revision = conversation.revision
    conversation.set_entries(entries, Author.user())
    assert conversation.revision == revision
    changed = [entries[0], Entry(Message.user("B"), id=entries[1].id), entries[2]]
    done = conversation.set_entries(changed, Author.user())
    assert done.kept == [entries[1].id]
    assert ids_of(conversation) == [e.id for e in entries]
    assert conversation.messages()[1] == Message.user("B")


def test_edit_each_that_changes_nothing_records_nothing() -> None:
    """`edit_each` returning only equal or no messages records nothing."""
    conversation = Conversation.from_messages([Message.user("a")])
    assert conversation.edit_each(Author.user(), lambda ref: ref.message) == []
    assert len(conversation.unsaved()) == 1


def test_edit_each_keeps_authors() -> None:
    """Rewritten entries keep their authors."""
    conversation = Conversation()
    conversation.push(Entry(Message.user("a"), author=Author.agent("helper")))
    conversation.edit_each(Author.plugin("x"), lambda ref: Message.user("A"))
    assert conversation.author(0) == Author.agent("helper")


def test_asides_saved_unsaved_replace_and_remove() -> None:
    """Unsaved asides make no records; replacing a saved one with an unsaved one records its
    removal and keeps it in place."""
    conversation = Conversation()
    revision = conversation.revision
    local = conversation.add_aside(Aside("ui", None, Author.user(), {"x": 1}, saved=False))
    assert conversation.revision == revision
    shared = conversation.add_aside(Aside("note", None, Author.user(), {"title": "t", "text": ""}))
    assert conversation.revision == revision + 1
    assert conversation.replace_aside(shared, Aside("note", None, Author.user(), 1, saved=False))
    assert [id_ for id_, _ in conversation.asides()] == [local, shared]
    record = conversation.unsaved()[-1]
    assert record.change == AsideChange(shared, None)
    assert encode(conversation).count(b"aside_") == 0
    assert conversation.remove_aside(local) is not None
    assert conversation.remove_aside(local) is None
    assert not conversation.replace_aside(local, Aside("ui", None, Author.user(), 2))


def test_turns_open_and_end() -> None:
    """`open_turn` numbers turns and starts them at `turn_start`; `end_turn` ends the open one."""
    conversation = Conversation.from_messages([Message.user("q")])
    first = conversation.open_turn()
    assert (first.index, first.start) == (0, conversation.id(0))
    answer = conversation.push(Message.assistant("a"))
    assert conversation.end_turn(TurnEnd.answered(answer))
    assert not conversation.end_turn(TurnEnd.failed("again"))
    conversation.push(Message.user("q2"))
    second = conversation.open_turn()
    assert second.index == 1
    turns = conversation.turns()
    assert [record.index for _, record in turns] == [0, 1]
    assert turns[0][1].end == TurnEnd.answered(answer)
    assert folded(conversation) == conversation


def test_normalize_merges_assistants_and_moves_asides() -> None:
    """`normalize` merges consecutive assistant entries into the first and moves its asides."""
    conversation = Conversation.from_messages(
        [Message.user("q"), Message.assistant("a"), Message.assistant("b")]
    )
    first, second = conversation.id(1), conversation.id(2)
    note = conversation.add_aside(Aside.note("n", "t", second))
    result = conversation.normalize(Author.rig())
    assert [r.reason for r in result.repairs] == ["consecutive_assistant"]
    assert ids_of(conversation)[1:] == [first]
    message = conversation.messages()[1]
    assert isinstance(message, Assistant)
    assert message.content == [Text("a"), Text("b")]
    moved = conversation.aside(note)
    assert moved is not None and moved.after == first
    assert folded(conversation) == conversation


def test_normalize_of_valid_conversation_records_nothing() -> None:
    """A conversation needing no repair is left as it is, with no record."""
    conversation = Conversation.from_messages([Message.user("q"), Message.assistant("a")])
    revision = conversation.revision
    assert conversation.normalize(Author.rig()).repairs == []
    assert conversation.revision == revision


# ---------------------------------------------------------------- apply and the fit rules


def test_apply_refuses_a_push_of_a_held_id_and_changes_nothing() -> None:
    """A push whose entry id is held does not fit; the value and its revision stay."""
    conversation = Conversation.from_messages([Message.user("a")])
    held = conversation.entry(0)
    assert held
    before = conversation.copy()
    with pytest.raises(ApplyError) as caught:
        conversation.apply(ChangeRecord(Push([held])))
    assert caught.value.reason == "held"
    assert conversation == before and conversation.revision == before.revision


@pytest.mark.parametrize(
    ("start", "stop", "removed", "reason"),
    [(0, 3, None, "range"), (1, 0, [], "range"), (0, 1, ["msg_x"], "removed")],
)
def test_apply_refuses_a_splice_that_does_not_fit(
    start: int, stop: int, removed: list[str] | None, reason: str
) -> None:
    """A splice outside the conversation or naming other removed ids does not fit."""
    conversation = Conversation.from_messages([Message.user("a"), Message.user("b")])
    before = conversation.copy()
    change = Splice(start, stop, removed if removed is not None else ids_of(conversation), [])
    with pytest.raises(ApplyError) as caught:
        conversation.apply(ChangeRecord(change))
    assert caught.value.reason == reason
    assert conversation == before and conversation.revision == before.revision


def test_apply_refuses_removing_a_missing_aside() -> None:
    """Removing an aside that is not there does not fit."""
    conversation = Conversation()
    with pytest.raises(ApplyError):
        conversation.apply(ChangeRecord(AsideChange("aside_" + "0" * 12 + "7" + "0" * 19, None)))
    assert conversation.revision == 0


def test_apply_always_fits_a_halt() -> None:
    """A halt record always fits and counts one revision, out of the outbox."""
    conversation = Conversation()
    conversation.apply(ChangeRecord(HaltChange(Halt.KEPT)))
    assert conversation.halted() is Halt.KEPT
    assert conversation.revision == 1 and conversation.unsaved() == []


# ---------------------------------------------------------------- revision, lineage, serde


def test_revision_lineage_and_continues() -> None:
    """A new value continues any empty log; after saving it continues its own."""
    conversation = Conversation.from_messages([Message.user("a")])
    assert conversation.lineage == Lineage.EMPTY
    assert conversation.continues(Lineage.EMPTY, 0)
    assert conversation.continues(1234, 0)
    records = conversation.take_unsaved()
    conversation.continue_log(1234, len(records))
    assert conversation.continues(1234, 1) and not conversation.continues(1234, 0)
    conversation.push(Message.assistant("b"))
    assert conversation.revision == 2 and conversation.continues(1234, 1)
    assert not conversation.continues(99, 1)


def test_serde_round_trip_is_detached_and_equal() -> None:
    """A value read back from its state equals it, with lineage DETACHED and revision 0."""
    conversation = Conversation.from_messages([Message.user("a"), Message.assistant("b")])
    conversation.add_aside(Aside.note("t", "x", conversation.id(0)))
    conversation.add_aside(Aside("ui", None, Author.user(), 1, saved=False))
    back = decode_state(encode(conversation))
    assert back == conversation
    assert back.lineage == Lineage.DETACHED and back.revision == 0 and back.unsaved() == []
    assert len(back.asides()) == 1


def test_reread_takes_the_log_and_keeps_unsaved_asides() -> None:
    """`reread` takes everything from the log value and keeps this value's unsaved asides."""
    log = Conversation.from_messages([Message.user("a")])
    log.take_unsaved()
    log.continue_log(77, 1)
    mine = Conversation()
    local = mine.add_aside(Aside("ui", None, Author.user(), 1, saved=False))
    mine.reread(log)
    assert mine == log and mine.lineage == 77 and mine.revision == 1
    assert mine.aside(local) is not None


def test_reread_refuses_while_unsaved() -> None:
    """`reread` refuses with `mismatch` while records are unsaved, changing nothing."""
    log = Conversation.from_messages([Message.user("a")])
    mine = Conversation.from_messages([Message.user("b")])
    before = mine.copy()
    with pytest.raises(ApplyError) as caught:
        mine.reread(log)
    assert caught.value.reason == "mismatch"
    assert mine == before and mine.unsaved() == before.unsaved()


def test_view_and_request_view() -> None:
    """A view has no outbox and continues no log; a request view has no asides."""
    conversation = Conversation.from_messages([Message.user("a")])
    conversation.add_aside(Aside.note("t", "x", None))
    view = conversation.view()
    assert view == conversation and view.unsaved() == []
    assert view.lineage == Lineage.DETACHED
    assert conversation.request_view().asides() == []


def test_reset_replaces_everything_and_folds() -> None:
    """A reset replaces entries, asides and halt in one record that folds like any other."""
    conversation = Conversation.from_messages([Message.user("a")])
    other = Conversation.from_messages([Message.user("x"), Message.assistant("y")])
    conversation.reset(other)
    assert conversation == other
    assert folded(conversation) == conversation


def test_user_entry_predicates() -> None:
    """Tool-result-only messages are not requests; titled user authors are not the user's own."""
    conversation = Conversation()
    conversation.push(Message.tool_result("c", "f", "out"))
    conversation.push(Entry(Message.user("from a form"), author=Author.user().titled("Form")))
    results, titled = list(conversation.entries())
    assert not results.is_request() and not results.is_users_own()
    assert titled.is_request() and not titled.is_users_own()
    assert isinstance(results.message, User)


def test_take_back_pushes_undoes_trailing_pushes_only() -> None:
    """Pushes still at the end are taken back exactly (entries, ids, revision); anything
    else changes nothing and says so."""
    conversation = Conversation()
    conversation.push(Message.user("kept"))
    before = conversation.copy()
    conversation.take_unsaved()
    conversation.extend([Message.user("one"), Message.user("two")])
    conversation.push(Message.user("three"))
    records = conversation.take_unsaved()
    assert conversation.take_back_pushes(records)
    assert conversation.messages() == before.messages()
    assert conversation.revision == before.revision
    first = records[0].change.entries[0]  # type: ignore[union-attr]
    assert conversation.push(first) == first.id  # its id is free again: the index forgot it

    # Not the last entries (an entry came after them): nothing changes.
    value = Conversation()
    value.push(Message.user("a"))
    pushed = value.take_unsaved()
    value.push(Message.user("b"))
    value.take_unsaved()
    copy = value.copy()
    assert not value.take_back_pushes(pushed)
    assert value == copy and value.revision == copy.revision

    # A record that is not a push: nothing changes.
    value.splice(range(0, 1), [], None)
    spliced = value.take_unsaved()
    copy = value.copy()
    assert not value.take_back_pushes(spliced)
    assert value == copy and value.revision == copy.revision


def test_record_limit_refuses_an_edit_and_leaves_the_value_as_it_was() -> None:
    """With `record_limit`, an edit whose record is larger raises `too_large` naming the size
    and the limit; nothing moves (an unsaved aside it would have saved stays, in place), and
    records folded from a log are not measured."""
    conversation = Conversation(record_limit=2000)
    conversation.push(Message.user("q"))
    first = conversation.add_aside(Aside("note", None, Author.user(), "a", saved=False))
    conversation.add_aside(Aside("note", None, Author.user(), "b", saved=False))
    before = (conversation.state(), conversation.asides(), conversation.unsaved())
    big = Aside("note", None, Author.user(), "x" * 3000)
    with pytest.raises(UsageError) as raised:
        conversation.replace_aside(first, big)
    assert raised.value.reason == "too_large"
    size = len(encode(ChangeRecord(AsideChange(first, big), Author.user())))
    assert f"record is {size:,} bytes, over the record_limit of 2,000 bytes" in str(raised.value)
    assert (conversation.state(), conversation.asides(), conversation.unsaved()) == before
    log = Conversation()
    log.push(Message.user("y" * 5000))
    [record] = log.take_unsaved()
    conversation.apply(record)  # from a log: folded whatever its size
    assert conversation.messages()[-1] == Message.user("y" * 5000)


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "4096"])
def test_record_limit_must_be_a_positive_int(limit: object) -> None:
    """A record limit that is not a positive number of bytes is refused, changing nothing."""
    conversation = Conversation(record_limit=100)
    with pytest.raises(UsageError) as raised:
        conversation.record_limit = limit  # type: ignore[assignment]
    assert raised.value.reason == "bad_setting" and repr(limit) in raised.value.message
    assert conversation.record_limit == 100
