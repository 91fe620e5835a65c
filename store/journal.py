"""The journal's layouts, the row changes' and the events': what most of them repeat kept once, each row pointing to
it by number (issue 47), and how an older store's rows, which held that text in every row, move over.

A row change's schema, table, op, binlog file and commit clock are kept in `row_sources`; an event's topic,
timestamp type and format in `event_sources`. A store's rows are read through `rows_from` and `events_from` (the
rows joined with their sources), so every column a reader knows keeps its name, in an older store not moved yet
(its writer not started since) too. An event keeps its rowid through the move: the entity index points to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from oncewatch.store.dialect import POSTGRES, Connection, Dialect
from oncewatch.store.numbered import Numbered
from oncewatch.store.packing import as_bytes
from oncewatch.store.schema import aside, columns, move_rows

if TYPE_CHECKING:
    from oncewatch.store.entities import InsertRows

SOURCE_COLUMNS = ("schema_name", "table_name", "op", "binlog_file", "commit_clock")
ROW_CHANGES = "row_changes JOIN row_sources ON row_sources.id = row_changes.source"
# What an older store's records are filed under, by record, from one seq or rowid to another (store.moves)
Numbers = Callable[[int, int], dict[int, "bytes | None"]]
OLD_TABLE = aside("row_changes")  # an older store's rows, set aside (schema.set_older_aside) until moved
MOVE_CHUNK = 20_000
ROWS_PER_STATEMENT = 16
COLUMNS = "seq, txid, row_index, source, pk, before_row, after_row, end_pos, commit_time, snapshot, entities"
INSERT = f"INSERT INTO row_changes ({COLUMNS}) VALUES "
ROW = "(?,?,?,?,?,?,?,?,?,?,?)"
EVENT_SOURCE_COLUMNS = ("topic", "timestamp_type", "format")
EVENTS = "events JOIN event_sources ON event_sources.id = events.source"
OLD_EVENTS = aside("events")
EVENT_STORED = 'source, partition, "offset", timestamp_ms, record_key, body, entities'  # the columns events holds
INSERT_EVENT = f"INSERT INTO events ({EVENT_STORED}) VALUES "
EVENT_ROW = "(?,?,?,?,?,?,?)"


def rows_from(conn: Connection) -> str:
    """What a query of row changes reads FROM: the rows with their sources; an older store's rows alone, which hold
    the same columns (asked at every query: a reader may be open while the writer moves them)."""
    return ROW_CHANGES if "source" in columns(conn, "row_changes") else "row_changes"


def events_from(conn: Connection) -> str:
    """What a query of events reads FROM (its rowid as `events.rowid`): the events with their sources; an older
    store's events alone, which hold the same columns."""
    return EVENTS if "source" in columns(conn, "events") else "events"


def event_sources() -> Numbered:
    """The numbers of the events' sources: (topic, timestamp type, format)."""
    return Numbered("event_sources", EVENT_SOURCE_COLUMNS)


def row_sources() -> Numbered:
    """The numbers of the rows' sources: (schema, table, op, binlog file, commit clock)."""
    return Numbered("row_sources", SOURCE_COLUMNS)


def move_old_rows(conn: Connection, tables_sql: str, sources: Numbered, insert_rows: InsertRows, numbers: Numbers
                  ) -> int:
    """An older store's rows, set aside, moved into row_changes (same seq) and OLD_TABLE dropped, inside the
    caller's transaction; returns the rows moved. Each is given the numbers of the entities it is filed under
    (`numbers`: of the rows from one seq to another). The layout before kept the sources numbered already; the one
    before it, their text in every row."""
    if OLD_TABLE not in {t for (t,) in conn.execute(tables_sql)}:
        return 0
    numbered = "source" in columns(conn, OLD_TABLE)
    source = "source" if numbered else ", ".join(SOURCE_COLUMNS)

    def insert(rows: list[tuple[Any, ...]]) -> None:
        kept = numbers(rows[0][0], rows[-1][0])
        insert_rows(INSERT, ROW, ROWS_PER_STATEMENT, [
            (seq, txid, index, rest[0] if numbered else sources.number(conn, tuple(rest[:len(SOURCE_COLUMNS)])),
             pk, as_bytes(before), as_bytes(after), pos, at, snapshot, kept.get(seq))
            for seq, txid, index, *rest, pk, before, after, pos, at, snapshot in rows], "")

    more = f"txid, row_index, {source}, pk, before_row, after_row, end_pos, commit_time, snapshot"
    return move_rows(conn, OLD_TABLE, "seq", (-1,), MOVE_CHUNK, more, insert, "row_changes_moved")


def move_old_events(conn: Connection, dialect: Dialect, sources: Numbered, insert_rows: InsertRows, numbers: Numbers
                    ) -> int:
    """An older store's events, set aside, moved into events under the same rowids and OLD_EVENTS dropped, inside
    the caller's transaction; returns the events moved. Each is given the numbers of the entities it is filed under
    (`numbers`: of the events from one rowid to another)."""
    if OLD_EVENTS not in {t for (t,) in conn.execute(dialect.tables)}:
        return 0
    postgres = dialect is POSTGRES
    # PostgreSQL's rowid is an identity column: given here, and its sequence set past the largest afterwards
    head = f"INSERT INTO events (rowid, {EVENT_STORED}) {'OVERRIDING SYSTEM VALUE ' if postgres else ''}VALUES "

    def insert(rows: list[tuple[Any, ...]]) -> None:
        kept = numbers(rows[0][0], rows[-1][0])
        insert_rows(head, "(?,?,?,?,?,?,?,?)", ROWS_PER_STATEMENT, [
            (rowid, sources.number(conn, (topic, kind, fmt)), partition, offset, ms, key, as_bytes(body),
             kept.get(rowid)) for rowid, topic, kind, fmt, partition, offset, ms, key, body in rows], "")

    more = f'{", ".join(EVENT_SOURCE_COLUMNS)}, partition, "offset", timestamp_ms, record_key, body'
    moved = move_rows(conn, OLD_EVENTS, "rowid", (-1,), MOVE_CHUNK, more, insert, "events_moved")
    if postgres and moved:
        conn.execute("SELECT setval(pg_get_serial_sequence('events', 'rowid'), (SELECT MAX(rowid) FROM events))")
    return moved
