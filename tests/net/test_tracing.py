"""OpenTelemetry spans of a hub (the `otel` extra): what they say, and what they never hold."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from cliproc import Running, convsync
from conftest import bound, hub_config
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from websockets.asyncio.client import connect as ws_connect

from client import connect
from server import Hub, MemoryStore, tracing
from server.auth import Key, KeyRing, mint_token
from server.logs import JsonFormatter, TextFormatter
from sync import Message
from sync.entries import TurnEnd
from sync.errors import Refused
from sync.messages import Assistant, Origin, Stop, Text, Usage
from sync.protocol import SUBPROTOCOL

SECRET = b"tracing-secret-0123456789abcdefghijklmn"
ASKED = "what the user asked, never in a span"
DRAFTED = "words streamed as a draft, never in a span"
ARGUMENTS = '{"city": "a tool argument never in a span"}'
ANSWER = "the model's answer, never in a span"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, to an in-memory exporter, for one test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


def _everything(span: ReadableSpan) -> str:
    """A span whole: its name, attributes, events and their attributes, status."""
    return json.dumps(
        {
            "name": span.name,
            "attributes": dict(span.attributes or {}),
            "events": [(e.name, dict(e.attributes or {})) for e in span.events],
            "status": str(span.status.status_code),
            "description": span.status.description,
        },
        default=str,
    )


async def _session(hub: Hub, write: str, forbidden: str) -> None:
    """A user message, a streamed draft with a tool call, a reply with usage and a turn
    record, a replica catching up (from the store), a refused token."""
    async with connect(hub.url, "traced", client="agent", token=write, draft_interval=0) as a:
        a.conversation.push(Message.user(ASKED))
        a.conversation.open_turn()
        await a.flush()
        behind = (a.session.lineage, a.session.revision)  # the reader's, below
        async with a.draft() as d:
            d.append(DRAFTED)
            d.append(ARGUMENTS, part="call:c1", name="weather")
            with anyio.fail_after(bound(10)):  # the hub has them (it echoes own drafts)
                while d.id not in a.drafts or a.drafts[d.id].text != DRAFTED:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            reply = Assistant(
                [Text(ANSWER)],
                stop=Stop("stop"),
                origin=Origin("anthropic", "claude-test", "resp_1"),
                usage=Usage(input_tokens=12, output_tokens=34, cache_read_tokens=5),
            )
            await d.commit(reply)
        a.conversation.end_turn(TurnEnd.answered(d.id))
        with anyio.fail_after(bound(10)):
            await a.flush()
    await _catch_up(hub, write, *behind)
    with pytest.raises(Refused):
        async with connect(hub.url, "traced", client="x", token=forbidden):
            pass


async def _catch_up(hub: Hub, token: str, lineage: int, revision: int) -> None:
    """A replica that holds the log at `revision` joins and is sent the records since."""
    async with ws_connect(f"{hub.url}/v1/conversations/traced", subprotocols=[SUBPROTOCOL]) as ws:
        hello = {"type": "hello", "client": "reader", "lineage": lineage, "revision": revision}
        await ws.send(json.dumps({**hello, "token": token}))
        with anyio.fail_after(bound(10)):
            kinds = [json.loads(await ws.recv())["type"] for _ in range(2)]
    assert kinds == ["welcome", "records"]


async def test_spans_cover_hello_push_catch_up_drafts_and_turns_and_hold_no_secret(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    """A session with auth yields hello, push (append, ack), catch-up, draft and turn spans,
    the reply's usage as `gen_ai.*` attributes; no span attribute or event, and no log line
    (text or JSON), holds a token, the secret, or any text of the messages and drafts."""
    caplog.set_level(logging.DEBUG)
    write = mint_token(SECRET, "alice", ["write"], ["*"], 300)
    forbidden = mint_token(SECRET, "bob", ["read"], ["elsewhere"], 300)
    config = hub_config(recent_records=0)  # a replica behind catches up from the store
    async with Hub(
        MemoryStore(), port=0, config=config, keys=KeyRing.of(Key.secret(SECRET))
    ) as hub:
        await _session(hub, write, forbidden)
    finished = spans.get_finished_spans()
    names = {span.name for span in finished}
    assert {
        "convsync.hello", "convsync.push", "convsync.append", "convsync.catch_up",
        "convsync.draft", "convsync.turn",
    } <= names, names  # fmt: skip
    by_id = {span.context.span_id: span for span in finished}
    append = next(s for s in finished if s.name == "convsync.append")
    assert append.parent is not None and by_id[append.parent.span_id].name == "convsync.push"
    pushes = [s for s in finished if s.name == "convsync.push"]
    assert all(any(e.name == "ack" for e in s.events) for s in pushes)
    [reply] = [
        s
        for s in finished
        if s.name == "convsync.turn" and s.attributes.get("gen_ai.usage.input_tokens")
    ]  # type: ignore[union-attr]
    attributes: dict[str, Any] = dict(reply.attributes or {})
    assert attributes["gen_ai.usage.output_tokens"] == 34
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 5
    assert attributes["gen_ai.response.model"] == "claude-test"
    assert attributes["gen_ai.provider.name"] == "anthropic"
    ends = {s.attributes.get("convsync.turn.end") for s in finished if s.name == "convsync.turn"}  # type: ignore[union-attr]
    assert "answered" in ends
    catch_up = [
        s
        for s in finished
        if s.name == "convsync.hello" and s.attributes.get("convsync.client") == "reader"
    ]  # type: ignore[union-attr]
    assert catch_up and catch_up[0].attributes["convsync.catch_up.records"] > 0  # type: ignore[index]
    forms = (TextFormatter(), JsonFormatter())
    ours = [r for r in caplog.records if r.name != "websockets.client"]  # the test's raw socket
    logged = [f"{r.__dict__} " + " ".join(f.format(r) for f in forms) for r in ours]
    assert any("convsync.hub" in line for line in logged), "the capture is not working"
    text = "\n".join([_everything(span) for span in finished] + logged)
    for secret in (write, forbidden, SECRET.decode(), ASKED, DRAFTED, ARGUMENTS, ANSWER):
        assert secret not in text
        assert secret.rsplit(".", 1)[-1] not in text
    for word in ("never in a span", "tool argument"):
        assert word not in text


def test_tracing_off_imports_no_opentelemetry() -> None:
    """A hub (and the CLI) without tracing never imports `opentelemetry`: no import cost."""
    code = (
        "import sys, server, server.hub, server.room, server.tracing, client.cli\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_serve_trace_console_writes_one_span_a_line_without_message_text() -> None:
    """`convsync serve --trace console`: each span one JSON line on stderr (hello, push,
    append among them), the pushed message's text in none."""
    hub = Running("serve", "--db", ":memory:", "--port", "0", "--trace", "console")
    try:
        url = hub.url()
        assert convsync("send", "traced", ASKED, "--url", url).returncode == 0
    finally:
        code, err = hub.stop()
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("{")]
    names = {json.loads(line)["name"] for line in lines}
    assert {"convsync.hello", "convsync.push", "convsync.append"} <= names, err
    assert ASKED not in err
