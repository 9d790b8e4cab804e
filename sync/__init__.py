"""convsync's conversation model: pure, no I/O.

A `Conversation` holds entries (messages with stable ids and authors), asides and a halt, and
records every edit as a `ChangeRecord` that another copy folds with `apply`.
"""

from . import pairing, snapshot
from .changes import (
    AnyChange,
    AsideChange,
    Change,
    ChangeRecord,
    ConversationState,
    HaltChange,
    Push,
    Reset,
    Splice,
)
from .codec import decode, decode_message, decode_record, decode_state, encode
from .conversation import Conversation, Spliced
from .entries import (
    Aside,
    Author,
    Entry,
    EntryRef,
    Halt,
    Note,
    SavedAside,
    TurnEnd,
    TurnRecord,
)
from .errors import (
    AnswerError,
    ApplyError,
    ConvsyncError,
    DecodeError,
    PairingError,
    ProtocolError,
    SnapshotError,
    UsageError,
)
from .ids import AsideId, IdMinter, MessageId
from .lineage import Lineage
from .messages import (
    Assistant,
    Document,
    Image,
    Json,
    Message,
    Origin,
    Reasoning,
    Stop,
    System,
    Text,
    ToolCall,
    ToolResult,
    User,
)

__all__ = [
    "AnswerError",
    "AnyChange",
    "ApplyError",
    "Aside",
    "AsideChange",
    "AsideId",
    "Assistant",
    "Author",
    "Change",
    "ChangeRecord",
    "Conversation",
    "ConversationState",
    "ConvsyncError",
    "DecodeError",
    "Document",
    "Entry",
    "EntryRef",
    "Halt",
    "HaltChange",
    "IdMinter",
    "Image",
    "Json",
    "Lineage",
    "Message",
    "MessageId",
    "Note",
    "Origin",
    "PairingError",
    "ProtocolError",
    "Push",
    "Reasoning",
    "Reset",
    "SavedAside",
    "SnapshotError",
    "Splice",
    "Spliced",
    "Stop",
    "System",
    "Text",
    "ToolCall",
    "ToolResult",
    "TurnEnd",
    "TurnRecord",
    "UsageError",
    "User",
    "decode",
    "decode_message",
    "decode_record",
    "decode_state",
    "encode",
    "pairing",
    "snapshot",
]
