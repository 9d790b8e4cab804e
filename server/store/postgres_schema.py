"""The PostgreSQL store's schema: the versioned tables and `convsync_append`, made once under
an advisory lock, and the tables beside them made on first use by the same lock.

The versioned schema (`SCHEMA_VERSION`, recorded in `convsync_meta`) is made inside one
transaction that holds `SCHEMA_LOCK`, so hubs starting together do not race; a database whose
`convsync_meta` names another version is refused. The unversioned tables (`convsync_leases`,
`convsync_hubs`: hints and heartbeats, nothing that outlives the hubs) are made by
`create_once`, under the same lock, so a schema of any version gains them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import StoreError

if TYPE_CHECKING:
    from .postgres_pool import Conn

__all__ = [
    "HUBS_TABLE",
    "LEASES_TABLE",
    "MOVED",
    "SCHEMA",
    "SCHEMA_LOCK",
    "SCHEMA_VERSION",
    "SEQ_TAKEN",
    "create_once",
    "create_schema",
]

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE convsync_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE conversations (
    id TEXT COLLATE "C" PRIMARY KEY,
    lineage BIGINT NOT NULL,
    revision BIGINT NOT NULL
);
CREATE TABLE records (
    conversation_id TEXT COLLATE "C" NOT NULL,
    revision BIGINT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (conversation_id, revision)
);
CREATE TABLE snapshots (
    conversation_id TEXT COLLATE "C" PRIMARY KEY,
    lineage BIGINT NOT NULL,
    revision BIGINT NOT NULL,
    data BYTEA NOT NULL
);
CREATE TABLE clients (
    conversation_id TEXT COLLATE "C" NOT NULL,
    client TEXT NOT NULL,
    seq BIGINT NOT NULL,
    ack_from BIGINT NOT NULL,
    ack_revision BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, client)
);
CREATE FUNCTION convsync_append(
    p_id TEXT, p_lineage BIGINT, p_revision BIGINT, p_records BYTEA[],
    p_client TEXT, p_seq BIGINT, p_ack_from BIGINT, p_ack_revision BIGINT
) RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    new_revision BIGINT := p_revision + cardinality(p_records);
    held clients%ROWTYPE;
    head conversations%ROWTYPE;
BEGIN
    IF p_client IS NOT NULL THEN
        -- Checked first: a resend is answered with its ack even when the log moved since.
        INSERT INTO clients (conversation_id, client, seq, ack_from, ack_revision)
        VALUES (p_id, p_client, p_seq, p_ack_from, p_ack_revision)
        ON CONFLICT (conversation_id, client) DO UPDATE SET
            seq = excluded.seq, ack_from = excluded.ack_from, ack_revision = excluded.ack_revision
        WHERE excluded.seq > clients.seq;
        IF NOT FOUND THEN
            SELECT * INTO held FROM clients WHERE conversation_id = p_id AND client = p_client;
            RAISE EXCEPTION USING ERRCODE = 'CV001', MESSAGE = 'seq taken',
                DETAIL = held.seq || ' ' || held.ack_from || ' ' || held.ack_revision;
        END IF;
    END IF;
    -- The race is decided here: a second writer at this position waits for the first to
    -- commit, re-checks the WHERE against the committed row, and updates nothing.
    UPDATE conversations SET revision = new_revision
    WHERE id = p_id AND lineage = p_lineage AND revision = p_revision;
    IF NOT FOUND THEN
        IF p_revision = 0 THEN
            INSERT INTO conversations (id, lineage, revision)
            VALUES (p_id, p_lineage, new_revision) ON CONFLICT (id) DO NOTHING;
        END IF;
        IF p_revision <> 0 OR NOT FOUND THEN
            SELECT * INTO head FROM conversations WHERE id = p_id;
            RAISE EXCEPTION USING ERRCODE = 'CV002', MESSAGE = 'log moved',
                DETAIL = coalesce(head.lineage || ' ' || head.revision, 'none');
        END IF;
    END IF;
    INSERT INTO records (conversation_id, revision, data)
    SELECT p_id, p_revision + n, data FROM unnest(p_records) WITH ORDINALITY AS r(data, n);
    RETURN new_revision;
END
$$;
"""

# What `convsync_append` raises (the statement, and so everything it wrote, is rolled back).
SEQ_TAKEN = "CV001"
MOVED = "CV002"

# Any constant works; it only keeps two hubs from creating the schema at the same moment.
SCHEMA_LOCK = 0x636F6E7673796E63  # "convsync"

# Turn leases (SPEC 10): rows beside the log, one per open turn, hints only.
LEASES_TABLE = (
    "CREATE TABLE IF NOT EXISTS convsync_leases (conversation_id text NOT NULL"
    ' COLLATE "C", turn bigint NOT NULL, owner text NOT NULL,'
    " expires bigint, stop_expires bigint, PRIMARY KEY (conversation_id, turn))"
)

# The bus's heartbeats (SPEC 9): UNLOGGED, since heartbeats need no crash safety.
HUBS_TABLE = (
    "CREATE UNLOGGED TABLE IF NOT EXISTS convsync_hubs"
    " (hub text PRIMARY KEY, expires timestamptz NOT NULL)"
)


async def create_schema(conn: Conn, schema: str | None, where: str) -> None:
    """Make the versioned schema (in `schema` when given) unless `convsync_meta` is there.

    Raises:
        StoreError: `convsync_meta` names another version (reason `schema`; `where` names
            the server). Database failures are the caller's to translate.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
        if schema is not None:
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        exists = await conn.fetchval("SELECT to_regclass('convsync_meta') IS NOT NULL")
        if not exists:
            await conn.execute(SCHEMA)
            await conn.execute(
                "INSERT INTO convsync_meta (key, value) VALUES ('schema_version', $1)",
                str(SCHEMA_VERSION),
            )
            return
        found = await conn.fetchval("SELECT value FROM convsync_meta WHERE key = 'schema_version'")
    version = int(found) if found is not None and str(found).isdigit() else None
    if version != SCHEMA_VERSION:
        newer = version is not None and version > SCHEMA_VERSION
        raise StoreError(
            f"postgresql at {where} holds convsync schema version {found}; this code"
            f" knows version {SCHEMA_VERSION}" + (": upgrade convsync" if newer else ""),
            "schema",
        )


async def create_once(conn: Conn, made: set[str], ddl: str) -> None:
    """Run `ddl` (a `CREATE ... IF NOT EXISTS`) unless this store ran it already (`made`),
    under the schema lock: two hubs creating one table at once would clash."""
    if ddl in made:
        return
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
        await conn.execute(ddl)
    made.add(ddl)
