"""`AiSdk`: the AI SDK's chat endpoints served by the hub (SPEC 13).

How this works: `useChat` with a `DefaultChatTransport({api: HUB + "/v1/aisdk"})` talks to
these routes and to nothing else:

- `POST /v1/aisdk`: the body `DefaultChatTransport` sends (`id`: the conversation,
  `messages`: the whole history as the client holds it, `trigger`, `messageId`). The
  client's new user messages are pushed (its ids kept in `source_id`, so a message sent
  again is not pushed twice; queued when the worker is mid-step), approval responses and
  frontend tools' outputs in the parts of its last assistant message are written as
  decisions and results, then the answer is streamed as the UI message stream
  (`server.uistream`) until its turn ends or waits for a person. A regenerate, or a history
  that edits or reorders the log, gets 409 and nothing changes.
- `GET /v1/aisdk/{id}/stream` (what `useChat({resume: true})` asks on load and after a
  cut): the answer in progress, replayed from its start (the transport's default
  `resumeStreamIsReplay`), 204 when none runs.
- `POST /v1/aisdk/{id}/stop`: SPEC 10's stop; `GET /v1/aisdk/{id}/messages`: the history as
  UIMessages (committed entries only), for `useChat({messages})` after a reload.

Every request acts through a `server.kits.Watch` (a replica of the conversation with the
caller's token), so the hub's own rules decide what lands. A client that goes away closes
its watch only: the agent goes on, and the next resume shows the answer from its start.

Async API: anyio (the front door's routes), over the watch's asyncio replica.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from sync.entries import Failed, Stopped
from sync.ids import is_aside_id

from .front import FrontRequest, Reply, Stream
from .kits import Caller, KitRefused, Kits, Watch
from .kitstate import Answer, SentMessage, read_sent
from .uistream import ChunkWriter, sent_messages, ui_messages

if TYPE_CHECKING:
    from .hub import Hub

__all__ = ["PATH", "AiSdk"]

log = logging.getLogger("convsync.hub")

PATH = "/v1/aisdk"

HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Type", "text/event-stream"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
    ("x-vercel-ai-ui-message-stream", "v1"),
)
"""The headers of a UI message stream (as the SDK's `createUIMessageStreamResponse`)."""

_TRIGGERS = ("submit-message", "regenerate-message")


class AiSdk:
    """The `/v1/aisdk` routes of `hub` (register `route` under `PATH`)."""

    def __init__(self, hub: Hub) -> None:
        self._kits = Kits(hub)

    async def route(self, request: FrontRequest) -> Reply | Stream:
        """Answer one request under `/v1/aisdk`."""
        try:
            return await self._route(request)
        except KitRefused as refused:
            return Reply.text(refused.status, refused.phrase + "\n")

    async def _route(self, request: FrontRequest) -> Reply | Stream:
        rest = request.path[len(PATH) :].strip("/")
        method = request.method
        authorization = request.headers.get("Authorization")
        if rest == "":
            if method != "POST":
                return _not_allowed("POST")
            return await self._post(request, authorization)
        conversation_id, _, action = rest.partition("/")
        if action == "stream":
            if method != "GET":
                return _not_allowed("GET")
            return await self._resume(conversation_id, authorization)
        if action == "stop":
            if method != "POST":
                return _not_allowed("POST")
            return await self._stop(conversation_id, authorization)
        if action == "messages":
            if method != "GET":
                return _not_allowed("GET")
            return await self._history(conversation_id, authorization)
        return Reply.text(404, "not found\n")

    # -- the routes

    async def _post(self, request: FrontRequest, authorization: str | None) -> Reply | Stream:
        body = _body(request)
        conversation_id = body["id"]
        caller = self._kits.caller(authorization, conversation_id, "read")
        if body["trigger"] == "regenerate-message":
            raise KitRefused(409, "regenerating would rewrite the log (no branches yet)")
        sent = [SentMessage(id_, role, text) for id_, role, text in sent_messages(body["messages"])]
        watch = await self._kits.open(conversation_id, caller, "aisdk")
        try:
            reading = read_sent(watch.conversation, sent)
            if reading.problem is not None:
                raise KitRefused(409, "the history would edit the log (no branches yet)")
            last = body["messages"][-1] if body["messages"] else None
            writer = ChunkWriter()
            continues = (
                isinstance(last, dict)
                and last.get("role") == "assistant"
                and not reading.new
                and last.get("id") == watch.answer().first_id
            )
            if continues:
                assert isinstance(last, dict)
                writer = ChunkWriter(message_id=last["id"])
                writer.skip(watch.answer())  # the client holds it: send what comes after
                await self._act_on_parts(watch, caller, last)
            await watch.send(list(reading.new))
            target = reading.new[-1].id if reading.new else None
        except BaseException:
            await watch.aclose()
            raise
        return Stream(_Streamed(self._kits, watch, writer, target), headers=HEADERS)

    async def _resume(self, conversation_id: str, authorization: str | None) -> Reply | Stream:
        caller = self._kits.caller(authorization, conversation_id, "read")
        watch = await self._kits.open(conversation_id, caller, "aisdk")
        answer = watch.answer()
        if not answer.running or answer.parked:
            await watch.aclose()
            return Reply(204)
        return Stream(_Streamed(self._kits, watch, ChunkWriter(), None), headers=HEADERS)

    async def _stop(self, conversation_id: str, authorization: str | None) -> Reply:
        caller = self._kits.caller(authorization, conversation_id, "write")
        async with self._kits.watch(conversation_id, caller, "aisdk") as watch:
            asked = await watch.stop()
        return Reply.json(200, {"stopped": asked})

    async def _history(self, conversation_id: str, authorization: str | None) -> Reply:
        caller = self._kits.caller(authorization, conversation_id, "read")
        async with self._kits.watch(conversation_id, caller, "aisdk") as watch:
            return Reply.json(200, ui_messages(watch.conversation))

    # -- writing what the client's parts say

    async def _act_on_parts(self, watch: Watch, caller: Caller, message: dict[str, Any]) -> None:
        """Decide the approvals and write the frontend tools' outputs that the parts of
        `message` (the client's last assistant message) carry; ones already written are
        left alone (a request sent again)."""
        for part in message.get("parts") or []:
            if not isinstance(part, dict) or not str(part.get("type", "")).startswith("tool-"):
                continue
            call_id = part.get("toolCallId")
            state = part.get("state")
            approval = part.get("approval")
            if state == "approval-responded" and isinstance(approval, dict):
                id_, approved = approval.get("id"), approval.get("approved")
                if (
                    not isinstance(id_, str)
                    or not is_aside_id(id_)
                    or not isinstance(approved, bool)
                ):
                    raise KitRefused(400, "an approval response needs its id and approved")
                held = watch.replica.approvals.get(id_)
                if held is None:
                    raise KitRefused(404, "no such approval")
                if held.is_open:
                    reason = approval.get("reason")
                    await watch.decide(
                        id_,
                        approve=approved,
                        reason=reason if isinstance(reason, str) else None,
                    )
                elif held.approved != approved:
                    raise KitRefused(409, "the approval was decided otherwise")
            elif state in ("output-available", "output-error") and isinstance(call_id, str):
                if not any(c.id == call_id for c in watch.conversation.pending_calls()):
                    continue  # answered already (by this client before, or another)
                name = str(part.get("type"))[len("tool-") :]
                if state == "output-error":
                    text = part.get("errorText")
                    output = text if isinstance(text, str) else "the tool failed"
                else:
                    value = part.get("output")
                    output = value if isinstance(value, str) else json.dumps(value)
                await watch.tool_result(call_id, name, output, is_error=state == "output-error")


class _Streamed:
    """The UI message stream of the answer a watch sees, as the body of a `Stream`: to the
    user message `target` when given (it may wait queued first), until the answer ends or
    waits for a person. `aclose` (the front calls it when the client goes away) closes the
    watch even when no chunk was asked for yet; the agent goes on."""

    def __init__(self, kits: Kits, watch: Watch, writer: ChunkWriter, target: str | None) -> None:
        self._kits = kits
        self._watch = watch
        self._chunks = self._generate(writer, target)

    def __aiter__(self) -> _Streamed:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            await self._watch.aclose()

    async def _generate(self, writer: ChunkWriter, target: str | None) -> AsyncGenerator[bytes]:
        watch = self._watch
        with self._kits.streaming("aisdk"):
            while True:
                answer = watch.answer()
                if target is None or _answers(answer, target):
                    done = _finish_reason(answer)
                    if done is not None:
                        yield _sse(writer.finish(answer, done))
                        break
                    chunks = writer.chunks(answer)
                    if chunks:
                        yield _sse(chunks)
                try:
                    await watch.changed()
                except KitRefused as lost:
                    yield _sse([{"type": "error", "errorText": lost.phrase}])
                    break
            yield b"data: [DONE]\n\n"


def _answers(answer: Answer, target: str) -> bool:
    """Whether `answer` answers the user message the client sent as `target` (it may still
    be queued behind the step under way)."""
    request = answer.request
    return request is not None and (request.source_id or request.id) == target


def _finish_reason(answer: Answer) -> str | None:
    """How the stream of `answer` ends now, or None while it goes on."""
    if answer.parked:
        return "tool-calls"  # waits for a person: an approval, a frontend tool
    if answer.running:
        return None
    end = answer.turn.end if answer.turn is not None else None
    if isinstance(end, Failed):
        return "error"
    return "other" if isinstance(end, Stopped) else "stop"


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(
        b"data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
        for chunk in chunks
    )


def _body(request: FrontRequest) -> dict[str, Any]:
    """The checked body of `POST /v1/aisdk`."""
    try:
        body = request.json()
    except ValueError:
        raise KitRefused(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise KitRefused(400, "the body is a JSON object")
    if not isinstance(body.get("id"), str):
        raise KitRefused(400, "the body needs the chat id (id)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise KitRefused(400, "the body needs its messages")
    if len(list(sent_messages(messages))) != len(messages):
        raise KitRefused(400, "each message needs an id, a role and parts")
    trigger = body.get("trigger", "submit-message")
    if trigger not in _TRIGGERS:
        raise KitRefused(400, "trigger is submit-message or regenerate-message")
    body["trigger"] = trigger
    return body


def _not_allowed(allow: str) -> Reply:
    return Reply(
        405,
        (("Allow", allow), ("Content-Type", "text/plain; charset=utf-8")),
        f"method not allowed (allowed: {allow})\n".encode(),
    )
