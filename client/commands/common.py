"""What every command of `convsync` shares: the one-line error, defaults, the hub url, TLS."""

from __future__ import annotations

import argparse
import os
import ssl

from ..replica import url_problem

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


def env_setting(name: str, default: str) -> str:
    return os.environ.get(f"CONVSYNC_{name}", default)


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is not in 0..65535")
    return port


def hub_url(text: str) -> str:
    problem = url_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text.rstrip("/")


def hub_url_list(text: str) -> list[str]:
    """One hub url, or several separated by commas (hubs sharing one database)."""
    return [hub_url(part.strip()) for part in text.split(",") if part.strip()] or [hub_url(text)]


def hub_urls(args: argparse.Namespace) -> list[str]:
    """The hubs `--url` named (repeated or comma-separated), else `CONVSYNC_URL`'s."""
    given: list[str] | None = args.url
    if given:
        return given
    try:
        return hub_url_list(env_setting("URL", DEFAULT_URL))
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"CONVSYNC_URL: {exc}", 2) from None


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context trusting `--ca-file`, or None (the system's CAs)."""
    if args.ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=args.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise CliError(f"cannot read the CA file {args.ca_file}: {exc}", 2) from exc
