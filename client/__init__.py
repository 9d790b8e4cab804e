"""convsync replicas: `connect` to a hub and edit a live copy of a conversation."""

from sync.rebase import Conflict

from .replica import Replica, connect
from .session import Applied, Connected, Disconnected, Event, Rebased, ReplicaSession, Reset

__all__ = [
    "Applied",
    "Conflict",
    "Connected",
    "Disconnected",
    "Event",
    "Rebased",
    "Replica",
    "ReplicaSession",
    "Reset",
    "connect",
]
