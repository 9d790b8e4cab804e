"""`/v1/aisdk` over HTTP (SPEC 13): tokens (`read` to watch, `write` to send and stop,
`approve` to decide), 409 for a regenerate or an edit with nothing changed, bad bodies 400,
a client that goes away leaves the agent running, stop stops, open streams in /metrics."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from conftest import bound, hub_config
from kitworker import Turn, answer_turns

from client import Replica, connect
from server import Hub
from server.auth import Key, KeyRing, mint_token
from server.store import MemoryStore
from sync import User
from sync.entries import Answered, Stopped

SECRET = b"s3cret-for-kit-tests-0123456789abcdef"
KEYS = KeyRing.of(Key.secret(SECRET))


def token(scope: str, convs: list[str] | None = None, sub: str = "web") -> str:
    return mint_token(SECRET, sub, scope.split(), convs or ["*"], 300)


def body(chat: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": chat, "messages": list(messages), "trigger": "submit-message", **extra}


def user(id_: str, text: str) -> dict[str, Any]:
    return {"id": id_, "role": "user", "parts": [{"type": "text", "text": text}]}


async def request(
    hub: Hub,
    method: str,
    path: str,
    payload: Any = None,
    bearer: str | None = None,
    headers: dict[str, str] | None = None,
    lines: int | None = None,
) -> tuple[int, bytes]:
    """`method path` (in a thread: urllib blocks); with `lines`, only that many lines of
    the body are read before the connection is closed (a client going away)."""

    def send() -> tuple[int, bytes]:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{hub.port}{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        if bearer is not None:
            req.add_header("Authorization", f"Bearer {bearer}")
        try:
            with urllib.request.urlopen(req, timeout=bound(30)) as response:
                if lines is None:
                    return response.status, response.read()
                read = b"".join(response.readline() for _ in range(lines))
                return response.status, read
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    return await anyio.to_thread.run_sync(send)


def chunks(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: ") :]))
    return out


@pytest.fixture
async def authed() -> AsyncIterator[Hub]:
    async with Hub(MemoryStore(), port=0, config=hub_config(), keys=KEYS) as running:
        yield running


@pytest.fixture
async def open_hub() -> AsyncIterator[Hub]:
    async with Hub(MemoryStore(), port=0, config=hub_config()) as running:
        yield running


async def test_each_route_needs_its_scope(authed: Hub) -> None:
    """No token: 401; a `read` token watches but cannot send or stop; another
    conversation's token is refused; a `write` token sends."""
    chat = "kit-scopes"
    sent = body(chat, user("u1", "hello"))
    assert (await request(authed, "POST", "/v1/aisdk", sent))[0] == 401
    status, text = await request(authed, "POST", "/v1/aisdk", sent, token("read"))
    assert status == 403 and b"write" in text
    assert (await request(authed, "POST", f"/v1/aisdk/{chat}/stop", {}, token("read")))[0] == 403
    assert (await request(authed, "GET", f"/v1/aisdk/{chat}/stream", None, token("read")))[0] == 204
    other = token("read write", ["elsewhere"])
    assert (await request(authed, "GET", f"/v1/aisdk/{chat}/messages", None, other))[0] == 403
    status, raw = await request(authed, "GET", f"/v1/aisdk/{chat}/messages", None, token("read"))
    assert (status, json.loads(raw)) == (200, [])
    writer = token("read write")
    async with connect(
        authed.url, chat, client="worker", token=token("read write", sub="agent")
    ) as worker:
        async with anyio.create_task_group() as group:
            group.start_soon(answer_turns, worker, Turn(tokens=5, delay=0))
            status, raw = await request(authed, "POST", "/v1/aisdk", sent, writer)
            group.cancel_scope.cancel()
    assert status == 200 and chunks(raw)[-1] == {"type": "finish", "finishReason": "stop"}


async def test_a_regenerate_or_an_edit_gets_409_and_changes_nothing(open_hub: Hub) -> None:
    """The kit's regenerate and an edit of a sent message would rewrite the log: 409."""
    chat = "kit-rewrite"
    async with connect(open_hub.url, chat, client="worker") as worker:
        async with anyio.create_task_group() as group:
            group.start_soon(answer_turns, worker, Turn(tokens=3, delay=0))
            status, _ = await request(open_hub, "POST", "/v1/aisdk", body(chat, user("u1", "hi")))
            assert status == 200
            history = json.loads((await request(open_hub, "GET", f"/v1/aisdk/{chat}/messages"))[1])
            revision = worker.revision
            again = body(chat, *history, trigger="regenerate-message")
            assert (await request(open_hub, "POST", "/v1/aisdk", again))[0] == 409
            edited = body(chat, user("u1", "hi, edited"), messageId="u1")
            assert (await request(open_hub, "POST", "/v1/aisdk", edited))[0] == 409
            swapped = body(chat, history[1], history[0], user("u2", "next"))
            assert (await request(open_hub, "POST", "/v1/aisdk", swapped))[0] == 409
            group.cancel_scope.cancel()
        with anyio.fail_after(bound(5)):
            await worker.flush()
        assert worker.revision == revision
        users = [
            m
            for m in worker.conversation.messages()
            if isinstance(m, User) and not m.only_results()
        ]
        assert len(users) == 1


async def test_bad_bodies_get_400(open_hub: Hub) -> None:
    """Not JSON, no id, no messages, a message without parts, a bad trigger: 400."""
    for payload in (
        "not json",
        {"messages": [user("u", "x")]},
        {"id": "kit-bad", "messages": []},
        {"id": "kit-bad", "messages": [{"id": "u", "role": "user"}]},
        body("kit-bad", user("u", "x"), trigger="rewind"),
        body("bad id!", user("u", "x")),
    ):
        status, _ = await request(open_hub, "POST", "/v1/aisdk", payload)
        assert status == 400, payload
    assert (await request(open_hub, "GET", "/v1/aisdk/kit-bad/nowhere"))[0] == 404
    assert (await request(open_hub, "GET", "/v1/aisdk"))[0] == 405


async def _ended(replica: Replica) -> Any:
    with anyio.fail_after(bound(30)):
        while True:
            turns = replica.conversation.turns()
            if turns and turns[-1][1].end is not None:
                return turns[-1][1].end
            async for _ in replica.events():
                break


async def test_a_client_going_away_never_stops_the_agent(open_hub: Hub) -> None:
    """The POST's connection closed after a few chunks: the turn still ends answered, and
    the open-stream gauge goes back to 0."""
    chat = "kit-gone"
    async with connect(open_hub.url, chat, client="worker") as worker:
        async with anyio.create_task_group() as group:
            group.start_soon(answer_turns, worker, Turn(tokens=60, delay=0.01))
            status, raw = await request(
                open_hub, "POST", "/v1/aisdk", body(chat, user("u1", "go")), lines=6
            )
            assert status == 200 and chunks(raw)[0]["type"] == "start"
            end = await _ended(worker)
            group.cancel_scope.cancel()
    assert isinstance(end, Answered)
    with anyio.fail_after(bound(10)):
        while open_hub.metrics.kit_streams.get("aisdk", 0):  # noqa: ASYNC110 (polls a gauge)
            await anyio.sleep(0.01)  # the front notices the closed socket at its next write


async def test_stop_stops_the_turn_and_ends_the_stream(open_hub: Hub) -> None:
    """`POST /v1/aisdk/{id}/stop` mid-answer: the worker finishes the turn stopped and the
    stream of the answer ends with finish `other`; the gauge counted it while open."""
    chat = "kit-stop"
    async with connect(open_hub.url, chat, client="worker") as worker:
        async with anyio.create_task_group() as group:
            group.start_soon(answer_turns, worker, Turn(tokens=2000, delay=0.01))
            got: dict[str, Any] = {}
            answered = anyio.Event()

            async def watch() -> None:
                got["post"] = await request(
                    open_hub, "POST", "/v1/aisdk", body(chat, user("u1", "go"))
                )
                answered.set()

            group.start_soon(watch)
            with anyio.fail_after(bound(20)):
                while not open_hub.metrics.kit_streams.get("aisdk"):  # noqa: ASYNC110 (a gauge)
                    await anyio.sleep(0.01)
            metrics = (await request(open_hub, "GET", "/metrics"))[1].decode()
            assert 'convsync_kit_streams{protocol="aisdk"} 1' in metrics
            status, raw = await request(open_hub, "POST", f"/v1/aisdk/{chat}/stop", {})
            assert (status, json.loads(raw)) == (200, {"stopped": True})
            end = await _ended(worker)
            with anyio.fail_after(bound(20)):
                await answered.wait()
            group.cancel_scope.cancel()
    assert isinstance(end, Stopped)
    status, raw = got["post"]
    assert status == 200 and chunks(raw)[-1] == {"type": "finish", "finishReason": "other"}


async def test_a_foreign_origin_is_refused(open_hub: Hub) -> None:
    """An Origin the hub does not allow gets 403 before the route runs."""
    status, _ = await request(
        open_hub,
        "POST",
        "/v1/aisdk",
        body("kit-origin", user("u1", "x")),
        headers={"Origin": "https://evil.example"},
    )
    assert status == 403
