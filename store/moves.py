"""An older store's tables moved to this version's layouts (issue 47), by its first writer of this version, inside
one transaction, before it reads anything: the events (first: the entity index's older entries find theirs by their
coordinates), the entity index (its names, then its events' entries), the engine's open state and the row changes,
and last the records given the numbers of the entities they are filed under. One list for both dialects
(store.store, store.postgres), so that a move is never made in one and forgotten in the other."""

from __future__ import annotations

from oncewatch.store import engine_state, entities, journal
from oncewatch.store.dialect import Connection, Dialect
from oncewatch.store.entities import EntityIds, InsertRows
from oncewatch.store.journal import Numbers
from oncewatch.store.numbered import Numbered


def move_older(conn: Connection, dialect: Dialect, entity_ids: EntityIds, spaces: engine_state.Spaces,
               sources: Numbered, event_sources: Numbered, insert_rows: InsertRows) -> None:
    """Every move an older store needs (each does nothing to a store already moved)."""
    tables_sql = dialect.tables
    by_record = entities.older_by_record(conn, dialect)

    def numbers(kind: int) -> Numbers:  # what an older store's records are filed under, from its index by record
        return lambda low, high: entities.numbers_by_record(conn, entities.ENTRIES[kind], low, high) if by_record \
            else {}

    journal.move_old_events(conn, dialect, event_sources, insert_rows, numbers(1))
    moved = entities.move_old_index(conn, tables_sql, entity_ids, insert_rows)
    if by_record:
        entities.move_event_entries(conn)
    engine_state.move_old_entries(conn, tables_sql, spaces, insert_rows)
    journal.move_old_rows(conn, tables_sql, sources, insert_rows, numbers(0))
    if by_record or moved:  # last: records whose entries were moved after them are numbered here
        entities.number_records(conn)
