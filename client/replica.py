"""`Replica`: a live copy of one conversation, kept in sync with the hub over a websocket.

How this works: the pure `ReplicaSession` decides everything; this module only moves bytes.
One task keeps a connection up (reconnecting with capped exponential backoff and full jitter)
and, per connection, reads frames into the session while a pusher task sends the next batch
whenever the application edits `replica.conversation` or the session becomes able to send.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Self

import anyio
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from sync import Conversation
from sync.errors import ConvsyncError, UsageError
from sync.protocol import SUBPROTOCOL, decode_hub_message, encode_message

from .session import Connected, Event, ReplicaSession

__all__ = ["Replica", "connect"]

log = logging.getLogger("convsync.replica")


class Replica:
    """A replica of conversation `conversation_id` on the hub at `url`.

    Use as `async with connect(url, conversation_id, client=...) as replica:`. Edit
    `replica.conversation` with ordinary `Conversation` methods; the replica pushes the edits
    by itself (batched, one batch in flight), applies everything the log accepts, and rebases
    your pending edits when the log moved under them.

    Args:
        url: the hub's base url (`ws://host:port`).
        conversation_id: the conversation to mirror.
        client: this replica's client id; give the same one to a process that continues this
            replica's pushes. A random one when omitted.
        conversation: a new value to start from (its unsaved records are pushed).
        max_frame: the largest frame sent (must not exceed the hub's limit).
        backoff: the first reconnect delay cap, in seconds; it doubles per failure...
        max_backoff: ...up to this cap. Each delay is drawn uniformly below the cap.
        connect_timeout: how long entering the `async with` waits for the first catch-up.
        compression: `"deflate"` to offer permessage-deflate (the hub must enable it too).
    """

    def __init__(
        self,
        url: str,
        conversation_id: str,
        *,
        client: str | None = None,
        conversation: Conversation | None = None,
        max_frame: int = 1 << 20,
        backoff: float = 0.05,
        max_backoff: float = 5.0,
        connect_timeout: float = 10.0,
        compression: str | None = None,
    ) -> None:
        self.url = f"{url.rstrip('/')}/v1/conversations/{conversation_id}"
        self.conversation_id = conversation_id
        self.session = ReplicaSession(
            client or f"replica-{uuid.uuid4().hex[:12]}", conversation, max_frame=max_frame
        )
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._connect_timeout = connect_timeout
        self._compression = compression
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._wake = asyncio.Event()  # something may be pushable
        self._progress = asyncio.Event()  # the session moved (for flush and ready waits)
        self._ws: ClientConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._welcomed = False
        self.connects = 0
        self.session.local.on_edit(self._wake.set)

    # ------------------------------------------------------------------ reads

    @property
    def conversation(self) -> Conversation:
        """The local value: edit it; it already holds your pending edits."""
        return self.session.local

    @property
    def client(self) -> str:
        return self.session.client

    @property
    def pending(self) -> int:
        """Edits made here that the hub has not acknowledged yet."""
        return self.session.pending

    @property
    def revision(self) -> int:
        """The log's revision as this replica last saw it (its confirmed records)."""
        return self.session.confirmed.revision

    @property
    def connected(self) -> bool:
        return self._ws is not None and self.session.ready

    async def events(self) -> AsyncIterator[Event]:
        """Every event, in order: `Connected`, `Disconnected`, `Applied`, `Rebased`, `Reset`,
        `Conflict`. Events wait here until read."""
        while True:
            yield await self._events.get()

    def events_nowait(self) -> list[Event]:
        """The events queued so far, without waiting."""
        events = []
        while not self._events.empty():
            events.append(self._events.get_nowait())
        return events

    async def flush(self) -> None:
        """Wait until every edit made so far is acknowledged and applied. Bound the wait
        with `anyio.fail_after` (it lasts while the hub is unreachable)."""
        self._wake.set()
        while not self.session.settled or self._ws is None:
            self._progress.clear()
            await self._progress.wait()

    async def wait_for(self, revision: int) -> None:
        """Wait until the replica has seen the log up to `revision`."""
        while self.session.confirmed.revision < revision or not self.session.ready:
            self._progress.clear()
            await self._progress.wait()

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        # The connection loop runs in a task of its own, so replicas can be closed in any
        # order and from any task.
        self._task = asyncio.create_task(self._run())
        try:
            with anyio.fail_after(self._connect_timeout):
                while not self.session.ready:
                    if self._task.done():
                        self._task.result()
                    self._progress.clear()
                    await self._progress.wait()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Disconnect and stop. Pending edits not yet acknowledged stay in `conversation`'s
        records; call `flush()` first to be sure they landed."""
        if self._closed:
            return
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        elif task is not None and not task.cancelled():
            task.exception()  # retrieved; a crash was already raised to whoever waited

    # ------------------------------------------------------------------ the loops

    def _emit(self, events: list[Event]) -> None:
        for event in events:
            self._events.put_nowait(event)
        self._progress.set()

    async def _run(self) -> None:
        failures = 0
        while not self._closed:
            reason = "closed"
            self._welcomed = False
            resync = False
            try:
                async with ws_connect(
                    self.url,
                    subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                    max_size=None,
                    compression="deflate" if self._compression == "deflate" else None,
                    open_timeout=self._connect_timeout,
                ) as ws:
                    self._ws = ws
                    try:
                        await self._serve(ws)
                    finally:
                        self._ws = None
                    close = ws.protocol.close_rcvd
                    if close is not None:
                        reason = f"closed {close.code} {close.reason}".strip()
                        resync = close.reason == "lagging"
            except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            except InvalidURI as exc:
                raise UsageError("bad_url", str(exc)) from exc
            except ConvsyncError as exc:
                reason = f"{exc.reason}: {exc.message}"
                log.warning("replica %s dropped the connection: %s", self.client, reason)
            self._emit(self.session.disconnected(reason))
            if self._closed:
                return
            failures = 0 if self._welcomed else failures + 1
            if resync:
                continue  # sent to resync: catch up at once
            cap = min(self._max_backoff, self._backoff * 2 ** max(failures - 1, 0))
            await anyio.sleep(random.uniform(0, cap))

    async def _serve(self, ws: ClientConnection) -> None:
        """Read frames into the session until the connection ends; a protocol error from the
        hub or the session ends it too, and is raised (outside the task group, unwrapped)."""
        session = self.session
        await ws.send(encode_message(session.hello()), text=True)
        failure: ConvsyncError | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(self._push_loop, ws)
            try:
                while True:
                    data = await ws.recv(decode=False)
                    events = session.receive(decode_hub_message(data))
                    if events and isinstance(events[0], Connected):
                        self._welcomed = True
                        self.connects += 1
                    self._emit(events)
                    self._wake.set()
            except ConnectionClosed:
                pass
            except ConvsyncError as error:
                failure = error
            finally:
                group.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _push_loop(self, ws: ClientConnection) -> None:
        session = self.session
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                frame, conflicts = session.next_push()
                if conflicts:
                    self._emit(list(conflicts))
                if frame is not None:
                    await ws.send(frame, text=True)
        except ConnectionClosed:
            pass  # the reading side sees the close and ends the connection


def connect(
    url: str,
    conversation_id: str,
    *,
    client: str | None = None,
    conversation: Conversation | None = None,
    **options: object,
) -> Replica:
    """A `Replica` of `conversation_id` on the hub at `url`; use with `async with`."""
    return Replica(url, conversation_id, client=client, conversation=conversation, **options)  # type: ignore[arg-type]
