"""`convsync demo`: a hub, a worker and a user in one process (`client.demo`)."""

from __future__ import annotations

import argparse
import sys

import anyio

from ..signals import on_signals
from .common import (
    DEFAULT_DB,
    CliError,
    env_setting,
)


async def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo (`client.demo`, imported here: it loads the hub's code)."""
    from ..demo import DemoError, run_demo

    db = args.db if args.db is not None else env_setting("DB", DEFAULT_DB)
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
