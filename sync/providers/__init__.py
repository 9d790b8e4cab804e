"""Converters between convsync messages and LLM provider payloads (SPEC §11), pure.

Each module handles one format on plain JSON-shaped dicts (what the SDKs take as parameters
and give with `model_dump()`; an SDK object is also accepted where a payload is read). Every
format's rules, renderings, losses and stop reasons are written down in its module:
`anthropic`, `openai_chat`, `openai_responses`. The stream folds are in `sync.providers.streams`.
"""

from __future__ import annotations

from ._common import Request
from .anthropic import from_anthropic, is_paused, to_anthropic
from .openai_chat import from_openai_chat, to_openai_chat
from .openai_responses import from_openai_responses, to_openai_responses

__all__ = [
    "Request",
    "from_anthropic",
    "from_openai_chat",
    "from_openai_responses",
    "is_paused",
    "to_anthropic",
    "to_openai_chat",
    "to_openai_responses",
]
