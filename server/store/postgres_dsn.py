"""The PostgreSQL store's URL: read as asyncpg will read it, and described without secrets.

`check_dsn` refuses a URL asyncpg would misread (a password holding `/`, `#`, `?` or `@` not
percent-encoded, a port that is not a number, a `key=value` string) without repeating it;
`describe_dsn` names `host:port/database` for messages, never the user or password.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from sync.errors import UsageError

__all__ = ["check_dsn", "describe_dsn"]


def describe_dsn(dsn: str) -> str:
    """`host:port/database` of a PostgreSQL URL, for messages (the first host of several);
    never the user or password, nor anything of a URL `check_dsn` would refuse."""
    parts = _split(dsn)
    if parts is None or _misquoted(dsn, parts) is not None:
        return "the configured server"
    first = parts.netloc.rpartition("@")[2].split(",")[0]
    host, port = _host_port(first)
    database = parts.path.lstrip("/")
    where = f"{host or 'localhost'}:{port or 5432}"
    return f"{where}/{database}" if database else where


def check_dsn(dsn: object) -> None:
    """Refuse what is not a `postgresql://` URL asyncpg reads as the user meant, without
    repeating it (it may hold a password).

    Raises:
        UsageError: `bad_dsn`, saying what is wrong.
    """
    if not isinstance(dsn, str):
        raise UsageError("bad_dsn", "the PostgreSQL URL must be a string")
    parts = _split(dsn)
    if parts is None:  # raised here, not in an `except`: the cause quotes the URL
        raise UsageError(
            "bad_dsn",
            "the PostgreSQL URL cannot be read (a password holding '/', '#', '?' or '@' must"
            " be percent-encoded)",
        )
    if parts.scheme not in ("postgresql", "postgres"):
        raise UsageError(
            "bad_dsn", "the PostgreSQL store takes a postgresql://user@host:port/database URL"
        )
    problem = _misquoted(dsn, parts)
    if problem is not None:
        raise UsageError("bad_dsn", problem)


_QUOTE_HINT = "a password holding '/', '#', '?' or '@' must be percent-encoded"


def _split(dsn: str) -> SplitResult | None:
    """`dsn` split, or None when it cannot be read (a port that is not a number, of any of
    its hosts: `host1:5432,host2:5433` names several)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return None
    for host in parts.netloc.rpartition("@")[2].split(","):
        _, port = _host_port(host)
        if port is not None and not port.isdigit():
            return None
    return parts


def _host_port(host: str) -> tuple[str, str | None]:
    """`host[:port]` (an IPv6 host in brackets) split."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else None
    name, colon, port = host.partition(":")
    return name, port if colon else None


def _misquoted(dsn: str, parts: SplitResult) -> str | None:
    """Why a URL's password looks cut by a character that should have been encoded: asyncpg
    splits at the first `@` where `urlsplit` takes the last, and `/`, `?` and `#` end the
    host part early, leaving the rest of the password in the path or the fragment."""
    if "@" in parts.netloc.rpartition("@")[0]:
        return f"the PostgreSQL URL holds '@' twice before its host: {_QUOTE_HINT}"
    if "@" in parts.path or "@" in parts.fragment:
        return f"the PostgreSQL URL has a '@' after its host part: {_QUOTE_HINT}"
    return None
