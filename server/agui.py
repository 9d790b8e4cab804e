"""AG-UI served by the hub (SPEC 13): `POST /v1/agui/{id}` runs, `POST /v1/agui/{id}/stop`.

How this works: a run request is a `RunAgentInput` (`threadId` = the conversation id). The
route checks the caller's token (`read`), opens a `server.kits.Watch` (a replica of the
conversation over loopback with the caller's own token, so every rule is the hub's), and
before answering anything does what the input asks, through the watch: the frontend tools
it offers go into `rig.tools`, its `resume[]` entries decide approvals, the frontend tools'
results it brings and its new user messages are pushed (the kit's ids kept in
`source_id`; queued per SPEC 10 when mid-step). A history that would edit the log is
answered 409, a write the token does not allow 403. Then the answer is an event stream:
`server.agui_events.Run` turns each state of the watch into the events that follow the one
turn (history, the draft so far, the rest, the end). A resume of an approval that is not
open any more ends the run at once with `RUN_ERROR` (code `decided`).

The client going away closes the stream and the watch, never the agent; stopping is
`POST /v1/agui/{id}/stop` (`write`), answered `{"stopped": bool}`.

`mount(hub)` registers the routes on the hub's front door. `ag-ui-protocol` is an extra
(`convsync[agui]`): without it the routes answer 501 and say what to install.

Async API: the front's (asyncio, anyio timeouts); a stream is an async generator the front
closes when the peer goes away.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

from .front import FrontRequest, Reply, Stream
from .kits import Caller, KitRefused, Kits

if TYPE_CHECKING:
    from ag_ui.core import BaseEvent, RunAgentInput

    from .hub import Hub
    from .kits import Watch

__all__ = ["Agui", "mount"]

PREFIX = "/v1/agui/"


def mount(hub: Hub) -> None:
    """Serve AG-UI under `/v1/agui/` on `hub`'s front door."""
    # Only whether the extra is installed: importing it loads pydantic (about 8 MiB), which a
    # hub whose clients never speak AG-UI should not pay for. The first run imports it.
    if importlib.util.find_spec("ag_ui") is None:
        hub.front.route(PREFIX, _missing, methods=("POST",))
        return
    hub.front.route(PREFIX, Agui(hub).respond, methods=("POST",))


async def _missing(request: FrontRequest) -> Reply:
    return Reply.text(501, "AG-UI needs the agui extra: pip install 'convsync[agui]'\n")


class Agui:
    """The AG-UI routes of one hub."""

    def __init__(self, hub: Hub) -> None:
        self._kits = Kits(hub)

    async def respond(self, request: FrontRequest) -> Reply | Stream:
        """Answer `POST /v1/agui/{id}` (a run) or `POST /v1/agui/{id}/stop`."""
        rest = request.path[len(PREFIX) :]
        conversation_id, _, action = rest.partition("/")
        authorization = request.headers.get("Authorization")
        try:
            if action == "stop":
                return await self._stop(conversation_id, authorization)
            if action:
                return Reply.text(404, "not found\n")
            return await self._run(request, conversation_id, authorization)
        except KitRefused as refused:
            return Reply.text(refused.status, refused.phrase + "\n")

    async def _stop(self, conversation_id: str, authorization: str | None) -> Reply:
        caller = self._kits.caller(authorization, conversation_id, "write")
        async with self._kits.watch(conversation_id, caller, "agui") as watch:
            stopped = await watch.stop()
        return Reply.json(200, {"stopped": stopped})

    async def _run(
        self, request: FrontRequest, conversation_id: str, authorization: str | None
    ) -> Reply | Stream:
        from ag_ui.core import RunAgentInput
        from pydantic import ValidationError

        try:
            run_input = RunAgentInput.model_validate_json(request.body)
        except ValidationError:
            return Reply.text(400, "the body is not an AG-UI RunAgentInput\n")
        if run_input.thread_id != conversation_id:
            return Reply.text(400, "threadId must be the conversation id of the path\n")
        caller = self._kits.caller(authorization, conversation_id, "read")
        events = self._events(conversation_id, caller, run_input)
        try:
            first = await events.__anext__()  # the writes are done (or refused) by then
        except StopAsyncIteration:  # pragma: no cover - a run always yields
            return Reply.text(500, "the run ended before it began\n")
        return Stream(_Chain(first, events))

    async def _events(
        self, conversation_id: str, caller: Caller, run_input: RunAgentInput
    ) -> AsyncGenerator[bytes, None]:
        """The run's stream: KitRefused before the first chunk, events after it."""
        from .agui_events import ResumeError, Run

        async with self._kits.watch(conversation_id, caller, "agui") as watch:
            try:
                expect = await self._write(watch, run_input)
            except ResumeError as refused:
                run = Run(conversation_id, run_input.run_id, expect_turn=False)
                yield _encode(run.fail(str(refused), refused.code))
                return
            with self._kits.streaming("agui"):
                run = Run(conversation_id, run_input.run_id, expect_turn=expect)
                yield _encode(run.begin(watch.conversation, _drafts(watch)))
                while not run.finished:
                    try:
                        await watch.changed()
                    except KitRefused:
                        yield _encode(run.fail("the conversation's connection ended", "gone"))
                        return
                    chunk = _encode(run.update(watch.conversation, _drafts(watch)))
                    if chunk:
                        yield chunk

    async def _write(self, watch: Watch, run_input: RunAgentInput) -> bool:
        """Do what the input asks; whether it gave the agent something to do.

        Raises:
            KitRefused: 409 for a history that edits the log, 403 for a write the token
                lacks the scope for (and what `Watch` raises).
            ResumeError: a resume naming no open approval.
        """
        from sync.approvals import frontend_tools

        from .agui_events import ResumeError, resume_decisions, sent_messages, tool_results
        from .kitstate import read_sent

        conversation = watch.conversation
        reading = read_sent(conversation, sent_messages(run_input.messages))
        if reading.problem is not None:
            raise KitRefused(409, "the history sent would rewrite the log (no branching yet)")
        decisions = resume_decisions(conversation, run_input.resume or [])
        offered = sorted({tool.name for tool in run_input.tools or []})
        if offered and not set(offered) <= frontend_tools(conversation):
            await watch.set_tools(offered)
        for decision in decisions:
            try:
                await watch.decide(
                    decision.id,
                    approve=decision.approve,
                    answer=decision.answer,
                    reason=decision.reason,
                )
            except KitRefused as refused:
                if refused.status != 409:
                    raise
                why = f"interrupt {decision.id!r} was decided already"
                raise ResumeError("decided", why) from None
        pushed = 0
        for result in tool_results(conversation, run_input.messages):
            text = "".join(getattr(part, "text", "") for part in result.content)
            pushed += await watch.tool_result(
                result.call_id, result.name, text, is_error=result.is_error
            )
        pushed += len(await watch.send(reading.new))
        return bool(pushed or decisions)


def _drafts(watch: Watch) -> dict[str, Any]:
    """The watch's open drafts by id, oldest first."""
    return {d.id: d for d in sorted(watch.drafts, key=lambda d: (d.since, d.id))}


def _encode(events: Sequence[BaseEvent]) -> bytes:
    """Server-sent events, one `data:` line each (`ag_ui.encoder`'s SSE)."""
    from ag_ui.encoder import EventEncoder

    encoder = EventEncoder()
    return "".join(encoder.encode(event) for event in events).encode()


class _Chain:
    """`first`, then the chunks of `rest`. `aclose` closes `rest` (the watch with it) even
    when nothing was read yet: a peer gone before the first write leaves nothing open."""

    def __init__(self, first: bytes, rest: AsyncGenerator[bytes, None]) -> None:
        self._first: bytes | None = first
        self._rest = rest

    def __aiter__(self) -> _Chain:
        return self

    async def __anext__(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._rest.__anext__()

    async def aclose(self) -> None:
        await self._rest.aclose()
