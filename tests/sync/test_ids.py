"""Ids: UUIDv7 form, strictly rising, and the one-pass check agreeing with the per-id one."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from sync.ids import IdMinter, are_message_ids, is_message_id, made_ms

MINTER = IdMinter(clock=lambda: 1_800_000_000_000, rng=random.Random(7))
GOOD = [MINTER.message_id() for _ in range(40)]


def test_minted_ids_are_uuid7_and_rise() -> None:
    """Ids carry their millisecond, version 7 and the RFC 9562 variant, and rise strictly."""
    assert all(is_message_id(id_) for id_ in GOOD)
    assert GOOD == sorted(GOOD) and len(set(GOOD)) == len(GOOD)
    assert {made_ms(id_) for id_ in GOOD} == {1_800_000_000_000}
    assert MINTER.message_id(at=5).startswith("msg_000000000005")


@given(
    st.integers(0, len(GOOD) - 1),
    st.integers(0, 35),
    st.sampled_from("0123456789abcdefABCDEFmsg_xz7 \u00e9"),
    st.booleans(),
)
def test_one_pass_check_agrees_with_the_per_id_check(
    which: int, where: int, char: str, truncate: bool
) -> None:
    """`are_message_ids` accepts exactly the lists whose every id `is_message_id` accepts."""
    ids: list[str | None] = list(GOOD)
    chars = list(GOOD[which])
    chars[where] = char
    ids[which] = "".join(chars[:-1] if truncate else chars)
    assert are_message_ids(ids) == all(is_message_id(id_) for id_ in ids)


def test_one_pass_check_rejects_non_strings_and_misaligned_ids() -> None:
    """None, non-strings and ids shifted across each other's boundary are refused."""
    assert are_message_ids([])
    assert not are_message_ids([*GOOD[:3], None])
    assert not are_message_ids([*GOOD[:3], 7])  # type: ignore[list-item]
    assert not are_message_ids([GOOD[0][:-1], GOOD[1][-1] + GOOD[1][:-1]])
