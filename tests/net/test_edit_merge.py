"""Concurrent edits of one entry merge, or conflict, never vanish (SPEC 16): through the
public API, two replicas on a real hub."""

from __future__ import annotations

import anyio
from conftest import bound

from client import Conflict, Replica, connect
from server import Hub
from sync import Aside, Author, Conversation, Message

FOX = "The quick brown fox jumps over the lazy dog."


async def _settle(replicas: list[Replica], hub: Hub, conversation_id: str) -> Conversation:
    """Flush every replica until all saw the whole log; the hub's value."""
    with anyio.fail_after(bound(20)):
        for _ in range(2):  # a rebase late in the run may have pushed again
            for replica in replicas:
                await replica.flush()
            room = await hub.room_for_read(conversation_id)
            assert room is not None
            for replica in replicas:
                await replica.wait_for(room.revision)
        return room.conversation.copy()


def _edit(replica: Replica, old: str, new: str) -> None:
    """Rewrite the first message in place, replacing `old` with `new` in its text."""
    replica.conversation.edit_each(
        Author.user(),
        lambda ref: Message.user(FOX.replace(old, new)) if ref.index == 0 else None,
    )


async def test_two_edits_of_one_message_merge(hub: Hub) -> None:
    """A changes "brown", B changes "lazy" at once: both replicas and the hub hold both."""
    async with connect(hub.url, "fox", client="a") as a, connect(hub.url, "fox", client="b") as b:
        a.conversation.push(Message.user(FOX))
        await _settle([a, b], hub, "fox")
        _edit(a, "brown", "RED")  # neither has heard of the other's edit
        _edit(b, "lazy", "SLEEPY")
        value = await _settle([a, b], hub, "fox")
        merged = [Message.user("The quick RED fox jumps over the SLEEPY dog.")]
        assert value.messages() == merged
        assert a.conversation.messages() == b.conversation.messages() == merged
        events = a.events_nowait() + b.events_nowait()
        assert not [event for event in events if isinstance(event, Conflict)]


async def test_two_edits_of_the_same_word_conflict_once(hub: Hub) -> None:
    """Both change "brown": exactly one Conflict(edited) with both versions; the version that
    landed first stays whole."""
    async with connect(hub.url, "fox2", client="a") as a, connect(hub.url, "fox2", client="b") as b:
        a.conversation.push(Message.user(FOX))
        await _settle([a, b], hub, "fox2")
        _edit(a, "brown", "RED")
        _edit(b, "brown", "BLUE")
        value = await _settle([a, b], hub, "fox2")
        conflicts = [e for e in a.events_nowait() + b.events_nowait() if isinstance(e, Conflict)]
        assert [c.reason for c in conflicts] == ["edited"]
        [conflict] = conflicts
        assert conflict.theirs is not None and conflict.ours is not None
        versions = [conflict.theirs.message, conflict.ours.message]  # type: ignore[union-attr]
        both = [Message.user(FOX.replace("brown", word)) for word in ("RED", "BLUE")]
        assert versions in (both, both[::-1])
        assert value.messages() == [conflict.theirs.message]  # type: ignore[union-attr]
        assert a.conversation == b.conversation == value


async def test_two_edits_of_one_note_merge(hub: Hub) -> None:
    """Two people edit one note at once, in different places: the note holds both."""
    async with connect(hub.url, "note", client="a") as a, connect(hub.url, "note", client="b") as b:
        id_ = a.conversation.add_aside(Aside.note("plan", FOX, None, Author.user()))
        await _settle([a, b], hub, "note")
        a.conversation.replace_aside(
            id_, Aside.note("plan", FOX.replace("brown", "RED"), None, Author.user())
        )
        b.conversation.replace_aside(
            id_, Aside.note("plan", FOX.replace("lazy", "SLEEPY"), None, Author.user())
        )
        value = await _settle([a, b], hub, "note")
        note = value.aside(id_)
        assert note is not None
        assert note.value["text"] == "The quick RED fox jumps over the SLEEPY dog."
        assert a.conversation == b.conversation == value
