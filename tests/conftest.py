"""Shared fixtures: a hub on loopback (port 0), bounded waits, PostgreSQL and Redis servers.

Two runs of the suite at once on one machine (two clones) share only the servers, never a
name on them, a port or a file:

- PostgreSQL: one server for the session (`postgres_dsn`: `CONVSYNC_TEST_PG`, else a cluster
  of our own on a fresh `mkdtemp` directory and a free port). Each test that stores in it
  takes `pg_schema`, a schema named `t_` + 20 random hex digits, dropped after the test; its
  tables, its `NOTIFY` channel (`convsync:<schema>`) and the sessions a test counts or kills
  (matched by `LISTEN "convsync:<schema>"`) are its own. No test uses the database's public
  schema or a fixed schema name.
- Redis: one server (`redis_url`: `CONVSYNC_TEST_REDIS`, else a `redis-server` of our own on a
  free port). The bus's channel and heartbeat keys are prefixed with the store's channel,
  so with the test's schema: `convsync:<schema>:...`. No test uses a fixed key or flushes.
- Ports: hubs and helper servers bind 127.0.0.1 port 0; a test that needs a taken port binds
  port 0 itself and keeps it bound.
- Files: under `tmp_path` (pytest numbers its base directories and locks them per run) or a
  `mkdtemp` directory; nothing in a fixed /tmp path, and the working tree is the clone's own.

Every task a test starts is awaited or cancelled before it ends: the `unretrieved` plugin
loaded below fails the session when asyncio reports an exception nobody retrieved.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from client import Replica
from server import Hub, HubConfig, MemoryStore
from server.store import LogStore, PostgresStore, SqliteStore

# The helpers (`tests/support/`) are imported by their bare names, as the tests of every layer
# and the benchmarks do.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

pytest_plugins = ["unretrieved"]  # the session fails on an exception no one retrieved

TIMEOUT_SCALE = float(os.environ.get("CONVSYNC_TIMEOUT_SCALE", "1"))

# The suite's default: Hypothesis's wall-clock checks (a per-example deadline, "input
# generation is slow") are off, because on a shared 2-core machine they measure the machine's
# load, not the code (a round-trip property failed `too_slow` at a load of 20). Every check of
# what is generated stays on.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")
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


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A PostgreSQL server for the whole session (see `tests/support/pgserver.py`).

    Skips when none can be had, or fails instead when `CONVSYNC_REQUIRE_PG=1` (`make test`
    sets it, so CI never passes with the PostgreSQL tests skipped).
    """
    import pgserver

    required = os.environ.get("CONVSYNC_REQUIRE_PG") == "1"
    try:
        found = pgserver.find_or_start()
    except (ImportError, RuntimeError) as exc:
        found = f"no PostgreSQL for the tests: {exc}"
    if isinstance(found, str):
        if required:
            pytest.fail(f"{found} (CONVSYNC_REQUIRE_PG=1)", pytrace=False)
        pytest.skip(found)
    try:
        yield found.dsn
    finally:
        found.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis server for the whole session (see `tests/support/redisserver.py`): skips when
    none can be had, or fails instead when `CONVSYNC_REQUIRE_REDIS=1` (`make test` sets it)."""
    required = os.environ.get("CONVSYNC_REQUIRE_REDIS") == "1"
    try:
        import redisserver

        found = redisserver.find_or_start()
    except ImportError as exc:
        found = f"no Redis for the tests: {exc}"
    if isinstance(found, str):
        if required:
            pytest.fail(f"{found} (CONVSYNC_REQUIRE_REDIS=1)", pytrace=False)
        pytest.skip(found)
    try:
        yield found.url
    finally:
        found.stop()


@pytest.fixture
def pg_schema(postgres_dsn: str) -> Iterator[str]:
    """A schema name of this test's own on the test server, dropped afterwards."""
    import pgserver

    schema = f"t_{uuid.uuid4().hex[:20]}"
    yield schema
    pgserver.drop_schema(postgres_dsn, schema)


def drop_connection(replica: Replica) -> None:
    """Cut `replica`'s current connection under it (it reconnects by itself)."""
    ws = replica._ws
    if ws is not None:
        ws.transport.abort()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], LogStore]:
    """Makes a fresh store of one kind; PostgreSQL in a schema of the test's own."""
    if request.param == "memory":
        return MemoryStore
    if request.param == "sqlite":
        return lambda: SqliteStore(tmp_path / "db")
    # Resolved here, outside the event loop: finding the server may start a cluster.
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema: str = request.getfixturevalue("pg_schema")
    return lambda: PostgresStore(dsn, schema=schema)
