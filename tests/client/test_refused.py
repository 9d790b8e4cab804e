"""What the hub refuses for good is raised at once as `Refused`; what is transient is retried."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import pytest
from cliproc import convsync
from conftest import bound, hub_config
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from client import connect
from client.cli import main
from server import Hub, MemoryStore
from sync import Message
from sync.errors import CODES, Refused, UsageError
from sync.protocol import SUBPROTOCOL, Error, encode_message

REFUSALS = sorted(code for code, info in CODES.items() if info.retry in ("never", "new_token"))
TRANSIENT = sorted(code for code, info in CODES.items() if info.retry == "backoff")


class ScriptedHub:
    """A websocket server that answers every hello with `error {code}` and the close code the
    table gives it (or refuses the handshake with an HTTP status), counting connections."""

    def __init__(self, code: str | None = None, status: int | None = None) -> None:
        self.code = code
        self.status = status
        self.connections = 0
        self.url = ""

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path == "/healthz":
            return connection.respond(200, "ok\n")
        if self.status is not None:
            self.connections += 1
            return connection.respond(self.status, f"refused with {self.status}\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        self.connections += 1
        await ws.recv()
        assert self.code is not None
        await ws.send(encode_message(Error(self.code, f"scripted {self.code}")), text=True)  # type: ignore[arg-type]
        await ws.close(CODES[self.code].close, self.code)  # type: ignore[index]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ScriptedHub]:
        async with serve(
            self._handle,
            "127.0.0.1",
            0,
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            process_request=self._http,
        ) as server:
            self.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            yield self


@pytest.mark.parametrize("code", REFUSALS)
async def test_connect_raises_refused_at_once_for_each_refusal_code(code: str) -> None:
    """A hub refusing the first handshake with a permanent code: `connect()` raises
    `Refused` with that code and the hub's reason within 1 s, and never tries again."""
    async with ScriptedHub(code).running() as hub:
        with anyio.fail_after(bound(1)), pytest.raises(Refused) as raised:
            async with connect(hub.url, "c", connect_timeout=30):
                pass
        assert (raised.value.code, raised.value.detail) == (code, f"scripted {code}")
        await anyio.sleep(0.2)
        assert hub.connections == 1


@pytest.mark.parametrize("status", [401, 403, 404])
async def test_a_handshake_refused_over_http_is_refused_too(status: int) -> None:
    """A 4xx answer to the websocket handshake is a refusal, `http_<status>`."""
    async with ScriptedHub(status=status).running() as hub:
        with anyio.fail_after(bound(1)), pytest.raises(Refused) as raised:
            async with connect(hub.url, "c", connect_timeout=30):
                pass
        assert raised.value.code == f"http_{status}"
        assert hub.connections == 1


@pytest.mark.parametrize("code", [*TRANSIENT, "http_503"])
async def test_transient_failures_are_retried_with_backoff(code: str) -> None:
    """`unavailable`, `shutting_down`, `internal`, `rate_limited` and HTTP 503 are retried:
    the replica keeps trying (with backoff) until its connect timeout, never `Refused`."""
    scripted = ScriptedHub(status=503) if code == "http_503" else ScriptedHub(code)
    async with scripted.running() as hub:
        with anyio.fail_after(bound(5)), pytest.raises(TimeoutError):
            async with connect(hub.url, "c", connect_timeout=0.6, backoff=0.01, max_backoff=0.1):
                pass
        assert hub.connections >= 2


async def test_real_hub_refusals_reach_the_caller() -> None:
    """Against a real hub: a client id it cannot take, and a push larger than its frame limit
    are each raised as `Refused` with the hub's code. A conversation id it cannot take is
    refused before any connection (`UsageError`, the same code): it goes into the URL as it
    is, so `a?b` would have reached conversation `a`."""
    config = hub_config(max_frame=4096)
    async with Hub(MemoryStore(), config=config) as hub:
        for bad in ("x" * 200, "a?b", "a#b", "a/b", ""):
            with pytest.raises(UsageError) as refused:
                connect(hub.url, bad)
            assert refused.value.reason == "bad_conversation_id"
        with anyio.fail_after(bound(1)), pytest.raises(Refused) as raised:
            async with connect(hub.url, "c", client="bad\x01client"):
                pass
        assert raised.value.code == "bad_client"
        async with connect(hub.url, "c", max_frame=1 << 20) as replica:
            replica.conversation.push(Message.user("x" * 10_000))
            with anyio.fail_after(bound(1)), pytest.raises(Refused) as raised:
                await replica.flush()
            assert raised.value.code == "too_big"
            assert replica.refused is raised.value


async def test_a_push_past_the_hubs_socket_limit_is_refused_not_retried() -> None:
    """A replica whose frame limit is far above the hub's: its push is cut by the socket's own
    size limit (a bare close 1009, no error frame), which is `too_big` for good, not a drop to
    retry with the same push forever."""
    config = hub_config(max_frame=4096)  # the socket takes frames up to 4x that
    async with Hub(MemoryStore(), config=config) as hub:
        async with connect(hub.url, "c", max_frame=1 << 20) as replica:
            replica.conversation.push(Message.user("x" * 100_000))
            with anyio.fail_after(bound(2)), pytest.raises(Refused) as raised:
                await replica.flush()
            assert raised.value.code == "too_big"
            assert replica.connects == 1  # never connected again to resend it


@pytest.mark.parametrize("code", ["forbidden", "bad_conversation_id"])
def test_cli_prints_the_hubs_reason_and_exits_non_zero(
    code: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`convsync send` refused by the hub prints the code and the hub's reason, exit 1."""

    async def run() -> int:
        async with ScriptedHub(code).running() as hub:
            with anyio.fail_after(bound(5)):
                return await anyio.to_thread.run_sync(
                    main, ["send", "--url", hub.url, "--timeout", "3", "conv", "hello"]
                )

    status = anyio.run(run)
    err = capsys.readouterr().err
    assert status == 1
    assert code in err and f"scripted {code}" in err


async def test_cli_prints_a_refusal_once() -> None:
    """The command, run as a user runs it, says the hub's refusal on one line, not twice
    (the library raises it to the caller; it does not also warn about it)."""
    async with ScriptedHub("forbidden").running() as hub:
        done = await anyio.to_thread.run_sync(
            lambda: convsync("send", "--url", hub.url, "--timeout", "3", "conv", "hello")
        )
    assert done.returncode == 1
    assert done.stderr.count("scripted forbidden") == 1, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
