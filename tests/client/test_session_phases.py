"""The replica session's phase table (`client.phases`): what each phase accepts, where it goes."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from client.phases import CATCHING_UP, CLOSED, CONNECTING, LIVE, PHASES, TABLE
from client.session import Connected, Disconnected, ReplicaSession
from sync import Conversation, Message, UsageError
from sync.errors import RemoteProtocolError
from sync.protocol import (
    Ack,
    AuthOk,
    DraftEnd,
    Drafts,
    DraftState,
    DraftUpdate,
    Entries,
    Error,
    HubMessage,
    Pong,
    PresenceDiff,
    PresenceSnapshot,
    Records,
    Reject,
    State,
    Welcome,
)

LINEAGE = 7

# One message of each type the hub sends; the session must refuse each where its phase does not
# list it, whatever the message holds.
MESSAGES: list[Any] = [
    Welcome(LINEAGE, 0, 0),
    Records(0, []),
    State(LINEAGE, 0, Conversation().state()),
    Entries([], more=False),
    Ack(1, 0, 1),
    Reject(1, "invalid", "no", LINEAGE, 0),
    Error("internal", "no"),
    AuthOk(60.0),
    Drafts([]),
    DraftUpdate("draft_1", "append"),
    DraftState("draft_1", {}),
    DraftEnd("draft_1", "done"),
    PresenceSnapshot([]),
    PresenceDiff(),
    Pong(),
]


def session_in(phase: str) -> ReplicaSession:
    """A session with an edit pending, brought to `phase` by its ordinary calls."""
    session = ReplicaSession("phases")
    session.local.push(Message.user("pending"))
    if phase == CLOSED:
        session.release()
        return session
    session.hello()
    if phase == CATCHING_UP:
        session.receive(Welcome(LINEAGE, 3, 0))  # three records to catch up on
    elif phase == LIVE:
        session.receive(Welcome(LINEAGE, 0, 0))
    assert session.phase == phase
    return session


def observed(session: ReplicaSession) -> tuple[object, ...]:
    """What a caller can see of a session, read without folding or copying anything."""
    return (
        session.phase,
        session.lineage,
        session.revision,
        session.lagging,
        session.shares_local,
        session.pending,
        session.ready,
        session.seq,
        session.sub,
        session.local.state(),
        session.local.unsaved(),
    )


def test_the_table_names_the_four_phases_and_every_hub_message() -> None:
    """Four phases, in order; every message the hub sends is accepted by some phase."""
    assert PHASES == ("connecting", "catching_up", "live", "closed")
    assert set(TABLE) == set(PHASES)
    hub_types = set(typing.get_args(HubMessage))
    assert {type(m) for m in MESSAGES} == hub_types
    assert hub_types <= {step for phase in PHASES for step in TABLE[phase]}
    assert TABLE[CONNECTING][Welcome] == CATCHING_UP
    assert TABLE[CATCHING_UP]["caught_up"] == LIVE
    assert all(TABLE[phase]["release"] == CLOSED for phase in PHASES)


@pytest.mark.parametrize("phase", PHASES)
def test_a_message_its_phase_does_not_accept_is_refused_and_changes_nothing(phase: str) -> None:
    """Each message a phase does not list raises (`unexpected`: the hub broke the protocol;
    `closed`: the caller fed a released session) before the session changes at all."""
    refused = [m for m in MESSAGES if type(m) not in TABLE[phase]]
    assert refused, phase
    for message in refused:
        session = session_in(phase)
        before = observed(session)
        error: type[Exception] = UsageError if phase == CLOSED else RemoteProtocolError
        with pytest.raises(error) as raised:
            session.receive(message)
        assert raised.value.reason == ("closed" if phase == CLOSED else "unexpected")
        assert observed(session) == before, type(message).__name__


def test_the_calls_move_the_phase_as_the_table_says() -> None:
    """hello and disconnected lead back to connecting; the catch-up ends live; release is for
    good: a released session refuses a new hello and stays closed."""
    session = ReplicaSession("phases")
    assert session.phase == CONNECTING
    session.hello()
    assert session.receive(Welcome(LINEAGE, 0, 0)) == [Connected(LINEAGE, 0)]
    assert session.phase == LIVE  # nothing to catch up on: live at once
    assert session.disconnected("gone") == [Disconnected("gone")]
    assert session.phase == CONNECTING
    session.hello()
    session.receive(Welcome(LINEAGE, 0, 0))
    session.hello()  # a new connection without a word about the old one
    assert session.phase == CONNECTING
    session.release()
    assert session.phase == CLOSED
    with pytest.raises(UsageError) as raised:
        session.hello()
    assert raised.value.reason == "closed"
    assert session.disconnected("late") == []  # the shell's last word is still taken
    assert session.phase == CLOSED
