"""What the store's SQL says differently in SQLite and PostgreSQL; everything else is one text.

The schema is written once, in SQLite's words (store.schema.SCHEMA); PostgreSQL's is made from it
here: 8-byte integers and floats (PostgreSQL's INTEGER and REAL are 4 bytes), BYTEA for BLOB, and
an identity column named `rowid` on the tables whose SQLite rowid the queries order by (insertion
order), so those queries read the same in both.
"""

from __future__ import annotations

import re
import sqlite3
from typing import TYPE_CHECKING, NamedTuple, Union

if TYPE_CHECKING:
    from oncewatch.store.postgres import PgConnection

# What the store's code executes its SQL on: sqlite3's connection, or PostgreSQL's in its API.
Connection = Union[sqlite3.Connection, "PgConnection"]

# The tables whose rowid a query reads (findings' and history's ties, retention's oldest-first slices).
ROWID_TABLES = ("events", "findings", "finding_history", "series")


class Dialect(NamedTuple):
    name: str
    begin_write: str  # a write transaction that takes the write lock at once
    begin_snapshot: str  # a read transaction whose reads all see one committed state
    tables: str  # SELECT of the names of the store's own tables
    label_match: str  # `AND <a series' label> = ?`: parameters (label_path(name), value)
    label_prefix: str
    key_search: str  # a findings WHERE clause: a key value equal to the search; parameters (value, value)
    contains: str  # `<column> holds the text`: contains.format(column), parameter (text)
    index_named: str  # a row when the store has an index of that name: parameter (name)

    def label_path(self, name: str) -> str:
        return self.label_prefix + name


SQLITE = Dialect(
    name="sqlite",
    begin_write="BEGIN IMMEDIATE",
    begin_snapshot="BEGIN",  # with WAL, a read transaction reads one snapshot
    tables="SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
    label_match=" AND json_extract(labels, ?) = ?",
    label_prefix="$.",
    # Any key value (lists included: F2's trade_nos) equal to the search. instr() cheaply discards most
    # rows, json_tree insists on an exact value; as a rowid set, so the newest-first scan of the
    # findings_seen index tests membership without reading rows.
    key_search="findings.rowid IN (SELECT rowid FROM findings WHERE instr(keys, ?) > 0 AND EXISTS "
               "(SELECT 1 FROM json_tree(findings.keys) j WHERE j.atom IS NOT NULL AND CAST(j.atom AS TEXT) = ?))",
    contains="instr({}, ?) > 0",
    index_named="SELECT 1 FROM sqlite_schema WHERE type = 'index' AND name = ?",
)

POSTGRES = Dialect(
    name="postgresql",
    begin_write="BEGIN",
    begin_snapshot="BEGIN ISOLATION LEVEL REPEATABLE READ",
    tables="SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
           "AND table_name <> 'oncewatch_store'",
    label_match=" AND labels::jsonb ->> ? = ?",
    label_prefix="",
    key_search="strpos(keys, ?) > 0 AND EXISTS (SELECT 1 FROM jsonb_path_query(keys::jsonb, 'strict $.**') j "
               "WHERE jsonb_typeof(j) IN ('string', 'number', 'boolean') AND j #>> '{}' = ?)",
    contains="strpos({}, ?) > 0",
    index_named="SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() AND indexname = ?",
)


def postgres_types(sql: str) -> str:
    """SQLite's types in `sql` as PostgreSQL's."""
    out = re.sub(r"\bINTEGER\b", "BIGINT", sql)
    out = re.sub(r"\bREAL\b", "DOUBLE PRECISION", out)
    return re.sub(r"\bBLOB\b", "BYTEA", out)


def postgres_schema(schema: str) -> str:
    """SQLite's schema text in PostgreSQL's types."""
    out = postgres_types(schema.replace(") WITHOUT ROWID;", ");"))
    for table in ROWID_TABLES:
        head = f"CREATE TABLE IF NOT EXISTS {table} ("
        if head not in out:
            raise ValueError(f"the schema has no table {table}")
        out = out.replace(head, f"{head}\n    rowid BIGINT GENERATED ALWAYS AS IDENTITY,", 1)
        # SQLite finds a rowid by its table's own b-tree; retention's oldest-first slices need it here
        out += f"CREATE INDEX IF NOT EXISTS {table}_rowid ON {table} (rowid);\n"
    return out
