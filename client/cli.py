"""The `convsync` command: run a hub, mint tokens, watch, write to, export and import
conversations.

How this works: `main(argv)` parses the command line with one argparse parser per subcommand
and runs the command's coroutine with `asyncio.run`; it returns the exit code instead of
exiting, so tests call it directly. Every failure a user can cause (a bad flag, a malformed
file, a conversation that is not empty, a hub that is not there) ends as one line on stderr:
exit code 2 for input that is wrong as given, 1 when the command was fine but could not be
done. Only bugs give a traceback. The work itself is done by library functions
(`client.transfer`, `client.http`, `client.tail`, `client.demo`) that raise errors with
reasons; this module turns them into lines and exit codes, and nothing imports it.
"""

from __future__ import annotations

import signal
import sys

# Ctrl-C while this module's imports run (a third of a second, most of a command's start-up)
# ends the process at once and quietly, as it ends any other command, instead of a traceback
# from inside some import. The end of this module hands Ctrl-C back to Python (then `main`
# exits 130 on it). The `client` package imports nothing before this runs.
_quiet_start = signal.getsignal(signal.SIGINT) is signal.default_int_handler
if _quiet_start:
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:  # imported off the main thread: signals are not ours to set
        _quiet_start = False

import argparse
import asyncio
import contextlib
import datetime
import errno
import gc
import importlib.metadata
import json
import logging
import math
import os
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, NoReturn

import anyio

from server.auth import Key, KeyRing, mint_token
from server.config import HubConfig
from server.session import is_conversation_id
from sync import ConvsyncError, Message, UsageError
from sync.errors import Refused, sole_exception
from sync.frames import MAX_FRAME

from .http import HubError
from .progress import Progress
from .replica import url_problem
from .signals import on_signals
from .tail import tail
from .transfer import (
    ImportRefused,
    TransferError,
    connect_checked,
    export_conversation,
    flush_edits,
    import_conversation,
)

__all__ = ["CliError", "main"]

DEFAULT_URL = "ws://127.0.0.1:8765"
DEFAULT_DB = "./convsync.db"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


class CliError(Exception):
    """A failure to report as one line on stderr, `{prog}: error: {message}`, with exit
    `code` (2: bad input, 1: the command could not be done)."""

    def __init__(self, message: str, code: int = 1, prog: str = "convsync") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.prog = prog


# ---------------------------------------------------------------------- arguments


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (and an exit code 2), not a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see {self.prog} --help)", 2, self.prog)


def _env(name: str, default: str) -> str:
    return os.environ.get(f"CONVSYNC_{name}", default)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is not in 0..65535")
    return port


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not (math.isfinite(days) and days > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days (more than 0)")
    return days


def _duration(text: str) -> float:
    """`900`, `30s`, `15m`, `12h` or `7d`, in seconds."""
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 900, 15m, 12h)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive duration")
    return value


def _conversation_id(text: str) -> str:
    if not is_conversation_id(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a conversation id (1-128 characters of A-Z a-z 0-9 . _ : -)"
        )
    return text


def _url(text: str) -> str:
    problem = url_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text.rstrip("/")


def _urls(text: str) -> list[str]:
    """One hub url, or several separated by commas (hubs sharing one database)."""
    return [_url(part.strip()) for part in text.split(",") if part.strip()] or [_url(text)]


def _hub_urls(args: argparse.Namespace) -> list[str]:
    """The hubs `--url` named (repeated or comma-separated), else `CONVSYNC_URL`'s."""
    given: list[str] | None = args.url
    if given:
        return given
    try:
        return _urls(_env("URL", DEFAULT_URL))
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"CONVSYNC_URL: {exc}", 2) from None


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=_urls,
        action="extend",
        default=None,
        help=f"the hub (env CONVSYNC_URL; default {DEFAULT_URL}); tail and send take several "
        "hubs sharing one database, repeated or comma-separated, and move to the next one "
        "when a hub goes away",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=10.0,
        help="seconds to wait for the hub to connect or answer (default 10)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("CONVSYNC_TOKEN") or None,  # set but empty: no token
        help="access token for a hub with auth (env CONVSYNC_TOKEN; `convsync token` mints one)",
    )
    parser.add_argument(
        "--ca-file",
        default=os.environ.get("CONVSYNC_CA_FILE"),
        metavar="FILE",
        help="trust this CA (PEM) for a wss:// hub with a private certificate (env "
        "CONVSYNC_CA_FILE)",
    )


def _version() -> str:
    """The installed package's version (the source tree run without installing has none)."""
    try:
        return importlib.metadata.version("convsync")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The `convsync` parser, one subparser per command."""
    parser = _Parser(
        prog="convsync",
        description="Mirror LLM-agent conversations between processes in real time.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser(
        "serve",
        help="run a hub",
        description="Run a hub: owns each conversation's log and broadcasts its changes. "
        "SIGINT or SIGTERM stops it cleanly (appends under way finish first). One hub per "
        "SQLite file: a second one on the same file exits 1 naming the hub that holds it.",
    )
    serve.add_argument(
        "--db",
        default=None,
        help=f"the store: a SQLite file, sqlite://PATH, postgresql://USER@HOST/DB or :memory: "
        f"(env CONVSYNC_DB; default {DEFAULT_DB})",
    )
    serve.add_argument("--host", default=None, help="address to bind (env CONVSYNC_HOST)")
    serve.add_argument(
        "--port",
        type=_port,
        default=None,
        help=f"port to bind, 0 for any free one (env CONVSYNC_PORT; default {DEFAULT_PORT})",
    )
    serve.add_argument(
        "--max-frame", type=_positive, default=None, help="largest frame in bytes (16 MiB)"
    )
    serve.add_argument(
        "--no-strict-pairing",
        action="store_true",
        help="accept pushes that leave an orphan tool result or two assistant messages in a row",
    )
    serve.add_argument(
        "--compression", choices=["deflate"], default=None, help="offer permessage-deflate"
    )
    serve.add_argument(
        "--bus",
        default=None,
        help="with a postgresql:// store: relay drafts and presence between hubs over Redis "
        "at this redis:// URL (env CONVSYNC_BUS; default: NOTIFY on the database)",
    )
    keys = serve.add_mutually_exclusive_group()
    keys.add_argument(
        "--auth-secret-file",
        metavar="FILE",
        help="check tokens with this HS256 secret (env CONVSYNC_AUTH_SECRET holds the secret "
        "itself); every socket and /v1 request then needs a token",
    )
    keys.add_argument(
        "--auth-public-key",
        metavar="PATH",
        help="check tokens with this PEM public key (ES256, RS256, EdDSA), or with the keys of "
        "a directory of <kid>.pem / <kid>.secret files, reread every 10 s to rotate keys",
    )
    serve.add_argument("--audience", default=None, help="the aud tokens must carry (convsync)")
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="a browser origin allowed besides the hub's own (repeatable; '*' for any)",
    )
    serve.add_argument(
        "--public-url", default=None, help="the URL browsers reach the hub at (its origin)"
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback bind without auth (anyone reaching it can read and write)",
    )
    serve.add_argument("--tls-cert", default=None, metavar="FILE", help="serve wss:// with this")
    serve.add_argument("--tls-key", default=None, metavar="FILE", help="the TLS private key")
    serve.add_argument(
        "--metrics-token", default=None, help="/metrics then needs this bearer token"
    )
    serve.add_argument(
        "--retain",
        type=_days,
        default=None,
        metavar="DAYS",
        help="delete conversations idle (nothing appended) for longer, at start and hourly "
        "(env CONVSYNC_RETAIN_DAYS; default: keep all; `convsync delete --idle DAYS "
        "--dry-run` shows what would go)",
    )
    serve.add_argument(
        "--keep-tombstones",
        type=_days,
        default=None,
        metavar="DAYS",
        help="forget a deleted conversation's tombstone after this many days (env "
        "CONVSYNC_KEEP_TOMBSTONES_DAYS; default: never); keep it longer than any replica "
        "keeps an outbox",
    )
    serve.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=None,
        help="log lines on stderr as text or as one JSON object per line (env "
        "CONVSYNC_LOG_FORMAT; default text)",
    )
    serve.add_argument(
        "--trace",
        choices=["console", "otlp"],
        default=None,
        help="OpenTelemetry spans (needs the otel extra): to stderr as JSON lines, or over "
        "OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (needs opentelemetry-exporter-otlp-proto-http"
        "); env CONVSYNC_TRACE; default off",
    )
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=None,
        help="the least level logged (env CONVSYNC_LOG_LEVEL; default warning; info adds "
        "each socket opened, closed and refused)",
    )

    token = commands.add_parser(
        "token",
        help="mint an access token",
        description="Print a signed access token (a JWT) for a hub run with the same secret: "
        "for development and scripts.",
    )
    token.add_argument(
        "--secret-file",
        metavar="FILE",
        default=None,
        help="the hub's HS256 secret (default: env CONVSYNC_AUTH_SECRET)",
    )
    token.add_argument("--sub", required=True, help="the principal")
    token.add_argument(
        "--scope",
        default="read",
        help='space-separated: read, write, presence, admin (delete), approve (default "read")',
    )
    token.add_argument(
        "--conv",
        action="append",
        default=None,
        metavar="ID|PREFIX*",
        help="a conversation, a prefix ending in *, or * (repeatable; default *)",
    )
    token.add_argument("--ttl", type=_duration, default=900.0, help="lifetime (default 15m)")
    token.add_argument(
        "--kind",
        choices=["agent", "ui", "dashboard", "service"],
        default=None,
        help="shown in presence",
    )
    token.add_argument("--kid", default=None, help="key id for a hub with a key directory")
    token.add_argument("--audience", default="convsync", help="the hub's audience (convsync)")

    tail = commands.add_parser(
        "tail",
        help="watch a conversation live",
        description="Show a conversation and follow it live: on a terminal, the latest "
        "entries that fit, redrawn as it changes; else the lines for each change are printed. "
        "A conversation nobody has written to yet is waited for. Ctrl-C stops.",
    )
    tail.add_argument("id", type=_conversation_id, metavar="ID", help="the conversation")
    _client_options(tail)
    tail.add_argument(
        "--once",
        action="store_true",
        help="print the conversation and exit (1 when the hub has no such conversation yet)",
    )

    send = commands.add_parser(
        "send",
        help="push a user message",
        description="Push a user message, wait until the hub has it, print the new revision. "
        "An empty message (nothing but whitespace) is refused.",
    )
    send.add_argument("id", type=_conversation_id, metavar="ID", help="the conversation")
    send.add_argument(
        "text",
        metavar="TEXT",
        help="the message; '-' reads it from stdin (UTF-8, one final line break dropped)",
    )
    _client_options(send)
    send.add_argument(
        "--client",
        default=None,
        help="client id to push as (default: a fresh one per run)",
    )

    approve = commands.add_parser(
        "approve",
        help="decide an approval or answer a question (SPEC 12)",
        description="Approve (or, with --deny, deny) an open approval of a conversation, "
        "named by its aside id or its key (the tool call's id, or a question's key), as the "
        "token's principal (it needs the approve scope). Prints the decision that stands; "
        "exits 1 when someone else decided first.",
    )
    approve.add_argument("id", type=_conversation_id, metavar="ID", help="the conversation")
    approve.add_argument("approval", metavar="APPROVAL", help="the approval's aside id or key")
    approve.add_argument("--deny", action="store_true", help="deny instead of approving")
    approve.add_argument("--reason", default=None, help="why (shown to everyone)")
    approve.add_argument(
        "--answer", default=None, metavar="JSON", help="a question's answer, as JSON"
    )
    _client_options(approve)

    export = commands.add_parser(
        "export",
        help="write a conversation to a file",
        description="Write a conversation to a file that `convsync import` reads back. The "
        "default format, state, keeps everything the log holds: entries with their ids and "
        "authors, turn records, notes and other asides, the halt and retired ids. "
        "--format snapshot writes the portable snapshot v1 instead: messages and pins only; "
        "it leaves out ids, authors, turn records, notes, the halt and retired ids, and says "
        "on stderr what it left out.",
    )
    export.add_argument("id", type=_conversation_id, metavar="ID", help="the conversation")
    _client_options(export)
    export.add_argument(
        "--format",
        choices=["state", "snapshot"],
        default="state",
        help="state (default: lossless) or snapshot (snapshot v1: messages and pins only)",
    )
    export.add_argument("-o", "--output", metavar="FILE", help="write here (default stdout)")

    imp = commands.add_parser(
        "import",
        help="load a file into a conversation",
        description="Load a state, snapshot v1 or hub answer file into a conversation; a file "
        "that is none of them, or holds a key the format does not know, is refused. An empty "
        "conversation gets the entries in batches, then the asides and halt; a conversation "
        "that is not empty is left alone unless --replace is given, which replaces it with "
        "one reset record (that record must fit one frame).",
    )
    imp.add_argument("file", metavar="FILE", help="the file to read ('-' for stdin)")
    imp.add_argument("id", type=_conversation_id, metavar="ID", help="the conversation")
    _client_options(imp)
    imp.add_argument(
        "--format",
        choices=["auto", "snapshot", "state"],
        default="auto",
        help="auto (default): whichever the file's keys say it is; state or snapshot: refuse "
        "a file of the other format",
    )
    imp.add_argument(
        "--replace", action="store_true", help="replace a conversation that is not empty"
    )
    imp.add_argument(
        "--progress",
        action="store_true",
        help="show the progress on stderr even when it is not a terminal (plain lines)",
    )
    imp.add_argument(
        "--no-pairing-check",
        action="store_true",
        help="skip the local tool-call pairing check (for a hub run with --no-strict-pairing)",
    )
    imp.add_argument(
        "--max-frame",
        type=_positive,
        default=MAX_FRAME,
        help="the hub's frame limit in bytes (default 16 MiB)",
    )

    back = commands.add_parser(
        "backup",
        help="copy a SQLite store to a new file while its hub runs",
        description="Copy the SQLite store --db to FILE with SQLite's online backup API, while "
        "a hub may be serving it: one consistent copy holding every record the hub had "
        "acknowledged when the backup began. FILE must not exist. For PostgreSQL, see "
        "docs/deploy.md (pg_dump).",
    )
    back.add_argument("file", metavar="FILE", help="the backup file to make")
    back.add_argument("--db", required=True, help="the store's SQLite file")

    rest = commands.add_parser(
        "restore",
        help="make a new SQLite store from a backup, every conversation under a fresh lineage",
        description="Make the new SQLite store --db from the backup FILE. Every conversation "
        "gets a fresh lineage, so a replica that saw revisions past the backup rereads the "
        "log instead of diverging (its edits not in the backup are replayed). --db must not "
        "exist: restore never overwrites a store; then run `convsync serve --db` on it.",
    )
    rest.add_argument("file", metavar="FILE", help="the backup file")
    rest.add_argument("--db", required=True, help="the new store's SQLite file")

    delete = commands.add_parser(
        "delete",
        help="delete conversations, by id or idle for some days",
        description="Delete conversations on a running hub (SPEC 15; the token needs scope "
        "admin on them): their logs leave the store, their sockets are closed (4410 "
        "deleted, never retried) and a tombstone keeps any replica from bringing them "
        "back. Give ids, or --idle DAYS for every conversation with no record appended for "
        "longer (with --dry-run: only list them, with when each was last written). Prints "
        "one line per conversation; exit 1 if one of the ids was not there.",
    )
    delete.add_argument(
        "ids", nargs="*", type=_conversation_id, metavar="ID", help="conversations to delete"
    )
    delete.add_argument(
        "--idle", type=_days, default=None, metavar="DAYS", help="every conversation idle longer"
    )
    delete.add_argument("--dry-run", action="store_true", help="with --idle: list, change nothing")
    _client_options(delete)

    listing = commands.add_parser(
        "list",
        help="list conversations, or watch them live",
        description="List the hub's conversations under a prefix (a page of rows: id, "
        "revision, entries, last update, turn, open drafts, who is online, last message): a "
        "table on a terminal, tab-separated lines when piped. --watch keeps the window live "
        "(on a terminal, a table redrawn as rows change; else a line per changed row, "
        "'-\tID' when a row leaves the window, '#\tdisconnected' / '#\tconnected' as the "
        "connection goes and comes back). Ctrl-C stops.",
    )
    listing.add_argument("--prefix", default="", help="only ids starting with it")
    listing.add_argument(
        "--order",
        choices=("id", "updated"),
        default="id",
        help="by id (default; pages with --after) or the most recently updated first",
    )
    listing.add_argument("--after", default=None, help="the page after this id (--order id)")
    listing.add_argument(
        "--limit", type=_positive, default=100, help="rows in the page (1 to 1000; default 100)"
    )
    listing.add_argument("--watch", action="store_true", help="keep the list live")
    _client_options(listing)

    demo = commands.add_parser(
        "demo",
        help="run a hub, an agent worker and a UI, and check they agree",
        description="Start a hub on a SQLite store, a scripted agent worker doing turns with "
        "tool calls and a UI replica mirroring it (and writing to it mid-turn); at the end "
        "check both replicas equal the hub's state. Exit 0 only when they do.",
    )
    demo.add_argument(
        "--db",
        default=None,
        help=f"the store (env CONVSYNC_DB; default {DEFAULT_DB}); each run uses a new conversation",
    )
    demo.add_argument("--turns", type=_positive, default=3, help="agent turns (default 3)")
    demo.add_argument("--fast", action="store_true", help="no pauses between steps")
    demo.add_argument(
        "--serve",
        action="store_true",
        help="serve the hub on 127.0.0.1:--port, print the viewer's address of the demo and "
        "keep serving after it until Ctrl-C",
    )
    demo.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"with --serve: the port (default {DEFAULT_PORT}; 0 for any free one)",
    )
    return parser


# ---------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run `convsync` with `argv` (default: the process arguments); returns the exit code."""
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help
            return exc.code if isinstance(exc.code, int) else 0
        command: Callable[[argparse.Namespace], Awaitable[int]] = _COMMANDS[args.command]
        return asyncio.run(_run(command, args))
    except CliError as exc:
        print(f"{exc.prog}: error: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`convsync demo | head`): stop quietly, as other tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1


def _cli_error(exc: ConvsyncError) -> CliError:
    """The one line a library error becomes: the client's own errors say what happened in
    plain words; any other convsync error shows its reason too."""
    if isinstance(exc, UsageError | ImportRefused):
        return CliError(exc.message, 2)
    if isinstance(exc, HubError | TransferError):
        return CliError(exc.message)
    if isinstance(exc, Refused):
        return CliError(f"the hub refused: {exc.code}: {exc.detail}")
    return CliError(f"{exc.reason}: {exc.message}")


async def _run(command: Callable[[argparse.Namespace], Awaitable[int]], ns: Any) -> int:
    try:
        return await command(ns)
    except BaseExceptionGroup as group:
        exc = sole_exception(group)
        if isinstance(exc, CliError):
            raise exc from None
        if isinstance(exc, ConvsyncError):
            raise _cli_error(exc) from group
        raise
    except ConvsyncError as exc:
        raise _cli_error(exc) from exc


# ---------------------------------------------------------------------- serve


async def cmd_serve(args: argparse.Namespace) -> int:
    """Run a hub until SIGINT or SIGTERM, logging as `--log-format` and `--log-level` say."""
    form = args.log_format if args.log_format is not None else _env("LOG_FORMAT", "text")
    level = args.log_level if args.log_level is not None else _env("LOG_LEVEL", "warning")
    if form not in ("text", "json"):
        raise CliError(f"CONVSYNC_LOG_FORMAT={form!r}: give text or json", 2)
    if level not in ("debug", "info", "warning", "error"):
        raise CliError(f"CONVSYNC_LOG_LEVEL={level!r}: give debug, info, warning or error", 2)
    trace = args.trace if args.trace is not None else _env("TRACE", "") or None
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

    db = args.db if args.db is not None else _env("DB", DEFAULT_DB)
    host = args.host if args.host is not None else _env("HOST", DEFAULT_HOST)
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
            port = _port(_env("PORT", str(DEFAULT_PORT)))
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


# ---------------------------------------------------------------------- tail, send


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context trusting `--ca-file`, or None (the system's CAs)."""
    if args.ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=args.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise CliError(f"cannot read the CA file {args.ca_file}: {exc}", 2) from exc


async def cmd_tail(args: argparse.Namespace) -> int:
    """Show a conversation, live until SIGINT/SIGTERM, or once."""
    out = sys.stdout
    urls = _hub_urls(args)
    async with connect_checked(
        urls, args.id, connect_timeout=args.timeout, token=args.token, ssl=_tls(args)
    ) as replica:
        if args.once:
            try:
                await tail(replica, out, once=True, tty=False)
            except HubError as exc:
                if exc.reason != "no_conversation":
                    raise
                raise CliError(f"{exc.message} (without --once, tail waits for it)") from exc
            return 0
        with anyio.CancelScope() as scope, on_signals(("SIGINT", "SIGTERM"), scope.cancel):
            await tail(replica, out, once=False, tty=out.isatty())
    return 0


def _message_text(text: str) -> str:
    """The text `send` pushes: `text`, or what stdin holds for `-`; refused when empty.

    Raises:
        CliError: (exit 2) stdin is not UTF-8, or the message is empty or only whitespace.
    """
    source = ""
    if text == "-":
        source = " read from stdin"
        try:
            text = sys.stdin.buffer.read().decode()
        except UnicodeDecodeError as exc:
            raise CliError(
                f"stdin is not UTF-8 text: {exc.reason} at byte {exc.start}", 2
            ) from None
        # `echo` and heredocs end with a line break nobody meant as part of the message.
        text = text.removesuffix("\n").removesuffix("\r")
    if not text.strip():
        raise CliError(f"the message{source} is empty or only whitespace; nothing sent", 2)
    return text


async def cmd_send(args: argparse.Namespace) -> int:
    """Push one user message and print the revision the log reached."""
    text = _message_text(args.text)  # read and checked before connecting
    # A given client id continues its push numbering (the welcome says where it stands).
    client = args.client or f"convsync-send-{os.urandom(4).hex()}"
    async with connect_checked(
        _hub_urls(args),
        args.id,
        connect_timeout=args.timeout,
        client=client,
        token=args.token,
        ssl=_tls(args),
    ) as replica:
        replica.conversation.push(Message.user(text))
        await flush_edits(replica, args.timeout, "the message")
        print(replica.revision)
    return 0


async def cmd_approve(args: argparse.Namespace) -> int:
    """Decide one open approval and print the decision that stands."""
    answer: Any = None
    if args.answer is not None:
        try:
            answer = json.loads(args.answer)
        except ValueError as exc:
            raise CliError(f"--answer is not JSON: {exc}", 2) from None
    async with connect_checked(
        _hub_urls(args), args.id, connect_timeout=args.timeout, token=args.token, ssl=_tls(args)
    ) as replica:
        held = replica.approvals
        named = [
            id_
            for id_, approval in held.items()
            if id_ == args.approval or (approval.key == args.approval and approval.is_open)
        ]
        if not named:
            raise CliError(f"no open approval {args.approval!r} in {args.id}", 1)
        id_ = named[-1]
        if not held[id_].is_open:
            raise CliError(_decision_line(id_, held[id_]), 1)
        try:
            replica.decide(id_, approve=not args.deny, answer=answer, reason=args.reason)
        except UsageError as exc:
            raise CliError(exc.message, 2) from None
        lost = False
        try:
            await flush_edits(replica, args.timeout, "the decision")
        except TransferError as exc:
            if exc.reason != "refused":
                raise
            lost = True  # someone decided first (or the token may not): what stands is shown
            print(exc.message, file=sys.stderr)
        stands = replica.approvals[id_]
        print(_decision_line(id_, stands))
        return 1 if lost else 0


def _decision_line(id_: str, approval: Any) -> str:
    who = f" by {approval.decided_by}" if approval.decided_by else ""
    why = f": {approval.reason}" if approval.reason else ""
    answer = f" {json.dumps(approval.answer)}" if approval.answer is not None else ""
    return f"{id_} {approval.key} {approval.state}{answer}{who}{why}"


# ---------------------------------------------------------------------- list


async def cmd_list(args: argparse.Namespace) -> int:
    """Print a page of summary rows, or keep a window of them live (`--watch`)."""
    from . import dashboard

    if args.limit > 1000:
        raise CliError("--limit: 1 to 1000", 2)
    if args.after is not None and args.order != "id":
        raise CliError("--after pages by id: it goes with --order id", 2)
    url = _hub_urls(args)[0]
    page = {"prefix": args.prefix, "order": args.order, "after": args.after, "limit": args.limit}
    out = sys.stdout
    if not args.watch:
        listing = await dashboard.list_conversations(
            url, **page, token=args.token, request_timeout=args.timeout, ssl=_tls(args)
        )
        if out.isatty():
            from rich.console import Console

            more = " (more follow: --after the last id)" if listing.more else ""
            Console(file=out).print(
                dashboard.table(listing.rows, f"{len(listing.rows)} rows{more}")
            )
        else:
            for row in listing.rows:
                print(dashboard.plain_line(row), file=out)
        return 0
    windows = dashboard.summary(
        url, **page, token=args.token, connect_timeout=args.timeout, ssl=_tls(args)
    )
    with anyio.CancelScope() as scope, on_signals(("SIGINT", "SIGTERM"), scope.cancel):
        if out.isatty():
            from rich.console import Console
            from rich.live import Live

            with Live(console=Console(file=out), auto_refresh=False) as live:
                async for window in windows:
                    state = "" if window.connected else " — offline, reconnecting"
                    title = f"{len(window.rows)} rows{state}"
                    live.update(dashboard.table(list(window.rows.values()), title), refresh=True)
        else:
            shown: dict[str, str] = {}
            connected = True
            async for window in windows:
                if window.connected != connected:
                    connected = window.connected
                    print(f"#\t{'connected' if connected else 'disconnected'}", file=out)
                for gone in [i for i in shown if i not in window.rows]:
                    del shown[gone]
                    print(f"-\t{gone}", file=out)
                for conversation_id, row in window.rows.items():
                    line = dashboard.plain_line(row)
                    if shown.get(conversation_id) != line:
                        shown[conversation_id] = line
                        print(line, file=out)
                out.flush()
    return 0


# ---------------------------------------------------------------------- delete


async def cmd_delete(args: argparse.Namespace) -> int:
    """Delete conversations by id, or those idle for `--idle` days (`--dry-run`: list)."""
    from . import http

    if bool(args.ids) == (args.idle is not None):
        raise CliError("give conversation ids or --idle DAYS (one of the two)", 2)
    if args.dry_run and args.idle is None:
        raise CliError("--dry-run goes with --idle DAYS", 2)
    url = _hub_urls(args)[0]
    options: dict[str, Any] = {"token": args.token, "ssl": _tls(args)}
    if args.idle is not None:
        listed = await http.retain(
            url, args.idle, dry_run=args.dry_run, request_timeout=max(args.timeout, 60), **options
        )
        for conversation_id, last in listed:
            if args.dry_run:
                when = datetime.datetime.fromtimestamp(last, datetime.UTC)
                print(f"would delete\t{conversation_id}\tlast written {when:%Y-%m-%d %H:%M}Z")
            else:
                print(f"deleted\t{conversation_id}")
        what = "would be deleted" if args.dry_run else "deleted"
        print(f"{len(listed)} idle conversation(s) {what}", file=sys.stderr)
        return 0
    missing = 0
    for conversation_id in args.ids:
        try:
            await http.delete_conversation(
                url, conversation_id, request_timeout=args.timeout, **options
            )
        except HubError as exc:
            if exc.reason != "no_conversation":
                raise
            missing += 1
            print(f"convsync: {exc.message}", file=sys.stderr)
            continue
        print(f"deleted\t{conversation_id}")
    return 1 if missing else 0


# ---------------------------------------------------------------------- export


async def cmd_export(args: argparse.Namespace) -> int:
    """Write a conversation's state or snapshot to a file or stdout; a snapshot says on stderr
    what it left out."""
    exported = await export_conversation(
        _hub_urls(args)[0],
        args.id,
        format=args.format,
        request_timeout=args.timeout,
        token=args.token,
        ssl=_tls(args),
    )
    if args.output is None or args.output == "-":
        sys.stdout.buffer.write(exported.data + b"\n")
        sys.stdout.flush()
    else:
        try:
            await anyio.Path(args.output).write_bytes(exported.data + b"\n")
        except OSError as exc:
            raise CliError(f"cannot write {args.output}: {exc.strerror or exc}", 2) from exc
        print(
            f"exported {exported.messages} messages of {args.id} at revision "
            f"{exported.revision} to {args.output} ({args.format})",
            file=sys.stderr,
        )
    if exported.left_out:
        # Asked for by name, but a user may not know what the portable format cannot hold.
        print(
            f"convsync: snapshot v1 left out {_listed(exported.left_out)} "
            "(the default format, state, keeps them)",
            file=sys.stderr,
        )
    return 0


def _listed(items: Sequence[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return " and ".join(filter(None, [", ".join(items[:-1]), items[-1]]))


# ---------------------------------------------------------------------- import


# What to do about a refused import, in this command's flags.
_IMPORT_HINTS = {
    "not_empty": " (--replace replaces it)",
    "unpairable": " (--no-pairing-check skips this check)",
    "wrong_format": " (--format auto reads either)",
}


async def cmd_import(args: argparse.Namespace) -> int:
    """Load a file into a conversation (see the subcommand's description)."""
    where = "stdin" if args.file == "-" else args.file
    bar: list[Progress] = []

    def show(done: int, total: int) -> None:
        if not bar:
            bar.append(Progress(total, sys.stderr))
        bar[0].update(done)

    try:
        imported = await import_conversation(
            _hub_urls(args)[0],
            sys.stdin.buffer if args.file == "-" else args.file,
            args.id,
            format=args.format,
            replace=args.replace,
            check_pairing=not args.no_pairing_check,
            max_frame=args.max_frame,
            step_timeout=args.timeout,
            progress=show if args.progress or sys.stderr.isatty() else None,
            where=where,
            token=args.token,
            ssl=_tls(args),
        )
    except ImportRefused as exc:
        raise CliError(exc.message + _IMPORT_HINTS.get(exc.reason, ""), 2) from exc
    finally:
        if bar:
            bar[0].close()
    if imported.replaced:
        print(
            f"replaced {args.id} with {imported.messages} messages from {where} "
            f"(revision {imported.revision})",
            file=sys.stderr,
        )
    else:
        print(
            f"imported {imported.messages} messages and {imported.asides} asides from {where} "
            f"into {args.id} (revision {imported.revision})",
            file=sys.stderr,
        )
    return 0


# ---------------------------------------------------------------------- backup


async def cmd_backup(args: argparse.Namespace) -> int:
    """Back the SQLite store up to a new file (off the event loop: it is one long copy)."""
    from server.store.backup import backup

    await _copy_store(backup, args.db, args.file)
    return 0


async def cmd_restore(args: argparse.Namespace) -> int:
    """Make a new SQLite store from a backup, every conversation under a fresh lineage."""
    from server.store.backup import restore

    await _copy_store(restore, args.file, args.db)
    return 0


async def _copy_store(copy: Callable[..., object], source: str, target: str) -> None:
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        await anyio.to_thread.run_sync(lambda: copy(source, target, say=say))
    except UsageError as exc:
        raise CliError(exc.message, 1) from exc


# ---------------------------------------------------------------------- demo


async def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo (`client.demo`, imported here: it loads the hub's code)."""
    from .demo import DemoError, run_demo

    db = args.db if args.db is not None else _env("DB", DEFAULT_DB)
    try:
        if not args.serve:
            return await run_demo(db, turns=args.turns, fast=args.fast, out=sys.stdout)
        # Serving: Ctrl-C (or SIGTERM) during the turns abandons the demo (130); after the
        # check it stops the hub, and the exit code is the check's.
        stop, after, scope = anyio.Event(), anyio.Event(), anyio.CancelScope()

        def on_signal() -> None:
            stop.set()
            if not after.is_set():
                scope.cancel()

        with on_signals(("SIGINT", "SIGTERM"), on_signal), scope:
            return await run_demo(
                db,
                turns=args.turns,
                fast=args.fast,
                out=sys.stdout,
                serve=args.port,
                until=stop,
                after=after,
            )
        return 130
    except DemoError as exc:
        raise CliError(exc.message, 2 if exc.reason == "bad_setting" else 1) from exc


_COMMANDS: dict[str, Callable[[argparse.Namespace], Awaitable[int]]] = {
    "serve": cmd_serve,
    "list": cmd_list,
    "token": cmd_token,
    "tail": cmd_tail,
    "send": cmd_send,
    "approve": cmd_approve,
    "export": cmd_export,
    "import": cmd_import,
    "demo": cmd_demo,
    "backup": cmd_backup,
    "restore": cmd_restore,
    "delete": cmd_delete,
}


if _quiet_start and signal.getsignal(signal.SIGINT) is signal.SIG_DFL:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the imports are done

if __name__ == "__main__":
    sys.exit(main())
