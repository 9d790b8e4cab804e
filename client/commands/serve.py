"""`convsync serve` (a hub until SIGINT or SIGTERM) and `convsync token` (mint one)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import logging
import os
import socket
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import anyio

from server.auth import Key, KeyRing, mint_token
from server.config import HubConfig
from sync import ConvsyncError, UsageError
from sync.errors import sole_exception

from ..signals import on_signals
from .common import (
    DEFAULT_DB,
    DEFAULT_HOST,
    DEFAULT_PORT,
    CliError,
    env_setting,
    port_number,
)


async def cmd_serve(args: argparse.Namespace) -> int:
    """Run a hub until SIGINT or SIGTERM, logging as `--log-format` and `--log-level` say."""
    form = args.log_format if args.log_format is not None else env_setting("LOG_FORMAT", "text")
    level = args.log_level if args.log_level is not None else env_setting("LOG_LEVEL", "warning")
    if form not in ("text", "json"):
        raise CliError(f"CONVSYNC_LOG_FORMAT={form!r}: give text or json", 2)
    if level not in ("debug", "info", "warning", "error"):
        raise CliError(f"CONVSYNC_LOG_LEVEL={level!r}: give debug, info, warning or error", 2)
    trace = args.trace if args.trace is not None else env_setting("TRACE", "") or None
    if trace not in (None, "console", "otlp"):
        raise CliError(f"CONVSYNC_TRACE={trace!r}: give console or otlp", 2)
    with _serve_logging(form, level), _serve_tracing(trace):
        return await _serve(args, json_logs=form == "json")


@contextlib.contextmanager
def _serve_tracing(kind: str | None) -> Iterator[None]:
    """Spans of the hub to `kind` (console: stderr; otlp) while it runs; nothing if None."""
    if kind is None:
        yield
        return
    from server import tracing

    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ModuleNotFoundError:
        raise CliError("--trace needs the otel extra: pip install 'convsync[otel]'", 2) from None
    exporter: SpanExporter
    if kind == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter,
            )
        except ModuleNotFoundError:
            raise CliError(
                "--trace otlp needs pip install opentelemetry-exporter-otlp-proto-http", 2
            ) from None
        exporter = OTLPSpanExporter()
    else:

        def one_line(span: ReadableSpan) -> str:
            return str(span.to_json(indent=None)) + "\n"

        exporter = ConsoleSpanExporter(out=sys.stderr, formatter=one_line)
    provider = TracerProvider(resource=Resource.create({"service.name": "convsync-hub"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield
    finally:
        tracing.disable()
        provider.shutdown()  # the spans still batched go out


@contextlib.contextmanager
def _serve_logging(form: str, level: str) -> Iterator[None]:
    """Log to stderr in `form` at `level` while the hub runs (then as before: in a test run
    in-process the logging of the test's own process is left as it was)."""
    from server.logs import configure_logging

    root = logging.getLogger()
    before = root.level
    handler = configure_logging("json" if form == "json" else "text", level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(before)


async def _serve(args: argparse.Namespace, *, json_logs: bool) -> int:
    from server.hub import Hub
    from server.store import open_store

    db = args.db if args.db is not None else env_setting("DB", DEFAULT_DB)
    host = args.host if args.host is not None else env_setting("HOST", DEFAULT_HOST)
    if not host.strip():
        # An empty host would bind every interface: never what an empty variable meant.
        where = "--host" if args.host is not None else "CONVSYNC_HOST"
        raise CliError(f"{where} is empty: give an address to bind, e.g. 127.0.0.1", 2)
    if not db.strip():
        where = "--db" if args.db is not None else "CONVSYNC_DB"
        raise CliError(f"{where} is empty: give a SQLite file, :memory: or postgresql://...", 2)
    if args.port is not None:
        port = args.port
    else:
        try:
            port = port_number(env_setting("PORT", str(DEFAULT_PORT)))
        except argparse.ArgumentTypeError as exc:
            raise CliError(f"CONVSYNC_PORT: {exc}", 2) from None
    config = HubConfig.from_env(
        max_frame=args.max_frame,
        strict_pairing=False if args.no_strict_pairing else None,
        compression=args.compression,
        bus=args.bus,
        audience=args.audience,
        allow_origin=tuple(args.allow_origin) if args.allow_origin else None,
        public_url=args.public_url,
        insecure=True if args.insecure else None,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        metrics_token=args.metrics_token,
        retain_days=args.retain,
        keep_tombstones_days=args.keep_tombstones,
    )
    keys, reload = _server_keys(args)
    stop = asyncio.Event()
    # Before the hub serves, Ctrl-C (or SIGTERM) abandons the start (exit 130, nothing left
    # open); once it serves, it stops the hub cleanly (exit 0).
    starting = anyio.CancelScope()
    serving = False

    def on_signal() -> None:
        if serving:
            stop.set()
        else:
            starting.cancel()

    with on_signals(("SIGINT", "SIGTERM"), on_signal):
        try:
            started: Hub | None = None
            with starting:
                hub = Hub(store=open_store(db), host=host, port=port, config=config, keys=keys)
                await hub.__aenter__()
                started = hub
            if starting.cancel_called:
                if started is not None:  # the signal came as the start finished
                    await started.aclose()
                return 130
            serving = True
            # What start-up made (modules, configuration, the store) lives as long as the
            # process: move it out of the collector's sight, so that a full collection walks
            # only what the hub made since (5 ms less per full collection after imports).
            gc.freeze()
            async with contextlib.AsyncExitStack() as stack, anyio.create_task_group() as group:
                stack.push_async_callback(hub.aclose)
                pairing = "on" if config.strict_pairing else "off"
                auth = "off" if keys is None else f"on (keys {_kids(keys)})"
                print(
                    f"convsync hub at {hub.url} (store {_shown(db)}, strict pairing {pairing}, "
                    f"auth {auth})",
                    flush=True,
                )
                if reload is not None:
                    group.start_soon(_reload_keys, hub, reload)
                await stop.wait()
                group.cancel_scope.cancel()
                if json_logs:  # every line on stderr is then a JSON object
                    logging.getLogger("convsync.serve").info("stopping")
                else:
                    print("convsync: stopping", file=sys.stderr, flush=True)
        except (OSError, BaseExceptionGroup) as exc:
            error = sole_exception(exc)
            if not isinstance(error, OSError):
                raise
            raise CliError(f"cannot serve on {host}:{port}: {_bind_error(error)}") from exc
    return 0


def _bind_error(error: OSError) -> str:
    """Why the hub could not listen, in words (asyncio's own message repeats the address)."""
    match error.errno:
        case errno.EADDRINUSE:
            return "the port is in use (another program listens there; --port 0 takes a free one)"
        case errno.EADDRNOTAVAIL:
            return "this machine has no such address"
        case errno.EACCES:
            return "permission denied (ports below 1024 need privileges)"
    if isinstance(error, socket.gaierror):
        return f"unknown host ({error.strerror})"
    return str(error.strerror or error)


def _shown(db: str) -> str:
    """`db` as printed: a database url without its password."""
    parts = urllib.parse.urlsplit(db)
    if "://" not in db or not parts.password:
        return db
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}@" if parts.username else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=user + netloc))


def _read_key_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise CliError(f"cannot read the {what} {path}: {exc.strerror or exc}", 2) from exc


def _key_dir(path: str) -> KeyRing:
    files = {
        name: _read_key_file(os.path.join(path, name), "key file")
        for name in os.listdir(path)
        if os.path.isfile(os.path.join(path, name))
    }
    return KeyRing.from_files(files)


def _server_keys(args: argparse.Namespace) -> tuple[KeyRing | None, Callable[[], KeyRing] | None]:
    """The hub's keys from the flags or the environment, and how to reread them (a key
    directory is reread so keys rotate without a restart)."""
    if args.auth_public_key is not None:
        path = args.auth_public_key
        if os.path.isdir(path):
            return _key_dir(path), lambda: _key_dir(path)
        return KeyRing.of(Key.public_pem(_read_key_file(path, "public key"))), None
    if args.auth_secret_file is not None:
        data = _read_key_file(args.auth_secret_file, "secret")
        return KeyRing.of(_secret(data, f"the secret in {args.auth_secret_file}")), None
    secret = os.environ.get("CONVSYNC_AUTH_SECRET")
    if secret is not None:
        return KeyRing.of(_secret(secret, "CONVSYNC_AUTH_SECRET")), None
    return None, None


def _secret(data: bytes | str, where: str) -> Key:
    """`Key.secret(data)`; a secret it refuses is a usage error naming `where` it came from
    (never the secret itself)."""
    try:
        return Key.secret(data)
    except UsageError as exc:
        raise CliError(f"{where}: {exc.message}", 2) from None


def _kids(keys: KeyRing) -> str:
    return ", ".join(kid or "unnamed" for kid in keys.kids)


async def _reload_keys(hub: Any, reload: Callable[[], KeyRing]) -> None:
    """Reread the key directory every 10 s; a broken directory keeps the keys in use."""
    while True:
        await anyio.sleep(10)
        try:
            keys = reload()
        except (ConvsyncError, CliError, OSError) as exc:
            print(f"convsync: keeping the current keys: {exc}", file=sys.stderr, flush=True)
            continue
        if keys != hub.keys:
            hub.keys = keys
            print(f"convsync: keys now {_kids(keys)}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- token


async def cmd_token(args: argparse.Namespace) -> int:
    """Print a signed token."""
    if args.secret_file is not None:
        secret = _read_key_file(args.secret_file, "secret")
    else:
        env = os.environ.get("CONVSYNC_AUTH_SECRET")
        if not env:
            raise CliError("give --secret-file or set CONVSYNC_AUTH_SECRET", 2)
        secret = env.encode()
    print(
        mint_token(
            secret,
            args.sub,
            args.scope.split(),
            args.conv or ["*"],
            args.ttl,
            kind=args.kind,
            kid=args.kid,
            audience=args.audience,
        )
    )
    return 0
