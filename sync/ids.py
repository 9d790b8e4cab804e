"""Entry and aside ids: a prefix plus the 32 lowercase hex digits of a UUIDv7 (RFC 9562).

How this works: the 48 high bits of a UUIDv7 are its millisecond timestamp, so an id says when
its entry was made. `IdMinter` keeps the last timestamp and the 74 random bits it used; within
one millisecond it counts those bits up instead of drawing new ones, so ids from one minter rise
strictly. Randomness comes from `os.urandom` by default (safe across `fork`), or from an
injected `random.Random` in tests.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Annotated

import msgspec

__all__ = [
    "ASIDE_PREFIX",
    "MESSAGE_PREFIX",
    "AsideId",
    "Count",
    "IdMinter",
    "MessageId",
    "are_message_ids",
    "default_minter",
    "is_aside_id",
    "is_message_id",
    "made_ms",
    "now_ms",
]

MessageId = str
"""`"msg_"` + UUIDv7 hex."""

AsideId = str
"""`"aside_"` + UUIDv7 hex."""

Count = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
"""A non-negative integer of the protocol (seq, lineage, revision, offset, index, a time in ms):
bounded to what every store holds (a signed 64-bit column), so a larger one is a `bad_message`
at decode, never a store fault that reads as transient."""

MESSAGE_PREFIX = "msg_"
ASIDE_PREFIX = "aside_"

# Version nibble 7 at hex digit 12, variant bits 10 (8, 9, a or b) at hex digit 16.
_UUID7_HEX = r"[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}"
_MESSAGE_ID = re.compile(MESSAGE_PREFIX + _UUID7_HEX)
_ASIDE_ID = re.compile(ASIDE_PREFIX + _UUID7_HEX)

_RAND_BITS = 74  # 12 bits of rand_a plus 62 bits of rand_b
_RAND_MASK = (1 << _RAND_BITS) - 1


def now_ms() -> int:
    """The real clock in milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


_NOT_HEX = str.maketrans("", "", "0123456789abcdef")
_ID_LENGTH = len(MESSAGE_PREFIX) + 32


def are_message_ids(values: list[str | None]) -> bool:
    """Whether every value is a well-formed `MessageId`, checked in a few passes of C code over
    their concatenation (for a state or a long push, where a call per id would dominate)."""
    if not values:
        return True
    if None in values or set(map(type, values)) != {str}:
        return False
    ids: list[str] = values  # type: ignore[assignment]
    if set(map(len, ids)) != {_ID_LENGTH}:
        return False
    joined = "".join(ids)
    count = len(ids)
    # Every character but the prefixes is lowercase hex, the prefixes sit at each id's start,
    # and each id has the UUIDv7 version and variant digits.
    return (
        joined.translate(_NOT_HEX) == MESSAGE_PREFIX * count
        and joined[0::_ID_LENGTH] == "m" * count
        and joined[1::_ID_LENGTH] == "s" * count
        and joined[2::_ID_LENGTH] == "g" * count
        and joined[3::_ID_LENGTH] == "_" * count
        and joined[16::_ID_LENGTH] == "7" * count
        and set(joined[20::_ID_LENGTH]) <= {"8", "9", "a", "b"}
    )


def is_message_id(value: object) -> bool:
    """Whether `value` is a well-formed `MessageId`."""
    return isinstance(value, str) and _MESSAGE_ID.fullmatch(value) is not None


def is_aside_id(value: object) -> bool:
    """Whether `value` is a well-formed `AsideId`."""
    return isinstance(value, str) and _ASIDE_ID.fullmatch(value) is not None


def made_ms(id_: str) -> int:
    """The millisecond timestamp a message or aside id carries."""
    hex_ = id_[id_.index("_") + 1 :]
    return int(hex_[:12], 16)


def _format(ms: int, rand: int) -> str:
    rand_a = rand >> 62
    rand_b = rand & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return f"{value:032x}"


class IdMinter:
    """Mints UUIDv7-based ids that rise strictly for this minter.

    Args:
        clock: milliseconds since the epoch; defaults to the real clock.
        rng: a source of random bits for tests; defaults to `os.urandom`.
    """

    def __init__(
        self, clock: Callable[[], int] | None = None, rng: random.Random | None = None
    ) -> None:
        self._clock = clock or now_ms
        self._rng = rng
        self._last_ms = -1
        self._last_rand = 0
        self._lock = threading.Lock()

    def _random(self) -> int:
        if self._rng is not None:
            return self._rng.getrandbits(_RAND_BITS)
        return int.from_bytes(os.urandom(10), "big") & _RAND_MASK

    def _next(self, at: int | None) -> str:
        if at is not None:
            # A dated id (an import at its source's time) stands outside the monotonic run.
            return _format(at, self._random())
        with self._lock:
            ms = self._clock()
            if ms > self._last_ms:
                # Keep headroom for counting up within this millisecond.
                rand = self._random() >> 1
            else:
                ms = self._last_ms
                rand = self._last_rand + 1
                if rand > _RAND_MASK:
                    ms += 1
                    rand = self._random() >> 1
            self._last_ms, self._last_rand = ms, rand
        return _format(ms, rand)

    def message_id(self, at: int | None = None) -> MessageId:
        """A new `MessageId`, made now or, when given, at `at` ms."""
        return MESSAGE_PREFIX + self._next(at)

    def aside_id(self, at: int | None = None) -> AsideId:
        """A new `AsideId`, made now or, when given, at `at` ms."""
        return ASIDE_PREFIX + self._next(at)


default_minter = IdMinter()
"""The process-wide minter every `Conversation` uses unless given its own."""
