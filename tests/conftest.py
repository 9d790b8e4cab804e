"""Shared fixtures: a hub on loopback (port 0) and bounded waits."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, settings

from server import Hub, HubConfig, MemoryStore

TIMEOUT_SCALE = float(os.environ.get("CONVSYNC_TIMEOUT_SCALE", "1"))

settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck)
)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


def bound(seconds: float) -> float:
    """A wait bound, scaled by `CONVSYNC_TIMEOUT_SCALE` for slow machines."""
    return seconds * TIMEOUT_SCALE


def hub_config(**overrides: object) -> HubConfig:
    """Test settings: no keepalive pings, quick unloads."""
    values: dict[str, object] = {"ping_interval": None, "idle_unload": 0.2}
    values.update(overrides)
    return HubConfig(**values)  # type: ignore[arg-type]


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    """A hub on 127.0.0.1, port 0, with an in-memory store."""
    async with Hub(MemoryStore(), host="127.0.0.1", port=0, config=hub_config()) as running:
        yield running
