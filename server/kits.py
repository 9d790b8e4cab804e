"""`Kits`: what the chat-kit endpoints (AI SDK, AG-UI) share (SPEC 13).

How this works: each request of a kit endpoint that reads or writes a conversation holds a
`Watch`: a real `client` replica of the conversation, connected to this same hub over
loopback with the caller's own token (watching without presence). Every rule the hub keeps
for any replica (scopes, the principal's caps, queued input, the approval state machine,
stop) applies to the kit's requests unchanged, because they are a replica's requests; the
endpoints only translate. The watch gives the conversation, the drafts as they grow and the
answer in progress (`server.kitstate.answer_in_progress`), and does the writes a kit asks
for: its user messages (the kit's id kept in `source_id`, so one sent again is not pushed
twice), stop, decisions, a frontend tool's result, the frontend tools offered.

A kit's client going away never stops anything: it only closes the watch (the replica), and
the agent goes on. `Kits.caller` checks the bearer token first, so a request without the
scope it needs is answered 401/403 at once with a fixed phrase (the replica would be
refused the same way, later). Origins and hosts are checked by the hub's HTTP door before
any route, as for every request. Open streams are counted in the metrics
(`convsync_kit_streams{protocol=...}`).

Async API: asyncio (the replica's), used from the hub's anyio tasks.
"""

from __future__ import annotations

import contextlib
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio

from client.live import Draft
from client.replica import Replica
from sync import Entry, Message, ToolResult, User
from sync.approvals import Approval
from sync.errors import ConvsyncError, UsageError
from sync.ids import AsideId
from sync.messages import Text

from .auth import AuthError, bearer_token, verify
from .kitstate import MAX_KIT_ID, Answer, DraftView, SentMessage, answer_in_progress, kit_id
from .session import is_conversation_id

if TYPE_CHECKING:
    from .hub import Hub

__all__ = ["Caller", "KitRefused", "Kits", "Watch"]

WRITE_TIMEOUT = 10.0
"""Seconds a kit's write waits for the hub's ack before the request gets 503."""


class KitRefused(Exception):
    """A kit request answered with an HTTP error: `status` and a fixed, lower-case
    `phrase` (never a token, never message text)."""

    def __init__(self, status: int, phrase: str) -> None:
        super().__init__(phrase)
        self.status = status
        self.phrase = phrase


@dataclass(frozen=True)
class Caller:
    """Who makes a kit request: the principal and the token to act with (None without
    auth), and the scopes it holds (None: a hub without auth, where anyone may do all)."""

    sub: str
    token: str | None
    scopes: frozenset[str] | None

    def may(self, scope: str) -> bool:
        return self.scopes is None or scope in self.scopes


class Kits:
    """The shared machinery of the kit endpoints of `hub`."""

    def __init__(self, hub: Hub) -> None:
        self._hub = hub

    def caller(self, authorization: str | None, conversation_id: str, scope: str) -> Caller:
        """The caller of a request on `conversation_id` that needs `scope` (`read` to
        watch, `write` to send or stop, `approve` to decide).

        Raises:
            KitRefused: 400 for a bad conversation id; 401 without a valid token; 403 when
                the token does not allow `scope` on the conversation.
        """
        if not is_conversation_id(conversation_id):
            raise KitRefused(400, "bad conversation id")
        keys = self._hub.keys
        if keys is None:
            return Caller("anonymous", None, None)
        token = bearer_token(authorization)
        try:
            grant = verify(token, keys, now=time.time(), audience=self._hub.config.audience)
            grant.require(conversation_id, scope)  # type: ignore[arg-type]
        except AuthError as refused:
            status = 401 if refused.code == "unauthorized" else 403
            raise KitRefused(status, f"{refused.code}: {refused.detail}") from None
        assert token is not None  # verify refuses a missing one
        return Caller(grant.sub, token, frozenset(grant.scopes))

    @contextlib.asynccontextmanager
    async def watch(
        self, conversation_id: str, caller: Caller, protocol: str
    ) -> AsyncIterator[Watch]:
        """`open` as a block: the watch is closed when the block ends."""
        watch = await self.open(conversation_id, caller, protocol)
        try:
            yield watch
        finally:
            await watch.aclose()

    async def open(self, conversation_id: str, caller: Caller, protocol: str) -> Watch:
        """A `Watch` of `conversation_id` acting as `caller`, caught up with the log; close
        it with `aclose` (that disconnects its replica, nothing else).

        Raises:
            KitRefused: 503 when the hub is shutting down or the replica cannot connect;
                403/401 when the hub refuses the caller's token.
        """
        if self._hub.closing:
            raise KitRefused(503, "shutting down")
        replica = Replica(
            self.loopback_url,
            conversation_id,
            client=f"{protocol}-{uuid.uuid4().hex[:12]}",
            token=caller.token,
            ssl=self._loopback_ssl(),
            presence=False,
            connect_timeout=WRITE_TIMEOUT,
            draft_interval=0,
        )
        try:
            await replica.__aenter__()
        except ConvsyncError as exc:
            await replica.aclose()
            code = getattr(exc, "code", "")
            if code in ("unauthorized", "forbidden"):
                raise KitRefused(401 if code == "unauthorized" else 403, code) from None
            raise KitRefused(503, "the hub could not be reached") from None
        except (OSError, TimeoutError):
            await replica.aclose()
            raise KitRefused(503, "the hub could not be reached") from None
        return Watch(replica, caller)

    @contextlib.contextmanager
    def streaming(self, protocol: str) -> Iterator[None]:
        """Count one open stream of `protocol` (`aisdk`, `agui`) while the block runs."""
        streams = self._hub.metrics.kit_streams
        streams[protocol] = streams.get(protocol, 0) + 1
        try:
            yield
        finally:
            streams[protocol] -= 1

    @property
    def loopback_url(self) -> str:
        """The hub's url as this process reaches it (a wildcard bind through loopback)."""
        url = self._hub.url
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        host = f"[{host}]" if ":" in host else host
        return f"{parts.scheme}://{host}:{self._hub.port}"

    def _loopback_ssl(self) -> ssl.SSLContext | None:
        if not self.loopback_url.startswith("wss:"):
            return None
        # The replica talks to this very process over loopback, on the port it bound: there
        # is nobody in between to authenticate, and the hub's certificate names its public
        # host, not 127.0.0.1.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context


class Watch:
    """One kit request's replica of a conversation (make it with `Kits.watch`).

    Reads are of the replica's local value (`conversation`, `drafts`, `answer()`); `changed`
    waits for the next change. Writes are pushed and acknowledged before they return.
    """

    def __init__(self, replica: Replica, caller: Caller) -> None:
        self.replica = replica
        self.caller = caller

    async def aclose(self) -> None:
        """Disconnect the replica (idempotent). The agent is not told anything."""
        with anyio.CancelScope(shield=True):
            await self.replica.aclose()

    @property
    def conversation(self) -> Any:
        """The replica's `Conversation` (read it; write through the methods below)."""
        return self.replica.conversation

    @property
    def drafts(self) -> list[DraftView]:
        """The drafts open now (every role), as `DraftView`s."""
        return [_view(d) for d in self.replica.drafts.values()]

    def answer(self) -> Answer:
        """The answer to the user's last message now (`kitstate.answer_in_progress`)."""
        return answer_in_progress(self.replica.conversation, self.drafts)

    async def changed(self) -> None:
        """Wait until the conversation, a draft or the connection changed (events are
        coalesced: read the state after it returns).

        Raises:
            KitRefused: 503 when the replica stopped for good (the hub refused it, e.g. its
                token expired, or the hub is shutting down).
        """
        async for _ in self.replica.events():
            self.replica.events_nowait()  # one wake for everything queued
            return
        raise KitRefused(503, "the conversation's connection ended")

    async def send(self, messages: Sequence[SentMessage]) -> list[str]:
        """Push each user message in `messages` that the log does not hold yet (by kit id,
        in entries or queued), its kit id kept in `source_id`, and wait for the ack.
        Returns the kit ids pushed now (a message sent again is not pushed twice).

        Raises:
            KitRefused: 400 for an id or text a kit may not send; 403 without `write`;
                409 when the hub refused the message; 503 when no ack came in time.
        """
        conversation = self.replica.conversation
        held = {kit_id(ref) for ref in conversation.entries()}
        for _, aside in conversation.asides():
            value = aside.value
            if aside.kind == "rig.queued" and isinstance(value, dict):
                held.add(str(value.get("source_id") or value.get("id")))
        fresh = [m for m in messages if m.role == "user" and m.id not in held]
        if not fresh:
            return []
        if not self.caller.may("write"):
            raise KitRefused(403, "forbidden: token lacks the write scope")
        for message in fresh:
            if not message.id or len(message.id) > MAX_KIT_ID or not message.id.isprintable():
                raise KitRefused(400, "a message id is 1 to 256 printable characters")
            if not message.text.strip():
                raise KitRefused(400, "a user message needs text")
        for message in fresh:
            conversation.push(Entry(Message.user(message.text), source_id=message.id))
        await self._flush()
        landed = {kit_id(ref) for ref in self.replica.conversation.entries()}
        for _, aside in self.replica.conversation.asides():
            value = aside.value
            if aside.kind == "rig.queued" and isinstance(value, dict):
                landed.add(str(value.get("source_id") or value.get("id")))
        if any(m.id not in landed for m in fresh):
            raise KitRefused(409, "the hub refused the message")
        return [m.id for m in fresh]

    async def stop(self) -> bool:
        """Ask the running turn to stop (SPEC 10's stop, as `Replica.stop`); whether there
        was anything to stop. Needs `write`."""
        if not self.caller.may("write"):
            raise KitRefused(403, "forbidden: token lacks the write scope")
        asked = self.replica.stop()
        await self._flush()
        return asked

    async def decide(
        self, id_: AsideId, *, approve: bool, answer: Any = None, reason: str | None = None
    ) -> Approval:
        """Decide approval `id_` as the caller and wait until the decision stands. Returns
        the approval as the log holds it.

        Raises:
            KitRefused: 403 without `approve`; 404 for no such approval; 409 when it was
                decided already (by someone else, or by this same request sent again: the
                caller compares the returned decision) or the hub refused it; 400 for an
                answer its schema refuses.
        """
        if not self.caller.may("approve"):
            raise KitRefused(403, "forbidden: token lacks the approve scope")
        approval = self.replica.approvals.get(id_)
        if approval is None:
            raise KitRefused(404, "no such approval")
        if not approval.is_open:
            raise KitRefused(409, "the approval was decided already")
        try:
            self.replica.decide(id_, approve=approve, answer=answer, reason=reason)
        except UsageError as exc:
            status = {"forbidden": 403, "decided": 409, "no_approval": 404}.get(exc.reason, 400)
            raise KitRefused(status, f"cannot decide: {exc.reason}") from None
        await self._flush()
        stands = self.replica.approvals.get(id_)
        if stands is None or stands.is_open:
            raise KitRefused(409, "the hub refused the decision")
        return stands

    async def tool_result(
        self, call_id: str, name: str, output: str, *, is_error: bool = False
    ) -> bool:
        """Push the result of a frontend tool's call `call_id` unless one stands already;
        whether it was pushed. Needs `write`."""
        if not self.caller.may("write"):
            raise KitRefused(403, "forbidden: token lacks the write scope")
        conversation = self.replica.conversation
        for ref in conversation.entries():
            message = ref.message
            if any(r.call_id == call_id for r in message.tool_results()):
                return False
        if not any(call.id == call_id for call in conversation.pending_calls()):
            raise KitRefused(409, "no such call waits for a result")
        result = ToolResult(call_id, name, [Text(output)], is_error)
        conversation.push(User([result]))
        await self._flush()
        return True

    async def set_tools(self, names: Sequence[str]) -> None:
        """Offer the frontend tools `names` to the worker (`rig.tools`). Needs `write`."""
        if not self.caller.may("write"):
            raise KitRefused(403, "forbidden: token lacks the write scope")
        self.replica.set_frontend_tools(list(names))
        await self._flush()

    async def _flush(self) -> None:
        try:
            with anyio.fail_after(WRITE_TIMEOUT):
                await self.replica.flush()
        except TimeoutError:
            raise KitRefused(503, "the hub did not acknowledge in time") from None
        except ConvsyncError:
            raise KitRefused(409, "the hub refused the change") from None


def _view(draft: Draft) -> DraftView:
    return DraftView(draft.id, draft.since, dict(draft.parts), dict(draft.names))
