"""JSON encoding of every wire type, with the encoder and the typed decoders built once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from .changes import ChangeRecord, ConversationState
from .errors import DecodeError
from .messages import AnyMessage

__all__ = ["decode", "decode_message", "decode_record", "decode_state_value", "encode"]

T = TypeVar("T")


def _encode_other(value: Any) -> Any:
    """A `Conversation` encodes as its state; nothing else outside the wire types encodes."""
    state = getattr(value, "state", None)
    if callable(state):
        return state()
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


_encoder = msgspec.json.Encoder(enc_hook=_encode_other)
_record_decoder = msgspec.json.Decoder(ChangeRecord)
_message_decoder: msgspec.json.Decoder[AnyMessage] = msgspec.json.Decoder(AnyMessage)
_state_decoder = msgspec.json.Decoder(ConversationState)
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


encode: Callable[[object], bytes] = _encoder.encode
"""JSON bytes of any wire type; a `Conversation` encodes as its state."""


def _run(decoder: msgspec.json.Decoder[T], data: bytes | str) -> T:
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from exc
    except RecursionError as exc:  # found by fuzzing: deep nesting in a free-form value
        raise DecodeError("nested too deeply") from exc


def decode(data: bytes | str, type_: Any) -> Any:
    """Decode `data` as `type_` (any wire type), with a decoder cached per type."""
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    return _run(decoder, data)


def decode_record(data: bytes | str) -> ChangeRecord:
    """A `ChangeRecord` from JSON; raises `DecodeError` saying where the input is wrong."""
    return _run(_record_decoder, data)


def decode_message(data: bytes | str) -> AnyMessage:
    """A `Message` from JSON; raises `DecodeError` saying where the input is wrong."""
    return _run(_message_decoder, data)


def decode_state_value(data: bytes | str) -> ConversationState:
    """The `ConversationState` in a state's JSON (`sync.decode_state` makes a `Conversation`
    of it); raises `DecodeError` saying where the input is wrong."""
    return _run(_state_decoder, data)
