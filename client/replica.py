"""`Replica`: a live copy of one conversation, kept in sync with the hub over a websocket.

How this works: the pure `ReplicaSession` decides everything; this module only moves bytes.
One task keeps a connection up (reconnecting with capped exponential backoff and full jitter)
and, per connection, reads frames into the session while a pusher task sends the next batch
whenever the application edits `replica.conversation` or the session becomes able to send.
With a token (SPEC 6), each connection asks for one (`token=` may be a callable), sends it in
`hello`, and a third task sends a fresh one (`auth`) before the hub's `expires_in` runs out.

A keepalive task pings the hub (websocket pings) every `keepalive / 2` seconds and drops the
connection when a ping is not answered within `keepalive / 2`, so a hub that went silent with
its socket still open (frozen, or behind a dead network path) is noticed within `keepalive`
seconds instead of when TCP gives up. The closing handshake is skipped then: a silent hub
would not answer it either.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import os
import random
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self

import anyio
import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from sync import (
    AsideId,
    Author,
    Conversation,
)
from sync.errors import (
    ConvsyncError,
    ProtocolError,
    Refused,
    Retry,
    Unavailable,
    UsageError,
    retry_of,
)
from sync.frames import MAX_FRAME
from sync.protocol import (
    STATE_FORMATS,
    SUBPROTOCOL,
    Auth,
    AuthOk,
    Hello,
    Welcome,
    decode_hub_message,
    encode_message,
    is_kind,
)

from .approvals import Approving
from .connection import (
    check_times,
    conversation_urls,
    first_error,
    refused_for_now,
    retry_after,
    url_problem,
)
from .drafting import DraftWriter
from .live import FEATURES, Draft, DraftChanged, DraftEnded, Presence
from .outbox import Outbox
from .session import Connected, Disconnected, Event, ReplicaSession, StopRequested
from .steering import Steering
from .turns import Turns

__all__ = ["Replica", "Token", "connect", "url_problem"]

Token = str | Callable[[], str | Awaitable[str]]
"""A token, or a function (sync or async) returning a fresh one: called on every connect
and before the current one expires."""

log = logging.getLogger("convsync.replica")
_ws_log = logging.getLogger("convsync.replica.websockets")
# websockets logs frames (a hello holds the token) at DEBUG: never below INFO.
_ws_log.setLevel(logging.INFO)


class Replica(Steering, Turns, Approving):
    """A replica of conversation `conversation_id` on the hub at `url`.

    Use as `async with connect(url, conversation_id, client=...) as replica:`. Edit
    `replica.conversation` with ordinary `Conversation` methods; the replica pushes the edits
    by itself (batched, one batch in flight), applies everything the log accepts, and rebases
    your pending edits when the log moved under them.

    Args:
        url: the hub's base url (`ws://host:port`), or several hubs sharing one store (SPEC
            9): the replica starts with the first and moves to the next one after each lost
            or failed connection (a refusal still stops it).
        conversation_id: the conversation to mirror.
        client: this replica's client id; give the same one to a process that continues this
            replica's pushes. A random one when omitted.
        conversation: a new value to start from (its unsaved records are pushed).
        max_frame: the largest frame sent (must not exceed the hub's limit).
        backoff: the first reconnect delay cap, in seconds; it doubles per failure...
        max_backoff: ...up to this cap. Each delay is drawn uniformly below the cap.
        connect_timeout: how long entering the `async with` waits for the first catch-up.
        compression: `"deflate"` to offer permessage-deflate (the hub must enable it too).
        draft_interval: seconds between two sends of a draft's appends (fixed coalescing).
            0, the default: each append goes at once, paced within the hub's draft budget
            (appends made while it is spent go together).
        keep_every: seconds of silence after which an open draft is kept alive (`keep`).
        kind: what this replica is (`user`, `agent`), shown in presence without a token.
        token: the access token for a hub with auth: a string, or a callable (sync or async)
            returning one. A callable is called on every (re)connect and again before the
            token expires (sent as `auth`); after `unauthorized` the replica retries with a
            new token. A string that the hub refuses raises `Refused`.
        ssl: the TLS context for `wss://` (e.g. `ssl.create_default_context(cafile=...)`
            for a hub with a private CA); the system's defaults when omitted.
        keepalive: seconds within which a hub that stopped answering is noticed (pings go
            every `keepalive / 2` seconds and must be answered within as long); at least 0.1,
            or None for no pings.
        presence: False to watch without joining (SPEC 17): the hub shows this replica in
            no one's presence and in no summary row's `online`; it still reads and writes.
        state_format: how the hub sends this replica the log's whole state (a new replica's
            catch-up): `msgpack` (the default; MessagePack in binary frames, about half the
            hub's encoding and a fifth less of the decoding) or `json` (text frames, readable
            in a capture). A hub that predates the setting sends JSON; both are read.
        outbox: a SQLite file that keeps the confirmed value, the pending edits and the client
            id (SPEC 14, `client.outbox`): each edit is in it when its call returns, so a
            process that dies loses none; one started again on the same file goes on with
            them (its client id comes from the file, from the moment it is entered). With it,
            entering does not wait for a hub that does not answer: it opens from the file (an
            offline start: `connected` is False, edits are kept and go once a hub answers).
            Entering raises `UsageError` (`outbox_locked`) while another live replica holds
            the file, `bad_outbox` for a file that is not this conversation's outbox.

    Connection state: `connected` is True while the replica is welcomed and caught up. The
    events `Connected` and `Disconnected` come once per change of state: one `Disconnected`
    (with its reason) when a connection is lost, none for each failed attempt after it, and
    one `Connected` when a welcome comes again. `failure` says why the last connection or
    attempt ended.

    Raises:
        UsageError: `bad_option` for a timing option out of its range (the message names the
            option, the value and the range).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        conversation_id: str,
        *,
        client: str | None = None,
        conversation: Conversation | None = None,
        max_frame: int = MAX_FRAME,
        backoff: float = 0.05,
        max_backoff: float = 5.0,
        connect_timeout: float = 10.0,
        compression: str | None = None,
        draft_interval: float = 0.0,
        keep_every: float = 10.0,
        kind: str | None = None,
        token: Token | None = None,
        ssl: ssl.SSLContext | None = None,
        keepalive: float | None = 10.0,
        presence: bool = True,
        state_format: str = "msgpack",
        outbox: str | os.PathLike[str] | None = None,
    ) -> None:
        if kind is not None and not is_kind(kind):
            raise UsageError("bad_kind", "kind is 1 to 64 printable characters, or None")
        if token is not None and not isinstance(token, str) and not callable(token):
            raise UsageError("bad_token", "token is a string, a callable that returns one, or None")
        check_times(
            backoff=backoff,
            max_backoff=max_backoff,
            connect_timeout=connect_timeout,
            draft_interval=draft_interval,
            keep_every=keep_every,
            keepalive=keepalive,
        )
        self.urls = conversation_urls(url, conversation_id)
        self.url = self.urls[0]  # the one connected to, or tried next
        self._url_at = 0
        self.conversation_id = conversation_id
        self.session = ReplicaSession(
            client or f"replica-{uuid.uuid4().hex[:12]}",
            conversation,
            max_frame=max_frame,
            features=FEATURES,
        )
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._connect_timeout = connect_timeout
        self._compression = compression
        self._keepalive = keepalive
        self._silent: str | None = None  # set by the keepalive when the hub stopped answering
        self._failure: str | None = None
        self._token = token
        self._ssl = ssl
        self._refresh_at = asyncio.Event()  # a welcome or auth_ok said when the token expires
        self._expires_at: float | None = None
        # Unread events; `_events_ready` is set when one is added (an `asyncio.Queue` cost
        # about a microsecond per event more, paid by every subscriber on every record).
        self._events: collections.deque[Event] = collections.deque()
        self._events_ready = asyncio.Event()
        self._wake = asyncio.Event()  # something may be pushable
        self._progress = asyncio.Event()  # the session moved (for flush and ready waits)
        self._ws: ClientConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._welcomed = False
        self._refused: Refused | None = None
        self.connects = 0
        self.session.local.on_edit(self._wake.set)
        self.session.kind = kind
        if not isinstance(presence, bool):
            raise UsageError("bad_option", f"presence must be True or False (got {presence!r})")
        self.session.watch = not presence  # watch without joining presence or `online`
        if state_format not in STATE_FORMATS:
            raise UsageError(
                "bad_option",
                f"state_format must be one of {', '.join(STATE_FORMATS)} (got {state_format!r})",
            )
        self._state_format = state_format
        self._draft_interval = draft_interval
        self._keep_every = keep_every
        self._live_wake = asyncio.Event()  # a draft op or a status may be sendable
        self._writers: dict[str, DraftWriter] = {}
        self._changes_queued: set[str] = set()  # drafts with an unread DraftChanged
        self._step: AsideId | None = None  # the `rig.step` marker this replica put, standing
        self._stop_scopes: list[anyio.CancelScope] = []  # cancelled by a `StopRequested`
        self._outbox = Outbox(outbox) if outbox is not None else None
        self._given = (client, conversation is not None)  # checked against the outbox's

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
        return self.session.revision

    @property
    def connected(self) -> bool:
        """Welcomed and caught up on a connection that is up. False from the moment the
        connection is lost (a silent hub: within `keepalive` seconds) until the next welcome
        and catch-up."""
        return self._ws is not None and self.session.ready

    @property
    def failure(self) -> str | None:
        """Why the replica is not connected: the reason the last connection or connection
        attempt ended (`keepalive timed out: ...`, `the hub is refusing connections for now
        (HTTP 503: ...)`, ...); None while a connection is up and before the first ends."""
        return self._failure

    # ------------------------------------------------------------------ drafts and presence

    @property
    def drafts(self) -> dict[str, Draft]:
        """Every open draft the hub reported (id -> `Draft`: `text`, `reasoning`, `parts`,
        `client`, `author`, `after`), own drafts included."""
        return self.session.live.drafts

    @property
    def presence(self) -> dict[str, Presence]:
        """Client id -> who is online and their status (live connections merged)."""
        return self.session.live.presence

    def draft(self, *, after: str | None = None, author: Author | None = None) -> DraftWriter:
        """A new draft (`async with replica.draft() as d:`, or `await d.open()`), following
        `after` (the last entry's id when omitted). Opening it puts the step marker (SPEC 10,
        `begin_step`): user input sent while the model streams is queued and lands right
        after the reply; the draft's commit or abort removes the marker, in the same edit as
        the message."""
        if after is None:
            conversation = self.conversation
            after = conversation.id(len(conversation) - 1) if len(conversation) else None
        return DraftWriter(self, after, author)

    async def set_status(self, status: str | None, detail: object = None) -> None:
        """Set this replica's presence status (at most 64 characters; `detail` at most 1 KiB
        of JSON); it is sent again after each reconnect."""
        self.session.live.set_status(status, detail)
        self._live_wake.set()

    def _open_draft(self, writer: DraftWriter) -> None:
        self._writers[writer.id] = writer
        self.session.live.open(writer.id, writer.after, writer.author, time.monotonic())
        self._live_wake.set()

    def _append_draft(self, writer: DraftWriter, text: str, part: str, name: str | None) -> None:
        self.session.live.append(writer.id, text, part, name)
        self._live_wake.set()

    def _forget_draft(self, writer: DraftWriter) -> None:
        self._writers.pop(writer.id, None)
        self.session.live.forget(writer.id)

    def _abort_draft(self, writer: DraftWriter) -> None:
        self._writers.pop(writer.id, None)
        self.session.live.abort(writer.id)
        self._live_wake.set()

    async def events(self) -> AsyncIterator[Event]:
        """Every event, in order: `Connected`, `Disconnected`, `Applied`, `Rebased`, `Reset`,
        `Conflict`, for steering `Queued` and `StopRequested` (SPEC 10), and for live state
        `DraftChanged`, `DraftEnded`, `PresenceChanged`. Events
        wait here until read; a `DraftChanged` is not queued again while one for the same draft
        waits unread (read the text in `drafts`), so an unread queue stays small."""
        events, ready = self._events, self._events_ready
        while True:
            while events:
                yield self._taken(events.popleft())
            if self._closed or (self._task is not None and self._task.done()):
                return  # nothing more will come
            ready.clear()
            await ready.wait()

    def events_nowait(self) -> list[Event]:
        """The events queued so far, without waiting."""
        events = [self._taken(event) for event in self._events]
        self._events.clear()
        return events

    def _taken(self, event: Event) -> Event:
        if isinstance(event, DraftChanged):
            self._changes_queued.discard(event.id)
        return event

    async def flush(self) -> None:
        """Wait until every edit made so far is acknowledged and applied. It keeps waiting
        while the hub is unreachable (the edits go once a connection is back): bound the wait
        with `anyio.fail_after`, and show `connected` / the `Disconnected` event meanwhile."""
        self._wake.set()
        while not self.session.settled or self._ws is None:
            self._raise_if_refused()
            self._progress.clear()
            await self._progress.wait()

    async def wait_for(self, revision: int) -> None:
        """Wait until the replica has seen the log up to `revision`."""
        while self.session.revision < revision or not self.session.ready:
            self._raise_if_refused()
            self._progress.clear()
            await self._progress.wait()

    @property
    def refused(self) -> Refused | None:
        """The hub's refusal that stopped this replica for good, if one did."""
        return self._refused

    def _raise_if_refused(self) -> None:
        """Raise why this replica cannot go on, if it cannot: the hub refused it for good,
        it is closed, or its connection task failed (a bug: the error is raised as it was)."""
        if self._refused is not None:
            raise self._refused
        if self._closed:
            raise UsageError("closed", "the replica is closed")
        task = self._task
        if task is not None and task.done() and not task.cancelled():
            error = task.exception()
            if error is not None:
                raise error

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        # The connection loop runs in a task of its own, so replicas can be closed in any
        # order and from any task.
        if self._task is not None or self._closed:
            raise UsageError("reentered", "a Replica is entered once (make a new one)")
        outbox = self._outbox
        if outbox is not None:
            client, fresh_value = self._given
            try:
                await outbox.open(
                    self.session, self.conversation_id, client=client, fresh_value=fresh_value
                )
            except BaseException:
                self._closed = True
                self.session.release()
                raise
            self.session.local.on_edit(self._edited)
        self._task = asyncio.create_task(self._run())
        self._task.add_done_callback(self._stopped)
        try:
            with anyio.fail_after(self._connect_timeout):
                # With an outbox, the first failed attempt opens from it (an offline start).
                while not self.session.ready and (outbox is None or self._failure is None):
                    self._raise_if_refused()
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            if outbox is not None:
                return self  # no hub answered in time: offline, from the outbox
            await self.aclose()
            raise TimeoutError(
                f"no catch-up within {self._connect_timeout:g}s (last: {self._failure})"
            ) from None
        except BaseException:
            await self.aclose()
            raise
        return self

    def _stopped(self, task: asyncio.Task[None]) -> None:
        """The connection task ended (closed, refused, or failed): wake every waiter, which
        then raises why (`_raise_if_refused`)."""
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("replica %s stopped: %s", self.client, type(error).__name__)
            self._failure = f"stopped: {type(error).__name__}"
            self._emit(self.session.disconnected(self._failure))
        self._progress.set()
        self._events_ready.set()

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
        self._closed = True
        self._progress.set()  # waiters raise `closed`
        self._events_ready.set()
        task = self._task
        try:
            if task is not None and not task.done():
                task.cancel()
                # Not `await task` under a suppress: that would swallow a cancellation of the
                # caller too. A second `aclose` (or one after a cancelled first) waits too.
                await asyncio.wait([task])
            if task is not None and task.done() and not task.cancelled():
                task.exception()  # retrieved; a crash was already raised to whoever waited
        finally:
            if self._outbox is not None:
                with anyio.CancelScope(shield=True):  # its lock must go, cancelled or not
                    await self._outbox.close()
            self.session.release()  # also when the caller is cancelled while it waits

    def _edited(self) -> None:
        """An edit of `conversation` (with an outbox): in the file before the call returns."""
        self._wake.set()
        assert self._outbox is not None
        self._outbox.edited()

    # ------------------------------------------------------------------ the loops

    def _emit(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, DraftChanged):
                if event.id in self._changes_queued:
                    continue  # one unread DraftChanged per draft is enough
                self._changes_queued.add(event.id)
            self._events.append(event)
            if isinstance(event, StopRequested):
                scopes, self._stop_scopes = self._stop_scopes, []
                for scope in scopes:
                    scope.cancel()
            if (
                isinstance(event, DraftEnded)
                and event.status != "gone"  # a snapshot taken before this replica reopened it
                and event.id in self._writers
            ):
                self._writers.pop(event.id)._end(event.status)
        if events:
            self._events_ready.set()
        self._progress.set()

    async def _run(self) -> None:
        failures = 0
        while not self._closed:
            reason = "closed"
            self._welcomed = False
            self._silent = None
            retry: Retry = "backoff"
            broke_protocol = False
            try:
                async with ws_connect(
                    self.url,
                    subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                    max_size=None,
                    compression="deflate" if self._compression == "deflate" else None,
                    open_timeout=self._connect_timeout,
                    ping_interval=None,  # the keepalive task pings, on its own schedule
                    logger=_ws_log,
                    **({"ssl": self._ssl} if self._ssl is not None else {}),  # type: ignore[arg-type]
                ) as ws:
                    self._ws = ws
                    try:
                        await self._serve(ws)
                    finally:
                        self._ws = None
                    close = ws.protocol.close_rcvd
                    if self._silent is not None:
                        reason = self._silent
                    elif close is not None:
                        reason = f"closed {close.code} {close.reason}".strip()
                        retry = retry_after(close.code, close.reason, reason)
            except Refused as exc:
                if not self._retry_with_new_token(exc.code):
                    self._stop_refused(exc)
                    return
                reason, retry = f"{exc.code}: {exc.detail}", "backoff"
            except InvalidStatus as exc:
                status = exc.response.status_code
                body = exc.response.body or b""
                detail = body.decode(errors="replace").strip()
                if 400 <= status < 500 and status not in (408, 429):
                    self._stop_refused(Refused(f"http_{status}", detail or f"HTTP {status}"))
                    return
                reason = refused_for_now(status, detail)
            except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake) as exc:
                reason = f"{type(exc).__name__}: {exc}"
                rcvd = exc.rcvd if isinstance(exc, ConnectionClosed) else None
                if rcvd is not None:
                    try:
                        retry = retry_after(rcvd.code, rcvd.reason, reason)
                    except Refused as refused:
                        if not self._retry_with_new_token(refused.code):
                            self._stop_refused(refused)
                            return
            except InvalidURI as exc:
                raise UsageError("bad_url", str(exc)) from exc
            except Unavailable as exc:
                reason = f"{exc.code}: {exc.detail}"
                retry = retry_of(exc.code)
            except ProtocolError as exc:
                reason = f"{exc.reason}: {exc.message}"
                broke_protocol = True
                log.warning("replica %s dropped the connection: %s", self.client, reason)
            except ConvsyncError as exc:
                reason = f"{exc.reason}: {exc.message}"
                log.warning("replica %s dropped the connection: %s", self.client, reason)
            self._failure = reason
            # A `Disconnected` only when a welcomed connection ended (the session knows): a
            # failed attempt while already disconnected changes no state a UI shows.
            self._emit(self.session.disconnected(reason))
            if self._closed:
                return
            # A connection that broke the protocol counts as a failure even after a welcome,
            # so a hub and a replica that disagree back off instead of spinning.
            failures = 0 if self._welcomed and not broke_protocol else failures + 1
            if retry == "at_once":
                continue  # sent to resync: catch up at once (on the same hub)
            self._fail_over()
            cap = min(self._max_backoff, self._backoff * 2 ** max(failures - 1, 0))
            await anyio.sleep(random.uniform(0, cap))

    def _retry_with_new_token(self, code: str) -> bool:
        """Whether a refusal with `code` is retried: `unauthorized` when a callable can give
        a new token (the table's `new_token`); a static token would be refused again."""
        return retry_of(code) == "new_token" and callable(self._token)

    async def _fresh_token(self) -> str | None:
        token = self._token
        if token is None or isinstance(token, str):
            return token
        try:
            value = token()
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            # A token service that fails now may answer later: this attempt fails and the
            # replica retries with backoff. Only the type is told: a message may quote secrets.
            raise Unavailable(
                "token_unavailable", f"the token callable failed ({type(exc).__name__})"
            ) from None
        if not isinstance(value, str):
            raise UsageError("bad_token", "the token callable must return a string")
        return value

    def _fail_over(self) -> None:
        """Move to the next hub url (round robin); with one url, nothing changes."""
        self._url_at = (self._url_at + 1) % len(self.urls)
        self.url = self.urls[self._url_at]

    def _stop_refused(self, refused: Refused) -> None:
        """The hub refused us for good: stop, and let every waiter raise it."""
        self._refused = refused
        # Info, not a warning: every waiter raises it, so the caller reports it (a CLI that
        # also saw this line printed the refusal twice).
        log.info("replica %s refused by the hub: %s", self.client, refused)
        reason = f"refused: {refused.code}: {refused.detail}"
        self._failure = reason
        # Stopping for good is a change of state even after failed attempts: say it once.
        self._emit(self.session.disconnected(reason) or [Disconnected(reason)])

    async def _serve(self, ws: ClientConnection) -> None:
        """Read frames into the session until the connection ends; a protocol error from the
        hub or the session ends it too, and is raised (outside the task group, unwrapped)."""
        session = self.session
        live = session.live
        outbox = self._outbox
        token = await self._fresh_token()
        self._expires_at = None
        with contextlib.suppress(ConnectionClosed):  # a refusal may already be on its way
            await ws.send(encode_message(self._hello(token)), text=True)
        failure: ConvsyncError | None = None
        async with first_error(), anyio.create_task_group() as group:
            group.start_soon(self._push_loop, ws)
            group.start_soon(self._live_loop, ws)
            if self._keepalive is not None:
                group.start_soon(self._keepalive_loop, ws, self._keepalive / 2)
            if callable(self._token):
                group.start_soon(self._refresh_loop, ws)
            try:
                while True:
                    data = await ws.recv(decode=False)
                    message = decode_hub_message(data)
                    if isinstance(message, Welcome | AuthOk) and message.expires_in is not None:
                        self._expires_at = time.monotonic() + message.expires_in
                        self._refresh_at.set()
                    if outbox is None:
                        events = session.receive(message)
                    else:  # the same, writing what moved to the file
                        events = outbox.receive(message)
                    if events and isinstance(events[0], Connected):
                        self._welcomed = True
                        self._failure = None
                        self.connects += 1
                    self._emit(events)
                    # Wake the senders only when they may have something to send: a
                    # subscriber's records must not cost two task switches each.
                    if session.local.has_unsaved:
                        self._wake.set()
                    if not live.quiet:
                        self._live_wake.set()
            except ConnectionClosed:
                pass
            except ConvsyncError as error:
                failure = error
            finally:
                group.cancel_scope.cancel()
        if failure is not None:
            raise failure

    def _hello(self, token: str | None) -> Hello:
        """The session's hello, asking for the state in this replica's `state_format` (the
        session itself reads decoded messages: the format is this shell's business)."""
        hello = self.session.hello(token)
        if self._state_format == "json":
            return hello
        return msgspec.structs.replace(hello, state_format=self._state_format)

    async def _keepalive_loop(self, ws: ClientConnection, every: float) -> None:
        """Ping every `every` seconds; a ping not answered within `every` (sending it
        included: a frozen hub's socket buffer may be full) drops the connection at once."""
        with contextlib.suppress(ConnectionClosed):
            while True:
                await anyio.sleep(every)
                with anyio.move_on_after(every) as waited:
                    pong = await ws.ping()
                    await pong
                if waited.cancelled_caught:
                    self._silent = f"keepalive timed out: a ping went unanswered for {every:g}s"
                    log.info("replica %s: %s", self.client, self._silent)
                    ws.transport.abort()  # the reader sees the connection end at once
                    return

    async def _refresh_loop(self, ws: ClientConnection) -> None:
        """Send a fresh token when three quarters of the current one's life have passed."""
        with contextlib.suppress(ConnectionClosed):
            while True:
                await self._refresh_at.wait()
                self._refresh_at.clear()
                expires_at = self._expires_at
                if expires_at is None:
                    continue
                life = expires_at - time.monotonic()
                with anyio.move_on_after(max(0.0, 0.75 * life)):
                    await self._refresh_at.wait()  # a newer expiry came first: start over
                    continue
                try:
                    token = await self._fresh_token()
                except Unavailable as failed:
                    # The token in use still has a quarter of its life: keep the connection
                    # and ask again when three quarters of what is left have passed. If no
                    # token comes, the hub closes it at expiry and the reconnect asks.
                    log.info("replica %s: token refresh failed: %s", self.client, failed.detail)
                    if expires_at - time.monotonic() > 0:
                        self._refresh_at.set()
                    continue
                if token is not None:
                    self._expires_at = None
                    await ws.send(encode_message(Auth(token)), text=True)

    async def _push_loop(self, ws: ClientConnection) -> None:
        session = self.session
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if self._outbox is None:
                    frame, conflicts = session.next_push(time.monotonic())
                else:
                    frame, conflicts, written = self._outbox.next_push(time.monotonic())
                    if written is not None:  # the batch's seq is in the file before it goes
                        await asyncio.wrap_future(written)
                if conflicts:
                    self._emit(list(conflicts))
                if frame is not None:
                    await ws.send(frame, text=True)
                elif session.paced_until is not None:  # within the hub's budget: wait, then
                    await anyio.sleep(session.paced_until - time.monotonic())  # push them all
                    self._wake.set()
        except ConnectionClosed:
            pass  # the reading side sees the close and ends the connection

    async def _live_loop(self, ws: ClientConnection) -> None:
        """Send the status and draft ops as they become due: appends at once within the
        hub's draft budget (or coalesced per a fixed `draft_interval`), a `keep` for a draft
        silent `keep_every` seconds."""
        live = self.session.live
        try:
            while True:
                with anyio.move_on_after(self._keep_every):
                    await self._live_wake.wait()
                self._live_wake.clear()
                status = live.status_to_send()
                if status is not None:
                    await ws.send(encode_message(status), text=True)
                ops = live.ops_to_send(time.monotonic(), self._keep_every)
                for op in ops:
                    await ws.send(encode_message(op), text=True)
                if ops and self._draft_interval > 0:
                    await anyio.sleep(self._draft_interval)
                elif live.paced_until is not None:  # within the hub's draft budget: wait,
                    await anyio.sleep(live.paced_until - time.monotonic())  # then send all
                    self._live_wake.set()
        except ConnectionClosed:
            pass  # the reading side sees the close and ends the connection


def connect(
    url: str | Sequence[str],
    conversation_id: str,
    *,
    client: str | None = None,
    conversation: Conversation | None = None,
    **options: object,
) -> Replica:
    """A `Replica` of `conversation_id` on the hub at `url` (or the first of several hubs,
    failing over to the next); use with `async with`."""
    return Replica(url, conversation_id, client=client, conversation=conversation, **options)  # type: ignore[arg-type]
