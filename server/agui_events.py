"""AG-UI events from a conversation's state (SPEC 13), pure: no I/O, no clock.

How this works: an AG-UI run (`POST /v1/agui/{id}`) follows one turn of a convsync
conversation. `Run` is that run's translator. The endpoint feeds it the conversation (the
log's value) and the open drafts each time either changes; `Run` compares them with what it
has already sent and returns the events that close the gap, so a run that attaches late (a
reattach, a reload) gets the history in one `MESSAGES_SNAPSHOT`, the draft so far in one
delta per part, then the rest, and nothing twice.

The mapping (one committed entry gives the messages `entry_messages` lists):

- a user entry: one `user` message (its text, or content parts when it holds images or
  documents) and one `tool` message per tool result; the first of them takes the id a kit
  knows the entry by (`kitstate.kit_id`: the kit's own id kept in `source_id`, else the
  entry's id), the others `{id}:{call_id}` / `{id}:user`;
- an assistant entry: a `reasoning` message `{entry}:reasoning` (when it has reasoning
  text), then an `assistant` message with the entry's id, its text and its tool calls (left
  out when it has neither);
- a system entry: a `system` message; the STOPPED note is the engine's marker, not shown.

A draft streams into the same ids: part `reasoning` as `REASONING_*`, `text` as
`TEXT_MESSAGE_*`, `call:<id>` as `TOOL_CALL_*` (parent: the draft's id), so the client's
own accumulation ends equal to `entry_messages` of the committed entry. When it cannot (a
commit whose text does not continue what was streamed, a draft that ends with no commit, a
rewritten history), the run sends a fresh `MESSAGES_SNAPSHOT` before it finishes, so every
client ends with the log's history.

How a run ends (`Run.update` returns the final events once): the followed turn's record ends
(`answered`: `RUN_FINISHED`; `stopped`: `RUN_FINISHED` with the `cancelled` outcome;
`failed`: `RUN_ERROR`), an approval of the turn opens (`RUN_FINISHED` with the `interrupt`
outcome, one interrupt per open approval, id = the approval's aside id), or the turn waits
only for frontend tools (`RUN_FINISHED`, success, `pendingToolCallIds`). A run that pushed
nothing and finds no turn open finishes at once (a reattach to an idle conversation shows its
history). Every message opened is closed with its `*_END` before the run finishes.

The request side: `sent_messages` gives a `RunAgentInput`'s history to `server.kitstate`'s
`read_sent` (the kits' one rule for what is new and what edits the log: 409), and
`tool_results` the frontend tools' results it brings; `resume_decisions` reads `resume[]`
into approval decisions, refusing one already decided (`ResumeError`, answered
`RUN_ERROR`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    FunctionCall,
    Interrupt,
    MessagesSnapshotEvent,
    ReasoningEndEvent,
    ReasoningMessage,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    ResumeEntry,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    SystemMessage,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)
from ag_ui.core import Message as AguiMessage
from ag_ui.core import ToolCall as AguiToolCall
from ag_ui.core.types import DataSource, DocumentPart, ImagePart, TextPart, UrlSource

from sync import (
    Assistant,
    Conversation,
    Document,
    EntryRef,
    Image,
    Json,
    Reasoning,
    System,
    Text,
    ToolCall,
    ToolResult,
)
from sync import approvals as approvals_
from sync.entries import Answered, Failed, Stopped
from sync.ids import AsideId
from sync.steer import STEP_KIND, open_turn

from .kitstate import SentMessage, kit_id

__all__ = [
    "Decision",
    "DraftParts",
    "ResumeError",
    "Run",
    "entry_messages",
    "history",
    "resume_decisions",
    "sent_messages",
    "tool_results",
]

PROTOCOL_VERSION = "1.0"
"""The AG-UI version these events follow (`ag-ui-protocol` 1.0, `@ag-ui/client` 1.0)."""
TEXT, REASONING, CALL = "text", "reasoning", "call:"


class DraftParts(Protocol):
    """What a run reads of an open draft (`client.live.Draft` and `sync.protocol.DraftInfo`
    both fit): its parts' text so far, and each call part's tool name."""

    @property
    def parts(self) -> Mapping[str, str]: ...
    @property
    def names(self) -> Mapping[str, str]: ...


# --------------------------------------------------------------------------- the history


def history(conversation: Conversation) -> list[AguiMessage]:
    """The AG-UI messages of every committed entry of `conversation`, in order."""
    messages: list[AguiMessage] = []
    for ref in conversation.entries():
        messages += entry_messages(ref)
    return messages


def entry_messages(ref: EntryRef) -> list[AguiMessage]:
    """The AG-UI messages one entry shows as (see the module's docstring for the ids)."""
    message = ref.message
    own_id = kit_id(ref)
    if isinstance(message, System):
        return [SystemMessage(id=own_id, content=message.content)]
    if isinstance(message, Assistant):
        out: list[AguiMessage] = []
        reasoning = _reasoning_text(message)
        if reasoning:
            out.append(ReasoningMessage(id=_reasoning_id(ref.id), content=reasoning))
        text = _text(message.content)
        calls = [
            AguiToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=_args(c)))
            for c in message.tool_calls()
        ]
        if text or calls:
            out.append(AssistantMessage(id=ref.id, content=text or None, tool_calls=calls or None))
        return out
    if ref.is_stop_marker():
        return []
    derived: list[AguiMessage] = []
    for result in message.tool_results():
        id_ = own_id if not derived else f"{own_id}:{result.call_id}"
        derived.append(
            ToolMessage(id=id_, tool_call_id=result.call_id, content=_result_text(result))
        )
    own = [part for part in message.content if not isinstance(part, ToolResult)]
    if own:
        id_ = own_id if not derived else f"{own_id}:user"
        derived.append(UserMessage(id=id_, content=_user_content(own)))
    return derived


def _reasoning_id(entry_id: str) -> str:
    return f"{entry_id}:reasoning"


def _text(parts: Iterable[object]) -> str:
    return "".join(part.text for part in parts if isinstance(part, Text))


def _reasoning_text(message: Assistant) -> str:
    return "".join(
        part.text for part in message.content if isinstance(part, Reasoning) and not part.redacted
    )


def _args(call: ToolCall) -> str:
    """A call's arguments as JSON text (Python's `json.dumps`, as a Python worker streams
    them): what a streamed call is compared with."""
    return json.dumps(call.arguments, ensure_ascii=False)


def _result_text(result: ToolResult) -> str:
    out = []
    for part in result.content:
        if isinstance(part, Text):
            out.append(part.text)
        elif isinstance(part, Json):
            out.append(json.dumps(part.value, separators=(",", ":"), ensure_ascii=False))
    return "".join(out)


def _user_content(parts: Sequence[object]) -> str | list[Any]:
    """A user message's content: its text, or parts when it holds an image or a document."""
    if all(isinstance(part, Text) for part in parts):
        return _text(parts)
    content: list[Any] = []
    for part in parts:
        if isinstance(part, Text):
            content.append(TextPart(text=part.text))
        elif isinstance(part, Image | Document):
            source: DataSource | UrlSource
            if part.data is not None:
                source = DataSource(value=part.data, mime_type=part.media_type)
            else:
                source = UrlSource(value=part.url or "", mime_type=part.media_type)
            kind = ImagePart if isinstance(part, Image) else DocumentPart
            content.append(kind(source=source))
    return content


# --------------------------------------------------------------------------- a run


@dataclass
class _Stream:
    """What a run has sent of one message in progress (a draft, or an entry it streams)."""

    sent: dict[str, str] = field(default_factory=dict)  # part -> text sent so far
    open: list[str] = field(default_factory=list)  # parts started and not ended, in order


class Run:
    """One AG-UI run over a conversation: `begin` once, then `update` on every change, until
    `finished`. Each returns the events to send, in order.

    Args:
        thread_id: the conversation's id (`RunAgentInput.threadId`).
        run_id: the client's `runId`.
        expect_turn: whether this request gave the agent something to do (a message, a
            decision, a tool result): then the run waits for the turn that answers it;
            otherwise a run that finds no turn open finishes at once.
    """

    def __init__(self, thread_id: str, run_id: str, *, expect_turn: bool) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.finished = False
        self._expect_turn = expect_turn
        self._known: dict[str, object] = {}  # entry id -> its message, as sent
        self._streams: dict[str, _Stream] = {}  # draft (entry) id -> what was sent of it
        self._turn: int | None = None
        self._diverged = False

    def begin(
        self, conversation: Conversation, drafts: Mapping[str, DraftParts]
    ) -> list[BaseEvent]:
        """`RUN_STARTED`, the history, the drafts so far, and the end if the run has nothing
        to wait for."""
        events: list[BaseEvent] = [
            RunStartedEvent(
                thread_id=self.thread_id, run_id=self.run_id, protocol_version=PROTOCOL_VERSION
            ),
            MessagesSnapshotEvent(messages=history(conversation)),
        ]
        self._known = {ref.id: ref.message for ref in conversation.entries()}
        turn = open_turn(conversation)
        self._turn = None if turn is None else turn[1].index
        events += self._drafts(drafts)
        events += self._end(conversation)
        return events

    def update(
        self, conversation: Conversation, drafts: Mapping[str, DraftParts]
    ) -> list[BaseEvent]:
        """The events that bring the client from what was sent to this state."""
        if self.finished:
            return []
        events = self._entries(conversation)
        events += self._drafts(drafts)
        events += self._end(conversation)
        return events

    def fail(self, message: str, code: str) -> list[BaseEvent]:
        """End the run with `RUN_ERROR` (what was opened closed first); [] once finished."""
        if self.finished:
            return []
        self.finished = True
        return [*self._close_all(), RunErrorEvent(message=message, code=code)]

    # -- committed entries

    def _entries(self, conversation: Conversation) -> list[BaseEvent]:
        events: list[BaseEvent] = []
        refs = conversation.entries()
        held = {ref.id for ref in refs}
        if any(id_ not in held for id_ in self._known):
            self._diverged = True  # a splice took out what the client shows
        for ref in refs:
            sent = self._known.get(ref.id)
            if sent is ref.message:
                continue
            if sent is not None:
                if sent != ref.message:
                    self._diverged = True  # edited in place
                self._known[ref.id] = ref.message
                continue
            self._known[ref.id] = ref.message
            message = ref.message
            if isinstance(message, Assistant):
                events += self._commit(ref.id, message)
            else:
                events += self._whole(ref)
        return events

    def _commit(self, id_: str, message: Assistant) -> list[BaseEvent]:
        """An assistant entry: the rest of its draft (or all of it), each part ended."""
        stream = self._streams.pop(id_, None) or _Stream()
        final = {REASONING: _reasoning_text(message), TEXT: _text(message.content)}
        names = {}
        for call in message.tool_calls():
            final[CALL + call.id] = _args(call)
            names[CALL + call.id] = call.name
        events: list[BaseEvent] = []
        for part, text in final.items():
            if not text and part not in stream.sent and not part.startswith(CALL):
                continue
            sent = stream.sent.get(part)
            if sent is None:
                if part == REASONING and stream.sent:
                    self._diverged = True  # the client placed it after the answer
                events += self._start(id_, part, names.get(part, ""))
                stream.sent[part] = ""
                stream.open.append(part)
                sent = ""
            if text.startswith(sent):
                events += self._delta(id_, part, text[len(sent) :])
            else:  # the same arguments spelled otherwise too: the snapshot spells them alike
                self._diverged = True
            if part in stream.open:
                stream.open.remove(part)
                events += self._stop(id_, part)
        for part in list(stream.open):  # parts the commit dropped
            self._diverged = True
            events += self._stop(id_, part)
        return events

    def _whole(self, ref: EntryRef) -> list[BaseEvent]:
        """A user or system entry committed during the run, in full."""
        events: list[BaseEvent] = []
        for message in entry_messages(ref):
            if isinstance(message, ToolMessage):
                events.append(
                    ToolCallResultEvent(
                        message_id=message.id,
                        tool_call_id=message.tool_call_id,
                        content=message.content,
                        role="tool",
                    )
                )
            elif isinstance(message, UserMessage | SystemMessage) and isinstance(
                message.content, str
            ):
                events += [
                    TextMessageStartEvent(message_id=message.id, role=message.role),
                    *(
                        [TextMessageContentEvent(message_id=message.id, delta=message.content)]
                        if message.content
                        else []
                    ),
                    TextMessageEndEvent(message_id=message.id),
                ]
            else:
                self._diverged = True  # content a text stream cannot carry: the snapshot does
        return events

    # -- drafts

    def _drafts(self, drafts: Mapping[str, DraftParts]) -> list[BaseEvent]:
        events: list[BaseEvent] = []
        for id_, draft in drafts.items():
            if id_ in self._known:
                continue  # committed: its entry has been sent
            stream = self._streams.setdefault(id_, _Stream())
            for part in _ordered(draft.parts):
                text = draft.parts[part]
                sent = stream.sent.get(part)
                if sent is None:
                    name = draft.names.get(part)
                    if part.startswith(CALL) and not name:
                        continue  # a call starts once its tool's name is known
                    if not part.startswith(CALL) and not text:
                        continue
                    if part == REASONING and stream.sent:
                        self._diverged = True
                    events += self._start(id_, part, name or "")
                    stream.sent[part] = sent = ""
                    stream.open.append(part)
                if len(text) > len(sent) and text.startswith(sent):
                    events += self._delta(id_, part, text[len(sent) :])
                    stream.sent[part] = text
        for id_ in [id_ for id_ in self._streams if id_ not in drafts]:
            if id_ not in self._known:  # ended with no commit (aborted, timed out)
                events += self._close(id_)
        return events

    def _close(self, id_: str) -> list[BaseEvent]:
        stream = self._streams.pop(id_)
        if stream.sent:
            self._diverged = True  # the client shows a message the log never got
        return [event for part in stream.open for event in self._stop(id_, part)]

    def _close_all(self) -> list[BaseEvent]:
        return [event for id_ in list(self._streams) for event in self._close(id_)]

    # -- events of one part

    @staticmethod
    def _start(id_: str, part: str, name: str) -> list[BaseEvent]:
        if part == REASONING:
            rid = _reasoning_id(id_)
            return [ReasoningStartEvent(message_id=rid), ReasoningMessageStartEvent(message_id=rid)]
        if part == TEXT:
            return [TextMessageStartEvent(message_id=id_, role="assistant")]
        return [
            ToolCallStartEvent(
                tool_call_id=part[len(CALL) :], tool_call_name=name, parent_message_id=id_
            )
        ]

    @staticmethod
    def _delta(id_: str, part: str, delta: str) -> list[BaseEvent]:
        if not delta:
            return []
        if part == REASONING:
            return [ReasoningMessageContentEvent(message_id=_reasoning_id(id_), delta=delta)]
        if part == TEXT:
            return [TextMessageContentEvent(message_id=id_, delta=delta)]
        return [ToolCallArgsEvent(tool_call_id=part[len(CALL) :], delta=delta)]

    @staticmethod
    def _stop(id_: str, part: str) -> list[BaseEvent]:
        if part == REASONING:
            rid = _reasoning_id(id_)
            return [ReasoningMessageEndEvent(message_id=rid), ReasoningEndEvent(message_id=rid)]
        if part == TEXT:
            return [TextMessageEndEvent(message_id=id_)]
        return [ToolCallEndEvent(tool_call_id=part[len(CALL) :])]

    # -- the end

    def _end(self, conversation: Conversation) -> list[BaseEvent]:
        """The run's last events once the followed turn ended or waits for a person."""
        if self._turn is None:
            turn = open_turn(conversation)
            if turn is not None:
                self._turn = turn[1].index
            elif self._expect_turn and conversation.awaits_model():
                return []  # the request waits for a worker to take it
            else:
                return self._finish(conversation, RunFinishedSuccessOutcome())
        record = next((r for _, r in conversation.turns() if r.index == self._turn), None)
        if record is None:
            return self._finish(conversation, RunFinishedSuccessOutcome())
        end = record.end
        if isinstance(end, Failed):
            return self._finish(conversation, None, error=end.why)
        if isinstance(end, Stopped):
            return self._finish(conversation, RunFinishedCancelledOutcome())
        if isinstance(end, Answered):
            return self._finish(conversation, RunFinishedSuccessOutcome())
        interrupts = [
            Interrupt(
                id=id_,
                reason="tool_approval" if approval.call is not None else "question",
                message=approval.prompt,
                tool_call_id=approval.call,
                response_schema=approval.schema if isinstance(approval.schema, dict) else None,
            )
            for id_, approval in approvals_.approvals(conversation)
            if approval.is_open and approval.turn == self._turn
        ]
        if interrupts:
            return self._finish(conversation, RunFinishedInterruptOutcome(interrupts=interrupts))
        pending = _frontend_pending(conversation)
        if pending:
            outcome = RunFinishedSuccessOutcome(pending_tool_call_ids=pending)
            return self._finish(conversation, outcome)
        return []

    def _finish(
        self,
        conversation: Conversation,
        outcome: RunFinishedSuccessOutcome
        | RunFinishedInterruptOutcome
        | RunFinishedCancelledOutcome
        | None,
        *,
        error: str | None = None,
    ) -> list[BaseEvent]:
        self.finished = True
        events = self._close_all()
        if self._diverged:
            events.append(MessagesSnapshotEvent(messages=history(conversation)))
        if error is not None:
            events.append(RunErrorEvent(message=error, code="turn_failed"))
        else:
            events.append(
                RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome)
            )
        return events


def _ordered(parts: Mapping[str, str]) -> list[str]:
    """Draft parts in the order their messages stand: reasoning, text, then calls."""
    head = [part for part in (REASONING, TEXT) if part in parts]
    return head + [part for part in parts if part.startswith(CALL)]


def _frontend_pending(conversation: Conversation) -> list[str]:
    """The calls left for a UI to run, when those are all the turn waits for."""
    if any(aside.kind == STEP_KIND for _, aside in conversation.asides()):
        return []
    calls = conversation.pending_calls()
    tools = approvals_.frontend_tools(conversation)
    if calls and all(call.name in tools for call in calls):
        return [call.id for call in calls]
    return []


# --------------------------------------------------------------------------- requests


def sent_messages(messages: Sequence[AguiMessage]) -> list[SentMessage]:
    """A `RunAgentInput`'s history as `server.kitstate.read_sent` reads it (which says what
    is new and what would edit the log). Ids this mapping derives from an entry's
    (`{id}:reasoning`, `{id}:{call}`, `{id}:user`) stand for that entry, already sent."""
    out: list[SentMessage] = []
    seen: set[str] = set()
    for message in messages:
        if ":" in message.id and message.id.rsplit(":", 1)[0] in seen:
            continue
        seen.add(message.id)
        text = ""
        if isinstance(message, UserMessage):
            content = message.content
            text = content if isinstance(content, str) else _text_parts(content)
        out.append(SentMessage(message.id, message.role, text))
    return out


def tool_results(conversation: Conversation, messages: Sequence[AguiMessage]) -> list[ToolResult]:
    """The frontend tools' results a run's messages bring: a `tool` message answering a call
    the log still waits on (a result sent again answers nothing any more)."""
    waiting = {call.id: call.name for call in conversation.pending_calls()}
    out = []
    for message in messages:
        if isinstance(message, ToolMessage) and message.tool_call_id in waiting:
            content = message.content
            text = content if isinstance(content, str) else _text_parts(content)
            name = waiting.pop(message.tool_call_id)
            is_error = message.error is not None
            out.append(ToolResult(message.tool_call_id, name, [Text(text)], is_error=is_error))
    return out


def _text_parts(parts: Sequence[object]) -> str:
    return "".join(part.text for part in parts if isinstance(part, TextPart))


class ResumeError(Exception):
    """A `resume[]` entry that cannot decide anything (answered `RUN_ERROR`); `code` is
    `unknown_interrupt` or `decided`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Decision:
    """One approval decision read from a resume entry (`sync.approvals.decide`'s terms)."""

    id: AsideId
    approve: bool
    answer: Any = None
    reason: str | None = None


def resume_decisions(conversation: Conversation, resume: Sequence[ResumeEntry]) -> list[Decision]:
    """The decisions `resume[]` makes, all checked before any is made.

    A `cancelled` entry denies (reason "cancelled"). A `resolved` entry of a tool approval
    approves unless its payload is `false` or `{"approved": false, "reason": ...}`; of a
    question, its payload is the answer.

    Raises:
        ResumeError: `unknown_interrupt` for an id that is no approval here, `decided` for an
            approval that is not open any more (decided before, or cancelled by a stop).
    """
    decisions = []
    for entry in resume:
        approval = approvals_.approval_of(conversation.aside(AsideId(entry.interrupt_id)))
        if approval is None:
            raise ResumeError("unknown_interrupt", f"no interrupt {entry.interrupt_id!r} here")
        if not approval.is_open:
            raise ResumeError(
                "decided", f"interrupt {entry.interrupt_id!r} is {approval.state} already"
            )
        id_ = AsideId(entry.interrupt_id)
        payload = entry.payload
        if entry.status == "cancelled":
            decisions.append(Decision(id_, approve=False, reason="cancelled"))
        elif approval.call is None:
            decisions.append(Decision(id_, approve=True, answer=payload))
        elif isinstance(payload, dict):
            approved = payload.get("approved", payload.get("approve", True))
            reason = payload.get("reason")
            decisions.append(
                Decision(id_, approve=approved is not False, reason=reason if reason else None)
            )
        else:
            decisions.append(Decision(id_, approve=payload is not False))
    return decisions
