"""Large records with the default settings: a screenshot's worth lands on every store, and a
record no frame can carry fails at the call that makes it (issue 13, item 1)."""

from __future__ import annotations

import base64
import itertools
import random
from collections.abc import Callable

import anyio
import msgspec
import pytest
from conftest import bound, hub_config
from hypothesis import given, settings
from hypothesis import strategies as st

from client import Conflict, connect
from server import Hub, MemoryStore
from server.store import LogStore
from sync import Conversation, Message, Text, UsageError, User, encode
from sync.frames import (
    FRAME_FILL,
    MAX_FRAME,
    PUSH_OVERHEAD,
    RECORDS_OVERHEAD,
    fill_budget,
    records_frames,
    runs,
    state_frames,
)
from sync.messages import Image

FIVE_MIB = 5 * 2**20


def screenshot(size: int) -> str:
    """`size` characters of base64, as a pasted image would be (not compressible)."""
    raw = random.Random(size).randbytes(size * 3 // 4 + 3)
    return base64.b64encode(raw).decode()[:size]


async def test_a_five_mib_message_lands_by_default(backend: Callable[[], LogStore]) -> None:
    """With every setting at its default, a 5 MiB message (a screenshot as base64) pushed by
    one replica lands: the hub stores it, a subscriber gets it live, a replica connecting
    later gets it in its catch-up, and so does one after a hub restart on the same (durable)
    store."""
    image = screenshot(FIVE_MIB)
    message = User([Text("what is on my screen?"), Image("image/png", image)])
    store = backend()
    with anyio.fail_after(bound(60)):
        async with Hub(store, config=hub_config()) as hub:
            async with (
                connect(hub.url, "big", client="writer") as writer,
                connect(hub.url, "big", client="reader") as reader,
            ):
                writer.conversation.push(Message.user("before"))
                writer.conversation.push(message)
                writer.conversation.push(Message.user("after"))
                await writer.flush()
                await reader.wait_for(writer.revision)
                assert writer.conversation.messages() == [
                    Message.user("before"),
                    message,
                    Message.user("after"),
                ]
                assert reader.conversation == writer.conversation
                assert not [e for e in writer.events_nowait() if isinstance(e, Conflict)], (
                    "nothing was refused"
                )
                async with connect(hub.url, "big", client="late") as late:
                    assert late.conversation == writer.conversation
                expected = writer.conversation.copy()
        if isinstance(store, MemoryStore):
            return  # nothing outlives the hub there
        async with (
            Hub(backend(), config=hub_config()) as hub,
            connect(hub.url, "big", client="after-restart") as again,
        ):
            assert again.conversation == expected


async def test_a_message_over_the_limit_raises_at_push_and_changes_nothing(hub: Hub) -> None:
    """With the default limit, a message whose record no push can carry raises `UsageError`
    at `push`, naming the record's size and the limit; the conversation, what is pending and
    the hub's log are unchanged, and the next edit goes through."""
    with anyio.fail_after(bound(30)):
        async with connect(hub.url, "over", client="writer") as writer:
            writer.conversation.push(Message.user("before"))
            await writer.flush()
            before = writer.conversation.copy()
            revision = writer.conversation.revision
            too_big = Message.user("x" * MAX_FRAME)
            with pytest.raises(UsageError) as raised:
                writer.conversation.push(too_big)
            assert not writer.conversation.has_unsaved and writer.pending == 0
            assert raised.value.reason == "too_large"
            limit = MAX_FRAME - PUSH_OVERHEAD
            assert f"over the record_limit of {limit:,} bytes" in raised.value.message
            assert "record is 16,777," in raised.value.message  # its size, not the excess
            assert writer.conversation == before and writer.conversation.revision == revision
            writer.conversation.push(Message.user("after"))
            await writer.flush()
            room = await hub.room_for_read("over")
            assert room is not None
            assert room.conversation.messages() == [Message.user("before"), Message.user("after")]
            assert not [e for e in writer.events_nowait() if isinstance(e, Conflict)]


def test_batches_are_filled_to_one_mib_and_a_large_record_goes_alone() -> None:
    """At the default limit, catch-up frames and state chunks of small records stay near
    1 MiB (as before the limit was raised), and a 5 MiB record travels alone in one frame
    under the limit; the frames carry every record, in order."""
    small = [encode(Message.user(f"{n} " + "y" * 2000)) for n in range(1500)]
    big = encode(Message.user(screenshot(FIVE_MIB)))
    records = [*small[:700], big, *small[700:]]
    frames = records_frames(0, records, None, MAX_FRAME)
    decoded = [msgspec.json.decode(frame) for frame in frames]
    assert [record for d in decoded for record in d["records"]] == [
        msgspec.json.decode(record) for record in records
    ]
    assert all(len(frame) <= MAX_FRAME for frame in frames)
    sizes = [len(frame) for frame in frames]
    alone = [at for at, d in enumerate(decoded) if len(d["records"]) == 1]
    assert len(alone) == 1 and sizes[alone[0]] > FIVE_MIB
    assert all(size <= FRAME_FILL for at, size in enumerate(sizes) if at not in alone)
    assert [d["from"] for d in decoded] == list(
        itertools.accumulate([0] + [len(d["records"]) for d in decoded[:-1]])
    )
    state = Conversation.from_messages(
        [Message.user("q"), Message.user(screenshot(FIVE_MIB)), *[Message.user("z" * 900)] * 3000]
    ).state()
    chunks = state_frames(1, 1, state, MAX_FRAME)
    assert all(len(chunk) <= MAX_FRAME for chunk in chunks)
    assert sum(len(chunk) > FRAME_FILL for chunk in chunks) == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=400), min_size=2, max_size=40),
    st.integers(min_value=RECORDS_OVERHEAD + 50, max_value=RECORDS_OVERHEAD + 3000),
)
def test_records_frames_fill_each_frame_as_the_chunker_does(sizes: list[int], limit: int) -> None:
    """A batch that fits one frame goes as one frame without the chunker's walk; otherwise
    the frames are the chunker's runs. Either way: what `runs` would make, in order."""
    records = [b'"' + b"r" * (size - 2) + b'"' if size > 1 else b"1" for size in sizes]
    frames = records_frames(5, records, None, limit)
    budget = fill_budget(limit, RECORDS_OVERHEAD)
    expected = list(runs(records, budget))
    decoded = [msgspec.json.decode(frame) for frame in frames]
    assert [len(d["records"]) for d in decoded] == [len(run) for run in expected]
    assert [d["from"] for d in decoded] == list(
        itertools.accumulate([5] + [len(run) for run in expected[:-1]])
    )
    assert [r for d in decoded for r in d["records"]] == [msgspec.json.decode(r) for r in records]
