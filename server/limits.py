"""The hub's limits and handshake rules as pure values and functions (SPEC §6).

A `TokenBucket` (from `sync.budget`, which the replicas pace themselves by) meters the
messages one socket may send, a `Caps` counts sockets per key (per
principal, or per remote address while they wait for `hello`), and the origin and host rules
decide which handshakes a browser may make. Nothing here reads a clock: every call that needs
the time takes `now` (any monotonic seconds), so the hub core and the tests drive it alike.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable, Iterable, Set
from urllib.parse import urlsplit

from sync.budget import BUDGETS, Budget, TokenBucket
from sync.errors import UsageError

__all__ = [
    "BUDGETS",
    "Budget",
    "Caps",
    "TokenBucket",
    "host_allowed",
    "is_loopback_bind",
    "normalize_origin",
    "origin_allowed",
    "own_origins",
]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class Caps:
    """Counts held per key, each at most `limit`: sockets per principal, or per address.

    `acquire` before admitting a socket, `release` exactly once when it goes. Keys whose
    count drops to zero are forgotten, so memory follows the sockets actually open.
    """

    __slots__ = ("_counts", "limit")

    def __init__(self, limit: int) -> None:
        """Raises: UsageError if `limit` is below 1."""
        if limit < 1:
            raise UsageError("bad_setting", "a cap must be at least 1")
        self.limit = limit
        self._counts: dict[Hashable, int] = {}

    def acquire(self, key: Hashable) -> bool:
        """Count one more for `key` and return True, or return False (unchanged) at the limit."""
        count = self._counts.get(key, 0)
        if count >= self.limit:
            return False
        self._counts[key] = count + 1
        return True

    def release(self, key: Hashable) -> None:
        """Give back one count of `key`.

        Raises:
            UsageError: `key` holds nothing (a release without its acquire, a caller's bug).
        """
        count = self._counts.get(key, 0)
        if count == 0:
            raise UsageError("not_held", "release without a matching acquire")
        if count == 1:
            del self._counts[key]
        else:
            self._counts[key] = count - 1

    def count(self, key: Hashable) -> int:
        """How many `key` holds now."""
        return self._counts.get(key, 0)

    def __len__(self) -> int:
        """How many keys hold at least one."""
        return len(self._counts)


# -- origins and hosts ----------------------------------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443}
_WS_TO_HTTP = {"ws": "http", "wss": "https", "http": "http", "https": "https"}


def normalize_origin(value: str) -> str | None:
    """`scheme://host[:port]` in lower case without a default port, or None if not an origin.

    `ws`/`wss` URLs become `http`/`https` (a page's origin is never `ws:`), and a path is
    dropped, so `--public-url wss://hub.example.com/` and the header `https://hub.example.com`
    compare equal.
    """
    try:
        parts = urlsplit(value.strip())
        scheme = _WS_TO_HTTP.get(parts.scheme.lower())
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if scheme is None or not host or parts.username is not None or parts.password is not None:
        return None
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def own_origins(public_url: str | None, port: int, tls: bool) -> set[str]:
    """The hub's own origins: its loopback names on its port, plus `--public-url`'s origin.

    They come from configuration only, never from a request's `Host` header.

    Raises:
        UsageError: `public_url` is given but is not an http(s) or ws(s) URL with a host.
    """
    scheme = "https" if tls else "http"
    origins = {
        origin
        for name in LOOPBACK_NAMES
        if (origin := normalize_origin(f"{scheme}://{name}:{port}")) is not None
    }
    if public_url is not None:
        origin = normalize_origin(public_url)
        if origin is None:
            raise UsageError("bad_setting", "public url must be http(s):// or ws(s):// with a host")
        origins.add(origin)
    return origins


def origin_allowed(origin: str | None, allowed: Iterable[str], own: Set[str]) -> bool:
    """Whether a handshake with this `Origin` header may proceed (else HTTP 403).

    No header (a non-browser client) is allowed. Otherwise the origin must be one of the hub's
    own (`own`, normalized as `own_origins` makes them) or listed in `allowed`
    (`--allow-origin`; `*` allows any origin, including `null`).
    """
    if origin is None:
        return True
    allowed = list(allowed)
    if "*" in allowed:
        return True
    normal = normalize_origin(origin)
    if normal is None:
        return False
    return normal in own or normal in {normalize_origin(entry) for entry in allowed}


def _host_name(host_header: str) -> str | None:
    """The host part of a `Host` header, lower case (`[::1]` keeps its brackets), or None."""
    value = host_header.strip().lower()
    if value.startswith("["):
        inside, bracket, after = value[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            return None
        name, colon, port = f"[{inside}]", after[:1], after[1:]
    else:
        name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    if not name or (not name.startswith("[") and any(char in name for char in "/@?#\\ ")):
        return None
    return name[:-1] if name.endswith(".") else name


def _is_loopback_name(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def host_allowed(host_header: str | None, public_host: str | None, auth_on: bool) -> bool:
    """Whether a request's `Host` header is acceptable (the DNS-rebinding guard).

    With auth on, any host is (a token is the guard). Without auth, only a loopback name
    (`localhost`, `127.0.0.1`, `[::1]`, with or without a port) or `public_host` (the public
    URL's host name; any port, as a proxy may change it) is; a request without `Host` is not.
    """
    if auth_on:
        return True
    if host_header is None:
        return False
    name = _host_name(host_header)
    if name is None:
        return False
    if _is_loopback_name(name):
        return True
    return public_host is not None and name == public_host.lower().rstrip(".")


def is_loopback_bind(host: str) -> bool:
    """Whether binding `host` serves this machine only (`localhost`, 127.x, ::1).

    The wildcard (`""`, `0.0.0.0`, `::`) and any other name are not: the hub refuses them
    without a key unless started with `--insecure`.
    """
    return _is_loopback_name(host.strip().lower())
