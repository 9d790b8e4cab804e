"""`on_signals`: call a function on some signals while inside a block, on the running loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator, Sequence

__all__ = ["on_signals"]


@contextlib.contextmanager
def on_signals(names: Sequence[str], callback: Callable[[], None]) -> Iterator[None]:
    """Call `callback` on each signal named in `names` (`"SIGINT"`, `"SIGWINCH"`, ...) while
    inside, through the running asyncio loop. A signal this platform lacks is skipped, and so
    is every one where the loop cannot take handlers (off the main thread)."""
    loop = asyncio.get_running_loop()
    installed: list[int] = []
    for name in names:
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        try:
            loop.add_signal_handler(sig, callback)
            installed.append(sig)
        except (ValueError, RuntimeError, NotImplementedError):
            pass
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
