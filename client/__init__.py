"""convsync replicas: `connect` to a hub and edit a live copy of a conversation; read, export
and import conversations of a hub (`fetch_conversation`, `export_conversation`,
`import_conversation`); list and watch a hub's conversations (`list_conversations`,
`summary`).

The names below are imported on first use, so importing a module of this package (the
`convsync` command's `client.cli` first of all) does not load all of them: the command gets
to set up its Ctrl-C handling before the slow imports (websockets, the model) run.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # not `typing`'s: importing typing costs more than the rest of this
if TYPE_CHECKING:
    from sync.approvals import Approval
    from sync.rebase import Conflict

    from .dashboard import Listing, Window, list_conversations, summary
    from .drafting import DraftWriter
    from .http import FetchedConversation, HubError, fetch_conversation
    from .live import Draft, DraftChanged, DraftEnded, Presence, PresenceChanged
    from .replica import Replica, connect
    from .session import (
        Applied,
        ApprovalAsked,
        ApprovalDecided,
        Connected,
        Disconnected,
        Event,
        Queued,
        Rebased,
        ReplicaSession,
        Reset,
        StopRequested,
    )
    from .transfer import (
        Exported,
        Imported,
        ImportRefused,
        TransferError,
        export_conversation,
        import_conversation,
    )

# Where each exported name lives (a module of this package, or an absolute one).
_HOMES = {
    "Conflict": "sync.rebase",
    "Listing": ".dashboard",
    "Window": ".dashboard",
    "list_conversations": ".dashboard",
    "summary": ".dashboard",
    "DraftWriter": ".drafting",
    "FetchedConversation": ".http",
    "HubError": ".http",
    "fetch_conversation": ".http",
    "Draft": ".live",
    "DraftChanged": ".live",
    "DraftEnded": ".live",
    "Presence": ".live",
    "PresenceChanged": ".live",
    "Replica": ".replica",
    "connect": ".replica",
    "Applied": ".session",
    "ApprovalAsked": ".session",
    "ApprovalDecided": ".session",
    "Approval": "sync.approvals",
    "Connected": ".session",
    "Disconnected": ".session",
    "Event": ".session",
    "Queued": ".session",
    "Rebased": ".session",
    "ReplicaSession": ".session",
    "Reset": ".session",
    "StopRequested": ".session",
    "Exported": ".transfer",
    "Imported": ".transfer",
    "ImportRefused": ".transfer",
    "TransferError": ".transfer",
    "export_conversation": ".transfer",
    "import_conversation": ".transfer",
}

__all__ = [
    "Applied",
    "Approval",
    "ApprovalAsked",
    "ApprovalDecided",
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
    "Listing",
    "Presence",
    "PresenceChanged",
    "Queued",
    "Rebased",
    "Replica",
    "ReplicaSession",
    "Reset",
    "StopRequested",
    "TransferError",
    "Window",
    "connect",
    "export_conversation",
    "fetch_conversation",
    "import_conversation",
    "list_conversations",
    "summary",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # once is enough
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
