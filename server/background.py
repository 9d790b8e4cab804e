"""`Background`: runs one anyio service in an asyncio task of its own.

Why: an anyio task group must be left by the task that entered it, but a hub is often entered
and left by different tasks (a test fixture's setup and its teardown). So the hub's task group
lives in a task of its own, started here; `Hub.__aenter__` waits until the service reports it
started, `Hub.aclose` until the task ends.

Async API: asyncio (a task that outlives the scope of whoever started it has no anyio
spelling); the one bridge: inside that task it enters the service's anyio task group.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

from sync.errors import sole_exception

__all__ = ["Background"]


class Background:
    """One service, in a task of its own once `start` is called."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    async def start(self, service: Callable[..., Coroutine[Any, Any, Any]]) -> Any:
        """Run `service(task_status=...)` (an anyio service) in a task of its own; return what
        it reported with `task_status.started(...)`.

        Raises:
            What stopped the service before it started (a port in use, a bad store), the one
            exception, not a group. Cancelled while starting (Ctrl-C), it stops what was
            started, then the cancellation goes on.
        """
        reported: list[Any] = []
        ready = asyncio.Event()

        async def main() -> None:
            async with anyio.create_task_group() as group:
                reported.append(await group.start(service))
                ready.set()

        task = self._task = asyncio.create_task(main())
        waiter = asyncio.create_task(ready.wait())
        try:
            await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled while starting (Ctrl-C): stop what was started
            waiter.cancel()
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.shield(task)
            raise
        waiter.cancel()
        if task.done():
            error = task.exception()
            if error is not None:
                raise sole_exception(error)
        return reported[0] if reported else None

    async def wait(self) -> None:
        """Until the service's task ends (not at all when it never started); raises what
        ended it. Cancelling the caller does not cancel the service."""
        if self._task is not None:
            await asyncio.shield(self._task)
