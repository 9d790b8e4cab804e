"""The commands on one conversation or the list of them: `tail`, `send`, `approve`, `list`,
`delete`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

import anyio

from sync import Message, UsageError

from ..http import HubError
from ..signals import on_signals
from ..tail import tail
from ..transfer import (
    TransferError,
    connect_checked,
    flush_edits,
)
from .common import (
    CliError,
    hub_urls,
    tls_context,
)


async def cmd_tail(args: argparse.Namespace) -> int:
    """Show a conversation, live until SIGINT/SIGTERM, or once."""
    out = sys.stdout
    urls = hub_urls(args)
    async with connect_checked(
        urls, args.id, connect_timeout=args.timeout, token=args.token, ssl=tls_context(args)
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
        hub_urls(args),
        args.id,
        connect_timeout=args.timeout,
        client=client,
        token=args.token,
        ssl=tls_context(args),
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
        hub_urls(args),
        args.id,
        connect_timeout=args.timeout,
        token=args.token,
        ssl=tls_context(args),
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
    from .. import dashboard

    if args.limit > 1000:
        raise CliError("--limit: 1 to 1000", 2)
    if args.after is not None and args.order != "id":
        raise CliError("--after pages by id: it goes with --order id", 2)
    url = hub_urls(args)[0]
    page = {"prefix": args.prefix, "order": args.order, "after": args.after, "limit": args.limit}
    out = sys.stdout
    if not args.watch:
        listing = await dashboard.list_conversations(
            url, **page, token=args.token, request_timeout=args.timeout, ssl=tls_context(args)
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
        url, **page, token=args.token, connect_timeout=args.timeout, ssl=tls_context(args)
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
    from .. import http

    if bool(args.ids) == (args.idle is not None):
        raise CliError("give conversation ids or --idle DAYS (one of the two)", 2)
    if args.dry_run and args.idle is None:
        raise CliError("--dry-run goes with --idle DAYS", 2)
    url = hub_urls(args)[0]
    options: dict[str, Any] = {"token": args.token, "ssl": tls_context(args)}
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
