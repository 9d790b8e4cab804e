"""`DraftWriter`: one message in progress that a replica streams to every UI (SPEC 7).

Use as `async with replica.draft() as d:`; `d.append(text)` returns at once (the replica sends
each append at once within the hub's draft budget, and `keep` while the model is silent);
`await d.commit(message)` pushes the finished message under the draft's id, which ends the
draft for everyone in the same step as its record lands. Leaving the block without a commit,
or with an exception, aborts it. When the hub ends the draft (a user stopped the turn: status
`stopped`; or `timeout`, `aborted`), `d.status` says so and every scope from
`d.cancel_on_end()` is cancelled, so the model call inside one stops at once.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio

from sync import Assistant, Author, Entry, Stop
from sync.ids import default_minter
from sync.messages import AnyMessage
from sync.providers.streams import Format, StreamFold, stream_fold

if TYPE_CHECKING:
    from .replica import Replica

__all__ = ["DraftWriter"]


class DraftWriter:
    """A draft this replica produces; see the module docstring.

    Args:
        replica: the replica that streams it.
        after: the id of the entry it follows (the last entry when omitted).
        author: the author its entry will carry.
    """

    def __init__(self, replica: Replica, after: str | None, author: Author | None) -> None:
        self.id: str = default_minter.message_id()
        self.after = after
        self.author = author
        self.status: str | None = None
        """None while open; then `committed`, `aborted`, `stopped`, `timeout` or `refused`."""
        self._replica = replica
        self._ended = anyio.Event()
        self._scopes: list[anyio.CancelScope] = []
        self._opened = False
        self._fold: StreamFold | None = None

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> Self:
        """Open the draft (the `open` goes to the hub with the next send)."""
        if not self._opened:
            self._opened = True
            self._replica.begin_step()  # a model call: input sent meanwhile waits (SPEC 10)
            self._replica._open_draft(self)
        return self

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.abort()  # or, once ended, let its text go

    # ------------------------------------------------------------------ writing

    def append(self, text: str, part: str = "text", name: str | None = None) -> None:
        """Add `text` to `part` (`text`, `reasoning`, or `call:<call_id>` for a tool call's
        arguments as JSON text so far, with the tool's `name` at its first append). Does
        nothing once the draft ended."""
        if self.status is None:
            self._replica._append_draft(self, text, part, name)

    def text_of(self, part: str = "text") -> str:
        """What was appended to `part` so far."""
        return self._replica.session.live.text_of(self.id, part)

    @property
    def text(self) -> str:
        return self.text_of("text")

    async def stream(
        self, events: AsyncIterable[Any] | Iterable[Any], *, format: Format
    ) -> Assistant:
        """Fold a provider's stream into this draft: text, reasoning and tool-call arguments
        are appended as they come; returns the final `Assistant` (content, stop, origin,
        usage), to `commit`. `events` is the SDK's stream (or any iterable of its events or
        their dicts), of `format` (`"anthropic"`, `"openai_chat"`, `"openai_responses"`).

        When the hub ends the draft meanwhile (a stop), the SDK stream is closed at once and
        what it said so far comes back as a reply under `Stop("aborted", <the status>)`.

        Raises:
            StreamError: the provider reported an error, or the stream ended early.
        """
        fold = self._fold = stream_fold(format)
        with self.cancel_on_end() as scope:
            try:
                if isinstance(events, AsyncIterable):
                    async for event in events:
                        for append in fold.feed(event):
                            self.append(append.text, append.part, append.name)
                else:
                    for event in events:
                        for append in fold.feed(event):
                            self.append(append.text, append.part, append.name)
                        await anyio.lowlevel.checkpoint()
            finally:
                if not fold.done:
                    with anyio.CancelScope(shield=True):
                        await _close(events)
        if scope.cancelled_caught and not fold.done:
            why = "stopped" if self.status == "stopping" else self.status
            return fold.partial(Stop("aborted", why))
        return fold.final()

    async def commit(self, message: AnyMessage) -> str:
        """Push `message` as an entry with this draft's id (the replica sends it like any
        edit; the hub ends the draft `committed` when it lands). Returns the id. A commit
        after a stop still lands, after the halt."""
        # Pushed first: if the push raises (`too_large`), the draft is still open here and
        # on the hub, to abort (forgotten first, nobody would have told the hub).
        self._replica.conversation.push(Entry(message, self.id, self.author))
        self._replica.end_step()  # in the same push: the step ends with its message
        self._replica._forget_draft(self)
        self._end("committed")
        return self.id

    async def abort(self) -> None:
        """Drop the draft for everyone (once the hub ended it, only let its text go)."""
        if self.status is None:
            self._replica._abort_draft(self)
            self._replica.end_step()
            self._end("aborted")
        else:
            self._replica._forget_draft(self)

    # ------------------------------------------------------------------ ending

    @property
    def ended(self) -> bool:
        return self.status is not None

    async def wait_ended(self) -> str:
        """Wait until the draft ends; its status."""
        await self._ended.wait()
        assert self.status is not None
        return self.status

    def cancel_on_end(self) -> anyio.CancelScope:
        """A cancel scope cancelled when the hub ends this draft (a stop, a timeout): run the
        model call inside it (`with d.cancel_on_end(): ...`)."""
        scope = anyio.CancelScope()
        if self.status is not None and self.status != "committed":
            scope.cancel()
        self._scopes.append(scope)
        return scope

    def _fold_partial(self, stop: Stop) -> Assistant | None:
        """What the last `stream` said before it failed, under `stop`; None if nothing."""
        if self._fold is None:
            return None
        partial = self._fold.partial(stop)
        return partial if partial.content else None

    def _end(self, status: str) -> None:
        if self.status is not None:
            return
        self.status = status
        self._ended.set()
        if status != "committed":
            for scope in self._scopes:
                scope.cancel()


async def _close(events: object) -> None:
    """Close an SDK stream (its HTTP response goes with it); sync or async `close`."""
    close = getattr(events, "aclose", None) or getattr(events, "close", None)
    if callable(close):
        closed = close()
        if inspect.isawaitable(closed):
            await closed
