"""A state as MessagePack, asked for in `hello` (issue 32): same content, JSON stays default."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest
from conftest import bound, hub_config
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from client import connect
from server import Hub, MemoryStore
from server.session import HubSession
from sync import Aside, Assistant, Author, Conversation, Message, ToolCall, UsageError
from sync.errors import ProtocolError
from sync.frames import MIN_FRAME, Binary, state_frames
from sync.protocol import SUBPROTOCOL, Entries, Hello, State, Welcome, decode_hub_message

LIMIT = 64 * 1024


def _hello(state_format: str | None) -> bytes:
    return msgspec.json.encode(Hello("raw", 0, 0, state_format=state_format))


async def _state_of(hub: Hub, conversation_id: str, state_format: str | None) -> list[Any]:
    """The raw frames a fresh client asking for `state_format` gets, up to the state's last:
    each as websockets hands it over (str for a text frame, bytes for a binary one)."""
    got: list[Any] = []
    async with ws_connect(
        f"{hub.url}/v1/conversations/{conversation_id}",
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        max_size=None,
        ping_interval=None,
    ) as raw:
        await raw.send(_hello(state_format), text=True)
        with anyio.fail_after(bound(10)):
            while True:
                frame = await raw.recv()
                got.append(frame)
                message = decode_hub_message(frame if isinstance(frame, bytes) else frame.encode())
                if isinstance(message, State | Entries) and not message.more:
                    return got


async def test_a_hello_asking_for_msgpack_gets_the_same_state_in_binary_frames() -> None:
    """A fresh client that asks for `msgpack` gets the welcome saying so, then the very state
    a JSON client gets, in binary frames under the frame limit; JSON stays the default."""
    async with Hub(MemoryStore(), port=0, config=hub_config(max_frame=LIMIT)) as hub:
        value = Conversation.from_messages([Message.user(f"{k} " + "é" * 300) for k in range(400)])
        await hub.rewrite("packed", value)
        as_json = await _state_of(hub, "packed", None)
        packed = await _state_of(hub, "packed", "msgpack")
    assert all(isinstance(frame, str) for frame in as_json)
    welcome = decode_hub_message(packed[0].encode())
    assert isinstance(welcome, Welcome) and welcome.state_format == "msgpack"
    assert decode_hub_message(as_json[0].encode()).state_format is None  # type: ignore[union-attr]
    assert len(packed) > 3 and all(isinstance(frame, bytes) for frame in packed[1:])
    assert max(map(len, packed[1:])) <= LIMIT

    def entries(frames: list[Any]) -> list[Any]:
        messages = [decode_hub_message(f if isinstance(f, bytes) else f.encode()) for f in frames]
        first = messages[1]
        assert isinstance(first, State)
        return first.state.entries + [e for m in messages[2:] for e in m.entries]  # type: ignore[union-attr]

    assert entries(packed) == entries(as_json) == value.state().entries


async def test_an_unknown_state_format_is_refused_with_a_clear_error(hub: Hub) -> None:
    """A hello asking for a format the hub does not know gets `bad_message` naming it and the
    formats there are, and is closed; nothing is sent as if it had been taken."""
    got: list[dict[str, Any]] = []
    async with ws_connect(
        f"{hub.url}/v1/conversations/unknown-format",
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        ping_interval=None,
    ) as raw:
        await raw.send(_hello("xml"), text=True)
        with anyio.fail_after(bound(10)):
            try:
                while True:
                    got.append(msgspec.json.decode(await raw.recv(decode=False)))
            except ConnectionClosed:
                pass
    assert [message["type"] for message in got] == ["error"]
    assert got[0]["code"] == "bad_message"
    assert "unknown state_format 'xml'" in got[0]["detail"]
    assert "json or msgpack" in got[0]["detail"]


def test_the_session_takes_the_known_formats_only() -> None:
    """`json`, `msgpack` and none are taken in a hello; anything else is `bad_message`."""
    for state_format in (None, "json", "msgpack"):
        assert isinstance(HubSession(1 << 20).receive(_hello(state_format)), Hello)
    with pytest.raises(ProtocolError) as refused:
        HubSession(1 << 20).receive(_hello("MSGPACK"))
    assert refused.value.reason == "bad_message"


@pytest.mark.parametrize("state_format", ["json", "msgpack"])
async def test_a_replica_catches_up_in_either_format(hub: Hub, state_format: str) -> None:
    """A fresh replica holds the whole conversation whichever format it asks for, on its
    first connection (one record per message: the hub sends it the state, not records)."""
    with anyio.fail_after(bound(20)):
        async with connect(hub.url, "either", client="writer") as writer:
            for k in range(50):
                writer.conversation.push(Message.user(f"m{k}"))
                await writer.flush()
            async with connect(hub.url, "either", state_format=state_format) as fresh:
                assert fresh.conversation.messages() == writer.conversation.messages()
                assert fresh.session.confirmed.revision == 50
                assert fresh.connects == 1  # the state itself was read, not records after


def test_a_replica_refuses_an_unknown_format() -> None:
    """`state_format` other than json or msgpack is a usage error naming the option."""
    with pytest.raises(UsageError, match="state_format"):
        connect("ws://127.0.0.1:1", "c", state_format="xml")


def test_a_state_msgpack_cannot_hold_goes_as_json() -> None:
    """An aside value with an integer past 64 bits (fine in JSON) sends the state as JSON
    instead of failing the join."""
    value = Conversation()
    value.push(Message.user("q"))
    value.add_aside(Aside("note", None, Author.rig(), {"n": 2**70}))
    frames = state_frames(1, 1, value.state(), LIMIT, "msgpack")
    assert not any(isinstance(frame, Binary) for frame in frames)
    message = decode_hub_message(frames[0])
    assert isinstance(message, State) and message.state.asides[0].value == {"n": 2**70}
    packed = state_frames(
        1, 1, Conversation.from_messages([Message.user("q")]).state(), LIMIT, "msgpack"
    )
    assert isinstance(packed[0], Binary)


def test_entries_msgpack_cannot_hold_go_as_json_frames_of_their_own() -> None:
    """A tool call's argument past 64 bits in a later frame of a MessagePack state: that
    run of entries goes as JSON `entries` frames, the others stay MessagePack, and the
    frames decode to the whole state in order."""
    value = Conversation()
    for k in range(200):
        value.push(Message.user(f"m{k} " + "x" * 400))
    value.push(Assistant([ToolCall("c1", "count", {"n": 2**70})]))
    value.push(Message.tool_result("c1", "count", "done"))
    frames = state_frames(1, 3, value.state(), MIN_FRAME * 4, "msgpack")
    kinds = [isinstance(frame, Binary) for frame in frames]
    assert kinds[0] and kinds.count(False) >= 1 and kinds.count(True) > 1
    decoded = [decode_hub_message(bytes(frame)) for frame in frames]  # as a socket gives them
    entries = [e for m in decoded for e in (m.state.entries if isinstance(m, State) else m.entries)]
    assert [e.message for e in entries] == [e.message for e in value.state().entries]
    assert [getattr(m, "more", None) for m in decoded[1:]][-1] is False
    assert all(m.more for m in decoded[1:-1]) and decoded[0].more
