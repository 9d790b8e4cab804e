"""A dashboard's data (SPEC 17): one page of summary rows, or a window of them kept live.

How this works: `list_conversations` is one `GET /v1/conversations` (a blocking `urllib` call
in a worker thread, as `client.http` makes them). `summary` opens the `/v1/summary` socket,
says `hello {token, prefix, order, after, limit}` and yields the window after its snapshot and
after each diff (rows that changed or entered; ids that left go). A lost connection yields the
rows it had with `connected=False` once, then reconnects with capped, jittered backoff; the
next snapshot replaces the rows, so nothing is missed across the gap. Websocket pings every
`keepalive / 2` seconds notice a hub that stopped answering (frozen) within `keepalive`. A
refusal (a bad hello, a token refused for good) raises `Refused`.
"""

from __future__ import annotations

import json
import random
import ssl as _ssl
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import anyio
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from sync import UsageError
from sync.errors import Refused, retry_of
from sync.protocol import SUBPROTOCOL

from .http import HubError, _get_async, http_url

__all__ = ["Listing", "Window", "list_conversations", "summary"]

Row = dict[str, Any]


class Listing(NamedTuple):
    """One page of rows as `GET /v1/conversations` answered, and whether more follow it."""

    rows: list[Row]
    more: bool


class Window(NamedTuple):
    """The rows of a live window, by id (in the window's order), as last heard."""

    rows: dict[str, Row]
    more: bool
    connected: bool


def _query(prefix: str, order: str, after: str | None, limit: int) -> str:
    params: dict[str, str] = {"prefix": prefix, "order": order, "limit": str(limit)}
    if after is not None:
        params["after"] = after
    return urllib.parse.urlencode(params)


def _check(order: str, limit: int) -> None:
    if order not in ("id", "updated"):
        raise UsageError("bad_option", f"order must be 'id' or 'updated' (got {order!r})")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise UsageError("bad_option", f"limit must be 1 to 1000 (got {limit!r})")


async def list_conversations(
    url: str,
    *,
    prefix: str = "",
    order: str = "id",
    after: str | None = None,
    limit: int = 100,
    token: str | None = None,
    request_timeout: float = 10.0,
    ssl: _ssl.SSLContext | None = None,
) -> Listing:
    """One page of the hub's summary rows under `prefix`: by id after `after` (`order`
    "id"), or the `limit` most recently updated ("updated").

    Raises:
        UsageError: a bad `order` or `limit` (checked before asking).
        HubError: `unreachable`, `bad_status` (the hub refused: its detail is in the message)
            or `bad_answer`.
    """
    _check(order, limit)
    address = f"{http_url(url)}/v1/conversations?{_query(prefix, order, after, limit)}"
    status, body = await _get_async(address, request_timeout, token, ssl)
    if status != 200:
        detail = body.decode(errors="replace").strip()
        try:
            detail = json.loads(detail)["detail"]
        except (ValueError, KeyError, TypeError):
            pass
        raise HubError("bad_status", f"the hub answered {status}: {detail}")
    try:
        answer = json.loads(body)
        rows, more = answer["conversations"], answer["more"]
        if not isinstance(rows, list) or not isinstance(more, bool):
            raise TypeError("not a page of rows")
    except (ValueError, KeyError, TypeError) as exc:
        raise HubError("bad_answer", f"the hub's list is not a page of rows: {exc}") from exc
    return Listing(rows, more)


async def summary(
    url: str,
    *,
    prefix: str = "",
    order: str = "id",
    after: str | None = None,
    limit: int = 100,
    token: str | None = None,
    keepalive: float | None = 10.0,
    backoff: float = 0.05,
    max_backoff: float = 5.0,
    connect_timeout: float = 10.0,
    ssl: _ssl.SSLContext | None = None,
) -> AsyncIterator[Window]:
    """The window's rows, live: `async for window in summary(url, ...)` yields after the
    snapshot and after every change, and once with `connected=False` when the connection is
    lost (it then reconnects by itself). Stop by leaving the loop.

    Raises:
        UsageError: a bad `order` or `limit`.
        Refused: the hub refused the hello or the token for good.
    """
    _check(order, limit)
    address = f"{url.rstrip('/')}/v1/summary"
    hello: Row = {"type": "hello", "token": token, "prefix": prefix, "order": order}
    hello["limit"] = limit
    if after is not None:
        hello["after"] = after
    rows: dict[str, Row] = {}
    more = False
    failures = 0
    shown_lost = True  # nothing to say before the first snapshot
    while True:
        code: str | None = None
        detail = ""
        try:
            with anyio.fail_after(connect_timeout):
                ws = await ws_connect(
                    address,
                    subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                    ping_interval=None if keepalive is None else keepalive / 2,
                    ping_timeout=None if keepalive is None else keepalive / 2,
                    ssl=ssl,
                    open_timeout=None,
                )
            async with ws:
                await ws.send(json.dumps(hello))
                async for data in ws:
                    message = json.loads(data)
                    kind = message.get("type")
                    if kind == "error":
                        code, detail = str(message.get("code")), str(message.get("detail"))
                        break
                    if kind == "summary":
                        rows = {row["id"]: row for row in message["rows"]}
                        more = bool(message["more"])
                        failures = 0
                        shown_lost = False
                    elif kind == "summary_diff":
                        for row in message["rows"]:
                            rows[row["id"]] = row
                        for gone in message.get("left", []):
                            rows.pop(gone, None)
                        more = bool(message.get("more", more))
                        if order == "updated":
                            rows = dict(sorted(rows.items(), key=_recent))
                        else:
                            rows = dict(sorted(rows.items()))
                    else:
                        continue
                    yield Window(dict(rows), more, True)
        except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake, ValueError):
            pass
        if code is not None and retry_of(code) in ("never", "new_token"):
            raise Refused(code, detail)
        if not shown_lost:
            shown_lost = True
            yield Window(dict(rows), more, False)
        failures += 1
        delay = min(max_backoff, backoff * 2**failures)
        await anyio.sleep(random.uniform(0, delay))  # full jitter


def _recent(item: tuple[str, Row]) -> tuple[int, str]:
    updated = item[1].get("updated")
    return (-(updated if isinstance(updated, int) else -1), item[0])


# ---------------------------------------------------------------------- showing rows (the CLI)

COLUMNS = (
    "id",
    "revision",
    "entries",
    "updated",
    "turn",
    "drafts",
    "waiting",
    "tokens",
    "online",
    "last",
)


def cells(row: Row) -> tuple[str, ...]:
    """A row as the text of `COLUMNS` (no control characters: rows hold what others wrote)."""
    updated = row.get("updated")
    when = "-"
    if isinstance(updated, int):
        import datetime

        moment = datetime.datetime.fromtimestamp(updated / 1000, datetime.UTC)
        when = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    turn = row.get("turn")
    turn_text = f"{turn['index']} {turn['state']}" if isinstance(turn, dict) else "-"
    drafts = row.get("drafts")
    open_drafts = drafts.get("open", 0) if isinstance(drafts, dict) else 0
    last = row.get("last")
    last_text = f"{last['role']}: {last['text']}" if isinstance(last, dict) else ""
    online = ",".join(row.get("online") or []) or "-"
    waiting = [
        f"{count} {label}"
        for count, label in ((row.get("queued"), "queued"), (row.get("approvals"), "to approve"))
        if isinstance(count, int) and count > 0
    ]
    usage = row.get("usage")
    tokens = "-"
    if isinstance(usage, dict):
        tokens = str(sum(usage.get(k) or 0 for k in ("input_tokens", "output_tokens")))
    values = (
        str(row["id"]),
        str(row.get("revision", "")),
        str(row.get("entries", "")),
        when,
        turn_text,
        str(open_drafts),
        ", ".join(waiting) or "-",
        tokens,
        online,
        last_text,
    )
    return tuple(_printable(value) for value in values)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text)


def plain_line(row: Row) -> str:
    """A row as one tab-separated line (for a pipe)."""
    return "\t".join(cells(row))


def table(rows: list[Row], title: str | None = None) -> Any:
    """A `rich` table of `rows` (for a terminal)."""
    from rich.table import Table
    from rich.text import Text

    shown = Table(title=title, expand=True)
    for column in COLUMNS:
        shown.add_column(
            column, overflow="ellipsis", no_wrap=True, ratio=3 if column == "last" else None
        )
    for row in rows:
        shown.add_row(*(Text(cell) for cell in cells(row)))  # Text: no markup from the rows
    return shown
