"""`untrack_tree`: take lists and dicts of settled data out of the cyclic garbage collector.

Why: every message holds its content in a list, and a list is always a tracked container, so a
full collection in a process holding a large conversation walked one list per message ever
received (50-100 ms at 100,000 messages: `bench/gc.py`). What those lists hold are frozen
`gc=False` structs, which the collector never sees, so such a list cannot close a reference
cycle the collector could break: tracking it buys nothing. Tuples would be untracked by CPython
itself, but storing them would change what `message.content` is (`content == [...]` would turn
false), so the lists stay and are untracked where they are made: in `__post_init__`, which
msgspec also runs when it decodes, converts or replaces a struct.

`untrack` is `PyObject_GC_UnTrack` of the C API (idempotent; a list or dict works the same
untracked, the collector just no longer visits it). On another interpreter it does nothing.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["is_tracked", "untrack", "untrack_tree"]

is_tracked = gc.is_tracked


def _keep(container: object) -> None:
    """No collector lists to leave on this interpreter."""


def _c_untrack() -> Callable[[object], None]:
    if sys.implementation.name != "cpython":
        return _keep
    try:
        import ctypes

        function = ctypes.pythonapi.PyObject_GC_UnTrack
    except (ImportError, AttributeError):  # a CPython built without ctypes
        return _keep
    function.argtypes = (ctypes.py_object,)
    function.restype = None
    return function


untrack: Callable[[object], None] = _c_untrack()
"""Take `container` (a list or dict of untracked values) out of the collector's lists."""


def untrack_tree(value: Any, depth: int = 0) -> bool:
    """Untrack `value` when it is a list or dict, after its nested lists and dicts; whether it
    ends up untracked.

    A container is untracked only when everything in it is: atoms, untracked structs, or
    containers this untracked. So anything else (an object of the caller's, a list nested
    deeper than 100) keeps its container tracked, and no cycle is hidden from the collector.
    A container CPython already left untracked is skipped whole (a dict of strings and
    numbers, the usual tool call arguments, costs one check).
    """
    if not is_tracked(value):
        return True
    kind = type(value)
    if (kind is not dict and kind is not list) or depth > 100:
        return False
    for item in value.values() if kind is dict else value:
        if is_tracked(item) and not untrack_tree(item, depth + 1):
            return False
    untrack(value)
    return True
