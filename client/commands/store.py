"""The commands that move conversations in and out: `export`, `import`, `backup`, `restore`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import anyio

from sync import UsageError

from ..progress import Progress
from ..transfer import (
    ImportRefused,
    export_conversation,
    import_conversation,
)
from .common import (
    CliError,
    hub_urls,
    tls_context,
)


async def cmd_export(args: argparse.Namespace) -> int:
    """Write a conversation's state or snapshot to a file or stdout; a snapshot says on stderr
    what it left out."""
    exported = await export_conversation(
        hub_urls(args)[0],
        args.id,
        format=args.format,
        request_timeout=args.timeout,
        token=args.token,
        ssl=tls_context(args),
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
            hub_urls(args)[0],
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
            ssl=tls_context(args),
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
