"""OpenTelemetry spans for a hub (the `otel` extra: `pip install 'convsync[otel]'`), off by
default.

How this works: `TRACER` is None until `enable()` is called, and every hook in the hub is
`if tracing.TRACER is not None:` in front of the code it would trace, so a hub without
tracing does what it did before, and nothing imports `opentelemetry` (a test holds both).
`enable()` takes spans to the global tracer provider (the program configures its exporter,
as OpenTelemetry has it) or to the one given.

The spans (`SPANS`): `convsync.hello` (a socket joins: its catch-up in its attributes),
`convsync.push` (a batch: its `convsync.append` store call inside it, then an `ack` or
`reject` event), `convsync.catch_up` (records read from the store for a replica behind),
the other store calls (`convsync.load`, `convsync.snapshot`, ...), `convsync.draft` (one
draft op) and `convsync.turn` (a model reply landing with a push: `gen_ai.*` attributes with
its usage, provider and model, where the reply says them; and each turn record's end).

What a span never holds: a token, a key, any text of a message, a draft or a tool call, an
error's message (only its type: a store's message may quote data). Attributes are ids,
counts, revisions, names of outcomes and token counts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sync import AsideChange, Assistant, ChangeRecord, Push, Splice
from sync.entries import TURN_KIND

if TYPE_CHECKING:
    from sync.protocol import DraftOp, Hello, PushBatch

    from .auth import Grant
    from .core import StoreCall

__all__ = ["SPANS", "TRACER", "disable", "enable"]

TRACER: Any = None
"""The tracer spans go to; None: tracing is off (the default)."""

SPANS = (
    "convsync.hello",
    "convsync.push",
    "convsync.append",
    "convsync.catch_up",
    "convsync.load",
    "convsync.read_mark",
    "convsync.snapshot",
    "convsync.rewrite",
    "convsync.draft",
    "convsync.turn",
)

_STORE_SPANS = {
    "AppendRecords": "convsync.append",
    "ReadRecords": "convsync.catch_up",
    "LoadLog": "convsync.load",
    "ReadMark": "convsync.read_mark",
    "WriteSnapshot": "convsync.snapshot",
    "RewriteLog": "convsync.rewrite",
}


def enable(tracer_provider: Any = None) -> None:
    """Trace the hubs of this process from now on, to `tracer_provider` (an OpenTelemetry
    `TracerProvider`; default: the global one).

    Raises:
        ModuleNotFoundError: `opentelemetry-api` is not installed (the `otel` extra).
    """
    global TRACER
    from opentelemetry import trace

    TRACER = trace.get_tracer("convsync.hub", tracer_provider=tracer_provider)


def disable() -> None:
    """Stop tracing (spans already started still end)."""
    global TRACER
    TRACER = None


@contextlib.contextmanager
def _span(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    """A span named `name`, current inside the block; an exception marks it failed with its
    type only (its message could quote data)."""
    from opentelemetry.trace import Status, StatusCode

    with TRACER.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR))
            raise


def hello_span(
    conversation_id: str, hello: Hello, grant: Grant
) -> contextlib.AbstractContextManager[Any]:
    """A socket joins `conversation_id` (its welcome and catch-up are inside)."""
    return _span(
        "convsync.hello",
        {
            "convsync.conversation": conversation_id,
            "convsync.client": hello.client,
            "convsync.principal": grant.sub,
            "convsync.hello.lineage": hello.lineage,
            "convsync.hello.revision": hello.revision,
        },
    )


def joined(span: Any, hello: Hello, lineage: int, revision: int) -> None:
    """What the join caught the replica up with: records (`convsync.catch_up.records`), or
    the whole state (another lineage, or a revision the log is not at)."""
    span.set_attribute("convsync.revision", revision)
    if hello.lineage == lineage and hello.revision <= revision:
        span.set_attribute("convsync.catch_up", "records")
        span.set_attribute("convsync.catch_up.records", revision - hello.revision)
    else:
        span.set_attribute("convsync.catch_up", "state")


def push_span(conversation_id: str, batch: PushBatch) -> contextlib.AbstractContextManager[Any]:
    """A push batch, from its arrival to its ack or reject (its store append inside)."""
    return _span(
        "convsync.push",
        {
            "convsync.conversation": conversation_id,
            "convsync.push.seq": batch.seq,
            "convsync.push.revision": batch.revision,
            "convsync.push.records": len(batch.records),
        },
    )


def pushed(span: Any, records: Sequence[ChangeRecord], revision: int, rejected: str | None) -> None:
    """How the push ended: an `ack` event at `revision`, with a `convsync.turn` span for each
    model reply and turn end the records carry, or a `reject` event naming the reason."""
    if rejected is not None:
        span.add_event("reject", {"convsync.reject.reason": rejected})
        return
    span.add_event("ack", {"convsync.revision": revision})
    for record in records:
        change = record.change
        if isinstance(change, Push | Splice):
            for entry in change.entries:
                if isinstance(entry.message, Assistant):
                    _reply(entry.id, entry.message)
        elif isinstance(change, AsideChange) and change.aside is not None:
            if change.aside.kind == TURN_KIND:
                _turn_end(change.aside.value)


def _reply(entry_id: str | None, message: Assistant) -> None:
    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat"}
    if entry_id is not None:
        attributes["convsync.entry"] = entry_id
    if message.origin is not None:
        attributes["gen_ai.provider.name"] = message.origin.provider
        attributes["gen_ai.response.model"] = message.origin.model
        if message.origin.response_id is not None:
            attributes["gen_ai.response.id"] = message.origin.response_id
    if message.stop is not None:
        attributes["gen_ai.response.finish_reasons"] = [message.stop.reason]
    usage = message.usage
    if usage is not None:
        for key, value in (
            ("gen_ai.usage.input_tokens", usage.input_tokens),
            ("gen_ai.usage.output_tokens", usage.output_tokens),
            ("gen_ai.usage.cache_read.input_tokens", usage.cache_read_tokens),
            ("gen_ai.usage.cache_creation.input_tokens", usage.cache_write_tokens),
            ("convsync.usage.reasoning_tokens", usage.reasoning_tokens),
        ):
            if value is not None:
                attributes[key] = value
    TRACER.start_span("convsync.turn", attributes=attributes).end()


def _turn_end(value: Any) -> None:
    """A turn record: its index and, once it ended, how (never its `why`: free text)."""
    if not isinstance(value, dict):
        return
    attributes: dict[str, Any] = {}
    if isinstance(value.get("index"), int):
        attributes["convsync.turn.index"] = value["index"]
    end = value.get("end")
    how = end.get("how") if isinstance(end, dict) else None
    attributes["convsync.turn.end"] = how if how in ("answered", "failed", "stopped") else "open"
    TRACER.start_span("convsync.turn", attributes=attributes).end()


def store_span(conversation_id: str, call: StoreCall) -> contextlib.AbstractContextManager[Any]:
    """One store call of a room (its records counted, never shown)."""
    attributes: dict[str, Any] = {"convsync.conversation": conversation_id}
    kind = type(call).__name__
    records = getattr(call, "records", None)
    if records is not None:
        attributes["convsync.store.records"] = len(records)
    from_ = getattr(call, "from_", None)
    if from_ is not None:
        attributes["convsync.store.from_revision"] = from_
    return _span(_STORE_SPANS.get(kind, "convsync.store"), attributes)


def draft_span(conversation_id: str, op: DraftOp) -> contextlib.AbstractContextManager[Any]:
    """One draft op: which draft, which op, and for an append the part, offset and how many
    code points (never the text, nor a tool's arguments)."""
    attributes: dict[str, Any] = {
        "convsync.conversation": conversation_id,
        "convsync.draft.id": op.id,
        "convsync.draft.op": op.op,
    }
    if op.op == "append":
        attributes["convsync.draft.part"] = op.part
        attributes["convsync.draft.offset"] = op.offset
        attributes["convsync.draft.length"] = len(op.text)
    return _span("convsync.draft", attributes)
