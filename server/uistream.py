"""The AI SDK's UI message stream and UI messages, from a conversation, pure (SPEC 13).

How this works: the AI SDK (`ai` v6) sees one turn as one UIMessage, whose parts are built
by the chunks of its UI message stream (`uiMessageChunkSchema` in the package's source):
`start`, then per step `start-step`, `text-start/delta/end`, `reasoning-start/delta/end`,
`tool-input-start/delta/available`, `tool-output-available` (or `-error`),
`tool-approval-request`, `finish-step`, and `finish`. `ChunkWriter` turns the successive
states of an answer in progress (`server.kitstate.Answer`: the entries committed since the
user's message, the drafts still open, the approvals) into those chunks, each sent once: it
remembers how much of each part it sent, so a draft that grows gives deltas and its commit
gives only what the draft had not shown. One entry (or the draft that becomes it) is one
step; the UIMessage's id is the answer's first entry id, so a replay of the answer (a
resume) and the history (`ui_messages`) name the same message.

`ui_messages` gives the history a `useChat` loads: each user message, and each run of
assistant entries (with their tools' results) as one assistant message with the same parts
a replay of its stream builds. Only committed entries are in it.

Async API: none (pure).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from sync import Assistant, Conversation, EntryRef, Json, Reasoning, Text, ToolCall, User
from sync.approvals import Approval, approvals
from sync.entries import Entry
from sync.ids import AsideId
from sync.messages import ToolResult
from sync.steer import is_user_text

from .kitstate import Answer, DraftView, kit_id, user_text

__all__ = ["ChunkWriter", "part_keys", "result_output", "sent_messages", "ui_messages"]

Chunk = dict[str, Any]


def part_keys(message: Assistant) -> list[tuple[str, Reasoning | Text | ToolCall]]:
    """The parts of `message` a UIMessage shows, each with the key a draft streams it under
    (`reasoning`, `text`, `call:<id>`; a second text or reasoning part gets `text#1`...)."""
    keyed: list[tuple[str, Reasoning | Text | ToolCall]] = []
    seen: dict[str, int] = {}
    for part in message.content:
        if isinstance(part, ToolCall):
            keyed.append((f"call:{part.id}", part))
        elif isinstance(part, Text | Reasoning):
            if isinstance(part, Reasoning) and part.redacted:
                continue  # opaque to a person: nothing to show
            base = "text" if isinstance(part, Text) else "reasoning"
            n = seen.get(base, 0)
            seen[base] = n + 1
            keyed.append((base if n == 0 else f"{base}#{n}", part))
    return keyed


def result_output(result: ToolResult) -> Any:
    """A tool result as the AI SDK's `output`: the text of a text-only result, the value
    of a single JSON part, else the parts as JSON."""
    parts = result.content
    if all(isinstance(p, Text) for p in parts):
        return "".join(p.text for p in parts)  # type: ignore[union-attr]
    if len(parts) == 1 and isinstance(parts[0], Json):
        return parts[0].value
    return msgspec.to_builtins(parts)


@dataclass
class _Part:
    kind: str  # "text", "reasoning", "tool"
    ui_id: str
    sent: str = ""
    ended: bool = False  # text/reasoning: end sent; tool: input-available sent


@dataclass
class _Step:
    id: str
    parts: dict[str, _Part] = field(default_factory=dict)
    committed: bool = False


class ChunkWriter:
    """The chunks of one answer's UI message stream, fed the answer's states in order.

    Args:
        message_id: the UIMessage id to start with (a continuation of the message a client
            holds); by default the answer's first entry id, once one exists.
    """

    def __init__(self, message_id: str | None = None) -> None:
        self.message_id = message_id
        self.started = False
        self.finished = False
        self._steps: dict[str, _Step] = {}
        self._open: _Step | None = None  # the step last started and not finished
        self._outputs: set[str] = set()  # call ids whose output was sent
        self._asked: set[AsideId] = set()  # approvals whose request was sent
        self._calls: dict[str, str] = {}  # call id -> tool name, of calls sent

    def skip(self, answer: Answer) -> None:
        """Take everything `answer` shows as sent already (the client holds it), without
        chunks: a continuation sends only what comes after."""
        self.chunks(answer)
        self._open = None  # the client finished that step; a new one starts anew
        self.started = False  # the continuation's stream still begins with `start`

    def chunks(self, answer: Answer) -> list[Chunk]:
        """The chunks `answer` (a later state of the same answer) adds to what was sent."""
        out: list[Chunk] = []
        if self.finished:
            return out
        if not self.started:
            self.message_id = self.message_id or answer.first_id
            if self.message_id is None:
                return out  # nothing to name the message by yet
            self.started = True
            out.append({"type": "start", "messageId": self.message_id})
        for ref in answer.entries:
            message = ref.message
            if isinstance(message, Assistant):
                self._entry(ref.id, message, out)
            elif isinstance(message, User):
                for result in message.tool_results():
                    self._output(result, out)
        held = {ref.id for ref in answer.entries}
        for step in self._steps.values():  # a draft that ended without an entry
            if not step.committed and step.id not in held:
                if all(d.id != step.id for d in answer.drafts):
                    self._close_parts(step, out)
        for draft in answer.drafts:
            self._draft(draft, out)
        for id_, approval in answer.approvals:
            self._approval(id_, approval, out)
        return out

    def finish(self, answer: Answer, reason: str) -> list[Chunk]:
        """The last chunks: what `answer` adds, every part still open ended, the step
        finished, and `finish` with `reason` (`stop`, `tool-calls`, `error`, `other`)."""
        out = self.chunks(answer)
        if self.finished:
            return out
        if not self.started:
            self.started = True
            out.append(
                {"type": "start", **({"messageId": self.message_id} if self.message_id else {})}
            )
        for step in self._steps.values():
            self._close_parts(step, out)
        if self._open is not None:
            out.append({"type": "finish-step"})
            self._open = None
        out.append({"type": "finish", "finishReason": reason})
        self.finished = True
        return out

    # -- steps

    def _step(self, id_: str, out: list[Chunk]) -> _Step:
        step = self._steps.get(id_)
        if step is None:
            step = self._steps[id_] = _Step(id_)
            if self._open is not None:
                self._close_parts(self._open, out)
                out.append({"type": "finish-step"})
            out.append({"type": "start-step"})
            self._open = step
        return step

    def _close_parts(self, step: _Step, out: list[Chunk]) -> None:
        for part in step.parts.values():
            if not part.ended and part.kind != "tool":
                out.append({"type": f"{part.kind}-end", "id": part.ui_id})
                part.ended = True

    def _entry(self, id_: str, message: Assistant, out: list[Chunk]) -> None:
        step = self._steps.get(id_)
        if step is not None and step.committed:
            return
        step = self._step(id_, out)
        for key, part in part_keys(message):
            if isinstance(part, ToolCall):
                self._tool_input(step, key, part.name, json.dumps(part.arguments), out)
                self._tool_available(step, key, part, out)
            else:
                kind = "text" if isinstance(part, Text) else "reasoning"
                self._text(step, key, kind, part.text, out)
                self._end(step.parts[key], out)
        self._close_parts(step, out)  # a draft's part the entry left out
        step.committed = True

    def _draft(self, draft: DraftView, out: list[Chunk]) -> None:
        step = self._step(draft.id, out)
        for key, text in draft.parts.items():
            if key.startswith("call:"):
                name = draft.names.get(key, "tool")
                self._tool_input(step, key, name, text, out)
            elif key.split("#")[0] in ("text", "reasoning"):
                self._text(step, key, key.split("#")[0], text, out)

    # -- parts

    def _text(self, step: _Step, key: str, kind: str, text: str, out: list[Chunk]) -> None:
        part = step.parts.get(key)
        if part is None:
            part = step.parts[key] = _Part(kind, f"{step.id}:{key}")
            out.append({"type": f"{kind}-start", "id": part.ui_id})
        if part.ended or not text.startswith(part.sent) or len(text) == len(part.sent):
            return  # a commit that changed the streamed text cannot take it back
        out.append({"type": f"{kind}-delta", "id": part.ui_id, "delta": text[len(part.sent) :]})
        part.sent = text

    def _end(self, part: _Part, out: list[Chunk]) -> None:
        if not part.ended:
            out.append({"type": f"{part.kind}-end", "id": part.ui_id})
            part.ended = True

    def _tool_input(self, step: _Step, key: str, name: str, text: str, out: list[Chunk]) -> None:
        call_id = key.removeprefix("call:")
        part = step.parts.get(key)
        if part is None:
            part = step.parts[key] = _Part("tool", call_id)
            self._calls[call_id] = name
            out.append({"type": "tool-input-start", "toolCallId": call_id, "toolName": name})
        if part.ended or not text.startswith(part.sent) or len(text) == len(part.sent):
            return
        out.append(
            {
                "type": "tool-input-delta",
                "toolCallId": call_id,
                "inputTextDelta": text[len(part.sent) :],
            }
        )
        part.sent = text

    def _tool_available(self, step: _Step, key: str, call: ToolCall, out: list[Chunk]) -> None:
        part = step.parts[key]
        if part.ended:
            return
        self._calls[call.id] = call.name
        out.append(
            {
                "type": "tool-input-available",
                "toolCallId": call.id,
                "toolName": call.name,
                "input": call.arguments,
            }
        )
        part.ended = True

    def _output(self, result: ToolResult, out: list[Chunk]) -> None:
        if result.call_id in self._outputs or result.call_id not in self._calls:
            return  # sent, or the call is not in this message
        self._outputs.add(result.call_id)
        if result.is_error:
            text = result_output(result)
            out.append(
                {
                    "type": "tool-output-error",
                    "toolCallId": result.call_id,
                    "errorText": text if isinstance(text, str) else json.dumps(text),
                }
            )
        else:
            out.append(
                {
                    "type": "tool-output-available",
                    "toolCallId": result.call_id,
                    "output": result_output(result),
                }
            )

    def _approval(self, id_: AsideId, approval: Approval, out: list[Chunk]) -> None:
        call = approval.call
        if id_ in self._asked or call is None or call not in self._calls:
            return  # a question has no part of its own in a UIMessage
        if call in self._outputs:
            return
        for step in self._steps.values():
            part = step.parts.get(f"call:{call}")
            if part is not None and not part.ended:
                return  # its input is not complete yet
        self._asked.add(id_)
        out.append({"type": "tool-approval-request", "approvalId": id_, "toolCallId": call})


# ---------------------------------------------------------------------- the history


def ui_messages(conversation: Conversation) -> list[dict[str, Any]]:
    """The conversation's committed entries as AI SDK UIMessages (what `useChat` loads):
    each user message (its kit id: the id the kit minted), and each run of assistant
    entries and their tools' results as one assistant message named by its first entry."""
    asked = {a.call: (id_, a) for id_, a in approvals(conversation) if a.call is not None}
    messages: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    tools: dict[str, dict[str, Any]] = {}
    for ref in conversation.entries():
        message = ref.message
        if isinstance(message, User) and not message.only_results():
            current = None
            if _is_shown_user(ref):
                messages.append(
                    {
                        "id": kit_id(ref),
                        "role": "user",
                        "parts": [{"type": "text", "text": user_text(ref)}],
                    }
                )
            continue
        if isinstance(message, User):
            for result in message.tool_results():
                _put_result(tools.get(result.call_id), result)
            continue
        if not isinstance(message, Assistant):
            continue
        if current is None:
            current = {"id": ref.id, "role": "assistant", "parts": []}
            messages.append(current)
        parts: list[dict[str, Any]] = current["parts"]
        parts.append({"type": "step-start"})
        for key, part in part_keys(message):
            if isinstance(part, ToolCall):
                tool = {
                    "type": f"tool-{part.name}",
                    "toolCallId": part.id,
                    "state": "input-available",
                    "input": part.arguments,
                }
                found = asked.get(part.id)
                if found is not None:
                    _put_approval(tool, *found)
                tools[part.id] = tool
                parts.append(tool)
            elif isinstance(part, Text):
                parts.append({"type": "text", "text": part.text, "state": "done"})
            else:  # the SDK keeps a reasoning part's stream id in the part
                shown = {"type": "reasoning", "id": f"{ref.id}:{key}", "text": part.text}
                parts.append({**shown, "state": "done"})
    return messages


def _is_shown_user(ref: EntryRef) -> bool:
    """A person's message (the STOPPED note the hub or worker writes is not shown)."""
    return is_user_text(Entry(ref.message, ref.id, ref.author, ref.source_id))


def _put_approval(tool: dict[str, Any], id_: AsideId, approval: Approval) -> None:
    if approval.is_open:
        tool["state"] = "approval-requested"
        tool["approval"] = {"id": id_}
    else:
        tool["state"] = "approval-responded"
        decided: dict[str, Any] = {"id": id_, "approved": approval.approved}
        if approval.reason is not None:
            decided["reason"] = approval.reason
        tool["approval"] = decided


def _put_result(tool: dict[str, Any] | None, result: ToolResult) -> None:
    if tool is None:
        return
    if result.is_error:
        output = result_output(result)
        tool["state"] = "output-error"
        tool["errorText"] = output if isinstance(output, str) else json.dumps(output)
    else:
        tool["state"] = "output-available"
        tool["output"] = result_output(result)


def sent_messages(messages: Sequence[Any]) -> Iterable[tuple[str, str, str]]:
    """`(id, role, text)` of each well-formed UIMessage a client sent (text: a user
    message's text parts joined); malformed ones are left out for the caller to refuse."""
    for message in messages:
        if not isinstance(message, dict):
            continue
        id_, role, parts = message.get("id"), message.get("role"), message.get("parts")
        if not isinstance(id_, str) or not isinstance(role, str) or not isinstance(parts, list):
            continue
        text = "".join(
            p["text"]
            for p in parts
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
        yield id_, role, text
