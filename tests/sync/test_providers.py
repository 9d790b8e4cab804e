"""The provider converters (SPEC §11): lossless for what each format can say, byte-identical
for equal messages, each format's rules, the lossy cases named, stop reasons mapped."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from sync import (
    Assistant,
    Conversation,
    Document,
    Image,
    Json,
    Message,
    Origin,
    Reasoning,
    Stop,
    System,
    Text,
    ToolCall,
    ToolResult,
    UsageError,
    User,
)
from sync.messages import AnyMessage
from sync.providers import (
    from_anthropic,
    from_openai_chat,
    from_openai_responses,
    to_anthropic,
    to_openai_chat,
    to_openai_responses,
)
from sync.providers.anthropic import stop_of as anthropic_stop
from sync.providers.openai_chat import stop_of as chat_stop
from sync.providers.openai_responses import stop_of as responses_stop

texts = st.text(min_size=1, max_size=12)
b64 = st.sampled_from(["aGk=", "AAEC", "iVBORw0KGgo="])
call_ids = st.sampled_from(["c1", "c2", "c3"])
arguments = st.dictionaries(st.sampled_from(["a", "city", "n"]), st.integers() | texts, max_size=3)


def _calls(format: str) -> st.SearchStrategy[ToolCall]:
    data = st.none() if format != "responses" else st.none() | st.just({"id": "fc_1"})
    return st.builds(ToolCall, call_ids, texts, arguments, data)


def _reasoning(format: str) -> st.SearchStrategy[Reasoning]:
    if format == "anthropic":
        return st.builds(lambda t, s: Reasoning(t, signature=s), texts, texts) | st.builds(
            lambda d: Reasoning("", redacted=True, data=d), texts
        )
    return st.builds(
        lambda t, e: Reasoning(t, provider_data={"id": "rs_1", "encrypted_content": e}),
        texts,
        texts,
    )


def _user(format: str, with_results: bool) -> st.SearchStrategy[User]:
    images = st.builds(Image, st.sampled_from(["image/png", "image/jpeg"]), b64)
    documents = st.builds(Document, st.just("application/pdf"), b64, st.none(), st.none() | texts)
    plain = st.builds(Text, texts) | images | documents
    result_parts = st.lists(st.builds(Text, texts), min_size=1, max_size=1)
    errors = st.booleans() if format == "anthropic" else st.just(False)
    results = st.lists(st.builds(ToolResult, call_ids, texts, result_parts, errors), max_size=2)
    rest = st.lists(plain, max_size=3)

    def build(found: list[ToolResult], others: list[Any]) -> User:
        return User([*found, *others])

    return st.builds(build, results if with_results else st.just([]), rest).filter(
        lambda user: bool(user.content)
    )


def _assistant(format: str) -> st.SearchStrategy[Assistant]:
    origin = Origin("anthropic" if format == "anthropic" else "openai", "m")
    text_parts = st.lists(st.builds(Text, texts), max_size=2)
    calls = st.lists(_calls(format), max_size=2)
    thoughts = st.lists(_reasoning(format), max_size=2) if format != "chat" else st.just([])

    def build(reasoning: list[Any], said: list[Any], made: list[Any]) -> Assistant:
        return Assistant([*reasoning, *said, *made], origin=origin)

    return st.builds(build, thoughts, text_parts, calls).filter(lambda m: bool(m.content))


def _conversations(format: str) -> st.SearchStrategy[list[AnyMessage]]:
    """Paired conversations: each user message answers the calls of the reply before it."""
    head = st.lists(st.builds(System, texts), max_size=1)
    errors = st.booleans() if format == "anthropic" else st.just(False)

    @st.composite
    def build(draw: st.DrawFn) -> list[AnyMessage]:
        out: list[AnyMessage] = list(draw(head))
        pending: list[ToolCall] = []
        for turn in range(draw(st.integers(0, 4))):
            user = draw(_user(format, False)) if not pending else User([])
            results = [
                ToolResult(call.id, call.name, [Text(draw(texts))], draw(errors))
                for call in pending
            ]
            others = [] if not pending else draw(st.lists(st.builds(Text, texts), max_size=1))
            out.append(User([*results, *others]) if pending else user)
            reply = draw(_assistant(format))
            calls = [
                ToolCall(f"t{turn}_{n}", c.name, c.arguments, c.provider_data)
                for n, c in enumerate(reply.tool_calls())
            ]
            rest = [p for p in reply.content if not isinstance(p, ToolCall)]
            reply = Assistant([*rest, *calls], origin=reply.origin)
            assume(reply.content)
            out.append(reply)
            pending = calls
        return out

    return build()


def _canonical(messages: list[AnyMessage], names: bool = True) -> list[AnyMessage]:
    """What a request can say of `messages`: no stop, origin or usage on a reply."""
    out: list[AnyMessage] = []
    for message in messages:
        if isinstance(message, Assistant):
            message = Assistant(message.content)
        out.append(message)
    return out


def _name_results(messages: list[AnyMessage]) -> list[AnyMessage]:
    """Results named after the call with their id (a format reads a result's name from it)."""
    names = {call.id: call.name for m in messages for call in m.tool_calls()}
    out: list[AnyMessage] = []
    for message in messages:
        if isinstance(message, User):
            message = User(
                [
                    ToolResult(p.call_id, names.get(p.call_id, ""), p.content, p.is_error)
                    if isinstance(p, ToolResult)
                    else p
                    for p in message.content
                ]
            )
        out.append(message)
    return out


def _chat_canonical(messages: list[AnyMessage]) -> list[AnyMessage]:
    """Chat says an assistant's text before its calls, images by data URL only."""
    out = []
    for message in messages:
        if isinstance(message, Assistant):
            said = [p for p in message.content if isinstance(p, Text)]
            made = [p for p in message.content if isinstance(p, ToolCall)]
            message = Assistant([*said, *made])
        out.append(message)
    return out


@given(_conversations("anthropic"))
def test_anthropic_round_trip(messages: list[AnyMessage]) -> None:
    """from_anthropic(to_anthropic(m)) == m for what Anthropic can say."""
    expected = _name_results(_canonical(messages))
    assert from_anthropic(to_anthropic(messages)) == expected


@given(_conversations("chat"))
def test_openai_chat_round_trip(messages: list[AnyMessage]) -> None:
    """from_openai_chat(to_openai_chat(m)) == m for what Chat can say."""
    expected = _chat_canonical(_name_results(_canonical(messages)))
    assert from_openai_chat(to_openai_chat(messages)) == expected


@given(_conversations("responses"))
def test_openai_responses_round_trip(messages: list[AnyMessage]) -> None:
    """from_openai_responses(to_openai_responses(m)) == m for what Responses can say."""
    expected = _name_results(_canonical(messages))
    assert from_openai_responses(to_openai_responses(messages)) == expected


CONVERTERS = [to_anthropic, to_openai_chat, to_openai_responses]


@pytest.mark.parametrize("to", CONVERTERS)
def test_ids_and_authors_never_reach_a_payload(to: Any) -> None:
    """Two conversations of the same messages, with other ids, authors, source ids and
    asides, give byte-identical payloads."""
    from sync import Aside, Author, Entry

    messages = [Message.user("hi"), Message.assistant("hello"), Message.user("more")]
    first = Conversation.from_messages(messages)
    second = Conversation()
    for message in messages:
        second.push(Entry(message, author=Author.agent("x"), source_id="corpus:1"))
    second.add_aside(Aside.note("n", "secret aside", second.id(0)))
    assert first.id(0) != second.id(0)
    one = json.dumps(to(first), sort_keys=False)
    two = json.dumps(to(second), sort_keys=False)
    assert one == two
    assert "msg_" not in one and "corpus" not in one and "secret" not in one


@pytest.mark.parametrize("to", CONVERTERS)
def test_failed_replies_are_not_sent_and_the_stopped_note_is(to: Any) -> None:
    """A failed reply is never sent; the STOPPED note goes as the user text it is."""
    conversation = Conversation()
    conversation.push(Message.user("go"))
    conversation.push(Message.assistant("half an answ", Stop("aborted", "stopped")))
    conversation.halt("stopped")
    conversation.push(Message.user("again"))
    payload = json.dumps(to(conversation))
    assert "half an answ" not in payload
    assert "STOPPED" in payload and "again" in payload


def test_chat_sends_one_tool_message_per_result_before_the_text() -> None:
    """Chat: each result its own `tool` message, then the rest of the user message; an
    error result is rendered in its text."""
    messages: list[AnyMessage] = [
        Message.user("q"),
        Assistant([ToolCall("a", "f"), ToolCall("b", "g")]),
        User(
            [
                Text("also"),
                ToolResult("a", "f", [Text("1")]),
                ToolResult("b", "g", [Text("x")], True),
            ]
        ),
    ]
    out = to_openai_chat(messages)["messages"]
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "tool", "user"]
    assert out[2] == {"role": "tool", "tool_call_id": "a", "content": "1"}
    assert out[3]["content"] == "Error: x"
    assert out[4]["content"] == "also"
    assert out[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}


def test_anthropic_puts_results_first_and_the_system_on_top() -> None:
    """Anthropic: the system prompt is top-level, results lead their user message."""
    messages: list[AnyMessage] = [
        Message.system("be brief"),
        Message.user("q"),
        Assistant([ToolCall("a", "f")]),
        User([Text("also"), ToolResult("a", "f", [Json({"k": 1})], True)]),
    ]
    request = to_anthropic(messages)
    assert request["system"] == "be brief"
    last = request["messages"][-1]["content"]
    assert last[0] == {
        "type": "tool_result",
        "tool_use_id": "a",
        "content": [{"type": "text", "text": '{"k":1}'}],
        "is_error": True,
    }
    assert last[1] == {"type": "text", "text": "also"}


def test_reasoning_goes_back_only_to_its_provider() -> None:
    """Anthropic thinking is replayed to Anthropic with its signature, dropped (or sent as
    text on request) elsewhere; Responses reasoning only to OpenAI."""
    thought = Assistant(
        [Reasoning("hmm", signature="sig"), Text("a")], origin=Origin("anthropic", "m")
    )
    messages: list[AnyMessage] = [Message.user("q"), thought]
    assert to_anthropic(messages)["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "hmm",
        "signature": "sig",
    }
    assert "sig" not in json.dumps(to_openai_responses(messages))
    assert "hmm" not in json.dumps(to_openai_chat(messages))
    assert to_openai_chat(messages, reasoning="text")["messages"][1]["content"] == [
        {"type": "text", "text": "hmm"},
        {"type": "text", "text": "a"},
    ]
    openai = Assistant(
        [Reasoning("r", provider_data={"id": "rs_1", "encrypted_content": "E"})],
        origin=Origin("openai", "m"),
    )
    assert to_openai_responses([Message.user("q"), openai])["input"][1]["id"] == "rs_1"
    assert "rs_1" not in json.dumps(to_anthropic([Message.user("q"), openai]))


def test_lossy_error_names_the_part_and_drop_returns_it() -> None:
    """What a format cannot say raises `UsageError` naming it, or is dropped and listed."""
    messages: list[AnyMessage] = [
        Message.user("q"),
        Assistant([Text("see"), Image("image/png", "aGk=")]),
        Message.system("late system"),
    ]
    with pytest.raises(UsageError) as caught:
        to_anthropic(messages)
    assert caught.value.reason == "lossy"
    assert "message 1" in caught.value.message and "image" in caught.value.message
    request = to_anthropic(messages, lossy="drop")
    assert request.dropped == (
        "message 1: an image in an assistant message",
        "message 2: a system message after the first turn",
    )
    assert request["messages"][1]["content"] == [{"type": "text", "text": "see"}]
    document = [User([Document("application/pdf", None, "https://x/a.pdf")])]
    with pytest.raises(UsageError, match="a document by URL"):
        to_openai_chat(document)
    assert to_openai_chat(document, lossy="drop").dropped == ("message 0: a document by URL",)
    assert to_openai_chat([Message.user("fine")]).dropped == ()


def test_stop_reasons_are_mapped() -> None:
    """Every documented stop reason has its `Stop`; pause_turn is marked, not final."""
    assert anthropic_stop("end_turn") == Stop("stop")
    assert anthropic_stop("max_tokens") == Stop("length")
    assert anthropic_stop("tool_use") == Stop("tool_use")
    assert anthropic_stop("pause_turn") == Stop("stop", "pause_turn")
    assert anthropic_stop("refusal") == Stop("stop", "refusal")
    assert anthropic_stop("stop_sequence") == Stop("stop", "stop_sequence")
    assert chat_stop("tool_calls") == Stop("tool_use")
    assert chat_stop("length") == Stop("length")
    assert chat_stop("content_filter") == Stop("stop", "content_filter")
    assert chat_stop("stop", refused=True) == Stop("stop", "refusal")
    incomplete = {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    assert responses_stop(incomplete) == Stop("length", "max_output_tokens")
    failed = {"status": "failed", "error": {"code": "server_error", "message": "boom"}}
    assert responses_stop(failed) == Stop("error", "server_error: boom")
    calls = {"status": "completed", "output": [{"type": "function_call"}]}
    assert responses_stop(calls) == Stop("tool_use")
    from sync.providers import is_paused

    assert is_paused(Assistant([], stop=Stop("stop", "pause_turn")))
    assert not is_paused(Assistant([], stop=Stop("stop")))
