"""convsync replicas: `connect` to a hub and edit a live copy of a conversation; read, export
and import conversations of a hub (`fetch_conversation`, `export_conversation`,
`import_conversation`)."""

from sync.rebase import Conflict

from .drafting import DraftWriter
from .http import FetchedConversation, HubError, fetch_conversation
from .live import Draft, DraftChanged, DraftEnded, Presence, PresenceChanged
from .replica import Replica, connect
from .session import Applied, Connected, Disconnected, Event, Rebased, ReplicaSession, Reset
from .transfer import (
    Exported,
    Imported,
    ImportRefused,
    TransferError,
    export_conversation,
    import_conversation,
)

__all__ = [
    "Applied",
    "Conflict",
    "Connected",
    "Disconnected",
    "Draft",
    "DraftChanged",
    "DraftEnded",
    "DraftWriter",
    "Event",
    "Exported",
    "FetchedConversation",
    "HubError",
    "ImportRefused",
    "Imported",
    "Presence",
    "PresenceChanged",
    "Rebased",
    "Replica",
    "ReplicaSession",
    "Reset",
    "TransferError",
    "connect",
    "export_conversation",
    "fetch_conversation",
    "import_conversation",
]
