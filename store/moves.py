"""An older store's tables moved to this version's layouts (issue 47), by its first writer of this version, inside
one transaction, before it reads anything: the entity index (its names, then its events' entries), the engine's open
state and the row changes. One list for both dialects (store.store, store.postgres), so that a move is never made
in one and forgotten in the other."""

from __future__ import annotations

from oncewatch.store import engine_state, entities, journal
from oncewatch.store.dialect import Connection
from oncewatch.store.entities import EntityIds, InsertRows
from oncewatch.store.numbered import Numbered


def move_older(conn: Connection, tables_sql: str, entity_ids: EntityIds, spaces: engine_state.Spaces,
               sources: Numbered, insert_rows: InsertRows) -> None:
    """Every move an older store needs (each does nothing to a store already moved); `tables_sql`: the dialect's
    query of the store's tables."""
    entities.move_old_index(conn, tables_sql, entity_ids, insert_rows)
    entities.move_event_entries(conn)
    engine_state.move_old_entries(conn, tables_sql, spaces, insert_rows)
    journal.move_old_rows(conn, tables_sql, sources, insert_rows)
