"""The store's tables and how a connection to them is opened (SQLite in WAL mode).

`engine_entries` holds the engine's open state one entry a row (store.engine_state); every other
table is described where it is written (store.batch) and read (store.store, store.queries).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS row_changes (
    seq INTEGER PRIMARY KEY,
    txid TEXT NOT NULL,
    row_index INTEGER NOT NULL,
    schema_name TEXT NOT NULL,
    table_name TEXT NOT NULL,
    op TEXT NOT NULL,
    pk TEXT NOT NULL,
    before_row TEXT,
    after_row TEXT,
    binlog_file TEXT NOT NULL,
    end_pos INTEGER NOT NULL,
    commit_time REAL NOT NULL,
    commit_clock TEXT NOT NULL,
    snapshot INTEGER NOT NULL DEFAULT 0,
    UNIQUE (txid, row_index, snapshot)
);
CREATE INDEX IF NOT EXISTS row_changes_table ON row_changes (schema_name, table_name, commit_time);
CREATE TABLE IF NOT EXISTS entity_index (
    entity TEXT NOT NULL,      -- e.g. 'trade_no:T123' or 'order_key:O9'
    kind TEXT NOT NULL,        -- 'row_change' | 'event'
    ref TEXT NOT NULL,         -- row_changes.seq or 'topic/partition@offset'
    PRIMARY KEY (entity, kind, ref)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    "offset" INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    timestamp_type TEXT NOT NULL,
    record_key TEXT,
    format TEXT NOT NULL,
    body TEXT NOT NULL,        -- the rest of the event as JSON: see event_body
    PRIMARY KEY (topic, partition, "offset")
);
CREATE TABLE IF NOT EXISTS quarantine (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    "offset" INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    size INTEGER NOT NULL,
    preview TEXT NOT NULL,
    quarantined_at REAL NOT NULL,
    PRIMARY KEY (topic, partition, "offset")
);
CREATE INDEX IF NOT EXISTS quarantine_reason ON quarantine (topic, reason);
-- A quarantined record's own bytes (a too_large value excepted): headers as JSON [[key, base64 or null]].
CREATE TABLE IF NOT EXISTS quarantine_raw (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    "offset" INTEGER NOT NULL,
    record_key BLOB,
    value BLOB,
    headers TEXT NOT NULL,
    PRIMARY KEY (topic, partition, "offset")
);
CREATE TABLE IF NOT EXISTS binlog_quarantine (
    txid TEXT NOT NULL,        -- the transaction's GTID
    binlog_file TEXT NOT NULL,
    event_pos INTEGER NOT NULL, -- end position of the rows event that could not be decoded
    table_name TEXT NOT NULL,  -- schema.table
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    quarantined_at REAL NOT NULL,
    PRIMARY KEY (binlog_file, event_pos)
);
CREATE TABLE IF NOT EXISTS state (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS findings (
    id TEXT PRIMARY KEY,
    rule TEXT NOT NULL,
    name TEXT NOT NULL,
    severity TEXT NOT NULL,
    status TEXT NOT NULL,
    keys TEXT NOT NULL,
    summary TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    resolved_at REAL,
    resolution TEXT,
    evidence TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS findings_rule ON findings (rule, status);
CREATE INDEX IF NOT EXISTS findings_seen ON findings (first_seen);
-- A person's acknowledgement or close of a finding while it stands (see store.reviews).
CREATE TABLE IF NOT EXISTS reviews (
    finding_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,       -- 'acknowledged' | 'closed'
    by TEXT NOT NULL,
    reason TEXT,               -- a close's reason (names.CLOSE_REASONS)
    duplicate_of TEXT,
    note TEXT NOT NULL,
    at REAL NOT NULL,
    until REAL                 -- an acknowledgement lapses, an accepted risk expires, then
);
CREATE INDEX IF NOT EXISTS reviews_until ON reviews (until);
-- Every change of a finding's status, kept for the auditors.
CREATE TABLE IF NOT EXISTS finding_history (
    finding_id TEXT NOT NULL,
    at REAL NOT NULL,
    status TEXT NOT NULL,      -- the status it changed to
    by TEXT NOT NULL,          -- 'oncewatch' for the monitor, else the person
    reason TEXT,
    note TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS finding_history_id ON finding_history (finding_id, at);
CREATE TABLE IF NOT EXISTS health (
    component TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS series (
    name TEXT NOT NULL,
    labels TEXT NOT NULL,
    at REAL NOT NULL,
    value REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS series_name_at ON series (name, at);
CREATE TABLE IF NOT EXISTS engine_entries (
    space TEXT NOT NULL,
    key TEXT NOT NULL,
    at REAL NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (space, key)
) WITHOUT ROWID;
"""


class StoreError(RuntimeError):
    """The store file cannot be opened or written; the message names the file."""


def connect(path: str, *, readonly: bool = False) -> sqlite3.Connection:
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30, check_same_thread=False)
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the store {path}: {exc}") from exc
    conn.execute("PRAGMA busy_timeout=30000")
    return conn
