"""Every hub setting, with its default and its `CONVSYNC_*` environment variable."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from sync.errors import UsageError
from sync.frames import MAX_FRAME, MIN_FRAME

from .limits import normalize_origin

__all__ = ["HubConfig"]


@dataclass(frozen=True)
class HubConfig:
    """How a hub behaves. Each field can be set from `CONVSYNC_<FIELD>` by `from_env`.

    Every field is checked when the config is made: a value of the wrong type or out of its
    range raises `UsageError` (`bad_setting`) naming the field, the value and the range.

    Attributes:
        max_frame: the largest frame, in bytes, a peer may send and the hub sends (16 MiB);
            so also the largest record. A larger incoming frame gets `error too_big`; frames
            of several records are filled to 1 MiB (`sync.frames.FRAME_FILL`) at most.
        strict_pairing: reject pushes that leave an orphan tool result or two assistant
            messages in a row (a retry after a failed reply is allowed).
        send_queue: bytes queued per subscriber before it counts as lagging and is sent to
            resync (closed with code 4000, reason `lagging`); 32 MiB, two frames at the
            default limit, so one large record behind another does not count as lagging.
        idle_unload: seconds a conversation with no subscriber stays loaded.
        snapshot_every: the fewest records between two snapshots written to the store; a
            snapshot also waits until the records since the last one weigh as much as it
            or number 10 times this.
        recent_records: encoded records kept in memory per conversation for catch-up.
        compression: `None` (default) or `"deflate"` (permessage-deflate).
        ping_interval: seconds between the hub's keepalive pings to each replica (`None`: no
            pings; at least 1: shorter ones cost more than they find).
        max_connections: connections served at once; more are refused with HTTP 503.
        head_check: seconds between two re-reads of each loaded conversation's head when
            other hubs share the store (PostgreSQL, SPEC 9); the backstop for a lost notice.
            Unused on a store only this hub writes (SQLite, memory).
        draft_interval: seconds between two draft delta messages to one replica. 0, the
            default: each delta at once, and the deltas of a subscriber whose socket is
            behind merge while they wait (one per draft part), so a slow reader costs no
            more frames than it can take.
        bus_interval: seconds between two bus messages about one conversation to other
            hubs (SPEC 9: never one per delta).
        draft_timeout: seconds of silence after which a draft ends `timeout`.
        draft_grace: seconds a draft waits for its producer to reconnect.
        turn_grace: seconds an open turn's worker may stay away (SPEC 10): its hub renews the
            turn's lease while it is connected; once the lease lapses, any hub ends the turn
            `failed` ("the worker went away") and the request is owed to the next worker.
            A worker that reconnects within it continues its turn. A turn waiting only for
            a person (an open approval, a frontend tool) never lapses.
        stop_grace: seconds a worker has to finish a turn the user stopped; past it, any hub
            finishes the turn `stopped` itself.
        draft_max_bytes: UTF-8 bytes one draft may hold (at most half of `max_frame` is used,
            so a draft's text always fits one `drafts` frame).
        draft_max_per_client: open drafts one (principal, client) may hold; one more
            `open` is answered `draft_end refused`.
        draft_max_parts: parts one draft may hold (`text`, `reasoning`, each `call:<id>`);
            an append that would start one more ends the draft `aborted`.
        draft_max_per_conversation: open drafts one conversation may hold, whoever owns
            them; one more `open` is answered `draft_end refused`. With `draft_max_bytes`
            this bounds a conversation's drafts (64 x 512 KiB = 32 MiB by default).
        bus: where hubs sharing a store (PostgreSQL) relay drafts and presence to each other
            (SPEC 9): a `redis://` or `rediss://` URL for Redis pub/sub (needs the `redis`
            extra), or None for `NOTIFY` on the store's own database. Unused on a store only
            this hub writes.
        heartbeat_interval: seconds between two heartbeats of this hub on the bus's store.
        heartbeat_ttl: seconds within which, once a hub died, the other hubs end its drafts
            (`timeout`) and drop its presence (its heartbeat lives `heartbeat_ttl -
            heartbeat_interval`, and they look once an interval); at least twice
            `heartbeat_interval`.
        hello_timeout: seconds a new socket has to send its `hello`; then `error no_hello`.
        open_timeout: seconds a new connection has to send its request head (and a websocket
            to finish its handshake); then it is closed. A body has as long again.
        keepalive_timeout: seconds an HTTP connection may sit idle between two requests.
        max_body: the largest HTTP request body, in bytes; a larger one gets 413.
        max_hello_frame: the largest first frame (the hello), in bytes; then `error too_big`.
        max_waiting_per_address: sockets one remote address may hold open before their
            `hello`; more handshakes from it get HTTP 503.
        max_per_principal: with auth, sockets one principal (token `sub`) may hold at once;
            one more gets `error rate_limited` (4008).
        rate: pushes per second a socket may send on average...
        rate_burst: ...with bursts of up to this many. Over it the hub reads that socket no
            faster than the budget (backpressure); `welcome` tells replicas the budget and
            they pace their pushes within it. Drafts, presence and pings have budgets of
            their own (`sync.budget.BUDGETS`).
        flood_after: seconds a socket may be held at one of its budgets without a break
            before it is closed with `error rate_limited` (4008), naming the limit.
        audience: the `aud` every token must carry.
        allow_origin: browser origins allowed besides the hub's own (`*`: any); a handshake
            or request with another `Origin` gets HTTP 403. Comma-separated in the env var.
        public_url: the URL browsers reach the hub at (behind a proxy): its origin is the
            hub's own, and without auth its host is an accepted `Host`.
        insecure: allow binding a non-loopback address without an auth key.
        metrics_token: when set, `GET /metrics` needs `Authorization: Bearer <it>`.
        tls_cert: a PEM certificate chain file: serve `wss://` directly (with `tls_key`).
        tls_key: the PEM private key file of `tls_cert`.
        expiry_grace: seconds a socket stays open after its token's `exp`, waiting for a
            refreshed one (`auth`); then `error unauthorized`, close 4001.
        hub_rebase: place a stale push (made on an older revision) by intent when all its
            records replay cleanly, for replicas that list the `hub_rebase` feature (SPEC
            2.4.6); off, every stale push is rejected `behind` and its replica rebases it.
        retain_days: delete conversations idle (no record appended) for longer than this
            many days (SPEC 15), checked at start and every `retain_every` seconds; None
            (default) keeps every conversation.
        retain_every: seconds between two retention sweeps.
        keep_tombstones_days: days a deleted conversation's tombstone is kept (it refuses
            the id's hellos and pushes, so no replica's outbox brings it back); None (default)
            keeps them for good. Keep it longer than any replica keeps an outbox.
    """

    max_frame: int = MAX_FRAME
    strict_pairing: bool = True
    send_queue: int = 2 * MAX_FRAME
    idle_unload: float = 30.0
    snapshot_every: int = 1000
    recent_records: int = 1000
    compression: str | None = None
    ping_interval: float | None = 20.0
    max_connections: int = 10_000
    head_check: float = 1.0
    draft_interval: float = 0.0
    bus_interval: float = 0.05
    draft_timeout: float = 30.0
    draft_grace: float = 10.0
    turn_grace: float = 30.0
    stop_grace: float = 10.0
    draft_max_bytes: int = 512 * 1024
    draft_max_per_client: int = 8
    draft_max_parts: int = 64
    draft_max_per_conversation: int = 64
    bus: str | None = None
    heartbeat_interval: float = 1.0
    heartbeat_ttl: float = 5.0
    hello_timeout: float = 5.0
    open_timeout: float = 10.0
    keepalive_timeout: float = 5.0
    max_body: int = 1024 * 1024
    max_hello_frame: int = 64 * 1024
    max_waiting_per_address: int = 64
    max_per_principal: int = 100
    rate: float = 2000.0
    rate_burst: float = 4000.0
    flood_after: float = 10.0
    audience: str = "convsync"
    allow_origin: tuple[str, ...] = ()
    public_url: str | None = None
    insecure: bool = False
    metrics_token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    expiry_grace: float = 30.0
    hub_rebase: bool = True
    retain_days: float | None = None
    retain_every: float = 3600.0
    keep_tombstones_days: float | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            problem = _problem(field.name, getattr(self, field.name))
            if problem is not None:
                raise UsageError("bad_setting", problem)
        if not 2 * self.heartbeat_interval <= self.heartbeat_ttl:
            raise UsageError(
                "bad_setting",
                f"heartbeat_ttl must be at least twice heartbeat_interval "
                f"(got {self.heartbeat_ttl:g} and {self.heartbeat_interval:g})",
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise UsageError("bad_setting", "tls_cert and tls_key go together: give both")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> HubConfig:
        """Defaults, then `CONVSYNC_*` variables, then `overrides` (the CLI's flags).

        Raises:
            UsageError: `bad_setting`, naming the variable, the value and the range, for a
                variable that does not parse or is out of range; naming the field for an
                override out of range.
        """
        environ = dict(os.environ) if environ is None else environ
        values: dict[str, Any] = {}
        for field in fields(cls):
            variable = f"CONVSYNC_{field.name.upper()}"
            raw = environ.get(variable)
            if raw is None:
                continue
            value = _parse(field.name, raw, getattr(cls(), field.name))
            problem = _problem(field.name, value)
            if problem is not None:
                raise UsageError("bad_setting", f"{variable}={raw!r}: {problem}")
            values[field.name] = value
        try:
            config = replace(cls(), **values)
        except UsageError as exc:  # two variables that do not go together
            raise UsageError("bad_setting", f"CONVSYNC_* settings: {exc.message}") from None
        return replace(config, **{k: v for k, v in overrides.items() if v is not None})


# The range of each numeric setting: (kind, bound, inclusive, unit). A value must be of the
# kind (an `int` for whole numbers; an int or float otherwise, finite) and at least the bound
# (more than it when not inclusive). Each range keeps out what breaks the hub: a zero ping
# interval pings in a busy loop, a zero cap refuses every connection, a negative time is
# meaningless.
_NUMBERS: dict[str, tuple[type, float, bool, str]] = {
    "max_frame": (int, MIN_FRAME, True, "bytes"),
    "send_queue": (int, 1, True, "bytes"),
    "idle_unload": (float, 0, True, "seconds"),
    "snapshot_every": (int, 1, True, "records"),
    "recent_records": (int, 0, True, "records"),
    "ping_interval": (float, 1, True, "seconds"),
    "max_connections": (int, 1, True, "connections"),
    "head_check": (float, 0.01, True, "seconds"),
    "draft_interval": (float, 0, True, "seconds"),
    "bus_interval": (float, 0, True, "seconds"),
    "draft_timeout": (float, 0, False, "seconds"),
    "draft_grace": (float, 0, True, "seconds"),
    "turn_grace": (float, 0, False, "seconds"),
    "stop_grace": (float, 0, False, "seconds"),
    "draft_max_bytes": (int, 1, True, "bytes"),
    "draft_max_per_client": (int, 1, True, "drafts"),
    "draft_max_parts": (int, 1, True, "parts"),
    "draft_max_per_conversation": (int, 1, True, "drafts"),
    "heartbeat_interval": (float, 0, False, "seconds"),
    "heartbeat_ttl": (float, 0, False, "seconds"),
    "hello_timeout": (float, 0, False, "seconds"),
    "open_timeout": (float, 0, False, "seconds"),
    "keepalive_timeout": (float, 0, False, "seconds"),
    "max_body": (int, 0, True, "bytes"),
    "max_hello_frame": (int, 1024, True, "bytes"),
    "max_waiting_per_address": (int, 1, True, "sockets"),
    "max_per_principal": (int, 1, True, "sockets"),
    "rate": (float, 0, False, "messages per second"),
    "rate_burst": (float, 1, True, "messages"),
    "flood_after": (float, 0, False, "seconds"),
    "expiry_grace": (float, 0, True, "seconds"),
    "retain_days": (float, 0, False, "days"),
    "retain_every": (float, 1, True, "seconds"),
    "keep_tombstones_days": (float, 0, False, "days"),
}

# Settings that may be None (off).
_OPTIONAL = {"ping_interval", "compression", "bus", "public_url", "metrics_token", "tls_cert"}
_DAYS = ("retain_days", "keep_tombstones_days")
_OPTIONAL |= {"tls_key", *_DAYS}
_FLAGS = {"strict_pairing", "insecure", "hub_rebase"}
_TEXTS = {"compression", "bus", "public_url", "allow_origin", "audience", "metrics_token"}
_TEXTS |= {"tls_cert", "tls_key"}
RULED = frozenset(_NUMBERS) | _FLAGS | _TEXTS
"""The settings `HubConfig` checks (a test holds every field to be one of them)."""


def _range(name: str) -> str:
    """What `name` takes, in words: `a whole number of bytes, at least 4096`, ..."""
    kind, bound, inclusive, unit = _NUMBERS[name]
    what = f"a whole number of {unit}" if kind is int else f"a number of {unit}"
    limit = f"{'at least' if inclusive else 'more than'} {bound:g}"
    return f"{'off (none) or ' if name in _OPTIONAL else ''}{what}, {limit}"


def _number_problem(name: str, value: object) -> str | None:
    kind, bound, inclusive, _ = _NUMBERS[name]
    if (
        isinstance(value, bool)
        or not isinstance(value, int if kind is int else int | float)
        or not math.isfinite(value)
        or (value < bound if inclusive else value <= bound)
    ):
        return f"{name} must be {_range(name)} (got {value!r})"
    return None


def _origins_problem(value: object) -> str | None:
    if not isinstance(value, tuple):
        return f"allow_origin must be a tuple of origins (got {value!r})"
    for origin in value:
        if origin != "*" and (not isinstance(origin, str) or normalize_origin(origin) is None):
            return f"allow_origin: {origin!r} is not '*' or an origin like https://host[:port]"
    return None


def _problem(name: str, value: object) -> str | None:
    """Why `value` cannot be setting `name` (naming the value and what it takes), or None."""
    if value is None and name in _OPTIONAL:
        return None
    if name in _NUMBERS:
        return _number_problem(name, value)
    if name in _FLAGS:
        return None if isinstance(value, bool) else f"{name} must be true or false (got {value!r})"
    match name:
        case "compression":
            ok = value == "deflate"
            expected = "off or 'deflate'"
        case "bus":
            ok = isinstance(value, str) and value.startswith(("redis://", "rediss://"))
            expected = "off or a redis:// or rediss:// URL"
        case "public_url":
            ok = isinstance(value, str) and normalize_origin(value) is not None
            expected = "an http(s):// or ws(s):// URL with a host"
        case "allow_origin":
            return _origins_problem(value)
        case "audience" | "metrics_token" | "tls_cert" | "tls_key":
            # The value is not repeated: a token is a secret.
            return None if isinstance(value, str) and value else f"{name} must not be empty"
        case _:
            return None  # tests/server/test_settings.py checks every field has a rule here
    return None if ok else f"{name} must be {expected} (got {value!r})"


def _parse(name: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, tuple):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if isinstance(default, bool):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes", "on")
        if raw.lower() in ("", "none", "off") and name in _OPTIONAL:
            return None
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float) or name in ("ping_interval", *_DAYS):
            return float(raw)
        return raw
    except ValueError:
        expected = _range(name) if name in _NUMBERS else "true or false"
        raise UsageError(
            "bad_setting",
            f"CONVSYNC_{name.upper()}={raw!r} is not valid: {name} must be {expected}",
        ) from None
