"""Pins as one aside per id and `compact` / `uncompact` (SPEC §11): no pinned entry removed,
no call separated from its result, the open turn untouched, undone exactly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sync import Aside, Assistant, Author, Conversation, Message, ToolCall, pairing
from sync.compact import COMPACTED_KIND, compact, migrate_pins, pin, pinned, uncompact, unpin
from sync.entries import PINS_KIND
from sync.messages import AnyMessage


@st.composite
def conversations(draw: st.DrawFn) -> tuple[Conversation, list[int], int]:
    messages: list[AnyMessage] = []
    for turn in range(draw(st.integers(1, 6))):
        messages.append(Message.user(f"ask {turn}"))
        for step in range(draw(st.integers(0, 2))):
            calls = [ToolCall(f"c{turn}_{step}_{n}", "f") for n in range(draw(st.integers(1, 2)))]
            messages.append(Assistant(calls))
            for call in calls:
                messages.append(Message.tool_result(call.id, "f", "ok"))
        messages.append(Message.assistant(f"answer {turn}"))
    conversation = Conversation.from_messages(messages)
    pins = draw(st.lists(st.integers(0, len(messages) - 1), max_size=3, unique=True))
    for at in pins:
        pin(conversation, conversation.id(at))  # type: ignore[arg-type]
    return conversation, pins, draw(st.integers(0, 4))


@given(conversations())
def test_compact_keeps_pins_and_pairs_and_uncompact_restores_exactly(
    drawn: tuple[Conversation, list[int], int],
) -> None:
    """No pinned entry removed, pairing still valid, the last `keep` untouched; uncompact
    gives back an equal conversation (entries, ids, authors, asides)."""
    conversation, _, keep = drawn
    before = conversation.copy()
    held = pinned(conversation)
    tail = [ref.id for ref in conversation.entries()][len(conversation) - keep :]
    spliced = compact(conversation, keep=keep, summary=Message.user("summary"))
    if spliced is None:
        assert conversation == before
        return
    assert not held & set(spliced.removed)
    assert len(spliced.removed) >= 2
    pairing.validate(conversation.messages())
    assert [ref.id for ref in conversation.entries()][
        len(conversation) - keep :
    ] == tail or not keep
    ((aside_id, _),) = [(i, a) for i, a in conversation.asides() if a.kind == COMPACTED_KIND]
    uncompact(conversation, aside_id)
    assert conversation == before
    assert [ref.id for ref in conversation.entries()] == [ref.id for ref in before.entries()]


def test_compact_never_touches_the_open_turn() -> None:
    """Entries of the open turn stay, even with keep=0."""
    conversation = Conversation.from_messages(
        [Message.user("a"), Message.assistant("b"), Message.user("c"), Message.assistant("d")]
    )
    conversation.push(Message.user("now"))
    conversation.open_turn()
    conversation.push(Message.assistant("working"))
    spliced = compact(conversation, keep=0, summary=Message.user("summary"))
    assert spliced is not None
    assert [m.content[0].text for m in conversation.messages()[-2:]] == ["now", "working"]  # type: ignore[union-attr]


def test_two_pins_at_once_both_hold_and_the_old_aside_migrates() -> None:
    """Two replicas pinning different entries each add their own aside; the old `pins`
    list is read and migrated to `rig.pin` asides; unpin removes one."""
    base = Conversation.from_messages([Message.user("a"), Message.assistant("b")])
    one, two = base.copy(), base.copy()
    pin(one, base.id(0))  # type: ignore[arg-type]
    pin(two, base.id(1))  # type: ignore[arg-type]
    merged = base.copy()
    for record in [*one.unsaved()[-1:], *two.unsaved()[-1:]]:
        merged.apply(record)
    assert pinned(merged) == {base.id(0), base.id(1)}
    old = Conversation.from_messages([Message.user("a"), Message.assistant("b")])
    old.add_aside(Aside(PINS_KIND, None, Author.rig(), [old.id(1)]))
    assert pinned(old) == {old.id(1)}
    assert migrate_pins(old) == 1
    assert [a.kind for _, a in old.asides()] == ["rig.pin"]
    assert unpin(old, old.id(1)) and pinned(old) == set()  # type: ignore[arg-type]


def test_a_snapshot_carries_rig_pin_pins_in_its_mask() -> None:
    """Snapshot v1 still carries the `pinned` mask, read from `rig.pin` asides."""
    from sync.snapshot import ConversationSnapshot

    conversation = Conversation.from_messages([Message.user("a"), Message.assistant("b")])
    pin(conversation, conversation.id(1))  # type: ignore[arg-type]
    assert ConversationSnapshot.from_conversation(conversation).pinned == [False, True]


def test_snapshot_leaves_out_does_not_list_rig_pin_asides() -> None:
    """A snapshot keeps `rig.pin` pins (in its mask), so they are not named as left out."""
    from client.transfer import snapshot_leaves_out

    conversation = Conversation.from_messages([Message.user("a")])
    pin(conversation, conversation.id(0))  # type: ignore[arg-type]
    assert snapshot_leaves_out(conversation) == ["entry ids"]
