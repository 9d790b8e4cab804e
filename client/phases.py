"""The replica session's phases, and the one table of what each accepts.

Everything that decides whether a message or a call is legal in a phase, and which phase it
leads to, lives in `TABLE` (as h11's `_state.py` keeps its transitions in one table): a
message or call the current phase does not list is refused before it changes anything.

    connecting --Welcome--> catching_up --CAUGHT_UP--> live
        ^                        |                      |
        +------ hello / disconnected -------------------+
    any phase --release--> closed (for good)

- `connecting`: `hello()` sent (or not yet), waiting for the hub's `welcome`.
- `catching_up`: welcomed; records (or a state) up to the welcome's revision are coming in.
  `CAUGHT_UP` is the session's own step once the log it holds reaches that revision (at once,
  from the welcome, when it holds it already).
- `live`: caught up: records from others, acks and rejects of pushes; pushes may go.
- `closed`: `release()` was called: the replica stopped for good. Only `disconnected()` (the
  shell's last word on the connection) and `release()` again are accepted.

An `Entries` message is accepted only after a `state` that said `more` (the state arriving in
pieces is data of the transfer, not a phase: the handler checks it).
"""

from __future__ import annotations

from typing import Final

from sync.protocol import (
    Ack,
    AuthOk,
    DraftEnd,
    Drafts,
    DraftState,
    DraftUpdate,
    Entries,
    Error,
    Pong,
    PresenceDiff,
    PresenceSnapshot,
    Records,
    Reject,
    State,
    Welcome,
)

__all__ = [
    "CATCHING_UP",
    "CAUGHT_UP",
    "CLOSED",
    "CONNECTING",
    "DISCONNECTED",
    "HELLO",
    "LIVE",
    "PHASES",
    "RELEASE",
    "TABLE",
    "Step",
]

CONNECTING: Final = "connecting"
CATCHING_UP: Final = "catching_up"
LIVE: Final = "live"
CLOSED: Final = "closed"
PHASES: Final = (CONNECTING, CATCHING_UP, LIVE, CLOSED)

# The session's calls and its own steps, beside the hub's message types.
HELLO: Final = "hello"
DISCONNECTED: Final = "disconnected"
RELEASE: Final = "release"
CAUGHT_UP: Final = "caught_up"

Step = type | str
"""What moves a session: a hub message's type, or one of the names above."""

_WELCOMED: Final = (
    Records,
    State,
    Entries,
    Ack,
    Reject,
    Drafts,
    DraftUpdate,
    DraftState,
    DraftEnd,
    PresenceSnapshot,
    PresenceDiff,
)
"""What the hub sends only once it has welcomed the connection."""

_ANY_TIME: Final = (Error, AuthOk, Pong)
"""What the hub may send on a connection at any time (a refusal, a refreshed token, a pong)."""


def _stay(phase: str, steps: tuple[type, ...]) -> dict[Step, str]:
    return dict.fromkeys(steps, phase)


TABLE: Final[dict[str, dict[Step, str]]] = {
    CONNECTING: {
        Welcome: CATCHING_UP,
        **_stay(CONNECTING, _ANY_TIME),
        HELLO: CONNECTING,
        DISCONNECTED: CONNECTING,
        RELEASE: CLOSED,
    },
    CATCHING_UP: {
        **_stay(CATCHING_UP, _WELCOMED + _ANY_TIME),
        CAUGHT_UP: LIVE,
        HELLO: CONNECTING,
        DISCONNECTED: CONNECTING,
        RELEASE: CLOSED,
    },
    LIVE: {
        **_stay(LIVE, _WELCOMED + _ANY_TIME),
        HELLO: CONNECTING,
        DISCONNECTED: CONNECTING,
        RELEASE: CLOSED,
    },
    CLOSED: {
        DISCONNECTED: CLOSED,
        RELEASE: CLOSED,
    },
}
"""For each phase, every message and call it accepts, and the phase that follows."""
