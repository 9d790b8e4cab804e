"""The `convsync` command: run a hub, mint tokens, watch, write to, export and import
conversations.

How this works: `main(argv)` parses the command line with one argparse parser per subcommand
and runs the command's coroutine with `asyncio.run`; it returns the exit code instead of
exiting, so tests call it directly. Every failure a user can cause (a bad flag, a malformed
file, a conversation that is not empty, a hub that is not there) ends as one line on stderr:
exit code 2 for input that is wrong as given, 1 when the command was fine but could not be
done. Only bugs give a traceback. The work itself is done by library functions
(`client.transfer`, `client.http`, `client.tail`, `client.demo`) that raise errors with
reasons; the commands (`client.commands`: `serve`, `conversation`, `store`, `demo`) turn them
into lines and exit codes. This module holds the parser and `main`, and nothing imports it.
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
import importlib.metadata
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn

from server.session import is_conversation_id
from sync import ConvsyncError, UsageError
from sync.errors import Refused, sole_exception
from sync.frames import MAX_FRAME

from .commands.common import (
    DEFAULT_DB,
    DEFAULT_PORT,
    DEFAULT_URL,
    CliError,
    hub_url_list,
    port_number,
)
from .commands.conversation import cmd_approve, cmd_delete, cmd_list, cmd_send, cmd_tail
from .commands.demo import cmd_demo
from .commands.serve import cmd_serve, cmd_token
from .commands.store import cmd_backup, cmd_export, cmd_import, cmd_restore
from .http import HubError
from .transfer import (
    ImportRefused,
    TransferError,
)

__all__ = ["CliError", "build_parser", "main"]

# ---------------------------------------------------------------------- arguments


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (and an exit code 2), not a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see {self.prog} --help)", 2, self.prog)


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


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=hub_url_list,
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
        type=port_number,
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
        type=port_number,
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
