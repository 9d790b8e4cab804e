"""Frames built from pre-encoded bytes, the one byte-budget chunker, and the frame sizes.

How this works: the hub holds every record as the JSON bytes the codec produced once, and the
replica measures each record it pushes as it encodes it. Both build their frames here by
wrapping those bytes in `msgspec.Raw`, so a record is encoded once however many frames carry it,
and nothing is decoded to be sent again. `runs` is the one chunker: it splits encoded items into
runs whose frames stay under a byte budget. Hub catch-up, hub state transfer, replica pushes
and CLI imports all size their frames with it and with the constants below.

Two sizes are at play. The frame limit (`max_frame`, `MAX_FRAME` by default) is a hard cap:
the largest frame either side sends or takes, so it bounds the largest record (a pasted
screenshot). `FRAME_FILL` is what a batch of records is filled to: catch-up, broadcast and
push batches stop there, and only a record larger than that goes alone in a frame of its own,
up to the limit. So a high limit lets big records through without making every batch big.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final

import msgspec

from .changes import ConversationState
from .codec import encode
from .entries import Halt, SavedAside
from .protocol import PushOrigin

__all__ = [
    "FRAME_FILL",
    "MAX_FRAME",
    "MIN_FRAME",
    "PUSH_OVERHEAD",
    "RECORDS_OVERHEAD",
    "RECORD_SLACK",
    "Binary",
    "fill_budget",
    "iter_state_frames",
    "push_frame",
    "records_frame",
    "records_frames",
    "runs",
    "state_frames",
]

MAX_FRAME: Final = 16 << 20
"""The default frame limit in bytes, on both sides (`HubConfig.max_frame`, `connect`): 16 MiB,
so one record may carry a screenshot of a few MiB as base64."""

FRAME_FILL: Final = 1 << 20
"""The bytes a frame of several records (or of state entries) is filled to, at most; a single
record larger than that goes alone, up to the frame limit."""

MIN_FRAME: Final = 4096
"""The smallest frame limit a hub accepts as a setting."""

PUSH_OVERHEAD: Final = 128
"""Bytes of a `push` frame around its records: seq, lineage and revision of up to 19 digits."""

RECORD_SLACK: Final = 4096
"""Bytes of a push frame around one push record's entries (the push header, the record's
change type, author and time): what an import leaves free when it sizes a record."""

RECORDS_OVERHEAD: Final = 1024
"""Bytes of a `records` frame around its records: `from` and an `origin` whose client id is up
to 128 characters, each escaped to at most 6 bytes in JSON."""


class _RecordsOut(
    msgspec.Struct, frozen=True, tag_field="type", tag="records", rename={"from_": "from"}
):
    from_: int
    records: list[msgspec.Raw]
    origin: PushOrigin | None = None


class _PushOut(msgspec.Struct, frozen=True, tag_field="type", tag="push"):
    seq: int
    lineage: int
    revision: int
    records: list[msgspec.Raw]


class _StateOut(msgspec.Struct, frozen=True, tag_field="type", tag="state"):
    lineage: int
    revision: int
    state: msgspec.Raw
    more: bool


class _EntriesOut(msgspec.Struct, frozen=True, tag_field="type", tag="entries"):
    entries: msgspec.Raw
    more: bool


class _StateBody(msgspec.Struct, frozen=True):
    """A `ConversationState` whose entries are already encoded (MessagePack)."""

    entries: msgspec.Raw
    asides: list[SavedAside]
    halt: Halt | None
    retired: list[str]


class Binary(bytes):
    """A frame to send as a binary websocket frame: a `state` or `entries` message in
    MessagePack (`Hello.state_format`). Every other frame is JSON, sent as text."""

    __slots__ = ()


_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()


def records_frame(from_: int, records: Sequence[bytes], origin: PushOrigin | None = None) -> bytes:
    """A `records` message from records already encoded (log revisions `from_ + 1 ..`)."""
    return _encoder.encode(_RecordsOut(from_, [msgspec.Raw(r) for r in records], origin))


def records_frames(
    from_: int, records: Sequence[bytes], origin: PushOrigin | None, max_frame: int
) -> list[bytes]:
    """`records` messages of consecutive `from` carrying `records`, each filled up to
    `min(max_frame, FRAME_FILL)` (a record larger than that goes alone; one larger than
    `max_frame` too, and a caller sends such a log as a state)."""
    budget = fill_budget(max_frame, RECORDS_OVERHEAD)
    # One record (`runs` sends it alone, whatever its size), or a batch that fits: one frame.
    if len(records) == 1 or sum(map(len, records)) + len(records) <= budget:
        return [records_frame(from_, records, origin)]
    frames = []
    start = from_
    for run in runs(records, budget):
        frames.append(records_frame(start, run, origin))
        start += len(run)
    return frames


def push_frame(seq: int, lineage: int, revision: int, records: Sequence[bytes]) -> bytes:
    """A `push` message from records already encoded."""
    return _encoder.encode(_PushOut(seq, lineage, revision, [msgspec.Raw(r) for r in records]))


def fill_budget(max_frame: int, overhead: int) -> int:
    """The bytes of records a frame of several is filled to: `FRAME_FILL` or `max_frame`,
    whichever is smaller, less the frame's `overhead`."""
    return min(max_frame, FRAME_FILL) - overhead


def runs(
    items: Iterable[bytes], budget: int, *, max_items: int | None = None
) -> Iterator[list[bytes]]:
    """Split `items` into consecutive runs whose sizes, plus a comma each, fit `budget`.

    Every run holds at least one item: an item larger than `budget` comes alone (the caller
    decides what to do with it). `items` is consumed lazily, one item past the run yielded,
    so a caller that encodes as it goes encodes only what it sends (and one more).
    """
    run: list[bytes] = []
    size = 0
    for item in items:
        if run and (size + len(item) + 1 > budget or len(run) == max_items):
            yield run
            run, size = [], 0
        run.append(item)
        size += len(item) + 1
    if run:
        yield run


def state_frames(
    lineage: int,
    revision: int,
    state: ConversationState,
    max_frame: int,
    state_format: str | None = None,
) -> list[bytes]:
    """The whole state as a `state` message, then as many `entries` messages as it needs,
    each filled up to `min(max_frame, FRAME_FILL)` (the last one says `"more": false`; an
    entry larger than that goes alone). Asides, halt and retired ids travel in the first
    frame. `state_format` `msgpack`: the same messages in MessagePack, as `Binary` frames
    (JSON when the state holds what MessagePack cannot: an integer past 64 bits in an
    aside's value, or, for that frame alone, in an entry)."""
    return list(iter_state_frames(lineage, revision, state, max_frame, state_format))


def iter_state_frames(
    lineage: int,
    revision: int,
    state: ConversationState,
    max_frame: int,
    state_format: str | None = None,
) -> Iterator[bytes]:
    """`state_frames`, each frame encoded only when the one before it was taken: a hub
    writes the first while it encodes the next (and other rooms run in between). `state`
    must not change meanwhile (`Conversation.state()` is a snapshot)."""
    budget = fill_budget(max_frame, RECORDS_OVERHEAD)
    if state_format == "msgpack":
        frames = _msgpack_state_frames(lineage, revision, state, budget)
        try:
            first = next(frames)  # what MessagePack cannot hold here sends it all as JSON
        except (OverflowError, TypeError):
            pass
        else:
            yield first
            yield from frames
            return
    rest = b',"asides":%s,"halt":%s,"retired":%s}' % (
        encode(state.asides),
        encode(state.halt),
        encode(state.retired),
    )
    head = _encoder.encode(_StateOut(lineage, revision, msgspec.Raw(b"{}"), True))
    arrays = _encoded_arrays(state.entries, budget - len(head) - len(rest), budget)
    array, more = next(arrays)
    first_body = b'{"entries":' + array + rest
    yield _encoder.encode(_StateOut(lineage, revision, msgspec.Raw(first_body), more))
    for array, more in arrays:
        yield _encoder.encode(_EntriesOut(msgspec.Raw(array), more))


def _msgpack_state_frames(
    lineage: int, revision: int, state: ConversationState, budget: int
) -> Iterator[bytes]:
    """`iter_state_frames` in MessagePack: the same messages, each frame `Binary`. The first
    raises what MessagePack cannot hold in it; a later run of entries it cannot hold goes as
    JSON `entries` frames (a replica tells the two apart per frame)."""
    pack = _msgpack_encoder.encode
    rest = _StateBody(msgspec.Raw(pack([])), state.asides, state.halt, state.retired)
    head = len(pack(_StateOut(lineage, revision, msgspec.Raw(pack(rest)), True)))
    arrays = _encoded_arrays(state.entries, budget - head, budget, pack, fallback=encode)
    array, more = next(arrays)
    body = msgspec.structs.replace(rest, entries=msgspec.Raw(array))
    yield Binary(pack(_StateOut(lineage, revision, msgspec.Raw(pack(body)), more)))
    for array, more in arrays:
        if array[:1] == b"[":  # JSON (`fallback`): a MessagePack array never starts so
            yield _encoder.encode(_EntriesOut(msgspec.Raw(array), more))
        else:
            yield Binary(pack(_EntriesOut(msgspec.Raw(array), more)))


def _encoded_arrays(
    items: Sequence[object],
    first_budget: int,
    budget: int,
    encode: Callable[[object], bytes] = encode,
    fallback: Callable[[object], bytes] | None = None,
) -> Iterator[tuple[bytes, bool]]:
    """`items` encoded (JSON unless `encode` says otherwise) as consecutive arrays, the first
    at most `first_budget` bytes and the others at most `budget` (an item larger than that
    goes alone), each with whether more follow; an array is encoded when it is taken. Each
    array is encoded in one call, sized from a sample, so the cost is about one encoding of
    everything. Past the first array, a run `encode` cannot hold (OverflowError, TypeError)
    is encoded with `fallback`, if given."""
    count_all = len(items)
    if not count_all:
        yield encode([]), False
        return
    sample = min(64, count_all)
    try:
        per_item = max(1, len(encode(list(items[:sample]))) // sample)
    except (OverflowError, TypeError):
        if fallback is None:
            raise
        per_item = max(1, len(fallback(list(items[:sample]))) // sample)
    start = 0
    limit = first_budget
    while start < count_all:
        count = max(1, min(count_all - start, int(limit * 0.9) // per_item))
        coder = encode
        while True:
            try:
                data = coder(list(items[start : start + count]))
            except (OverflowError, TypeError):
                if fallback is None or start == 0 or coder is fallback:
                    raise
                coder = fallback
                continue
            if len(data) <= limit or count == 1:
                break
            count = max(1, count // 2)
        start += count
        limit = budget
        yield data, start < count_all
