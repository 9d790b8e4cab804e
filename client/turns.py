"""A replica's turns (SPEC 10, SPEC 11): opening one, and answering in it with a model's reply.

`Turns` is part of `Replica` (`client.replica`): `answer` streams a model call into a draft
(`client.drafting`) and commits it, calling the model again when the reply is `superseded`.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from sync import Assistant, Author, ChangeRecord, Halt, Push, Splice, Stop, TurnOwner, TurnRecord
from sync.providers.streams import Format
from sync.steer import keep_superseded

from .drafting import DraftWriter

if TYPE_CHECKING:
    from sync import Conversation

    from .session import ReplicaSession

__all__ = ["Turns"]


class Turns:
    """The turn methods of `Replica`."""

    if TYPE_CHECKING:  # what `Replica` gives these methods
        session: ReplicaSession

        @property
        def conversation(self) -> Conversation: ...

        @property
        def client(self) -> str: ...

        def draft(
            self, *, after: str | None = None, author: Author | None = None
        ) -> DraftWriter: ...

        async def flush(self) -> None: ...

    def open_turn(self) -> TurnRecord:
        """Record a turn beginning now, owned by this replica (SPEC 10: `(sub, client)`, the
        identity the hub knows this connection as): while this replica is connected its hub
        keeps the turn's lease; if it stays away longer than the hub's `turn_grace`, any hub
        ends the turn `failed` and the request waits for the next worker. Returns the record."""
        return self.conversation.open_turn(TurnOwner(self.session.sub or "anonymous", self.client))

    async def answer(
        self,
        events: AsyncIterable[Any] | Iterable[Any] | Callable[[], Any],
        *,
        format: Format,
        author: Author | None = None,
        attempts: int = 3,
    ) -> Assistant:
        """Stream a model call's events into a draft and commit the reply (SPEC §11): the
        common case of `draft()` + `d.stream(...)` + `d.commit(...)`. The draft puts the step
        marker (SPEC 10: input sent meanwhile is queued and lands right after the reply) and
        the commit removes it. Returns the message committed, once the hub acknowledged it
        (with any input queued meanwhile, which lands right after it). A stop while it
        streams closes the SDK stream and commits what was said under
        `Stop("aborted", "stopped")`, before the halt when a halt ended the draft (the STOPPED
        note then goes before the next input, as SPEC 10 keeps a stopped turn); an error from
        the provider commits the partial reply under `Stop("error", ...)` and raises.

        `events` may also be a function that makes the call (returning the SDK's stream, or
        an awaitable of it) from `replica.conversation` as it is then: when the hub refuses
        the reply `superseded` (a request landed after the base it was made on), the reply
        is kept as an aborted message (`Stop("aborted", "superseded")`, never read by a
        model) and the model is called again with the new input, up to `attempts` times.
        """
        for _ in range(max(1, attempts)):
            stream = events() if callable(events) else events
            if inspect.isawaitable(stream):
                stream = await stream
            message, draft_id = await self._answer_once(stream, format, author)
            if draft_id is None:
                return message
            # Acknowledged before returning: input queued during the call landed with the
            # reply, so the worker's next model call sees it (SPEC 10).
            await self.flush()
            if not callable(events):
                return message
            refused = self._take_superseded(draft_id)
            if not refused:
                return message
            keep_superseded(self.conversation, refused)
        return message

    async def _answer_once(
        self, events: Any, format: Format, author: Author | None
    ) -> tuple[Assistant, str | None]:
        async with self.draft(author=author) as d:
            try:
                message = await d.stream(events, format=format)
            except Exception as exc:
                partial = d._fold_partial(Stop("error", type(exc).__name__))
                if partial is not None:
                    await d.commit(partial)
                raise
            if d.status == "stopped":
                await self._commit_stopped(d, message)
                return message, d.id
            if d.status in (None, "stopping"):
                await d.commit(message)
                return message, d.id
            return message, None

    def _take_superseded(self, entry_id: str) -> list[ChangeRecord]:
        """The refused `superseded` records that pushed entry `entry_id` (taken out)."""
        held = self.session.superseded
        mine = [
            record
            for record in held
            if isinstance(record.change, Push | Splice)
            and any(entry.id == entry_id for entry in record.change.entries)
        ]
        self.session.superseded = [record for record in held if record not in mine]
        return mine

    async def _commit_stopped(self, d: DraftWriter, partial: Assistant) -> None:
        """Keep the partial reply of a draft a halt `stopped` ended as SPEC 10 keeps a stopped
        answer: the partial (aborted, never read by a model), then the halt, so the STOPPED
        note goes before the next input and not before the partial; one push carries it."""
        conversation = self.conversation
        if conversation.halted() is Halt.STOPPED:
            conversation.resume()  # taken off and put back after the partial: no note first
        await d.commit(partial)
        conversation.halt(Halt.STOPPED)
