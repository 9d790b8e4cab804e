"""Reading a hub over HTTP: its health and one conversation's current state.

How this works: the hub answers `GET /healthz` and `GET /v1/conversations/{id}` on the port of
its websocket (`ws://` becomes `http://`, `wss://` becomes `https://`). Requests are blocking
`urllib` calls made in a worker thread, never through a proxy (a hub is usually on loopback or
a private network), each bounded by `request_timeout` seconds. Every failure is a `HubError` whose
`reason` says which (see its docstring).
"""

from __future__ import annotations

import ssl as _ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import NamedTuple

import anyio
import msgspec

from sync import Conversation, ConversationState, ConvsyncError, decode

__all__ = [
    "FetchedConversation",
    "HubError",
    "HubView",
    "check_hub",
    "delete_conversation",
    "fetch_conversation",
    "retain",
]


class HubError(ConvsyncError):
    """The hub could not be asked, or did not answer what was asked.

    Reasons: `unreachable` (connection refused, timed out, name unknown), `no_conversation`
    (404: the hub has no log for that id), `bad_status` (any other non-200 answer, or a health
    check that failed: probably not a convsync hub), `bad_answer` (the body is not a
    conversation), `timeout` (a replica got no welcome in time: `transfer.connect_checked`).
    """


class HubView(msgspec.Struct, frozen=True):
    """What `GET /v1/conversations/{id}` answers (also a file `convsync import` reads)."""

    lineage: int
    revision: int
    state: ConversationState


class FetchedConversation(NamedTuple):
    """One conversation as the hub holds it, at one revision of one lineage."""

    lineage: int
    revision: int
    conversation: Conversation


def http_url(url: str, conversation_id: str | None = None) -> str:
    """The http(s) url of the hub at ws(s) `url`, of one conversation's read endpoint when
    `conversation_id` is given."""
    parts = urllib.parse.urlsplit(url)
    scheme = "https" if parts.scheme == "wss" else "http"
    path = parts.path.rstrip("/")
    if conversation_id is not None:
        path += f"/v1/conversations/{conversation_id}"
    return urllib.parse.urlunsplit((scheme, parts.netloc, path, "", ""))


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def _get(
    url: str,
    timeout: float,
    token: str | None = None,
    ssl: _ssl.SSLContext | None = None,
    shown: str | None = None,
    method: str = "GET",
) -> tuple[int, bytes]:
    """Status and body of a GET (or `method`; blocking; an HTTP error status is an answer,
    not a raise), with `Authorization: Bearer <token>` when a token is given, and `ssl` for
    `https://`. An error names the hub as `shown` (the URL the user gave), else as `url`."""
    request = urllib.request.Request(url, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    opener = _opener
    if ssl is not None:
        https = urllib.request.HTTPSHandler(context=ssl)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), https)
    try:
        with opener.open(request, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, exc.read()
        finally:
            exc.close()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        where = shown or url
        raise HubError("unreachable", f"cannot reach the hub at {where}: {reason}") from exc


async def _get_async(
    url: str,
    request_timeout: float,
    token: str | None = None,
    ssl: _ssl.SSLContext | None = None,
    shown: str | None = None,
    method: str = "GET",
) -> tuple[int, bytes]:
    return await anyio.to_thread.run_sync(_get, url, request_timeout, token, ssl, shown, method)


async def check_hub(
    url: str, *, request_timeout: float = 10.0, ssl: _ssl.SSLContext | None = None
) -> None:
    """Return once the hub at ws(s) `url` answers its health check (within
    `request_timeout` seconds).

    Raises:
        HubError: `unreachable`, or `bad_status` when something else answers there.
    """
    status, _ = await _get_async(http_url(url) + "/healthz", request_timeout, None, ssl, url)
    if status != 200:
        raise HubError(
            "bad_status", f"{url} does not look like a convsync hub (healthz answered {status})"
        )


async def fetch_conversation(
    url: str,
    conversation_id: str,
    *,
    request_timeout: float = 10.0,
    token: str | None = None,
    ssl: _ssl.SSLContext | None = None,
) -> FetchedConversation:
    """The hub's current copy of a conversation: lineage, revision and value.

    Args:
        url: the hub's websocket url (`ws://host:port` or `wss://...`).
        conversation_id: the conversation.
        request_timeout: seconds the request may take.
        token: the access token, for a hub with auth (sent as a bearer header).
        ssl: the TLS context for a `wss://` hub with a private CA (default: the system's).

    Raises:
        HubError: `no_conversation` when the hub has no log for it, `unreachable`,
            `bad_status` (another HTTP status) or `bad_answer` (a body that is not one).
    """
    status, body = await _get_async(http_url(url, conversation_id), request_timeout, token, ssl)
    if status == 404:
        raise HubError("no_conversation", f"the hub has no conversation {conversation_id!r}")
    if status != 200:
        detail = body.decode(errors="replace").strip()
        raise HubError("bad_status", f"the hub answered {status}: {detail}")
    try:
        view = decode(body, HubView)
        conversation = Conversation.from_state(view.state)
    except ConvsyncError as exc:  # not JSON, not a state, or a state that does not fold
        raise HubError(
            "bad_answer",
            f"the hub's answer for {conversation_id!r} is not a conversation: {exc.message}",
        ) from exc
    return FetchedConversation(view.lineage, view.revision, conversation)


# ---------------------------------------------------------------------- deleting (SPEC 15)


def _refusal(status: int, body: bytes, what: str) -> HubError:
    """The error of a refused admin request: what the hub said, in one line."""
    detail = body.decode(errors="replace").strip()
    if status == 401:
        return HubError("unauthorized", f"the hub wants a valid token to {what} ({detail})")
    if status == 403:
        return HubError("forbidden", f"the token may not {what}: {detail} (needs scope admin)")
    return HubError("bad_status", f"the hub answered {status} to {what}: {detail}")


async def delete_conversation(
    url: str,
    conversation_id: str,
    *,
    request_timeout: float = 10.0,
    token: str | None = None,
    ssl: _ssl.SSLContext | None = None,
) -> None:
    """Delete a conversation on the hub at ws(s) `url` (`DELETE /v1/conversations/{id}`):
    its log goes from the store, its sockets are closed `deleted`, a tombstone stays.

    Raises:
        HubError: `no_conversation` (nothing to delete), `unauthorized`/`forbidden` (the
            token is missing, bad, or lacks `admin` on it), `unreachable`, `bad_status`.
    """
    status, body = await _get_async(
        http_url(url, conversation_id), request_timeout, token, ssl, url, "DELETE"
    )
    if status == 404:
        raise HubError("no_conversation", f"the hub has no conversation {conversation_id!r}")
    if status != 200:
        raise _refusal(status, body, f"delete {conversation_id!r}")


async def retain(
    url: str,
    days: float,
    *,
    dry_run: bool,
    request_timeout: float = 60.0,
    token: str | None = None,
    ssl: _ssl.SSLContext | None = None,
) -> list[tuple[str, float]]:
    """The conversations idle for more than `days` days on the hub at ws(s) `url`, each with
    when its last record was stamped (epoch seconds); deleted unless `dry_run`.

    Raises:
        HubError: as `delete_conversation` (`bad_answer` for a body that is not a list).
    """
    where = f"{http_url(url)}/v1/retain?{urllib.parse.urlencode({'days': repr(days)})}"
    method = "GET" if dry_run else "POST"
    status, body = await _get_async(where, request_timeout, token, ssl, url, method)
    if status != 200:
        raise _refusal(status, body, "delete idle conversations")
    try:
        answer = msgspec.json.decode(body)
        if dry_run:
            return [(str(item["id"]), float(item["last"])) for item in answer["idle"]]
        return [(str(cid), 0.0) for cid in answer["deleted"]]
    except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
        raise HubError("bad_answer", "the hub's answer is not a list of conversations") from exc
