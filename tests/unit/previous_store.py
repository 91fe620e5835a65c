"""A store as the version before issue 47's last layouts left it, made from one of this version: its row changes
without their entities' numbers and with a UNIQUE (txid, row_index, snapshot), its events with their topic,
timestamp type and format as text in every row, and the entries found by record through indexes of their own. The
same rows, rowids and entries: what its next writer must move and read back alike."""

from __future__ import annotations

from oncewatch.store import Store

PREVIOUS_ROW_CHANGES = """CREATE TABLE row_changes (seq {int} PRIMARY KEY, txid TEXT NOT NULL, row_index {int} NOT NULL,
    source {int} NOT NULL, pk TEXT NOT NULL, before_row {blob}, after_row {blob}, end_pos {int} NOT NULL,
    commit_time {real} NOT NULL, snapshot {int} NOT NULL DEFAULT 0, UNIQUE (txid, row_index, snapshot))"""
PREVIOUS_EVENTS = """CREATE TABLE events ({rowid}topic TEXT NOT NULL, partition {int} NOT NULL, "offset" {int} NOT NULL,
    timestamp_ms {int} NOT NULL, timestamp_type TEXT NOT NULL, record_key TEXT, format TEXT NOT NULL,
    body {blob} NOT NULL, PRIMARY KEY (topic, partition, "offset"))"""
ROW_COLUMNS = "seq, txid, row_index, source, pk, before_row, after_row, end_pos, commit_time, snapshot"
EVENT_COLUMNS = 'rowid, topic, partition, "offset", timestamp_ms, timestamp_type, record_key, format, body'


def make_previous(store: Store) -> None:
    """`store`'s row changes, events and entity index laid out as the version before kept them."""
    postgres = store.dialect.name == "postgresql"
    types = {"int": "BIGINT" if postgres else "INTEGER", "blob": "BYTEA" if postgres else "BLOB",
             "real": "DOUBLE PRECISION" if postgres else "REAL"}
    rows = store.conn.execute(f"SELECT {ROW_COLUMNS} FROM row_changes ORDER BY seq").fetchall()
    events = store.conn.execute(f"SELECT events.{EVENT_COLUMNS} FROM events JOIN event_sources s ON s.id = "
                                "events.source ORDER BY events.rowid DESC").fetchall()  # rowids not in key order
    with store.batch() as tx:
        for table in ("row_changes", "events", "event_sources"):
            tx.conn.execute(f"DROP TABLE {table}")
        tx.conn.execute(PREVIOUS_ROW_CHANGES.format(**types))
        tx.conn.executemany(f"INSERT INTO row_changes ({ROW_COLUMNS}) VALUES ({','.join('?' * 10)})", rows)
        tx.conn.execute(PREVIOUS_EVENTS.format(rowid="rowid BIGINT GENERATED ALWAYS AS IDENTITY, " if postgres
                                               else "", **types))
        tx.conn.executemany(f"INSERT INTO events ({EVENT_COLUMNS}) {'OVERRIDING SYSTEM VALUE ' if postgres else ''}"
                            f"VALUES ({','.join('?' * 9)})", events)
        tx.conn.execute("CREATE INDEX entity_entries_ref ON entity_entries (ref)")
        tx.conn.execute("CREATE INDEX event_entries_event ON event_entries (event)")
        if postgres:
            tx.conn.execute("CREATE INDEX events_rowid ON events (rowid)")
            tx.conn.execute("SELECT setval(pg_get_serial_sequence('events', 'rowid'), 1000)")
            tx.conn.execute("UPDATE oncewatch_store SET schema_sha256 = 'made by an older version'")
