"""`untrack_tree`: take lists and dicts of settled data out of the cyclic garbage collector.

Why: every message holds its content in a list, and a list is always a tracked container, so a
full collection in a process holding a large conversation walked one list per message ever
received (50-100 ms at 100,000 messages: `bench/gc.py`). What those lists hold are frozen
`gc=False` structs, which the collector never sees, so such a list cannot close a reference
cycle the collector could break: tracking it buys nothing. Tuples would be untracked by CPython
itself, but storing them would change what `message.content` is (`content == [...]` would turn
false), so the lists stay and are untracked where they are made: in `__post_init__`, which
msgspec also runs when it decodes, converts or replaces a struct.

`untrack_at` calls `PyObject_GC_UnTrack` of the C API (idempotent; a list or dict works the same
untracked, the collector just no longer visits it). On another interpreter it does nothing.
The worst an untracked container can do is hide a cycle: a caller who later puts into a list
it handed over (tool call arguments, an aside value) an object that refers back to it leaks
that cycle; nothing is ever freed early.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["is_tracked", "untrack_at", "untrack_tree"]

is_tracked = gc.is_tracked


def _keep(address: int) -> None:
    """No collector lists to leave on this interpreter."""


def _c_untrack() -> Callable[[int], None]:
    if sys.implementation.name != "cpython":
        return _keep
    try:
        import ctypes

        address = ctypes.cast(ctypes.pythonapi.PyObject_GC_UnTrack, ctypes.c_void_p).value
    except (ImportError, AttributeError):  # a CPython built without ctypes
        return _keep
    if address is None:
        return _keep
    # PYFUNCTYPE keeps the GIL held, as a C API call needs. Passing `id(obj)` (the object's
    # address in CPython) as a void pointer costs a third of converting a `py_object`, and
    # this runs once per message decoded.
    prototype = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
    return prototype(address)


untrack_at: Callable[[int], None] = _c_untrack()
"""`untrack_at(id(container))` takes `container` (a list or dict whose items are all
untracked) out of the collector's lists. The caller holds a reference to it throughout."""


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
    untrack_at(id(value))
    return True
