"""Parsing the project's own source files in tests, whatever ran earlier in the process.

CPython 3.11 up to 3.11.7 keeps the AST constructor's recursion counter in one
per-interpreter struct (gh-106905, fixed by gh-113035). When the garbage collector runs
during `ast.parse` (it allocates a node object per syntax node) and a finalizer it calls
parses too, the inner parse resets the counter under the outer one, and the outer one fails
with `SystemError: AST constructor recursion depth mismatch`. The finalizer that did it in
this suite was an asyncio task freed with an exception nobody retrieved: the loop logs it
with its traceback, and `traceback` in 3.11 calls `ast.parse` to place its carets. So
`parse` runs with the collector off: no collection, so no finalizer, so no second parse can
start inside it. See docs/design.md ("The suite passes every time").
"""

from __future__ import annotations

import ast
import gc
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """The syntax tree of the Python file at `path` (see `parse_source`)."""
    return parse_source(path.read_text(), str(path))


def parse_source(source: str, filename: str) -> ast.Module:
    """The syntax tree of `source`, parsed with the garbage collector paused (then restored to
    how it was), so no finalizer can run a parse of its own inside this one."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename)
    finally:
        if was_enabled:
            gc.enable()
