"""The chat kits' pure parts (SPEC 13): the answer in progress, the kit's sent history read
against the log (409 for an edit), and the AI SDK's UI message stream and history."""

from __future__ import annotations

from server.kitstate import DraftView, SentMessage, answer_in_progress, read_sent
from server.uistream import ChunkWriter, ui_messages
from sync import (
    Assistant,
    Conversation,
    Entry,
    Message,
    Reasoning,
    Text,
    ToolCall,
    TurnEnd,
)
from sync.ids import IdMinter

_IDS = IdMinter()
D1, D2 = _IDS.message_id(), _IDS.message_id()


def _asked(text: str = "weather?", kit: str = "u1") -> Conversation:
    talk = Conversation()
    talk.push(Entry(Message.user(text), source_id=kit))
    return talk


def test_the_answer_in_progress_is_what_follows_the_last_user_message() -> None:
    """Entries after the user's last message and the drafts not yet in the log make the
    answer; it runs while the request waits for the model, and stops running at its end."""
    talk = _asked()
    answer = answer_in_progress(talk, [])
    assert answer.running and answer.entries == () and answer.first_id is None
    talk.open_turn()
    draft = DraftView("msg_draft", 5, {"text": "he"}, {})
    answer = answer_in_progress(talk, [draft])
    assert answer.first_id == "msg_draft" and answer.turn is not None and answer.running
    done = talk.push(Message.assistant("hello"))
    talk.end_turn(TurnEnd.answered(done))
    answer = answer_in_progress(talk, [])
    assert [ref.id for ref in answer.entries] == [done] and not answer.running
    assert answer.request is not None and answer.request.source_id == "u1"


def test_a_sent_history_that_edits_or_reorders_the_log_is_a_problem() -> None:
    """A user message the log holds sent with other text, or held messages out of the log's
    order, is refused; new user messages and unknown assistant ids are not."""
    talk = _asked("one", "a")
    talk.push(Message.assistant("ok"))
    talk.push(Entry(Message.user("two"), source_id="b"))
    same = read_sent(talk, [SentMessage("a", "user", "one"), SentMessage("b", "user", "two")])
    assert same.problem is None and same.new == ()
    fresh = read_sent(
        talk,
        [
            SentMessage("a", "user", "one"),
            SentMessage("x", "assistant"),
            SentMessage("c", "user", "3"),
        ],
    )
    assert fresh.problem is None and [m.id for m in fresh.new] == ["c"]
    edited = read_sent(talk, [SentMessage("a", "user", "ONE")])
    assert edited.problem is not None and edited.new == ()
    swapped = read_sent(talk, [SentMessage("b", "user", "two"), SentMessage("a", "user", "one")])
    assert swapped.problem is not None
    after_new = read_sent(talk, [SentMessage("c", "user", "3"), SentMessage("a", "user", "one")])
    assert after_new.problem is not None


def _types(chunks: list[dict]) -> list[str]:
    return [c["type"] for c in chunks]


def test_the_chunk_writer_sends_each_character_once_from_draft_to_commit() -> None:
    """A draft that grows gives deltas, its commit only what it had not shown, the tool's
    result its output, the next step a new step, and `finish` closes what is open."""
    talk = _asked()
    talk.open_turn()
    writer = ChunkWriter()
    first = writer.chunks(answer_in_progress(talk, [DraftView(D1, 1, {"reasoning": "th"}, {})]))
    assert _types(first) == ["start", "start-step", "reasoning-start", "reasoning-delta"]
    assert first[0]["messageId"] == D1
    grown = DraftView(
        D1, 1, {"reasoning": "think", "text": "Le", "call:c1": '{"ci'}, {"call:c1": "weather"}
    )
    more = writer.chunks(answer_in_progress(talk, [grown]))
    assert [c.get("delta", c.get("inputTextDelta")) for c in more] == [
        "ink",
        None,
        "Le",
        None,
        '{"ci',
    ]
    assert more[3] == {"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"}
    step = Assistant([Reasoning("think"), Text("Let me"), ToolCall("c1", "weather", {"city": "L"})])
    talk.push(Entry(step, id=D1))
    committed = writer.chunks(answer_in_progress(talk, []))
    assert _types(committed) == [
        "reasoning-end",
        "text-delta",
        "text-end",
        "tool-input-delta",
        "tool-input-available",
    ]
    assert committed[1]["delta"] == "t me" and committed[3]["inputTextDelta"] == 'ty": "L"}'
    assert committed[4]["input"] == {"city": "L"}
    talk.push(Message.tool_result("c1", "weather", "sunny"))
    out = writer.chunks(answer_in_progress(talk, [DraftView(D2, 2, {"text": "It is"}, {})]))
    assert out[0] == {"type": "tool-output-available", "toolCallId": "c1", "output": "sunny"}
    assert _types(out[1:]) == ["finish-step", "start-step", "text-start", "text-delta"]
    assert writer.chunks(answer_in_progress(talk, [DraftView(D2, 2, {"text": "It is"}, {})])) == []
    end = writer.finish(answer_in_progress(talk, []), "stop")
    assert _types(end) == ["text-end", "finish-step", "finish"]


def test_a_continuation_sends_only_what_comes_after_the_clients_message() -> None:
    """`skip` takes what the client holds as sent: the next chunks are the new step only."""
    talk = _asked()
    talk.open_turn()
    first = talk.push(Assistant([Text("a"), ToolCall("c1", "rm", {})]))
    writer = ChunkWriter(message_id=first)
    writer.skip(answer_in_progress(talk, []))
    talk.push(Message.tool_result("c1", "rm", "done"))
    talk.push(Message.assistant("removed"))
    out = writer.chunks(answer_in_progress(talk, []))
    assert out[0]["type"] == "start" and out[0]["messageId"] == first
    assert _types(out[1:]) == [
        "tool-output-available",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
    ]


def test_the_history_holds_one_assistant_message_per_answer_named_by_its_first_entry() -> None:
    """User messages keep the kit's ids; an answer's entries and its tool results make one
    assistant message whose parts are those its stream builds."""
    talk = _asked()
    first = talk.push(Assistant([Reasoning("r"), Text("t"), ToolCall("c1", "weather", {"a": 1})]))
    talk.push(Message.tool_result("c1", "weather", "sunny"))
    talk.push(Message.assistant("done"))
    messages = ui_messages(talk)
    assert [(m["id"], m["role"]) for m in messages] == [("u1", "user"), (first, "assistant")]
    assert messages[1]["parts"] == [
        {"type": "step-start"},
        {"type": "reasoning", "id": f"{first}:reasoning", "text": "r", "state": "done"},
        {"type": "text", "text": "t", "state": "done"},
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "output-available",
            "input": {"a": 1},
            "output": "sunny",
        },
        {"type": "step-start"},
        {"type": "text", "text": "done", "state": "done"},
    ]
