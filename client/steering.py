"""A replica's steering (SPEC 10): the step marker, stop requests, and scopes a stop cancels.

`Steering` is part of `Replica` (`client.replica`); the rules themselves are `sync.steer`'s.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio

from sync import Aside, AsideId, Author, Halt
from sync.steer import STEP_KIND, STOP_KIND, mid_step, step_value

if TYPE_CHECKING:
    from sync import Conversation

    from .session import ReplicaSession

__all__ = ["Steering"]


class Steering:
    """The steering methods of `Replica`."""

    _step: AsideId | None  # the `rig.step` marker this replica put, standing
    _stop_scopes: list[anyio.CancelScope]  # cancelled by a `StopRequested`

    if TYPE_CHECKING:  # what `Replica` gives these methods
        session: ReplicaSession

        @property
        def conversation(self) -> Conversation: ...

    def begin_step(self, turn: int | None = None) -> AsideId:
        """Mark a model call under way (a `rig.step` aside, value `{"turn", "at"}`): user text
        sent meanwhile is queued by the hub and lands once the step ends. `turn` is the open
        turn's index (the last turn record's when omitted). Idempotent while one stands.
        Call `end_step` in the edit that ends the step (the assistant message; a `draft`'s
        commit does it), so one push carries both."""
        conversation = self.conversation
        if self._step is not None and conversation.aside(self._step) is not None:
            return self._step
        if turn is None:
            turns = conversation.turns()
            turn = turns[-1][1].index if turns and turns[-1][1].end is None else None
        after = conversation.id(len(conversation) - 1) if len(conversation) else None
        value = step_value(turn, int(time.time() * 1000))
        self._step = conversation.add_aside(Aside(STEP_KIND, after, Author.rig(), value))
        return self._step

    def end_step(self) -> bool:
        """Remove the step marker this replica put; whether one stood."""
        step, self._step = self._step, None
        return step is not None and self.conversation.remove_aside(step) is not None

    def stop(self) -> bool:
        """Ask the running turn to stop (SPEC 10): while a turn record is open or the
        conversation is mid-step, a stop request (`rig.stop` aside, value `{"turn", "at"}`)
        the worker finishes (`sync.steer.finish_stopped`); otherwise the user's last request
        is halted `stopped`, as `Conversation.halt` does. Whether anything was asked."""
        conversation = self.conversation
        turns = conversation.turns()
        open_turn = turns[-1][1].index if turns and turns[-1][1].end is None else None
        if open_turn is None and not mid_step(conversation):
            return conversation.halt(Halt.STOPPED)
        if any(aside.kind == STOP_KIND for _, aside in conversation.asides()):
            return True  # asked already
        after = conversation.id(len(conversation) - 1) if len(conversation) else None
        value = step_value(open_turn, int(time.time() * 1000))
        # Its author names who stopped (the hub checks it against the token, SPEC 10).
        stopper = Author("user", name=self.session.sub or "anonymous")
        conversation.add_aside(Aside(STOP_KIND, after, stopper, value))
        return True

    def stop_requested(self) -> bool:
        """Whether a stop request stands in the conversation."""
        return any(aside.kind == STOP_KIND for _, aside in self.conversation.asides())

    def cancel_on_stop(self) -> anyio.CancelScope:
        """A cancel scope cancelled when a stop request arrives (`StopRequested`), or at once
        when one stands: run the model call or the tool inside it, then finish the turn with
        `sync.steer.finish_stopped`."""
        scope = anyio.CancelScope()
        if self.stop_requested():
            scope.cancel()
        self._stop_scopes = [s for s in self._stop_scopes if not s.cancel_called]
        self._stop_scopes.append(scope)
        return scope
