"""The real `anthropic` and `openai` SDKs against a fake provider on loopback (SPEC §11): the
SDK parses streams in each provider's documented shape, `replica.answer` folds its events
into a draft a UI watches grow, and the committed message equals the SDK's own final
accumulation converted with `from_*`. Then the conversation goes back out through `to_*`
and the SDK, and the fake provider checks the request's shape."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from conftest import bound
from fakeprovider import FakeProvider, anthropic_stream, chat_stream, responses_stream

from client import Replica, connect
from server import Hub
from sync import Assistant, Halt, Message, Reasoning, Stop, ToolCall, Usage, User
from sync.providers import (
    from_anthropic,
    from_openai_chat,
    from_openai_responses,
    to_anthropic,
    to_openai_chat,
    to_openai_responses,
)
from sync.providers.streams import StreamError

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")


@pytest.fixture
def provider() -> Any:
    with FakeProvider().running() as fake:
        yield fake


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    with anyio.fail_after(bound(seconds)):
        while not check():  # noqa: ASYNC110 - a UI's redraw loop polls like this
            await anyio.sleep(0.005)


async def watched(
    hub: Hub, name: str, answer: Callable[[Replica], Any], provider: FakeProvider | None = None
) -> tuple[Assistant, Any, list[str], Replica]:
    """Run `answer(worker)` with a UI watching; the message committed, what `answer`
    returned beside it, every draft text the UI saw, and the UI. With `provider`, its stream
    waits at its first pause after text until the UI has shown some (no race with load)."""
    seen: list[str] = []
    if provider is not None:
        provider.partial_seen = threading.Event()
    async with (
        connect(hub.url, name, client="worker", draft_interval=0.01) as worker,
        connect(hub.url, name, client="ui") as ui,
    ):
        worker.conversation.push(Message.user("hello"))
        await worker.flush()

        async def watch() -> None:
            while True:
                for draft in ui.drafts.values():
                    if not seen or seen[-1] != draft.text:
                        seen.append(draft.text)
                    if draft.text and provider is not None and provider.partial_seen:
                        provider.partial_seen.set()
                await anyio.sleep(0.002)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            with anyio.fail_after(bound(10)):
                committed, other = await answer(worker)
                await worker.flush()
                await until(lambda: len(ui.conversation) == 2)
            tg.cancel_scope.cancel()
        assert ui.conversation.messages()[-1] == committed
        return committed, other, seen, ui


def _grew(seen: list[str], final: str) -> None:
    """The UI saw the draft as a proper prefix of the final text before the commit."""
    assert any(text and len(text) < len(final) and final.startswith(text) for text in seen), seen


# ---------------------------------------------------------------------- Anthropic

USAGE = {"cache_read_input_tokens": 100, "cache_creation_input_tokens": 7}


def anthropic_client(provider: FakeProvider) -> Any:
    return anthropic.AsyncAnthropic(base_url=provider.url, api_key="test-key", max_retries=0)


ANTHROPIC_CASES = {
    "text": anthropic_stream(
        [{"type": "text", "text": "Hello there, how are you today?"}], usage=USAGE, pause=0.025
    ),
    "thinking": anthropic_stream(
        [
            {
                "type": "thinking",
                "thinking": "Let me think about the weather.",
                "signature": "c2lnbmF0dXJl",
            },
            {"type": "text", "text": "Checking the weather for you now."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
        ],
        stop_reason="tool_use",
        pause=0.025,
    ),
    "redacted": anthropic_stream(
        [
            {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
            {"type": "text", "text": "Here is my answer, in a few words."},
        ],
        pause=0.025,
    ),
    "two calls": anthropic_stream(
        [
            {"type": "text", "text": "Looking up both cities right now."},
            {"type": "tool_use", "id": "toolu_a", "name": "weather", "input": {"city": "Paris"}},
            {
                "type": "tool_use",
                "id": "toolu_b",
                "name": "weather",
                "input": {"city": "Rome", "days": 3},
            },
        ],
        stop_reason="tool_use",
        pause=0.025,
    ),
    "refusal": anthropic_stream(
        [{"type": "text", "text": "I can't help with that one."}],
        stop_reason="refusal",
        pause=0.025,
    ),
    "max tokens": anthropic_stream(
        [{"type": "text", "text": "This answer was cut off at the"}],
        stop_reason="max_tokens",
        pause=0.025,
    ),
}


@pytest.mark.parametrize("case", list(ANTHROPIC_CASES))
async def test_anthropic_stream_commits_the_sdks_final_message(
    hub: Hub, provider: FakeProvider, case: str
) -> None:
    """Anthropic: the committed reply equals from_anthropic(get_final_message())."""
    provider.script(ANTHROPIC_CASES[case])
    client = anthropic_client(provider)

    async def answer(worker: Replica) -> Any:
        request = to_anthropic(worker.conversation)
        async with client.messages.stream(model="claude-fake", max_tokens=100, **request) as stream:
            committed = await worker.answer(stream, format="anthropic")
            return committed, await stream.get_final_message()

    committed, final, seen, _ = await watched(hub, f"a-{case.replace(' ', '_')}", answer, provider)
    assert [committed] == from_anthropic(final)
    text = "".join(block.text for block in final.content if block.type == "text")
    _grew(seen, text)
    assert committed.origin is not None and committed.origin.provider == "anthropic"
    if case == "text":
        assert committed.usage == Usage(12 + 100 + 7, 42, 100, 7, None)
    if case == "thinking":
        assert committed.content[0] == Reasoning(
            "Let me think about the weather.", signature="c2lnbmF0dXJl"
        )
        assert committed.stop == Stop("tool_use")
    if case == "redacted":
        assert committed.content[0] == Reasoning("", redacted=True, data="ZW5jcnlwdGVk")
    if case == "two calls":
        assert [c.arguments for c in committed.tool_calls()] == [
            {"city": "Paris"},
            {"city": "Rome", "days": 3},
        ]
    if case == "refusal":
        assert committed.stop == Stop("stop", "refusal")
    if case == "max tokens":
        assert committed.stop == Stop("length")


async def test_anthropic_tool_loop_replays_thinking_with_its_signature(
    hub: Hub, provider: FakeProvider
) -> None:
    """After a thinking + tool_use reply, the next request (to_anthropic through the SDK)
    carries the thinking block with its signature before the call, and the result first."""
    provider.script(ANTHROPIC_CASES["thinking"])
    provider.script(anthropic_stream([{"type": "text", "text": "It is sunny in Paris."}]))
    client = anthropic_client(provider)
    async with connect(hub.url, "a-loop", client="worker", draft_interval=0.01) as worker:
        worker.conversation.push(Message.user("weather in Paris?"))
        with anyio.fail_after(bound(10)):
            for _ in range(2):
                request = to_anthropic(worker.conversation)
                async with client.messages.stream(
                    model="claude-fake",
                    max_tokens=100,
                    thinking={"type": "enabled", "budget_tokens": 1024},
                    **request,
                ) as stream:
                    reply = await worker.answer(stream, format="anthropic")
                for call in reply.tool_calls():
                    worker.conversation.push(Message.tool_result(call.id, call.name, "sunny"))
            await worker.flush()
    _, second = provider.requests[1]
    assert second["messages"][1] == {
        "role": "assistant",
        "content": [
            {
                "type": "thinking",
                "thinking": "Let me think about the weather.",
                "signature": "c2lnbmF0dXJl",
            },
            {"type": "text", "text": "Checking the weather for you now."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
        ],
    }
    assert second["messages"][2] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "sunny"}],
            }
        ],
    }
    assert from_anthropic(second)[1:] == [
        Assistant(worker.conversation.messages()[1].content),  # type: ignore[union-attr]
        worker.conversation.messages()[2],
    ]


async def test_anthropic_error_mid_stream_keeps_the_partial_reply(
    hub: Hub, provider: FakeProvider
) -> None:
    """An `error` event mid-stream: the SDK raises, the text so far is committed as a
    failed reply (never read by a model), and the model still owes an answer."""
    provider.script(
        anthropic_stream(
            [{"type": "text", "text": "Partial answer"}, {"type": "text", "text": "never"}],
            error_after=1,
        )
    )
    client = anthropic_client(provider)
    async with connect(hub.url, "a-err", client="worker", draft_interval=0.01) as worker:
        worker.conversation.push(Message.user("hi"))
        with anyio.fail_after(bound(10)), pytest.raises(anthropic.APIStatusError):
            async with client.messages.stream(
                model="claude-fake", max_tokens=10, **to_anthropic(worker.conversation)
            ) as stream:
                await worker.answer(stream, format="anthropic")
        await worker.flush()
        last = worker.conversation.messages()[-1]
        assert isinstance(last, Assistant) and last.failed()
        assert last.content[-1].text == "Partial answer"  # type: ignore[union-attr]
        assert worker.conversation.awaits_model()


async def test_a_stop_closes_the_sdk_stream_and_keeps_the_partial(
    hub: Hub, provider: FakeProvider
) -> None:
    """A halt `stopped` while the model streams: the draft ends, the SDK stream is closed
    (the fake provider sees the client go), the partial reply lands aborted."""
    events = anthropic_stream([{"type": "text", "text": "Some words before the stop"}])
    provider.script([*events[:6], {"hang": True}])
    client = anthropic_client(provider)
    async with (
        connect(hub.url, "a-stop", client="worker", draft_interval=0.01) as worker,
        connect(hub.url, "a-stop", client="ui") as ui,
    ):
        worker.conversation.push(Message.user("hi"))
        await worker.flush()

        async def stop_when_drafting() -> None:
            await until(lambda: any(d.text for d in ui.drafts.values()))
            ui.conversation.halt("stopped")
            await ui.flush()

        with anyio.fail_after(bound(10)):
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_when_drafting)
                async with client.messages.stream(
                    model="claude-fake", max_tokens=10, **to_anthropic(worker.conversation)
                ) as stream:
                    reply = await worker.answer(stream, format="anthropic")
                    # Closed by `answer` itself, not by leaving the SDK's block.
                    await anyio.to_thread.run_sync(provider.closed_early.wait, bound(2))
                    assert provider.closed_early.is_set()
        assert reply.stop == Stop("aborted", "stopped")
        assert reply.content and reply.content[-1].text  # type: ignore[union-attr]
        await worker.flush()
        assert worker.conversation.messages()[-1] == reply
        # Kept as SPEC 10 keeps a stopped answer: the partial right after the request, then
        # the halt (the STOPPED note goes before the next input, not before the partial).
        with anyio.fail_after(bound(10)):
            await ui.wait_for(worker.revision)
        for replica in (worker, ui):
            assert [type(m) for m in replica.conversation.messages()] == [User, Assistant]
            assert replica.conversation.halted() is Halt.STOPPED
        worker.conversation.push(Message.user("go on"))
        note = worker.conversation.messages()[-2]
        assert isinstance(note, User) and note.content[0].text == "STOPPED"  # type: ignore[union-attr]


# ---------------------------------------------------------------------- OpenAI Chat

CHAT_CASES = {
    "text": chat_stream("Hello from the chat model, word by word.", pause=0.025),
    "one call": chat_stream(
        "Let me look that up for you.",
        calls=[("call_1", "weather", {"city": "Paris"})],
        finish="tool_calls",
        pause=0.025,
    ),
    "two calls": chat_stream(
        "Looking both of them up right now.",
        calls=[("call_1", "weather", {"city": "Paris"}), ("call_2", "time", {"tz": "CET"})],
        finish="tool_calls",
        pause=0.025,
    ),
    "refusal": chat_stream(
        "Well, let me say this plainly.", refusal="I can't help with that.", pause=0.025
    ),
    "max tokens": chat_stream("This answer was cut off at the", finish="length", pause=0.025),
}


def openai_client(provider: FakeProvider) -> Any:
    return openai.AsyncOpenAI(base_url=provider.url + "/v1", api_key="test-key", max_retries=0)


@pytest.mark.parametrize("case", list(CHAT_CASES))
async def test_openai_chat_stream_commits_the_sdks_final_completion(
    hub: Hub, provider: FakeProvider, case: str
) -> None:
    """Chat: the committed reply equals from_openai_chat(get_final_completion())."""
    provider.script(CHAT_CASES[case])
    client = openai_client(provider)

    async def answer(worker: Replica) -> Any:
        request = to_openai_chat(worker.conversation)
        async with client.chat.completions.stream(
            model="gpt-fake", stream_options={"include_usage": True}, **request
        ) as stream:
            committed = await worker.answer(stream, format="openai_chat")
            try:
                return committed, await stream.get_final_completion()
            except openai.LengthFinishReasonError as exc:  # the SDK's accumulation, refused
                return committed, exc.completion

    committed, final, seen, _ = await watched(hub, f"c-{case.replace(' ', '_')}", answer, provider)
    assert [committed] == from_openai_chat(final)
    _grew(seen, final.choices[0].message.content or "")
    assert committed.usage == Usage(30, 9, 20, None, 4)
    if "call" in case:
        assert committed.stop == Stop("tool_use")
        assert all(isinstance(c, ToolCall) for c in committed.tool_calls())
    if case == "refusal":
        assert committed.stop == Stop("stop", "refusal")
    if case == "max tokens":
        assert committed.stop == Stop("length")


async def test_openai_chat_tool_loop_sends_one_tool_message_per_result(
    hub: Hub, provider: FakeProvider
) -> None:
    """The second request carries the calls and one `tool` message per result."""
    provider.script(CHAT_CASES["two calls"])
    provider.script(chat_stream("Paris is sunny, and it is noon."))
    client = openai_client(provider)
    async with connect(hub.url, "c-loop", client="worker", draft_interval=0.01) as worker:
        worker.conversation.push(Message.user("weather and time?"))
        with anyio.fail_after(bound(10)):
            for _ in range(2):
                request = to_openai_chat(worker.conversation)
                async with client.chat.completions.stream(model="gpt-fake", **request) as stream:
                    reply = await worker.answer(stream, format="openai_chat")
                for call in reply.tool_calls():
                    worker.conversation.push(
                        Message.tool_result(call.id, call.name, f"ok {call.id}")
                    )
            await worker.flush()
    _, second = provider.requests[1]
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["user", "assistant", "tool", "tool"]
    assert second["messages"][1]["tool_calls"][1] == {
        "id": "call_2",
        "type": "function",
        "function": {"name": "time", "arguments": json.dumps({"tz": "CET"}, separators=(",", ":"))},
    }
    assert second["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_2",
        "content": "ok call_2",
    }


async def test_openai_chat_error_mid_stream_raises_and_keeps_the_partial(
    hub: Hub, provider: FakeProvider
) -> None:
    """An error chunk mid-stream: the SDK raises, the partial reply is kept as failed."""
    provider.script(chat_stream("Partial words", error=True))
    client = openai_client(provider)
    async with connect(hub.url, "c-err", client="worker", draft_interval=0.01) as worker:
        worker.conversation.push(Message.user("hi"))
        with anyio.fail_after(bound(10)), pytest.raises(openai.APIError):
            async with client.chat.completions.stream(
                model="gpt-fake", **to_openai_chat(worker.conversation)
            ) as stream:
                await worker.answer(stream, format="openai_chat")
        await worker.flush()
        last = worker.conversation.messages()[-1]
        assert isinstance(last, Assistant) and last.failed()
        assert last.content[-1].text == "Partial words"  # type: ignore[union-attr]


# ---------------------------------------------------------------------- OpenAI Responses

REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "Thinking it over."}],
    "encrypted_content": "ZW5j",
}


def _message(text: str, kind: str = "output_text") -> dict[str, Any]:
    part = (
        {"type": kind, "text": text, "annotations": []}
        if kind == "output_text"
        else {"type": "refusal", "refusal": text}
    )
    return {
        "type": "message",
        "id": "msg_o1",
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }


def _call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{n}",
        "call_id": f"call_{n}",
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }


RESPONSES_CASES = {
    "text": responses_stream(
        [_message("Hello from the responses model, piece by piece.")], pause=0.025
    ),
    "reasoning and calls": responses_stream(
        [
            REASONING,
            _message("Checking both cities now for you."),
            _call(1, "weather", {"city": "Paris"}),
            _call(2, "weather", {"city": "Rome"}),
        ],
        pause=0.025,
    ),
    "refusal": responses_stream(
        [_message("I can't help with that request.", "refusal")], pause=0.025
    ),
    "incomplete": responses_stream(
        [_message("This answer was cut off at the")],
        status="incomplete",
        incomplete="max_output_tokens",
        pause=0.025,
    ),
}


@pytest.mark.parametrize("case", list(RESPONSES_CASES))
async def test_openai_responses_stream_commits_the_sdks_final_response(
    hub: Hub, provider: FakeProvider, case: str
) -> None:
    """Responses: the committed reply equals from_openai_responses(get_final_response())."""
    provider.script(RESPONSES_CASES[case])
    client = openai_client(provider)

    async def answer(worker: Replica) -> Any:
        request = to_openai_responses(worker.conversation)
        ends: list[Any] = []

        async def events(stream: Any) -> AsyncIterator[Any]:
            async for event in stream:
                if event.type == "response.incomplete":
                    ends.append(event.response)  # get_final_response() only takes completed
                yield event

        async with client.responses.stream(model="gpt-fake", **request) as stream:
            committed = await worker.answer(events(stream), format="openai_responses")
            if ends:
                return committed, ends[-1]
            return committed, await stream.get_final_response()

    committed, final, seen, _ = await watched(hub, f"r-{case.replace(' ', '_')}", answer, provider)
    assert [committed] == from_openai_responses(final)
    texts = [
        p.text for p in committed.content if hasattr(p, "text") and not isinstance(p, Reasoning)
    ]
    _grew(seen, "".join(texts))
    assert committed.usage == Usage(50, 17, 32, None, 8)
    if case == "reasoning and calls":
        assert committed.stop == Stop("tool_use")
        assert committed.content[0] == Reasoning(
            "Thinking it over.", provider_data={"id": "rs_1", "encrypted_content": "ZW5j"}
        )
    if case == "refusal":
        assert committed.stop == Stop("stop", "refusal")
    if case == "incomplete":
        assert committed.stop == Stop("length", "max_output_tokens")


async def test_openai_responses_tool_loop_replays_reasoning_items(
    hub: Hub, provider: FakeProvider
) -> None:
    """The second request replays the reasoning item (id, encrypted content) and the
    function_call items with their ids, then one function_call_output per result."""
    provider.script(RESPONSES_CASES["reasoning and calls"])
    provider.script(responses_stream([_message("Both are sunny.")]))
    client = openai_client(provider)
    async with connect(hub.url, "r-loop", client="worker", draft_interval=0.01) as worker:
        worker.conversation.push(Message.user("weather?"))
        with anyio.fail_after(bound(10)):
            for _ in range(2):
                request = to_openai_responses(worker.conversation)
                async with client.responses.stream(
                    model="gpt-fake", include=["reasoning.encrypted_content"], **request
                ) as stream:
                    reply = await worker.answer(stream, format="openai_responses")
                for call in reply.tool_calls():
                    worker.conversation.push(Message.tool_result(call.id, call.name, "sunny"))
            await worker.flush()
    _, second = provider.requests[1]
    kinds = [item.get("type", item.get("role")) for item in second["input"]]
    assert kinds == [
        "user",
        "reasoning",
        "assistant",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    assert second["input"][1] == {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Thinking it over."}],
        "encrypted_content": "ZW5j",
    }
    assert second["input"][3]["id"] == "fc_1" and second["input"][3]["call_id"] == "call_1"
    assert second["input"][6] == {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": "sunny",
    }


async def test_openai_responses_error_event_raises(hub: Hub, provider: FakeProvider) -> None:
    """An `error` event: the SDK or the fold raises, and the partial is kept as failed."""
    provider.script(responses_stream([_message("Partial words here")], error=True))
    client = openai_client(provider)
    async with connect(hub.url, "r-err", client="worker", draft_interval=0.01) as worker:
        worker.conversation.push(Message.user("hi"))
        with anyio.fail_after(bound(10)), pytest.raises((openai.APIError, StreamError)):
            async with client.responses.stream(
                model="gpt-fake", **to_openai_responses(worker.conversation)
            ) as stream:
                await worker.answer(stream, format="openai_responses")
        await worker.flush()
        last = worker.conversation.messages()[-1]
        assert isinstance(last, Assistant) and last.failed()


# ---------------------------------------------------------------------- the demo's model


@pytest.mark.parametrize("with_call", [False, True])
def test_the_demos_fake_model_speaks_the_anthropic_stream_the_sdk_reads(with_call: bool) -> None:
    """`convsync demo`'s model events are Anthropic Messages events: the SDK's own parser
    and accumulation take them, and its final message converted with `from_anthropic` is
    what the stream fold (`replica.answer`'s path) commits."""
    from anthropic._models import construct_type
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import RawMessageStreamEvent

    from client.demo import model_events
    from sync.providers.streams import stream_fold

    call = ToolCall("call_0_weather", "weather", {"city": "Lisbon"}) if with_call else None
    events = list(model_events("It is 18°C and clear in Lisbon.", call))
    snapshot = None
    buffers: dict[int, bytes] = {}
    for event in events:
        parsed = construct_type(type_=RawMessageStreamEvent, value=event)
        snapshot = accumulate_event(event=parsed, current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    fold = stream_fold("anthropic")
    for event in events:
        fold.feed(event)
    content = snapshot.model_dump()["content"]
    [expected] = from_anthropic([{"role": "assistant", "content": content}])
    final = fold.final()
    assert final.content == expected.content  # type: ignore[union-attr]
    assert final.stop == (Stop("tool_use") if with_call else Stop("stop"))
    assert final.tool_calls() == ([call] if call else [])


# ---------------------------------------------------------------------- a stop, OpenAI


@pytest.mark.parametrize("format", ["openai_chat", "openai_responses"])
async def test_a_stop_closes_an_openai_sdk_stream_and_keeps_the_partial(
    hub: Hub, provider: FakeProvider, format: str
) -> None:
    """As with Anthropic: a halt `stopped` mid-stream closes the OpenAI SDK's stream (Chat
    and Responses) from inside `answer`, and the partial reply lands aborted, then the halt."""
    words = "Some words before the stop"
    if format == "openai_chat":
        events = chat_stream(words)
    else:
        events = responses_stream([_message(words)])
    provider.script([*events[:5], {"hang": True}])
    client = openai_client(provider)
    async with (
        connect(hub.url, f"o-stop-{format}", client="worker", draft_interval=0.01) as worker,
        connect(hub.url, f"o-stop-{format}", client="ui") as ui,
    ):
        worker.conversation.push(Message.user("hi"))
        await worker.flush()

        async def stop_when_drafting() -> None:
            await until(lambda: any(d.text for d in ui.drafts.values()))
            ui.conversation.halt("stopped")
            await ui.flush()

        with anyio.fail_after(bound(10)):
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_when_drafting)
                if format == "openai_chat":
                    request = to_openai_chat(worker.conversation)
                    opened = client.chat.completions.stream(model="gpt-fake", **request)
                else:
                    request = to_openai_responses(worker.conversation)
                    opened = client.responses.stream(model="gpt-fake", **request)
                async with opened as stream:
                    reply = await worker.answer(stream, format=format)  # type: ignore[arg-type]
                    await anyio.to_thread.run_sync(provider.closed_early.wait, bound(2))
                    assert provider.closed_early.is_set()
            await worker.flush()
            await ui.wait_for(worker.revision)
        assert reply.stop == Stop("aborted", "stopped")
        assert words.startswith(reply.content[-1].text)  # type: ignore[union-attr]
        for replica in (worker, ui):
            assert replica.conversation.messages()[-1] == reply
            assert replica.conversation.halted() is Halt.STOPPED
