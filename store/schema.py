"""The store's tables, how a new store is made and how a connection to one is opened (SQLite, WAL).

`open_state` holds the engine's open state one entry a row (store.engine_state); every other
table is described where it is written (store.batch) and read (store.store, store.queries).

A store carries APPLICATION_ID in its header (SQLite's own place for "which program's file is
this"), so that a connection can tell it from an empty file or another program's database and
refuse those before writing anything: a schema written into them would be a silent new store,
and would change a stranger's file.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from oncewatch.store.dialect import Connection, postgres_types
from oncewatch.store.errors import NotAStoreError, StoreError
from oncewatch.store.files import MEMORY, make_dir, said_full

log = logging.getLogger(__name__)

APPLICATION_ID = 0x6F6E6377  # "oncw"
# Stores made before the mark are known by these tables; their next writer marks them.
UNMARKED_TABLES = {"checkpoints", "findings"}
# A writer's page cache, in KiB (SQLite's default is 2 MiB): every record adds to the B-trees of the entity
# index and of the engine's entries at its key's place, which for a shop's scattered ids is anywhere, and a
# page not in the cache is read back from the file. Filled only as pages are read, so a small store uses
# less. bench/monitor_throughput.py (3 runs each): +7 % records/s, +18 % with --scattered-keys, for about
# 70 MiB more RSS at the peak.
WRITER_CACHE_KIB = 64 * 1024

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
    source INTEGER NOT NULL,   -- row_sources.id: its schema, table, op, binlog file and commit clock
    pk TEXT NOT NULL,
    before_row BLOB,           -- packed JSON (store.packing), as after_row, events.body and open_state.value
    after_row BLOB,
    end_pos INTEGER NOT NULL,
    commit_time REAL NOT NULL,
    snapshot INTEGER NOT NULL DEFAULT 0,
    entities BLOB              -- the entity index's numbers it is filed under (store.entities.pack_numbers), or NULL
);
-- What most row changes repeat, kept once (store.journal): a row's values in these five were 45 bytes of text.
CREATE TABLE IF NOT EXISTS row_sources (
    id INTEGER PRIMARY KEY,
    schema_name TEXT NOT NULL,
    table_name TEXT NOT NULL,
    op TEXT NOT NULL,
    binlog_file TEXT NOT NULL,
    commit_clock TEXT NOT NULL,
    UNIQUE (schema_name, table_name, op, binlog_file, commit_clock)
);
-- No page or command reads row changes by table and time; the index an older version made for it goes.
DROP INDEX IF EXISTS row_changes_table;
-- The drill-down's way in (store.entities): the records filed under each entity ('trade_no:T1'), its name kept
-- once under a number the writer gives in the order names are first seen; a row change's entries (ref: its seq)
-- apart from an event's (its rowid). A record keeps the numbers it is filed under itself (its `entities`), which
-- is how a timeline walks from it and retention finds its entries: an index of the entries by record took three
-- times the room.
CREATE TABLE IF NOT EXISTS entity_names (
    id INTEGER PRIMARY KEY,
    prefix INTEGER NOT NULL,   -- entity_prefixes.id: the name up to its last ':' ('pk:shop.orders:', 'trade_no:')
    rest TEXT NOT NULL,        -- the name after it
    UNIQUE (rest, prefix)      -- rest first: a lookup of names reads by their rests
);
CREATE TABLE IF NOT EXISTS entity_prefixes (
    id INTEGER PRIMARY KEY,
    prefix TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS entity_entries (
    entity INTEGER NOT NULL,
    ref INTEGER NOT NULL,
    PRIMARY KEY (entity, ref)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS event_entries (
    entity INTEGER NOT NULL,
    event INTEGER NOT NULL,    -- events.rowid
    PRIMARY KEY (entity, event)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    source INTEGER NOT NULL,   -- event_sources.id: its topic, timestamp type and format
    partition INTEGER NOT NULL,
    "offset" INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    record_key TEXT,
    body BLOB NOT NULL,        -- the rest of the event as packed JSON: see event_body
    entities BLOB,             -- as row_changes.entities
    PRIMARY KEY (source, partition, "offset")
);
-- What every event of a topic repeats, kept once (store.journal): 36 bytes of text an event, its topic twice.
CREATE TABLE IF NOT EXISTS event_sources (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    timestamp_type TEXT NOT NULL,
    format TEXT NOT NULL,
    UNIQUE (topic, timestamp_type, format)
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
-- A quarantined record's own bytes (a too_large value excepted): headers as JSON [[key, base64 or null]]
-- (a key that is not UTF-8 in surrogate escapes, as JSON writes them); timestamp_type CreateTime or LogAppendTime.
CREATE TABLE IF NOT EXISTS quarantine_raw (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    "offset" INTEGER NOT NULL,
    record_key BLOB,
    value BLOB,
    headers TEXT NOT NULL,
    timestamp_type TEXT,
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
-- covers the GROUP BY of /metrics' counts, read at every scrape
CREATE INDEX IF NOT EXISTS findings_counts ON findings (rule, severity, status);
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
-- The engine's open state, an entry a row (store.engine_state): each space's name once, under a number, and the
-- prefixes of the engine's keys (up to their last separator: an announced key's topic and event type) likewise.
CREATE TABLE IF NOT EXISTS open_state_spaces (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS open_state_prefixes (
    id INTEGER PRIMARY KEY,
    prefix TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS open_state (
    space INTEGER NOT NULL,    -- open_state_spaces.id
    prefix INTEGER NOT NULL,   -- open_state_prefixes.id
    rest TEXT NOT NULL,        -- the engine's key after its prefix, as it is (not JSON)
    at REAL NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (space, prefix, rest)
) WITHOUT ROWID;
-- by age: what the horizon drops (an older layout's index, open_state_at, goes with its table when it is moved)
CREATE INDEX IF NOT EXISTS open_state_age ON open_state (space, at);
-- The zstd dictionaries packed values need (store.packing): never changed, never deleted.
CREATE TABLE IF NOT EXISTS dictionaries (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    data BLOB NOT NULL
);
-- The verdict of each successful payment (issue 45, checks.verdicts): pending, then verified or violated; a
-- verified trade a later finding touches is violated, its verified_at kept. amount: exact decimal text in the
-- shop's unit (NULL when the payments table has no amount column).
CREATE TABLE IF NOT EXISTS trade_verdicts (
    trade_no TEXT PRIMARY KEY,
    order_id TEXT,
    amount TEXT,
    verdict TEXT NOT NULL,
    rule TEXT,
    committed_at REAL NOT NULL,
    reached_at REAL,
    verified_at REAL
);
CREATE INDEX IF NOT EXISTS trade_verdicts_committed ON trade_verdicts (committed_at, trade_no);
CREATE INDEX IF NOT EXISTS trade_verdicts_verdict ON trade_verdicts (verdict);
"""

# Columns added to a table after stores were made with it: CREATE TABLE IF NOT EXISTS leaves an older
# store's table as it was, so its writer adds them (`add_columns`). (table, column, its type in SQLite's words)
ADDED_COLUMNS = (("quarantine_raw", "timestamp_type", "TEXT"),)
# Columns that hold store.packing's values; an older store's are text (SQLite keeps bytes in them as they are).
PACKED_COLUMNS = (("row_changes", "before_row"), ("row_changes", "after_row"), ("events", "body"),
                  ("open_state", "value"))


def columns(conn: Connection, table: str) -> set[str]:
    """The names of a table's columns (in SQLite or PostgreSQL)."""
    return {d[0] for d in conn.execute(f"SELECT * FROM {table} LIMIT 0").description}


# Tables whose layout changed: (the table, a column, whether its older layouts have it or lack it). Its older rows are
# set aside until they are moved into the new one (store.journal, store.entities). The row changes' older layouts lack
# their entities' numbers and held their text's UNIQUE (txid, row_index, snapshot), which nothing reads by.
RELAID = (("row_changes", "entities", False), ("entity_names", "name", True), ("open_state", "key", True),
          ("events", "topic", True))


def aside(table: str) -> str:
    """The name a table of RELAID in its older layout is set aside under."""
    return f"{table}_old"


def set_older_aside(conn: Connection, tables_sql: str) -> None:
    """Before the schema is made: each table of RELAID still in its older layout renamed aside, so that the
    schema makes the new one beside it."""
    tables = {t for (t,) in conn.execute(tables_sql)}
    for table, column, older_has in RELAID:
        if table in tables and aside(table) not in tables and (column in columns(conn, table)) == older_has:
            conn.execute(f"ALTER TABLE {table} RENAME TO {aside(table)}")


def in_key_order(conn: Connection, table: str, key: str, start: tuple[Any, ...], chunk: int, more: str = ""
                 ) -> Iterator[list[tuple[Any, ...]]]:
    """An older table's rows `chunk` at a time, ordered by `key` (its primary key's columns) from past `start`:
    the key's columns, then `more`'s. What moves an older store's table into a newer one, a slice a statement."""
    after, selected = start, f"{key}, {more}" if more else key
    while rows := conn.execute(f"SELECT {selected} FROM {table} WHERE ({key}) > ({','.join('?' * len(after))}) "
                               f"ORDER BY {key} LIMIT ?", (*after, chunk)).fetchall():
        after = tuple(rows[-1][:len(start)])
        yield rows


def move_rows(conn: Connection, table: str, key: str, start: tuple[Any, ...], chunk: int, more: str,
              insert: Callable[[list[tuple[Any, ...]]], None], moved_event: str) -> int:
    """An older store's `table` moved row for row into its newer one and dropped, inside the caller's transaction:
    each slice of `in_key_order` handed to `insert`; the rows moved are logged as `moved_event` and returned."""
    moved = 0
    for rows in in_key_order(conn, table, key, start, chunk, more):
        insert(rows)
        moved += len(rows)
    conn.execute(f"DROP TABLE {table}")
    if moved:
        log.info("an older store's table moved to its newer layout", extra={"event": moved_event, "table": table,
                                                                             "rows": moved})
    return moved


def add_columns(conn: Connection) -> None:
    """Give an older store's tables the columns of ADDED_COLUMNS they lack; call it in a write transaction,
    so that two writers starting together do not both add one."""
    for table, column, kind in ADDED_COLUMNS:
        if column not in columns(conn, table):
            kind = kind if isinstance(conn, sqlite3.Connection) else postgres_types(kind)
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def create(path: str) -> None:
    """A new store at `path`: marked, with its schema, 0600; nothing happens when a file is there.
    It is built beside `path` and linked into place, so a failure (a full disk) leaves no half
    store behind that the next start would have to refuse as empty."""
    make_dir(path)
    with said_full(path):
        fd, new = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.new-")
    os.close(fd)
    try:
        with said_full(path):
            conn = sqlite3.connect(new, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                conn.executescript(SCHEMA)
            finally:
                conn.close()
            os.link(new, path)
    except FileExistsError:
        pass  # made meanwhile by another process: theirs stands
    finally:
        for name in (new, f"{new}-wal", f"{new}-shm"):
            Path(name).unlink(missing_ok=True)


def connect(path: str, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection to the existing store at `path` (or to `:memory:`). An empty file, or one that is
    not an oncewatch store, is NotAStoreError and left exactly as it was: SQLite would take an empty
    file for a new database (and drop the `-wal` beside it), so it is refused before SQLite opens it."""
    if path != MEMORY:
        _refuse_empty(path)
    try:
        with said_full(path):
            if readonly:
                conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30, check_same_thread=False)
            else:
                conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA busy_timeout=30000")
                if path != MEMORY:
                    _recognise(conn, path, mark=not readonly)
                if not readonly:
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
            except BaseException:
                conn.close()
                raise
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the store {path} ({exc}): check store.path, and that this user may read "
                         f"the store's files (they are 0600: the monitor's user)") from exc
    return conn


def _refuse_empty(path: str) -> None:
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise StoreError(f"there is no store at {path}") from None
    if size == 0:
        raise NotAStoreError(
            f"{path} is empty (0 bytes), so it is not an oncewatch store (a store holds at least its schema): "
            f"it was truncated, or made by something else. It is left as it is: restore the store from a "
            f"backup, or delete the file to start afresh (the monitor then makes a new store and bootstraps; "
            f"the findings of the old one are gone)")


def _recognise(conn: sqlite3.Connection, path: str, *, mark: bool) -> None:
    """NotAStoreError unless the file is an oncewatch store; an unmarked one gets the mark if `mark`."""
    advice = "point store.path at the monitor's store, or at a path where there is no file yet"
    try:
        found = conn.execute("PRAGMA application_id").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        if exc.sqlite_errorcode != sqlite3.SQLITE_NOTADB:
            raise
        raise NotAStoreError(f"{path} is not an oncewatch store (it is not a SQLite database); it is left as "
                             f"it is: {advice}") from None
    if found == APPLICATION_ID:
        return
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    if found == 0 and UNMARKED_TABLES <= tables:
        if mark:
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
        return
    what = f"application_id {found:#x}" if found else f"tables: {', '.join(sorted(tables)) or 'none'}"
    raise NotAStoreError(f"{path} is a SQLite database but not an oncewatch store ({what}); it is left as it "
                         f"is: {advice}")
