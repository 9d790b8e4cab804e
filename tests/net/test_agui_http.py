"""`POST /v1/agui/{id}` over real HTTP (server/agui.py): the token's scopes decide what a run
may do (read to watch, write to send), bad input and edits of the history are refused and
change nothing, and an open stream is counted in the metrics until its client goes away,
which stops nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import h11
from conftest import bound, hub_config

from client import connect
from server import Hub, MemoryStore
from server.auth import Key, KeyRing, mint_token
from sync import Message

SECRET = b"agui-secret-for-tests-only-0123456789"
KEYS = KeyRing.of(Key.secret(SECRET))
CONV = "agui-1"
ROOT = Path(__file__).resolve().parents[2]


def token(scope: str) -> str:
    return mint_token(SECRET, "alice", scope.split(), ("*",), 300)


def run_input(messages: Sequence[dict[str, Any]] = (), thread: str = CONV) -> bytes:
    return json.dumps({"threadId": thread, "runId": "r1", "messages": list(messages)}).encode()


class Http:
    """One HTTP/1.1 connection to a hub, spoken with h11."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def to(cls, hub: Hub) -> Http:
        return cls(await anyio.connect_tcp("127.0.0.1", hub.port))

    async def post(self, target: str, body: bytes, auth: str | None = None) -> h11.Response:
        headers = [("Host", "127.0.0.1"), ("Content-Length", str(len(body)))]
        if auth is not None:
            headers.append(("Authorization", f"Bearer {auth}"))
        for event in (h11.Request(method="POST", target=target, headers=headers),):
            await self.stream.send(self.h11.send(event) or b"")
        await self.stream.send(self.h11.send(h11.Data(data=body)) or b"")
        await self.stream.send(self.h11.send(h11.EndOfMessage()) or b"")
        head = await self.event()
        assert isinstance(head, h11.Response), head
        return head

    async def event(self) -> Any:
        while (event := self.h11.next_event()) is h11.NEED_DATA:
            self.h11.receive_data(await self.stream.receive())
        return event

    async def body(self) -> bytes:
        out = b""
        while not isinstance(event := await self.event(), h11.EndOfMessage):
            out += event.data
        self.h11.start_next_cycle()
        return out


async def answer(hub: Hub, target: str, body: bytes, auth: str | None) -> tuple[int, bytes]:
    """POST and read the whole answer (a run's stream to its end)."""
    with anyio.fail_after(bound(20)):
        http = await Http.to(hub)
        try:
            head = await http.post(target, body, auth)
            return head.status_code, await http.body()
        finally:
            await http.stream.aclose()


def events(body: bytes) -> list[dict[str, Any]]:
    blocks = body.decode().split("\n\n")[:-1]
    return [json.loads(block.removeprefix("data: ")) for block in blocks]


async def revision(hub: Hub) -> int:
    loaded = await hub.store.load(CONV)
    return 0 if loaded is None else loaded.revision


async def test_scopes_and_bad_runs_are_refused_and_change_nothing() -> None:
    """No token: 401. A read token may watch (a reattach shows the history) but not send
    (403). A body that is no RunAgentInput, or names another thread: 400. An edit of a
    message the log holds: 409. A stop needs write. None of them changes the log."""
    async with Hub(MemoryStore(), port=0, config=hub_config(), keys=KEYS) as hub:
        async with connect(hub.url, CONV, client="seeder", token=token("write")) as seeder:
            seeder.conversation.push(Message.user("seeded"))
            with anyio.fail_after(bound(10)):
                await seeder.flush()
            seeded = seeder.conversation.id(0)
        before = await revision(hub)
        target = f"/v1/agui/{CONV}"
        new = [{"id": "kit-1", "role": "user", "content": "hello"}]

        status, _ = await answer(hub, target, run_input(new), None)
        assert status == 401
        status, body = await answer(hub, target, run_input(new), token("read"))
        assert status == 403, body
        status, body = await answer(hub, target, run_input(), token("read"))
        assert status == 200
        kinds = [e["type"] for e in events(body)]
        assert kinds == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        assert events(body)[1]["messages"] == [{"id": seeded, "role": "user", "content": "seeded"}]
        status, _ = await answer(hub, target, b'{"threadId": 1}', token("write"))
        assert status == 400
        status, _ = await answer(hub, target, run_input(thread="other"), token("write"))
        assert status == 400
        edited = [{"id": seeded, "role": "user", "content": "changed"}]
        status, body = await answer(hub, target, run_input(edited), token("write"))
        assert status == 409, body
        status, _ = await answer(hub, f"{target}/stop", b"", token("read"))
        assert status == 403
        assert await revision(hub) == before


async def test_an_open_run_is_counted_and_its_client_leaving_loses_nothing() -> None:
    """A run waiting for a worker shows in `convsync_kit_streams{protocol="agui"}`; when its
    client goes away the gauge drops back, and the message it sent stays in the log."""
    async with Hub(MemoryStore(), port=0, config=hub_config()) as hub:
        gauge = 'convsync_kit_streams{protocol="agui"}'

        async def streams() -> str:
            return next(line for line in hub.metrics.render().splitlines() if gauge in line)

        http = await Http.to(hub)
        body = run_input([{"id": "kit-1", "role": "user", "content": "anyone there?"}])
        with anyio.fail_after(bound(20)):
            head = await http.post(f"/v1/agui/{CONV}", body)
            assert head.status_code == 200
            first = await http.event()  # RUN_STARTED and the history: the run is open
            assert b"RUN_STARTED" in first.data
            assert await streams() == f"{gauge} 1"
            await http.stream.aclose()
            while await streams() != f"{gauge} 0":  # noqa: ASYNC110 - a gauge has no event
                await anyio.sleep(0.01)  # the hub notices the peer gone (bounded above)
        async with connect(hub.url, CONV, client="reader") as reader:
            [ref] = reader.conversation.entries()
            assert ref.source_id == "kit-1" and ref.message == Message.user("anyone there?")


PROBE = """
import json, sys, threading, urllib.request
import anyio
from server import Hub, HubConfig, MemoryStore

async def main():
    config = HubConfig(ping_interval=None)
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=config) as hub:
        before = sorted(m for m in ("ag_ui", "pydantic") if m in sys.modules)
        body = json.dumps({"threadId": "probe", "runId": "r1", "messages": []}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{hub.port}/v1/agui/probe", body,
                                         {"Content-Type": "application/json"})
        def post():
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        status, _ = await anyio.to_thread.run_sync(post)
        after = sorted(m for m in ("ag_ui", "pydantic") if m in sys.modules)
        print(json.dumps({"before": before, "after": after, "status": status}))

anyio.run(main)
"""


def test_a_hub_imports_the_agui_extra_only_when_a_run_arrives() -> None:
    # The extra brings pydantic (about 8 MiB): a hub whose clients never speak AG-UI must not
    # load it at start, and the first run must still find it.
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=bound(60),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == [], seen
    assert seen["after"] == ["ag_ui", "pydantic"], seen
    assert seen["status"] == 200, seen
