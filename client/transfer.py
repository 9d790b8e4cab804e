"""Export a conversation to a file's bytes, import a file into a conversation.

How this works: `export_conversation` reads the hub's copy over HTTP (`client.http`) and
encodes it as a snapshot v1 (messages and pins) or as its whole state (entries with ids and
authors, asides, halt, retired ids). `import_conversation` reads a snapshot v1, a state or a
hub answer, checks everything it can before touching the hub (JSON, schema, tool-call pairing,
each message against the frame limit), then connects a replica. An empty conversation gets the
retired ids, then the entries as push records cut to fit one frame each (`batches`), one
acknowledged batch at a time with a progress callback after each, then the asides and the
halt. A conversation that is not empty is refused unless `replace=True`, which sends one reset
record (that record must fit one frame).

Errors: `ImportRefused` (the input or the target cannot take this import as given; nothing was
sent), `TransferError` (the hub refused or did not answer in time; `imported` says how many
messages it took before), `HubError` (the hub is not there, or has no such conversation).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from ssl import SSLContext
from typing import IO, Literal, NamedTuple

import anyio
import msgspec

from sync import (
    AsideChange,
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
from sync.frames import MAX_FRAME, RECORD_SLACK, runs
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
    sent. Reasons: `unreadable`, `bad_file`, `unpairable`, `too_large`, `not_empty`."""


class Exported(NamedTuple):
    """A conversation written out, and where the hub's log stood when it was read."""

    data: bytes
    """The JSON document (no trailing newline)."""
    lineage: int
    revision: int
    messages: int


class Imported(NamedTuple):
    """What an import did."""

    messages: int
    asides: int
    revision: int
    """The log's revision once the hub took everything."""
    replaced: bool
    """True when a conversation that was not empty was replaced with one reset record."""


# ---------------------------------------------------------------------- export


def encode_conversation(conversation: Conversation, format: ExportFormat = "snapshot") -> bytes:
    """`conversation` as a snapshot v1 document or as its whole state (JSON, no newline)."""
    if format == "snapshot":
        return ConversationSnapshot.from_conversation(conversation).encode()
    if format == "state":
        return encode(conversation)
    raise ValueError(f"no export format {format!r} (snapshot or state)")


async def export_conversation(
    url: str,
    conversation_id: str,
    *,
    format: ExportFormat = "snapshot",
    request_timeout: float = 10.0,
    token: str | None = None,
    ssl: SSLContext | None = None,
) -> Exported:
    """Read a conversation from the hub at ws(s) `url` and encode it (with `token`, for a
    hub with auth: it needs `read` on the conversation).

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
    data = encode_conversation(fetched.conversation, format)
    return Exported(data, fetched.lineage, fetched.revision, len(fetched.conversation))


# ---------------------------------------------------------------------- reading a file


def read_conversation(
    data: bytes, format: ImportFormat = "auto", where: str = "input"
) -> Conversation:
    """The conversation a snapshot v1 or state document holds.

    `format` is `snapshot`, `state` or `auto` (a snapshot when the JSON object has a `version`
    key; a `{"lineage","revision","state"}` answer of the hub is read as its state). `where`
    names the input in error messages.

    Raises:
        ImportRefused: (`bad_file`) the data is not JSON, or not a valid snapshot or state.
    """
    fmt: str = format
    try:
        if fmt == "auto":
            try:
                top = msgspec.json.decode(data)
            except msgspec.DecodeError as exc:
                raise ImportRefused("bad_file", f"{where}: not JSON: {exc}") from None
            if not isinstance(top, dict):
                raise ImportRefused(
                    "bad_file", f"{where}: expected a JSON object, not {type(top).__name__}"
                )
            if "version" in top:
                fmt = "snapshot"
            elif "state" in top and "revision" in top:
                return Conversation.from_state(decode(data, HubView).state)
            else:
                fmt = "state"
        if fmt == "snapshot":
            return ConversationSnapshot.decode(data).to_conversation().view()
        return Conversation.from_state(decode(data, ConversationState))
    except ImportRefused:
        raise
    except ConvsyncError as exc:
        raise ImportRefused("bad_file", f"{where}: {exc.message}") from exc


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
    """Load a snapshot v1 or state document into a conversation of the hub at ws(s) `url`.

    Args:
        source: the document's bytes, a path to it, or a binary file to read.
        conversation_id: the target. An empty one gets the entries in batches; one that is
            not empty is refused unless `replace`.
        format: `auto` (a snapshot when the JSON has a `version` key), `snapshot` or `state`.
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
            revision = replica.session.confirmed.revision
            return Imported(len(entries), len(state.asides), revision, replaced=True)
        done = 0
        try:
            if state.retired:
                # Ids the file says were taken out stay taken out here too.
                target.replay(ChangeRecord(Reset(ConversationState(retired=state.retired))))
            if progress is not None:
                progress(0, len(entries))
            for run in batches(entries, budget):
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
        revision = replica.session.confirmed.revision
        return Imported(len(entries), len(state.asides), revision, replaced=False)
