"""Every hub setting, with its default and its `CONVSYNC_*` environment variable."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

from sync.errors import UsageError
from sync.frames import MAX_FRAME, MIN_FRAME

__all__ = ["HubConfig"]


@dataclass(frozen=True)
class HubConfig:
    """How a hub behaves. Each field can be set from `CONVSYNC_<FIELD>` by `from_env`.

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
        snapshot_every: records between two snapshots written to the store.
        recent_records: encoded records kept in memory per conversation for catch-up.
        compression: `None` (default) or `"deflate"` (permessage-deflate).
        ping_interval: seconds between keepalive pings (`None`: no pings).
        max_connections: connections served at once; more are refused with HTTP 503.
        head_check: seconds between two re-reads of each loaded conversation's head when
            other hubs share the store (PostgreSQL, SPEC 9); the backstop for a lost notice.
            Unused on a store only this hub writes (SQLite, memory).
        draft_interval: seconds between two draft delta messages to one replica (0: each
            delta at once).
        draft_timeout: seconds of silence after which a draft ends `timeout`.
        draft_grace: seconds a draft waits for its producer to reconnect.
        draft_max_bytes: UTF-8 bytes one draft may hold (at most half of `max_frame` is used,
            so a draft's text always fits one `drafts` frame).
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
        max_hello_frame: the largest first frame (the hello), in bytes; then `error too_big`.
        max_waiting_per_address: sockets one remote address may hold open before their
            `hello`; more handshakes from it get HTTP 503.
        max_per_principal: with auth, sockets one principal (token `sub`) may hold at once;
            one more gets `error rate_limited` (4008).
        rate: inbound messages per second a socket may send on average...
        rate_burst: ...with bursts of up to this many; over it: `error rate_limited` (4008).
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
    draft_interval: float = 0.05
    draft_timeout: float = 30.0
    draft_grace: float = 10.0
    draft_max_bytes: int = 512 * 1024
    bus: str | None = None
    heartbeat_interval: float = 1.0
    heartbeat_ttl: float = 5.0
    hello_timeout: float = 5.0
    max_hello_frame: int = 64 * 1024
    max_waiting_per_address: int = 64
    max_per_principal: int = 100
    rate: float = 200.0
    rate_burst: float = 400.0
    audience: str = "convsync"
    allow_origin: tuple[str, ...] = ()
    public_url: str | None = None
    insecure: bool = False
    metrics_token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    expiry_grace: float = 30.0
    hub_rebase: bool = True

    def __post_init__(self) -> None:
        if self.max_frame < MIN_FRAME:
            raise UsageError("bad_setting", f"max_frame must be at least {MIN_FRAME} bytes")
        if self.send_queue < 1 or self.snapshot_every < 1 or self.recent_records < 0:
            raise UsageError("bad_setting", "queue, snapshot and recent sizes must be positive")
        if not self.head_check > 0:
            raise UsageError("bad_setting", "head_check must be a positive number of seconds")
        if min(self.draft_interval, self.draft_timeout, self.draft_grace) < 0:
            raise UsageError("bad_setting", "draft times are not negative")
        if self.draft_max_bytes < 1:
            raise UsageError("bad_setting", "draft_max_bytes must be positive")
        if not 0 < 2 * self.heartbeat_interval <= self.heartbeat_ttl:
            raise UsageError(
                "bad_setting", "heartbeat_ttl must be at least twice heartbeat_interval (> 0)"
            )
        if self.bus is not None and not self.bus.startswith(("redis://", "rediss://")):
            raise UsageError("bad_setting", "bus is a redis:// or rediss:// URL")
        if self.compression not in (None, "deflate"):
            raise UsageError("bad_setting", "compression is None or 'deflate'")
        if not self.hello_timeout > 0 or self.max_hello_frame < 1024:
            raise UsageError(
                "bad_setting", "hello_timeout must be positive, max_hello_frame >= 1024"
            )
        if min(self.max_waiting_per_address, self.max_per_principal, self.max_connections) < 1:
            raise UsageError("bad_setting", "connection caps must be at least 1")
        if not self.rate > 0 or not self.rate_burst >= 1:
            raise UsageError("bad_setting", "rate must be positive and rate_burst at least 1")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise UsageError("bad_setting", "tls_cert and tls_key go together")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> HubConfig:
        """Defaults, then `CONVSYNC_*` variables, then `overrides` (the CLI's flags)."""
        environ = dict(os.environ) if environ is None else environ
        values: dict[str, Any] = {}
        for field in fields(cls):
            raw = environ.get(f"CONVSYNC_{field.name.upper()}")
            if raw is None:
                continue
            values[field.name] = _parse(field.name, raw, getattr(cls(), field.name))
        config = replace(cls(), **values)
        return replace(config, **{k: v for k, v in overrides.items() if v is not None})


def _parse(name: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, tuple):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if isinstance(default, bool):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes", "on")
        if raw.lower() in ("", "none", "off") and name in ("compression", "ping_interval", "bus"):
            return None
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float) or name == "ping_interval":
            return float(raw)
        return raw
    except ValueError as exc:
        raise UsageError("bad_setting", f"CONVSYNC_{name.upper()}={raw!r} is not valid") from exc
