"""A replica's approvals and questions (SPEC 12), and the frontend tools a UI runs.

`Approving` is part of `Replica` (`client.replica`); the rules themselves are
`sync.approvals`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from sync import Aside, AsideId, Assistant, Author, Conversation, ToolResult, User, approvals
from sync.approvals import Approval
from sync.errors import UsageError

if TYPE_CHECKING:
    from .session import ReplicaSession

__all__ = ["Approving"]


class Approving:
    """The approval methods of `Replica`."""

    if TYPE_CHECKING:  # what `Replica` gives these methods
        session: ReplicaSession
        _progress: asyncio.Event

        @property
        def conversation(self) -> Conversation: ...

        @property
        def client(self) -> str: ...

        def _raise_if_refused(self) -> None: ...

    @property
    def approvals(self) -> dict[AsideId, Approval]:
        """Every approval and question in the conversation (aside id -> `Approval`), in the
        order asked, as the local value holds them (own edits included)."""
        return dict(approvals.approvals(self.conversation))

    @property
    def may_decide(self) -> bool:
        """Whether this replica's token may decide approvals (the `approve` scope; every
        socket of a hub without auth may, except on the approvals its client asked)."""
        scopes = self.session.scopes
        return scopes is None or "approve" in scopes

    async def ask(
        self,
        *,
        call: str | None = None,
        prompt: str | None = None,
        schema: Any = None,
        key: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (SPEC 12's signature; None waits)
    ) -> Approval:
        """Ask a person, and wait for the decision (SPEC 12): about tool call `call` (an
        approval) or, with `key` and `prompt` (and a JSON `schema` for the answer), a
        question. Asks in the open turn; asking again for the same `(turn, key)` (`key`
        defaults to `call`) finds the approval asked already, so a worker restarted while
        it waited gets the decision made meanwhile without a second card. Returns the
        decided `Approval` (`state` `approved`, `denied` or `answered`, with `answer`,
        `reason`, `decided_by`), or one `cancelled` by a stop.

        Raises:
            UsageError: `no_turn` (no turn record is open), `bad_key`, `bad_schema`;
                `not_asked` when the hub refused the ask (its `Conflict` says why).
            TimeoutError: no decision within `timeout` seconds; the approval is then
                cancelled (reason `timeout`).
        """
        key = key if key is not None else call
        if key is None:
            raise UsageError("bad_key", "ask about a call, or give a question its key")
        await self._welcomed_once()
        sub = self.session.sub or "anonymous"
        conversation = self.conversation
        _, approval, _ = approvals.ask(
            conversation,
            key=key,
            call=call,
            prompt=prompt,
            schema=schema,
            asked_by=sub,
            asked_client=self.client,
        )
        turn = approval.turn
        try:
            with anyio.fail_after(timeout) if timeout is not None else contextlib.nullcontext():
                while True:
                    found = approvals.find(self.conversation, turn, key)
                    if found is None:
                        raise UsageError("not_asked", "the hub refused the ask (see Conflict)")
                    approval = found[1]
                    if not approval.is_open:
                        return approval
                    self._raise_if_refused()
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            found = approvals.find(self.conversation, turn, key)
            if found is not None and not found[1].is_open:
                return found[1]
            if found is not None:
                now = int(time.time() * 1000)
                approvals.cancel(
                    self.conversation, found[0], decided_by=sub, at=now, reason="timeout"
                )
            raise

    def decide(
        self,
        id: AsideId,
        *,
        approve: bool = True,
        answer: Any = None,
        reason: str | None = None,
    ) -> Approval:
        """Decide approval `id` (approve or deny; a question is answered with `answer`,
        checked against its schema), as this replica's principal. An edit, pushed like any
        other (`await flush()`); when someone else decided first, the hub refuses it and a
        `Conflict(decided)` comes, and `approvals[id]` holds the decision that stands.
        Returns the approval as decided here.

        Raises:
            UsageError: `no_approval`; `decided` (it is not open here any more: nothing is
                sent); `bad_answer` (the schema refuses the answer); `forbidden` (this
                token lacks the `approve` scope).
        """
        if not self.may_decide:
            raise UsageError("forbidden", "this token lacks the approve scope")
        return approvals.decide(
            self.conversation,
            id,
            approve=approve,
            answer=answer,
            reason=reason,
            decided_by=self.session.sub or "anonymous",
            at=int(time.time() * 1000),
        )

    def set_frontend_tools(self, names: Sequence[str]) -> AsideId:
        """List the tools a UI runs (a `rig.tools` aside): their calls wait for a UI's
        result (`result`), and a turn waiting only for them is parked."""
        value = {"tools": list(names)}
        conversation = self.conversation
        for id_, aside in conversation.asides():
            if aside.kind == approvals.TOOLS_KIND:
                if aside.value != value:
                    conversation.replace_aside(id_, Aside(aside.kind, None, aside.author, value))
                return id_
        return conversation.add_aside(Aside(approvals.TOOLS_KIND, None, Author.rig(), value))

    async def result(self, call_id: str) -> ToolResult:
        """Wait for the result of tool call `call_id` (a frontend tool's, pushed by a UI)
        and return it: the first that landed (strict pairing refuses a second)."""
        while True:
            found = _result_of(self.conversation, call_id)
            if found is not None:
                return found
            self._raise_if_refused()
            self._progress.clear()
            await self._progress.wait()

    async def _welcomed_once(self) -> None:
        while self.session.sub is None:
            self._raise_if_refused()
            self._progress.clear()
            await self._progress.wait()


def _result_of(conversation: Conversation, call_id: str) -> ToolResult | None:
    """The first result answering call `call_id` after the (last) entry holding it."""
    at = len(conversation) - 1
    while at >= 0:
        message = conversation.entry(at).message  # type: ignore[union-attr]
        if isinstance(message, Assistant) and any(c.id == call_id for c in message.tool_calls()):
            break
        at -= 1
    else:
        return None
    for later in range(at + 1, len(conversation)):
        message = conversation.entry(later).message  # type: ignore[union-attr]
        if isinstance(message, User):
            for result in message.tool_results():
                if result.call_id == call_id:
                    return result
    return None
