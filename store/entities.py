"""The entity index: the row changes and events each drill-down entity ('trade_no:T1', 'pk:shop.shipments:7') is
filed under (oncewatch.monitor.entities says which), so the drill-down finds them without a scan.

An entry is two numbers in `entity_refs`: the entity's id (the first eight bytes of its name's BLAKE2b, signed)
and the record's: a row change's seq, or minus an event's rowid. The name is kept once, in `entity_names`. An
entry takes about a sixth of what the name and the record's coordinates took as text (issue 47). Two names with
one id would share their records in the drill-down; at 2^-64 a pair, a store of a billion entities has a chance
in 30 billion of one.

Stores made before kept the index as text in `entity_index`; their first writer of this version moves it here
(`move_old_index`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from oncewatch.core.names import split_partition_key
from oncewatch.store.dialect import Connection

log = logging.getLogger(__name__)

CHUNK = 500  # ids or refs to a statement
# A row's own entity ('pk:shop.orders:7') is only ever looked up by its name, never walked to from a record
# (`names_of` serves the timeline's walk to a record's trade_nos and announced keys), so its name is not kept:
# half the names, one store write less for most records.
UNNAMED = "pk:"
OLD_INDEX = "entity_index"
MOVE_CHUNK = 50_000
# Batch.insert_rows: (head, one row's placeholders, rows per statement, rows, tail)
InsertRows = Callable[[str, str, int, list[tuple[Any, ...]], str], None]


def entity_id(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


def event_ref(rowid: int) -> int:
    """The entity index's number for the event at `rowid` (row changes are their seq)."""
    return -rowid


class KnownNames:
    """The ids of names the writer has stored lately, so that an entity's later records do not store its name again
    (most entities have several records close together). Bounded; one stored by a transaction that rolls back,
    or deleted by retention, is forgotten."""

    LIMIT = 200_000

    def __init__(self) -> None:
        self.ids: set[int] = set()
        self._unsaved: set[int] = set()

    def new(self, ids: dict[str, int]) -> list[tuple[int, str]]:
        """(id, name) of those of `ids` not known to be stored; they are taken as stored from now on."""
        fresh = [(i, name) for name, i in ids.items() if i not in self.ids]
        if len(self.ids) > self.LIMIT:
            self.ids.clear()
        self.ids.update(i for i, _ in fresh)
        self._unsaved.update(i for i, _ in fresh)
        return fresh

    def gone(self, ids: Iterable[int]) -> None:
        self.ids.difference_update(ids)

    def committed(self) -> None:
        self._unsaved.clear()

    def rolled_back(self) -> None:
        self.ids -= self._unsaved
        self._unsaved.clear()


def file(conn: Connection, entries: Sequence[tuple[str, int]], insert_rows: InsertRows,
         known: KnownNames | None = None) -> None:
    """File each record `ref` under the entity `name` of (name, ref); `insert_rows`: Batch.insert_rows; `known`:
    the names the writer knows are stored (None: none)."""
    if not entries:
        return
    ids = {name: entity_id(name) for name, _ in entries}
    named = {name: i for name, i in ids.items() if not name.startswith(UNNAMED)}
    names = known.new(named) if known is not None else [(i, name) for name, i in named.items()]
    insert_rows("INSERT INTO entity_names (id, name) VALUES ", "(?,?)", 50, names, " ON CONFLICT DO NOTHING")
    insert_rows("INSERT INTO entity_refs (entity, ref) VALUES ", "(?,?)", 50,
                [(ids[name], ref) for name, ref in entries], " ON CONFLICT DO NOTHING")


def refs_of(conn: Connection, names: Iterable[str]) -> dict[str, list[int]]:
    """The refs filed under each of `names` (a name with none is not in the answer)."""
    by_id = {entity_id(n): n for n in set(names)}
    out: dict[str, list[int]] = {}
    ids = sorted(by_id)
    for i in range(0, len(ids), CHUNK):
        part = ids[i:i + CHUNK]
        for entity, ref in conn.execute(
                f"SELECT entity, ref FROM entity_refs WHERE entity IN ({','.join('?' * len(part))})", part):
            out.setdefault(by_id[entity], []).append(ref)
    return out


def names_of(conn: Connection, refs: Iterable[int]) -> set[str]:
    """Every entity the records `refs` are filed under, but their own (UNNAMED)."""
    refs = sorted(set(refs))
    out: set[str] = set()
    for i in range(0, len(refs), CHUNK):
        part = refs[i:i + CHUNK]
        out.update(name for (name,) in conn.execute(
            "SELECT n.name FROM entity_refs r JOIN entity_names n ON n.id = r.entity "
            f"WHERE r.ref IN ({','.join('?' * len(part))})", part))
    return out


def forget(conn: Connection, refs: Sequence[int], known: KnownNames | None = None) -> int:
    """Delete the entries of the records `refs` (pruned), and the names left with none (which `known` forgets);
    returns the entries."""
    gone = 0
    for i in range(0, len(refs), CHUNK):
        part = list(refs[i:i + CHUNK])
        deleted = conn.execute(f"DELETE FROM entity_refs WHERE ref IN ({','.join('?' * len(part))}) RETURNING entity",
                               part).fetchall()
        gone += len(deleted)
        ids = sorted({e for (e,) in deleted})
        for j in range(0, len(ids), CHUNK):
            some = ids[j:j + CHUNK]
            names = conn.execute(f"DELETE FROM entity_names WHERE id IN ({','.join('?' * len(some))}) AND NOT EXISTS "
                                 "(SELECT 1 FROM entity_refs r WHERE r.entity = entity_names.id) RETURNING id",
                                 some).fetchall()
            if known is not None:
                known.gone(i for (i,) in names)
    return gone


def move_old_index(conn: Connection, tables_sql: str, insert_rows: InsertRows) -> int:
    """An older store's text index (`entity_index`: entity, kind 'row_change' or 'event', ref the seq or
    'topic/partition@offset') filed here and dropped, inside the caller's transaction, MOVE_CHUNK entries at a
    time; returns the entries moved. `tables_sql`: the dialect's query of the store's tables. An entry whose
    event is no longer kept is left out, as retention would have pruned it."""
    if OLD_INDEX not in {t for (t,) in conn.execute(tables_sql)}:
        return 0
    moved, after = 0, ("", "", "")
    while rows := conn.execute(f"SELECT entity, kind, ref FROM {OLD_INDEX} WHERE (entity, kind, ref) > (?, ?, ?) "
                               "ORDER BY entity, kind, ref LIMIT ?", (*after, MOVE_CHUNK)).fetchall():
        after = tuple(rows[-1])
        entries = []
        for name, kind, ref in rows:
            if kind == "row_change":
                entries.append((name, int(ref)))
                continue
            topic_partition, offset = ref.rsplit("@", 1)
            topic, partition = split_partition_key(topic_partition)
            found = conn.execute('SELECT rowid FROM events WHERE topic = ? AND partition = ? AND "offset" = ?',
                                 (topic, partition, int(offset))).fetchone()
            if found is not None:
                entries.append((name, event_ref(found[0])))
        file(conn, entries, insert_rows)
        moved += len(entries)
    conn.execute(f"DROP TABLE {OLD_INDEX}")
    log.info("the entity index moved to its compact tables", extra={"event": "entity_index_moved", "entries": moved})
    return moved
