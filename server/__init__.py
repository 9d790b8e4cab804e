"""The convsync hub: owns each conversation's log and broadcasts every record it accepts."""

from .config import HubConfig
from .hub import Hub
from .store import LogStore, MemoryStore, SqliteStore, open_store

__all__ = ["Hub", "HubConfig", "LogStore", "MemoryStore", "SqliteStore", "open_store"]
