"""Three-way merge of text, messages, entries and asides (SPEC 16).

How this works. Two people edited the same thing, each from one `base`. `diff` finds what
each side changed, as hunks over the base's code points (`base[start:stop]` became `text`):
the common prefix and suffix are cut off, and what is left between them is diffed with
Myers' O(ND) algorithm, so a small edit of a large text costs little; then each pure
insertion or deletion is slid to the leftmost place that gives the same text (`_leftmost`),
so that two sides' edits at one point are found at one place. `merge_text` then walks
the hunks of both sides in base order and groups the ones that touch:

- two hunks **touch** when their base ranges overlap, or when one of them is an insertion
  (an empty range) at a point inside or at either end of the other's range (two insertions at
  the same point touch). Two non-empty ranges that only meet end to start do not touch: "ab"
  with "a" changed on one side and "b" on the other merges.
- a group made by one side alone is taken as it is; a group with hunks of both sides merges
  only when both sides made the base's run into the same text (the same edit made twice);
  otherwise the merge is a conflict.

So the merge is symmetric (`merge_text(b, x, y) == merge_text(b, y, x)`), takes every change
of both sides when no two touch, and never drops one silently: it returns `None` instead.

Indexes count code points (what a Python `str` indexes); the JS twin (client/web/lib/merge.js)
counts code points too, never UTF-16 units, and the vectors in `tests/vectors/merge.json` pin
both. When the middle needs more than `_budget(n, m)` edit steps the diff gives up finding the
shortest script and calls the whole middle one hunk: never wrong, only more likely to conflict,
and the cost stays bounded for texts that share nothing.

Messages merge part by part (`merge_message`): text parts (`Text`, a `System` message's text,
a tool call's arguments as their compact JSON text) at character level; any other part, and
any other field, must be unchanged on one side. Different part counts or kinds conflict unless
one side left the message unchanged. A note's text merges likewise (`merge_aside`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from .entries import Aside, Entry
from .messages import AnyMessage, Assistant, System, Text, ToolCall, User

__all__ = ["Hunk", "diff", "merge_aside", "merge_entry", "merge_message", "merge_text"]


class Hunk(NamedTuple):
    """`base[start:stop]` (code points) became `text`."""

    start: int
    stop: int
    text: str


_BUDGET = 1 << 20  # edit steps times text length the middle's diff may take


def _budget(n: int, m: int) -> int:
    """The most edit steps the middle's diff tries before it calls the middle one hunk."""
    return max(64, _BUDGET // (n + m))


def diff(base: str, other: str) -> list[Hunk]:
    """The hunks that make `base` into `other`, in base order, each separated from the next
    by at least one unchanged code point of the base."""
    if base == other:
        return []
    n, m = len(base), len(other)
    head = _common_prefix(base, other)
    tail = _common_suffix(base, other, min(n, m) - head)
    a, b = base[head : n - tail], other[head : m - tail]
    if not a or not b:
        return _leftmost(base, [Hunk(head, n - tail, b)])
    return _leftmost(base, [Hunk(head + s, head + e, t) for s, e, t in _myers(a, b)])


def _leftmost(base: str, hunks: list[Hunk]) -> list[Hunk]:
    """Each pure insertion or deletion slid to the leftmost place that gives the same text,
    short of the hunk before it (with one unchanged code point between).

    The same insertion has many places when the text around it repeats it ("<a><b>" made
    "<a><c><b>": "<c>" after "<a>", or "c><" after "<a><"); each side's diff picks by its own
    common prefix, so two insertions at one point could land apart and interleave. Sliding
    both to one canonical place makes them touch, as they do.
    """
    out: list[Hunk] = []
    floor = 0
    for start, stop, text in hunks:
        if start == stop:  # an insertion: rotate it left while the code point before matches
            while start > floor and base[start - 1] == text[-1]:
                text = base[start - 1] + text[:-1]
                start -= 1
            stop = start
        elif not text:  # a deletion: slide it left while the run stays the same
            while start > floor and base[start - 1] == base[stop - 1]:
                start -= 1
                stop -= 1
        out.append(Hunk(start, stop, text))
        floor = stop + 1
    return out


def _common_prefix(a: str, b: str) -> int:
    """How many code points `a` and `b` share at their start (by halving: slices compare in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, most: int) -> int:
    """How many code points (at most `most`) `a` and `b` share at their end."""
    n, m = len(a), len(b)
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[n - mid : n - lo] == b[m - mid : m - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _myers(a: str, b: str) -> list[Hunk]:
    """The hunks of a shortest edit script from `a` to `b` (both non-empty), by Myers' greedy
    forward search; the whole of `a` as one hunk past the budget. Ties go to a deletion
    first (the path that keeps `x` larger), exactly as the JS twin does."""
    n, m = len(a), len(b)
    limit = min(n + m, _budget(n, m))
    offset = limit + 1
    v = [0] * (2 * limit + 3)
    trace: list[list[int]] = []
    for d in range(limit + 1):
        trace.append(v[offset - d - 1 : offset + d + 2])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]
            else:
                x = v[offset + k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[offset + k] = x
            if x >= n and y >= m:
                return _hunks(a, b, _matches(trace, n, m))
    return [Hunk(0, n, b)]


def _matches(trace: list[list[int]], n: int, m: int) -> list[tuple[int, int]]:
    """The matched (x, y) pairs of the path found, in order, read back from `trace` (`trace[d]`
    holds `v[-d-1 .. d+1]` as it was before step `d`)."""
    matched: list[tuple[int, int]] = []
    x, y = n, m
    for d in range(len(trace) - 1, -1, -1):
        v = trace[d]
        k = x - y
        # v[j] here is the V entry of diagonal j - d - 1.
        if k == -d or (k != d and v[k - 1 + d + 1] < v[k + 1 + d + 1]):
            prev_k = k + 1
        else:
            prev_k = k - 1
        prev_x = v[prev_k + d + 1] if d > 0 else 0
        prev_y = prev_x - prev_k if d > 0 else 0
        while x > prev_x and y > prev_y:
            x -= 1
            y -= 1
            matched.append((x, y))
        x, y = prev_x, prev_y
    matched.reverse()
    return matched


def _hunks(a: str, b: str, matched: list[tuple[int, int]]) -> list[Hunk]:
    """The runs between matched pairs, as hunks."""
    hunks: list[Hunk] = []
    px, py = 0, 0
    for x, y in [*matched, (len(a), len(b))]:
        if x > px or y > py:
            hunks.append(Hunk(px, x, b[py:y]))
        px, py = x + 1, y + 1
    return hunks


def _touch(h: Hunk, lo: int, hi: int) -> bool:
    """Whether hunk `h` touches the base range `[lo, hi)` (see the module's docstring)."""
    if h.start < hi and lo < h.stop:
        return True
    return (h.start == h.stop or lo == hi) and h.start <= hi and lo <= h.stop


def _apply(base: str, lo: int, hi: int, hunks: list[Hunk]) -> str:
    """`base[lo:hi]` with `hunks` (all within it, in order) applied."""
    out: list[str] = []
    at = lo
    for h in hunks:
        out.append(base[at : h.start])
        out.append(h.text)
        at = h.stop
    out.append(base[at:hi])
    return "".join(out)


def merge_text(base: str, ours: str, theirs: str) -> str | None:
    """`base` with the changes of both `ours` and `theirs`, or `None` when two of them touch
    and differ (a conflict). Symmetric in `ours` and `theirs`."""
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    sides = (diff(base, ours), diff(base, theirs))
    at = [0, 0]
    out: list[str] = []
    done = 0
    while at[0] < len(sides[0]) or at[1] < len(sides[1]):
        first = (
            0
            if at[1] >= len(sides[1])
            or (at[0] < len(sides[0]) and sides[0][at[0]].start <= sides[1][at[1]].start)
            else 1
        )
        seed = sides[first][at[first]]
        at[first] += 1
        group: tuple[list[Hunk], list[Hunk]] = ([], [])
        group[first].append(seed)
        lo, hi = seed.start, seed.stop
        grown = True
        while grown:
            grown = False
            for side in (0, 1):
                hunks = sides[side]
                while at[side] < len(hunks) and _touch(hunks[at[side]], lo, hi):
                    h = hunks[at[side]]
                    group[side].append(h)
                    lo, hi = min(lo, h.start), max(hi, h.stop)
                    at[side] += 1
                    grown = True
        out.append(base[done:lo])
        if group[0] and group[1]:
            mine, yours = _apply(base, lo, hi, group[0]), _apply(base, lo, hi, group[1])
            if mine != yours:
                return None
            out.append(mine)
        else:
            out.append(_apply(base, lo, hi, group[0] or group[1]))
        done = hi
    out.append(base[done:])
    return "".join(out)


class _Clash(Exception):
    """Two sides changed the same thing differently (internal: the merge returns `None`)."""


def _pick(base: Any, ours: Any, theirs: Any) -> Any:
    """The side that changed (a value unchanged on one side), or `_Clash`."""
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    raise _Clash


def _text(base: str, ours: str, theirs: str) -> str:
    merged = merge_text(base, ours, theirs)
    if merged is None:
        raise _Clash
    return merged


_json_encode = msgspec.json.encode
_json_decode = msgspec.json.decode


def _arguments(base: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any]) -> Any:
    """A tool call's arguments merged as their compact JSON text; a clash when the merged
    text is not a JSON object."""
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    texts = [_json_encode(value).decode() for value in (base, ours, theirs)]
    merged = _text(*texts)
    try:
        value = _json_decode(merged)
    except msgspec.DecodeError:
        raise _Clash from None
    if not isinstance(value, dict):
        raise _Clash
    return value


def _part(base: Any, ours: Any, theirs: Any) -> Any:
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    if not (type(base) is type(ours) is type(theirs)):
        raise _Clash
    if isinstance(base, Text):
        return Text(_text(base.text, ours.text, theirs.text))
    if isinstance(base, ToolCall):
        return ToolCall(
            _pick(base.id, ours.id, theirs.id),
            _pick(base.name, ours.name, theirs.name),
            _arguments(base.arguments, ours.arguments, theirs.arguments),
            provider_data=_pick(base.provider_data, ours.provider_data, theirs.provider_data),
        )
    raise _Clash  # any other part must be unchanged on one side


def _message(base: AnyMessage, ours: AnyMessage, theirs: AnyMessage) -> AnyMessage:
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    if not (type(base) is type(ours) is type(theirs)):
        raise _Clash
    if isinstance(base, System):
        assert isinstance(ours, System) and isinstance(theirs, System)
        return System(_text(base.content, ours.content, theirs.content))
    assert isinstance(base, User | Assistant)
    assert isinstance(ours, User | Assistant) and isinstance(theirs, User | Assistant)
    parts: tuple[list[Any], list[Any], list[Any]] = (base.content, ours.content, theirs.content)
    if not len(parts[0]) == len(parts[1]) == len(parts[2]):
        raise _Clash
    content = [_part(b, o, t) for b, o, t in zip(*parts, strict=True)]
    if isinstance(base, User):
        return User(content)
    assert isinstance(ours, Assistant) and isinstance(theirs, Assistant)
    return Assistant(
        content,
        stop=_pick(base.stop, ours.stop, theirs.stop),
        origin=_pick(base.origin, ours.origin, theirs.origin),
        usage=_pick(base.usage, ours.usage, theirs.usage),
    )


def merge_message(base: AnyMessage, ours: AnyMessage, theirs: AnyMessage) -> AnyMessage | None:
    """`base` with the changes of both sides, part by part, or `None` on a conflict.
    Symmetric in `ours` and `theirs`."""
    try:
        return _message(base, ours, theirs)
    except _Clash:
        return None


def _newer(base: Any, log: Any, pending: Any) -> Any:
    """Who made it or where it came from: the pending side's when it changed that (its edit is
    the one that puts the merged entry there), else the log's."""
    return pending if pending != base else log


def merge_entry(base: Entry, log: Entry, pending: Entry) -> Entry | None:
    """The entry `pending` (a replica's edit of `base`) becomes on a log that made `base` into
    `log`: its id, the messages merged, and the author and source of the pending side when it
    changed them (else the log's); `None` when the messages conflict."""
    message = merge_message(base.message, log.message, pending.message)
    if message is None:
        return None
    return Entry(
        message,
        pending.id,
        _newer(base.author, log.author, pending.author),
        _newer(base.source_id, log.source_id, pending.source_id),
    )


def _note(base: Any, log: Any, pending: Any) -> Any:
    """A note's value merged: its text at character level, every other key unchanged on one
    side (a key dropped on one side counts as a change)."""
    values = (base, log, pending)
    if not all(isinstance(v, dict) and isinstance(v.get("text"), str) for v in values):
        return _pick(base, log, pending)
    merged: dict[str, Any] = {}
    missing = object()
    for key in [*log, *(k for k in pending if k not in log)]:
        values = (base.get(key, missing), log.get(key, missing), pending.get(key, missing))
        value = _text(*values) if key == "text" else _pick(*values)
        if value is not missing:
            merged[key] = value
    return merged


def merge_aside(base: Aside, log: Aside, pending: Aside) -> Aside | None:
    """The aside `pending` (a replica's replacement of `base`) becomes on a log that made
    `base` into `log`: a note's text merged at character level, every other field unchanged on
    one side (the author as `merge_entry` takes it); `None` on a conflict."""
    try:
        kind = _pick(base.kind, log.kind, pending.kind)
        value = (
            _note(base.value, log.value, pending.value)
            if kind == "note" == base.kind
            else _pick(base.value, log.value, pending.value)
        )
        return Aside(
            kind,
            _pick(base.after, log.after, pending.after),
            _newer(base.author, log.author, pending.author),
            value,
            _pick(base.saved, log.saved, pending.saved),
        )
    except _Clash:
        return None
