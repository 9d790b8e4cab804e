"""Export a conversation to a file's bytes, import a file into a conversation.

How this works: `export_conversation` reads the hub's copy over HTTP (`client.http`) and
encodes it as its whole state (the default: entries with ids and authors, asides, halt, retired
ids) or as a snapshot v1 (messages and pins only; `snapshot_leaves_out` says what that drops).
`import_conversation` reads a state, a snapshot v1 or a hub answer, told apart by their keys;
it checks everything it can before touching the hub (JSON, the shape, every key, the schema,
tool-call pairing, each message against the frame limit), then connects a replica. An empty
conversation gets the retired ids, then the entries as push records cut to fit one frame each
(`batches`), one acknowledged batch at a time with a progress callback after each, then the
asides and the halt. A conversation that is not empty is refused unless `replace=True`, which
sends one reset record (that record must fit one frame).

Errors: `ImportRefused` (the input or the target cannot take this import as given; nothing was
sent), `TransferError` (the hub refused or did not answer in time; `imported` says how many
messages it took before), `HubError` (the hub is not there, or has no such conversation).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from ssl import SSLContext
from typing import IO, Literal, NamedTuple

import anyio
import msgspec
from msgspec.inspect import ListType, StructType, Type, UnionType, type_info

from sync import (
    AsideChange,
    Assistant,
    ChangeRecord,
    Conversation,
    ConversationState,
    ConvsyncError,
    Entry,
    HaltChange,
    Push,
    Reset,
    decode,
    encode,
)
from sync.compact import PIN_KIND
from sync.entries import PINS_KIND, TURN_KIND
from sync.frames import MAX_FRAME, RECORD_SLACK, fill_budget, runs
from sync.snapshot import ConversationSnapshot
from sync.strict import strict_violation

from .http import HubError, HubView, check_hub, fetch_conversation
from .replica import Replica, connect
from .session import Conflict

__all__ = [
    "BATCH",
    "Exported",
    "ImportRefused",
    "Imported",
    "TransferError",
    "batches",
    "connect_checked",
    "encode_conversation",
    "export_conversation",
    "flush_edits",
    "import_conversation",
    "read_conversation",
    "snapshot_leaves_out",
]

# Chunking of an import into push records. (The frame constants may move to a module of their
# own in `sync/`; these two are the only ones here.)
BATCH = 500  # messages per push record when importing

ExportFormat = Literal["snapshot", "state"]
ImportFormat = Literal["auto", "snapshot", "state"]
ProgressCallback = Callable[[int, int], object]
"""Called as `progress(done, total)` with the messages imported so far and in all."""


class TransferError(ConvsyncError):
    """An import could not be completed: the hub refused a record (`refused`) or did not
    acknowledge in time (`timeout`).

    Attributes:
        imported: messages the hub took before the failure (0: the conversation is as it was,
            unless the failure was in the asides after every message went in).
    """

    def __init__(self, reason: str, message: str, imported: int = 0) -> None:
        super().__init__(reason, message)
        self.imported = imported


class ImportRefused(TransferError):
    """The input, or the target conversation, cannot take this import as given; nothing was
    sent. Reasons: `unreadable`, `bad_file`, `wrong_format` (a valid file of another format
    than the one asked for), `unpairable`, `too_large`, `not_empty`."""


class Exported(NamedTuple):
    """A conversation written out, and where the hub's log stood when it was read."""

    data: bytes
    """The JSON document (no trailing newline)."""
    lineage: int
    revision: int
    messages: int
    left_out: tuple[str, ...] = ()
    """What the format could not hold (a snapshot's `snapshot_leaves_out`; a state: none)."""


class Imported(NamedTuple):
    """What an import did."""

    messages: int
    asides: int
    revision: int
    """The log's revision once the hub took everything."""
    replaced: bool
    """True when a conversation that was not empty was replaced with one reset record."""


# ---------------------------------------------------------------------- export

PIN_KINDS = (PINS_KIND, PIN_KIND)  # a snapshot keeps pins in its mask


def encode_conversation(conversation: Conversation, format: ExportFormat = "state") -> bytes:
    """`conversation` as its whole state or as a snapshot v1 document (JSON, no newline)."""
    if format == "state":
        return encode(conversation)
    if format == "snapshot":
        return ConversationSnapshot.from_conversation(conversation).encode()
    raise ValueError(f"no export format {format!r} (state or snapshot)")


def _plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {words or word + 's'}"


def snapshot_leaves_out(conversation: Conversation) -> list[str]:
    """What a snapshot v1 of `conversation` would not hold, in words (empty when it would lose
    nothing): entry ids, authors and source ids, the replies' token usage, asides other than
    the pins (turn records, notes, others by kind), the halt and the retired ids."""
    state = conversation.state()
    left_out: list[str] = []
    if state.entries:
        left_out.append("entry ids")  # an import mints new ones
    authored = sum(entry.author is not None for entry in state.entries)
    if authored:
        left_out.append(f"the authors of {_plural(authored, 'entry', 'entries')}")
    sourced = sum(entry.source_id is not None for entry in state.entries)
    if sourced:
        left_out.append(f"the source ids of {_plural(sourced, 'entry', 'entries')}")
    used = sum(
        isinstance(e.message, Assistant) and e.message.usage is not None for e in state.entries
    )
    if used:
        left_out.append(f"the token usage of {_plural(used, 'reply', 'replies')}")
    kinds = Counter(saved.kind for saved in state.asides if saved.kind not in PIN_KINDS)
    for kind, count in kinds.items():
        if kind == TURN_KIND:
            left_out.append(_plural(count, "turn record"))
        elif kind == "note":
            left_out.append(_plural(count, "note"))
        else:
            left_out.append(_plural(count, f"{kind!r} aside"))
    if state.halt is not None:
        left_out.append(f"the halt ({state.halt.value})")
    if state.retired:
        left_out.append(_plural(len(state.retired), "retired id"))
    return left_out


async def export_conversation(
    url: str,
    conversation_id: str,
    *,
    format: ExportFormat = "state",
    request_timeout: float = 10.0,
    token: str | None = None,
    ssl: SSLContext | None = None,
) -> Exported:
    """Read a conversation from the hub at ws(s) `url` and encode it (with `token`, for a
    hub with auth: it needs `read` on the conversation).

    `format` is `state` (the default: everything the log holds, so an import gives an equal
    conversation) or `snapshot` (snapshot v1, the portable form: messages and pins only;
    `Exported.left_out` then says what it dropped).

    Returns:
        The document (`Exported.data`; write it with a newline after it to get what
        `convsync export` writes), with the lineage, revision and message count it came from.

    Raises:
        HubError: `no_conversation` when the hub has no log for it, or the hub could not be
            read (see `fetch_conversation`).
    """
    fetched = await fetch_conversation(
        url, conversation_id, request_timeout=request_timeout, token=token, ssl=ssl
    )
    conversation = fetched.conversation
    data = encode_conversation(conversation, format)
    left_out = tuple(snapshot_leaves_out(conversation)) if format == "snapshot" else ()
    return Exported(data, fetched.lineage, fetched.revision, len(conversation), left_out)


# ---------------------------------------------------------------------- reading a file


# The three documents an import reads, told apart by their keys (no two share one).
_Shape = Literal["snapshot", "state", "hub"]
_SHAPES: dict[_Shape, tuple[str, type]] = {
    "state": ("a state (entries, asides, halt, retired)", ConversationState),
    "snapshot": ("a snapshot v1 (version, messages, pinned)", ConversationSnapshot),
    "hub": ("a hub answer (lineage, revision, state)", HubView),
}
_STATE_KEYS = frozenset(field.encode_name for field in msgspec.structs.fields(ConversationState))


def _shape_of(top: dict[str, object]) -> _Shape | None:
    """Which document a JSON object is meant to be, by its keys; None: none of them."""
    if "version" in top:
        return "snapshot"
    if "state" in top:
        return "hub"
    if _STATE_KEYS & top.keys():
        return "state"
    return None


def _found(top: dict[str, object]) -> str:
    if not top:
        return "found an empty object"
    keys = ", ".join(repr(key) for key in list(top)[:5]) + (", ..." if len(top) > 5 else "")
    hint = ""
    if "messages" in top:
        # The shape of a chat API's request body: close to a snapshot, but not one.
        hint = " (a snapshot v1 also needs version 1 and a pinned flag per message)"
    return f"found keys {keys}{hint}"


def _expected(format: ImportFormat) -> str:
    if format == "auto":
        state, snapshot, hub = (described for described, _ in _SHAPES.values())
        return f"{state}, {snapshot} or {hub}"
    return _SHAPES[format][0]


# A key check of decoded JSON: None when every key is known, else the path to the first unknown
# key as segments from the inside out (joined only on failure: the check runs on every entry).
_KeyCheck = Callable[[object], list[str] | None]


def _key_check(info: Type) -> _KeyCheck | None:
    """The check of the keys a value of type `info` may hold, or None when the type holds no
    struct (scalars; free-form values such as `Any`, a tool call's arguments or an aside's
    value, which may hold any key). It runs on a value that decoded as that type, so it
    need not report shape mismatches: the decoder did."""
    if isinstance(info, StructType):
        return _struct_check(info)
    if isinstance(info, ListType):
        item_check = _key_check(info.item_type)
        if item_check is None:
            return None

        def check_list(value: object) -> list[str] | None:
            for at, item in enumerate(value if isinstance(value, list) else ()):
                found = item_check(item)
                if found is not None:
                    found.append(f"[{at}]")
                    return found
            return None

        return check_list
    if isinstance(info, UnionType):
        structs = [t for t in info.types if isinstance(t, StructType)]
        lists = [check for t in info.types if isinstance(t, ListType) if (check := _key_check(t))]
        # A tagged union picks its member by the tag; an optional struct has one member.
        tag = structs[0].tag_field if structs else None
        members = {t.tag: _struct_check(t) for t in structs}
        if not members and not lists:
            return None

        def check_union(value: object) -> list[str] | None:
            if isinstance(value, dict) and members:
                member = members.get(value.get(tag)) if tag is not None else members[None]
                return None if member is None else member(value)
            if isinstance(value, list) and lists:
                return lists[0](value)
            return None

        return check_union
    return None


def _struct_check(info: StructType) -> _KeyCheck:
    fields = {field.encode_name: _key_check(field.type) for field in info.fields}
    tag = info.tag_field

    def check_struct(value: object) -> list[str] | None:
        if not isinstance(value, dict):
            return None
        for key, item in value.items():
            if key not in fields:
                if key == tag:
                    continue
                return [f".{key}"]
            field_check = fields[key]
            if field_check is not None:
                found = field_check(item)
                if found is not None:
                    found.append(f".{key}")
                    return found
        return None

    return check_struct


@functools.cache
def _document_check(type_: type) -> _KeyCheck:
    info = type_info(type_)
    assert isinstance(info, StructType)
    return _struct_check(info)


def _unknown_key(value: object, type_: type) -> str | None:
    """The path (as msgspec writes it, `$.a[0].b`) of the first key in decoded JSON `value`
    that the document type `type_` has no field for, or None."""
    found = _document_check(type_)(value)
    return None if found is None else "$" + "".join(reversed(found))


def read_conversation(
    data: bytes, format: ImportFormat = "auto", where: str = "input"
) -> Conversation:
    """The conversation a state, snapshot v1 or hub answer document holds.

    The document is told apart by its keys: `version` makes a snapshot v1, `state` a hub
    answer (`{"lineage","revision","state"}`, read as its state), any of `entries`, `asides`,
    `halt`, `retired` a state. `format` is `auto` (take what is found), `state` (a state or a
    hub answer) or `snapshot`. Every key must be one the format knows, at any depth but inside
    free-form values: a key that would be dropped silently is an error instead. `where` names
    the input in error messages.

    Raises:
        ImportRefused: `bad_file` when the data is not JSON, not any of the documents, holds
            an unknown key or is not a valid document of its kind; `wrong_format` when it is
            a document of another format than the `format` asked for.
    """
    try:
        top = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ImportRefused("bad_file", f"{where}: not JSON: {exc}") from None
    except RecursionError:
        raise ImportRefused("bad_file", f"{where}: not JSON: nested too deeply") from None
    if not isinstance(top, dict):
        raise ImportRefused(
            "bad_file", f"{where}: expected a JSON object, not {type(top).__name__}"
        )
    shape = _shape_of(top)
    if shape is None:
        raise ImportRefused("bad_file", f"{where}: {_found(top)}; expected {_expected(format)}")
    if format != "auto" and format != ("state" if shape == "hub" else shape):
        raise ImportRefused(
            "wrong_format", f"{where}: expected {_expected(format)}, found {_SHAPES[shape][0]}"
        )
    described, type_ = _SHAPES[shape]
    try:
        if shape == "snapshot":
            conversation = ConversationSnapshot.decode(data).to_conversation().view()
        elif shape == "hub":
            conversation = Conversation.from_state(decode(data, HubView).state)
        else:
            conversation = Conversation.from_state(decode(data, ConversationState))
    except ConvsyncError as exc:
        raise ImportRefused("bad_file", f"{where}: {exc.message}") from exc
    unknown = _unknown_key(top, type_)
    if unknown is not None:
        raise ImportRefused(
            "bad_file",
            f"{where}: unknown key {unknown} in {described}; importing would drop it",
        )
    return conversation


async def _read_source(
    source: bytes | str | os.PathLike[str] | IO[bytes], where: str | None
) -> tuple[bytes, str]:
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source), where or "input"
    if isinstance(source, str | os.PathLike):
        where = where or os.fspath(source)
        try:
            return await anyio.Path(source).read_bytes(), where
        except OSError as exc:
            message = f"cannot read {where}: {exc.strerror or exc}"
            raise ImportRefused("unreadable", message) from exc
    where = where or str(getattr(source, "name", "input"))
    try:
        return bytes(await anyio.to_thread.run_sync(source.read)), where
    except OSError as exc:
        raise ImportRefused("unreadable", f"cannot read {where}: {exc.strerror or exc}") from exc


# ---------------------------------------------------------------------- chunking


def batches(entries: Sequence[Entry], budget: int, count: int = BATCH) -> list[list[Entry]]:
    """`entries` cut into runs of at most `count` whose encodings add up to at most `budget`
    bytes (an entry larger than the budget alone makes a run), by `sync.frames.runs`.

    Each run becomes one push record, so it has to fit one frame.
    """
    cut: list[list[Entry]] = []
    start = 0
    for run in runs([encode(entry) for entry in entries], budget, max_items=count):
        cut.append(list(entries[start : start + len(run)]))
        start += len(run)
    return cut


def _too_large(entries: Sequence[Entry], budget: int) -> tuple[int, int] | None:
    for at, entry in enumerate(entries):
        length = len(encode(entry))
        if length > budget:
            return at, length
    return None


# ---------------------------------------------------------------------- a replica for a task


@contextlib.asynccontextmanager
async def connect_checked(
    url: str | Sequence[str],
    conversation_id: str,
    *,
    connect_timeout: float = 10.0,
    client: str | None = None,
    max_frame: int = MAX_FRAME,
    token: str | None = None,
    ssl: SSLContext | None = None,
) -> AsyncIterator[Replica]:
    """A connected replica, for a task that ends: a hub that is not there is an error at
    once (an HTTP health check first) instead of a replica that keeps reconnecting.

    Raises:
        HubError: `unreachable`, `bad_status` (not a convsync hub) or `timeout` (no welcome
            within `connect_timeout` seconds; the message gives the last attempt's failure,
            such as a hub at capacity refusing connections with HTTP 503).
    """
    urls = await _answering_first(
        [url] if isinstance(url, str) else list(url), connect_timeout, ssl
    )
    replica = connect(
        urls,
        conversation_id,
        client=client,
        connect_timeout=connect_timeout,
        max_frame=max_frame,
        token=token,
        ssl=ssl,
    )
    try:
        await replica.__aenter__()
    except TimeoutError:
        # The health check answered, so the hub is there: say what kept the socket out.
        where = url if isinstance(url, str) else ", ".join(url)
        failure = replica.failure
        if failure is None:
            message = f"timed out after {connect_timeout:g}s connecting to {where}"
        else:
            message = (
                f"cannot connect to {where}: {failure}; "
                f"gave up after retrying for {connect_timeout:g}s"
            )
        raise HubError("timeout", message) from None
    try:
        yield replica
    finally:
        await replica.aclose()


async def _answering_first(
    urls: list[str], request_timeout: float, ssl: SSLContext | None = None
) -> list[str]:
    """`urls` turned so the first hub that answers its health check comes first.

    Raises:
        HubError: no hub answers (the last hub's error); `bad_url` for an empty list.
    """
    if not urls:
        raise HubError("bad_url", "no hub url given")
    failure: HubError | None = None
    for at, url in enumerate(urls):
        try:
            await check_hub(url, request_timeout=request_timeout, ssl=ssl)
        except HubError as exc:
            failure = exc
            continue
        return urls[at:] + urls[:at]
    assert failure is not None
    raise failure


async def flush_edits(replica: Replica, wait: float, what: str) -> None:
    """Wait (at most `wait` seconds) until the hub took every edit of `replica`; `what`
    names the edits in error messages.

    Raises:
        TransferError: `timeout`, or `refused` when the hub turned an edit down (the first
            `Conflict` event says why).
    """
    try:
        with anyio.fail_after(wait):
            await replica.flush()
    except TimeoutError:
        raise TransferError(
            "timeout", f"timed out after {wait:g}s waiting for the hub to take {what}"
        ) from None
    conflicts = [event for event in replica.events_nowait() if isinstance(event, Conflict)]
    if conflicts:
        first = conflicts[0]
        raise TransferError(
            "refused", f"the hub refused {what}: {first.reason} {first.detail}".rstrip()
        )


# ---------------------------------------------------------------------- import


async def import_conversation(
    url: str,
    source: bytes | str | os.PathLike[str] | IO[bytes],
    conversation_id: str,
    *,
    format: ImportFormat = "auto",
    replace: bool = False,
    check_pairing: bool = True,
    max_frame: int = MAX_FRAME,
    step_timeout: float = 10.0,
    progress: ProgressCallback | None = None,
    where: str | None = None,
    client: str | None = None,
    token: str | None = None,
    ssl: SSLContext | None = None,
) -> Imported:
    """Load a state, snapshot v1 or hub answer document into a conversation of the hub at
    ws(s) `url`.

    Args:
        source: the document's bytes, a path to it, or a binary file to read.
        conversation_id: the target. An empty one gets the entries in batches; one that is
            not empty is refused unless `replace`.
        format: `auto` (the default: whichever of the documents the keys say it is),
            `state` (a state or a hub answer) or `snapshot`; see `read_conversation`.
        replace: replace a conversation that is not empty, with one reset record.
        check_pairing: refuse a document whose tool calls and results do not pair, as a hub
            with strict pairing would (False for a hub run with `--no-strict-pairing`).
        max_frame: the hub's frame limit in bytes; every record sent must fit one frame.
        step_timeout: seconds for connecting, and for each batch to be acknowledged (an
            import of any size has no overall deadline: bound it with `anyio.fail_after`).
        progress: called as `progress(done, total)` before the first batch and after each.
        where: names the input in messages (default: the path, or "input").
        client: client id to push as (default: a fresh `convsync-import-...`).
        token: the access token, for a hub with auth (needs `write`).
        ssl: the TLS context for a `wss://` hub with a private CA (default: the system's).

    Returns:
        How many messages and asides went in and the revision the log reached.

    Raises:
        ImportRefused: the input cannot be read or imported as given, or the target is not
            empty; nothing was sent.
        TransferError: the hub refused a record or did not acknowledge in time; `imported`
            says how many messages it took before.
        HubError: the hub is not there (or is not a convsync hub).
    """
    data, where = await _read_source(source, where)
    imported = read_conversation(data, format, where)
    if check_pairing:
        violation = strict_violation(imported, 0)
        if violation is not None:
            raise ImportRefused(
                "unpairable", f"{where}: {violation.message}; a hub with strict pairing refuses it"
            )
    budget = max_frame - RECORD_SLACK
    state = imported.state()
    entries = state.entries

    # Everything that can be checked before touching the hub is checked here.
    big = _too_large(entries, budget)
    if big is not None:
        raise ImportRefused(
            "too_large",
            f"{where}: message {big[0]} is {big[1]:,} bytes, over the frame limit "
            f"({max_frame:,}); it cannot be sent",
        )
    if (
        state.retired
        and len(encode(ChangeRecord(Reset(ConversationState(retired=state.retired))))) > budget
    ):
        raise ImportRefused("too_large", f"{where}: too many retired ids to send in one record")

    client = client or f"convsync-import-{os.urandom(4).hex()}"
    async with connect_checked(
        url,
        conversation_id,
        connect_timeout=step_timeout,
        client=client,
        max_frame=max_frame,
        token=token,
        ssl=ssl,
    ) as replica:
        target = replica.conversation
        if len(target) or any(aside.saved for _, aside in target.asides()):
            if not replace:
                raise ImportRefused(
                    "not_empty",
                    f"conversation {conversation_id} is not empty ({len(target)} entries); "
                    "nothing imported",
                )
            size = len(encode(ChangeRecord(Reset(state))))
            if size > budget:
                raise ImportRefused(
                    "too_large",
                    f"{where}: as one reset record it is {size:,} bytes, over the frame limit "
                    f"({max_frame:,}); a replace cannot send it (import it into a new, "
                    "empty conversation instead: that goes in batches)",
                )
            target.reset(imported)
            await flush_edits(replica, step_timeout, "the reset")
            revision = replica.revision
            return Imported(len(entries), len(state.asides), revision, replaced=True)
        done = 0
        try:
            if state.retired:
                # Ids the file says were taken out stay taken out here too.
                target.replay(ChangeRecord(Reset(ConversationState(retired=state.retired))))
            if progress is not None:
                progress(0, len(entries))
            # Filled to FRAME_FILL like any batch; only an entry larger than that goes alone.
            for run in batches(entries, fill_budget(max_frame, RECORD_SLACK)):
                target.replay(ChangeRecord(Push(run), run[-1].author))
                await flush_edits(replica, step_timeout, f"messages {done}..{done + len(run) - 1}")
                done += len(run)
                if progress is not None:
                    progress(done, len(entries))
            for saved in state.asides:
                target.replay(ChangeRecord(AsideChange(saved.id, saved.aside), saved.author))
            if state.halt is not None:
                target.replay(ChangeRecord(HaltChange(state.halt)))
            await flush_edits(replica, step_timeout, "the asides")
        except TransferError as exc:
            if not done:
                raise
            raise TransferError(
                exc.reason,
                f"{exc.message} ({done} of {len(entries)} messages were imported)",
                imported=done,
            ) from exc
        revision = replica.revision
        return Imported(len(entries), len(state.asides), revision, replaced=False)
