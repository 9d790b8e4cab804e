"""Protocol fuzzing against a live hub: bad frames never crash it or change a conversation.

Hypothesis makes frames of four kinds: random bytes; random JSON; valid messages with one field
broken (a wrong type, a missing field, a huge value, deep nesting); and valid messages in the
wrong order. Each goes to the hub after a hello on sockets of their own, while a well-behaved
replica keeps pushing. Every answer must be a documented one (`error` with a known code, a
`reject`, or the hello's `welcome` and catch-up), no push from a fuzzing socket is ever acked,
and the conversation ends as the good replica left it. `CONVSYNC_FUZZ_FRAMES` sets the frame
count (default 10,000). The same harness runs once more against a hub with auth on, where the
frames also carry tokens (in `auth` messages, broken or from someone else) and no log line may
hold a token.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest
from conftest import bound, hub_config
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from client import connect
from server import Hub, MemoryStore
from server.auth import Key, KeyRing, mint_token
from server.logs import JsonFormatter, TextFormatter
from sync import Message
from sync.protocol import SUBPROTOCOL

FRAMES = int(os.environ.get("CONVSYNC_FUZZ_FRAMES", "10000"))
PER_EXAMPLE = 50
CODES = {
    "malformed_json",
    "unknown_type",
    "bad_message",
    "no_hello",
    "unexpected",
    "too_big",
    "bad_client",
    "bad_conversation_id",
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
huge = st.sampled_from([2**70, -(2**70), 1e308, "x" * 200_000, [0] * 50_000, {"k" * 1000: 1}, None])
deep = st.integers(min_value=50, max_value=5000).map(lambda n: "[" * n + "]" * n)

VALID_PUSH: dict[str, Any] = {
    "type": "push",
    "seq": 1,
    "lineage": 12345,
    "revision": 0,
    "records": [
        {
            "change": {
                "type": "push",
                "entries": [
                    {
                        "message": {"role": "user", "content": [{"type": "text", "text": "x"}]},
                        "id": "msg_0190a5b2c3d47e0f8a1b2c3d4e5f6071",
                        "author": None,
                        "source_id": None,
                    }
                ],
            },
            "by": None,
            "at": None,
        }
    ],
}
VALID_HELLO: dict[str, Any] = {"type": "hello", "client": "fuzz", "lineage": 0, "revision": 0}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _broken(message: dict[str, Any], path: tuple[Any, ...], how: str, new: Any) -> bytes:
    copy = msgspec.json.decode(msgspec.json.encode(message))
    target = copy
    for key in path[:-1]:
        target = target[key]
    if how == "delete" and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = new
    return msgspec.json.encode(copy)


@st.composite
def broken_message(draw: st.DrawFn) -> bytes:
    """A valid hello or push with one field broken (the push also sits on a wrong lineage, so
    even a push that still decodes is refused: nothing may change)."""
    base = draw(st.sampled_from([VALID_HELLO, VALID_PUSH]))
    path = draw(st.sampled_from(_paths(base)))
    how = draw(st.sampled_from(["replace", "delete", "huge"]))
    new = draw(huge if how == "huge" else json_values)
    return _broken(base, path, how, new)


frames = st.one_of(
    st.binary(max_size=200),
    json_values.map(msgspec.json.encode),
    broken_message(),
    broken_message(),
    deep.map(str.encode),
    st.just(msgspec.json.encode(VALID_HELLO)),  # a second hello: wrong order
)


async def _probe(
    hub: Hub, frame: bytes, answers: list[dict[str, Any]], hello: dict[str, Any] = VALID_HELLO
) -> None:
    """Send `hello`, then `frame`, on a socket of its own; collect every answer."""
    try:
        async with ws_connect(
            f"{hub.url}/v1/conversations/fuzzed",
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            max_size=None,
            ping_interval=None,
        ) as ws:
            await ws.send(msgspec.json.encode(hello), text=True)
            await ws.send(frame, text=True)
            await ws.send(b'{"type":"hello"}', text=True)  # always bad: ends the session
            with anyio.fail_after(bound(10)):
                while True:
                    answers.append(msgspec.json.decode(await ws.recv(decode=False)))
    except ConnectionClosed:
        pass
    except InvalidStatus as status:  # refused at the handshake: only when over capacity
        raise AssertionError(f"the hub refused a connection: {status}") from status


# A batch holds frames of several MB: when Hypothesis builds its repr (to report it) it warns
# that the repr is large, and `filterwarnings = error` made that warning the failure shown.
FUZZ_REPR = "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"


@pytest.mark.filterwarnings(FUZZ_REPR)
@settings(
    max_examples=max(1, FRAMES // PER_EXAMPLE),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    phases=[Phase.explicit, Phase.generate],  # a shrink over sockets takes minutes: print instead
)
@given(st.lists(frames, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_fuzzed_frames_never_crash_or_change_the_hub(batch: list[bytes]) -> None:
    """Fuzzed frames each get a documented answer; the hub stays up and nothing changes."""
    anyio.run(_fuzz, batch)


async def _fuzz(batch: list[bytes]) -> None:
    config = hub_config(max_frame=256 * 1024)
    async with Hub(MemoryStore(), port=0, config=config) as hub:
        async with connect(hub.url, "fuzzed", client="good") as good:
            good.conversation.push(Message.user("before the fuzz"))
            await good.flush()
            answers: list[dict[str, Any]] = []
            async with anyio.create_task_group() as group:
                for k in range(0, len(batch), 10):
                    for frame in batch[k : k + 10]:
                        group.start_soon(_probe, hub, frame, answers)
                    good.conversation.push(Message.user(f"during {k}"))
                    await anyio.lowlevel.checkpoint()
            with anyio.fail_after(bound(10)):
                await good.flush()
            room = await hub.room_for_read("fuzzed")
            assert room is not None
            assert room.conversation == good.conversation
            assert len(room.conversation) == 1 + len(range(0, len(batch), 10))
            for answer in answers:
                kind = answer["type"]
                assert kind in {"welcome", "records", "state", "entries", "reject", "error"}, answer
                if kind == "error":
                    assert answer["code"] in CODES, answer
                if kind == "reject":
                    assert answer["reason"] in {"behind", "lineage", "invalid"}, answer
            assert sum(1 for a in answers if a["type"] == "error") >= len(batch)
            assert hub.metrics.records_appended == room.revision


# ---------------------------------------------------------------------- with auth on

SECRET = b"fuzzing-secret-0123456789abcdefghijkl"
PROBE_TOKEN = mint_token(SECRET, "fuzzer", ["write"], ["*"], 3600)
GOOD_TOKEN = mint_token(SECRET, "good", ["write"], ["*"], 3600)
OTHER_TOKENS = [
    mint_token(SECRET, "mallory", ["write"], ["*"], 3600),  # another principal
    mint_token(SECRET, "fuzzer", ["read"], ["elsewhere"], 3600),  # another conversation
    mint_token(SECRET, "fuzzer", ["write"], ["*"], 60, now=time.time() - 3600),  # expired
    mint_token(b"not-the-hub-secret-0123456789abcdefgh", "fuzzer", ["write"], ["*"], 3600),
]
TOKENS = [PROBE_TOKEN, GOOD_TOKEN, *OTHER_TOKENS]
VALID_AUTH: dict[str, Any] = {"type": "auth", "token": OTHER_TOKENS[0]}
AUTH_CODES = CODES | {"unauthorized", "forbidden"}


@st.composite
def broken_auth(draw: st.DrawFn) -> bytes:
    """An `auth` message with one field broken, or one whose token is not this socket's."""
    if draw(st.booleans()):
        return msgspec.json.encode({"type": "auth", "token": draw(st.sampled_from(OTHER_TOKENS))})
    path = draw(st.sampled_from(_paths(VALID_AUTH)))
    how = draw(st.sampled_from(["replace", "delete", "huge"]))
    new = draw(huge if how == "huge" else json_values)
    return _broken(VALID_AUTH, path, how, new)


auth_frames = st.one_of(frames, broken_auth(), broken_auth())


TEXT_FORM, JSON_FORM = TextFormatter(), JsonFormatter()


class _Lines(logging.Handler):
    """Every log record, formatted with all its attributes (to grep for tokens)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != "websockets.client":  # the probes' own sockets, not the hub
            # As `convsync serve` would write it too, in either `--log-format`.
            forms = f"{TEXT_FORM.format(record)} {JSON_FORM.format(record)}"
            self.lines.append(f"{record.name} {record.getMessage()} {record.__dict__} {forms}")


@pytest.mark.filterwarnings(FUZZ_REPR)
@settings(
    max_examples=max(1, FRAMES // PER_EXAMPLE),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    phases=[Phase.explicit, Phase.generate],
)
@given(st.lists(auth_frames, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_fuzzed_frames_with_auth_on_never_crash_change_or_log_a_token(batch: list[bytes]) -> None:
    """With auth on, fuzzed frames and tokens get documented answers, change nothing, and no
    log line holds a token."""
    handler = _Lines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        anyio.run(_fuzz_with_auth, batch)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert any(line.startswith("convsync.hub") for line in handler.lines)
    for line in handler.lines:
        for token in TOKENS:
            assert token not in line and token.rsplit(".", 1)[1] not in line, line


async def _fuzz_with_auth(batch: list[bytes]) -> None:
    config = hub_config(max_frame=256 * 1024)
    keys = KeyRing.of(Key.secret(SECRET))
    async with Hub(MemoryStore(), port=0, config=config, keys=keys) as hub:
        async with connect(hub.url, "fuzzed", client="good", token=GOOD_TOKEN) as good:
            good.conversation.push(Message.user("before the fuzz"))
            await good.flush()
            answers: list[dict[str, Any]] = []
            async with anyio.create_task_group() as group:
                for k in range(0, len(batch), 10):
                    for n, frame in enumerate(batch[k : k + 10]):
                        # A client id per probe: sockets of one (sub, client) replace each other.
                        hello = dict(VALID_HELLO, client=f"fuzz-{k + n}", token=PROBE_TOKEN)
                        group.start_soon(_probe, hub, frame, answers, hello)
                    good.conversation.push(Message.user(f"during {k}"))
                    await anyio.lowlevel.checkpoint()
            with anyio.fail_after(bound(10)):
                await good.flush()
            room = await hub.room_for_read("fuzzed")
            assert room is not None
            assert room.conversation == good.conversation
            assert len(room.conversation) == 1 + len(range(0, len(batch), 10))
            for answer in answers:
                kind = answer["type"]
                assert kind in {
                    "welcome",
                    "records",
                    "state",
                    "entries",
                    "reject",
                    "error",
                }, answer  # never `auth_ok`: no token of these frames may be taken
                if kind == "error":
                    assert answer["code"] in AUTH_CODES, answer
                if kind == "reject":
                    assert answer["reason"] in {"behind", "lineage", "invalid"}, answer
            assert sum(1 for a in answers if a["type"] == "error") >= len(batch)
            assert hub.metrics.records_appended == room.revision
            loaded = await hub.store.load("fuzzed")
            assert loaded is not None and set(loaded.clients) == {"good/good"}
