"""The rules of a replica's connections: hub urls, timing options, and what a close means.

`Replica` (`client.replica`) uses these; `url_problem` is public (the CLI checks a url with it).
"""

from __future__ import annotations

import contextlib
import math
import urllib.parse
from collections.abc import AsyncIterator, Sequence

from sync.errors import Refused, Retry, UsageError, code_of_close, retry_of, sole_exception
from sync.protocol import is_conversation_id

__all__ = [
    "check_times",
    "conversation_urls",
    "first_error",
    "refused_for_now",
    "retry_after",
    "url_problem",
]


def refused_for_now(status: int, detail: str) -> str:
    """The reason for a handshake answered with HTTP `status` (not 4xx: retried)."""
    detail = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
    if status == 503:
        return f"the hub is refusing connections for now ({detail})"
    return f"the hub answered {detail}"


def check_times(**options: float | None) -> None:
    """Refuse a timing option out of its range (`keepalive` may be None: no pings).

    Raises:
        UsageError: `bad_option`, naming the option, the value and the range.
    """
    ranges = {
        "backoff": (0.0, False),
        "max_backoff": (0.0, False),
        "connect_timeout": (0.0, False),
        "draft_interval": (0.0, True),
        "keep_every": (0.0, False),
        "keepalive": (0.1, True),
    }
    for name, value in options.items():
        if value is None and name == "keepalive":
            continue
        least, inclusive = ranges[name]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if (
            not number
            or not math.isfinite(value)  # type: ignore[arg-type]
            or (value < least if inclusive else value <= least)  # type: ignore[operator]
        ):
            off = "None (no pings) or " if name == "keepalive" else ""
            bound = f"{'at least' if inclusive else 'more than'} {least:g}"
            raise UsageError(
                "bad_option", f"{name} must be {off}a number of seconds, {bound} (got {value!r})"
            )
    if options["max_backoff"] < options["backoff"]:  # type: ignore[operator]
        raise UsageError(
            "bad_option",
            f"max_backoff must be at least backoff (got {options['max_backoff']!r} "
            f"and {options['backoff']!r})",
        )


def retry_after(close_code: int, close_reason: str, detail: str) -> Retry:
    """What to do after the hub closed with `close_code`/`close_reason` (`sync.errors.CODES`).

    Raises:
        Refused: the close means the hub refused this replica for good.
    """
    code = code_of_close(close_code, close_reason)
    if code is None:
        return "backoff"
    retry = retry_of(code)
    if retry in ("never", "new_token"):
        raise Refused(code, f"the hub closed the connection ({detail})")
    return retry


def url_problem(url: str) -> str | None:
    """What is wrong with hub url `url` (`ws://host:port` or `wss://...`), in words, or None.

    An IPv6 address without brackets is named as such (`ws://[::1]:8790`), not as a bad
    scheme or port.
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # an unclosed `[`
        return f"{url!r} is not a url ({exc})"
    if parts.scheme not in ("ws", "wss"):
        hint = f"not {parts.scheme}://" if "://" in url else f"e.g. ws://{url}"
        return f"{url!r} is not a ws:// or wss:// url ({hint})"
    netloc = parts.netloc.rpartition("@")[2]
    if netloc.count(":") > 1 and not netloc.startswith("["):
        host, _, port = netloc.rpartition(":")
        if not port.isdigit() or ":" not in host or host.endswith(":"):  # no port given
            host, port = netloc, ""
        shown = f"{parts.scheme}://[{host}]" + (f":{port}" if port else "")
        return f"{url!r}: IPv6 addresses need brackets, as in {shown}"
    if not parts.hostname:
        return f"{url!r} has no host (e.g. ws://127.0.0.1:8765)"
    try:
        parts.port  # noqa: B018 - raises for a bad port
    except ValueError as exc:
        return f"{url!r}: {exc}"
    return None


@contextlib.asynccontextmanager
async def first_error() -> AsyncIterator[None]:
    """Raise the error that ended a task group, not a group of one: `_run` tells a failed
    connection by the error's type (a child loop's too: keepalive, token refresh)."""
    try:
        yield
    except BaseExceptionGroup as group:
        error = sole_exception(group)
        if error is group:
            raise  # several at once (a bug): the task ends and its waiters raise the group
        raise error from None


def conversation_urls(url: str | Sequence[str], conversation_id: str) -> list[str]:
    """The websocket urls of `conversation_id` on each hub of `url` (one or several).

    Raises:
        UsageError: no url given, or one that is not a hub url (`url_problem` says why).
    """
    if not is_conversation_id(conversation_id):
        # Pasted into the URL as it is: a `?` or `#` would send the edits to another one.
        raise UsageError(
            "bad_conversation_id",
            f"conversation id {conversation_id!r} is not 1 to 128 of A-Z a-z 0-9 . _ : -",
        )
    bases = [url] if isinstance(url, str) else list(url)
    if not bases:
        raise UsageError("bad_url", "no hub url given")
    for base in bases:
        problem = url_problem(base)
        if problem is not None:
            raise UsageError("bad_url", problem)
    return [f"{base.rstrip('/')}/v1/conversations/{conversation_id}" for base in bases]
