"""The entity index: the row changes and events each drill-down entity ('trade_no:T1', 'pk:shop.shipments:7') is
filed under (oncewatch.monitor.entities says which), so the drill-down finds them without a scan.

An entry of `entity_refs` is the entity's name and the record's number: a row change's seq, or minus an event's
rowid. Stores made before kept `entity_index`, whose entries also held the kind and the record's coordinates as
text (about 127 bytes an entry, with its index; these take about 60). An entity id hashed from its name would
take a third less, but it lands each entry on a page anywhere in the index: a shop's ids, written in order
(auto-increment keys, numbered orders), would lose the locality that makes their entries an append, and the
judge's filing took 2.5 times the CPU (issue 47). Their first writer of this version moves an older store's
entries here (`move_old_index`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from oncewatch.core.names import split_partition_key
from oncewatch.store.dialect import Connection

log = logging.getLogger(__name__)

CHUNK = 500  # names or refs to a statement
OLD_INDEX = "entity_index"
MOVE_CHUNK = 50_000
# Batch.insert_rows: (head, one row's placeholders, rows per statement, rows, tail)
InsertRows = Callable[[str, str, int, list[tuple[Any, ...]], str], None]


def event_ref(rowid: int) -> int:
    """The entity index's number for the event at `rowid` (row changes are their seq)."""
    return -rowid


def event_rowid(ref: int) -> int:
    """The inverse of `event_ref`."""
    return -ref


def file(entries: list[tuple[str, int]], insert_rows: InsertRows) -> None:
    """File each record `ref` under the entity `name` of (name, ref); `insert_rows`: Batch.insert_rows."""
    if entries:
        insert_rows("INSERT INTO entity_refs (entity, ref) VALUES ", "(?,?)", 50, entries, " ON CONFLICT DO NOTHING")


def refs_of(conn: Connection, names: Iterable[str]) -> dict[str, list[int]]:
    """The refs filed under each of `names` (a name with none is not in the answer)."""
    names = sorted(set(names))
    out: dict[str, list[int]] = {}
    for i in range(0, len(names), CHUNK):
        part = names[i:i + CHUNK]
        for entity, ref in conn.execute(
                f"SELECT entity, ref FROM entity_refs WHERE entity IN ({','.join('?' * len(part))})", part):
            out.setdefault(entity, []).append(ref)
    return out


def names_of(conn: Connection, refs: Iterable[int]) -> set[str]:
    """Every entity the records `refs` are filed under."""
    refs = sorted(set(refs))
    out: set[str] = set()
    for i in range(0, len(refs), CHUNK):
        part = refs[i:i + CHUNK]
        out.update(name for (name,) in conn.execute(
            f"SELECT entity FROM entity_refs WHERE ref IN ({','.join('?' * len(part))})", part))
    return out


def forget(conn: Connection, refs: Sequence[int]) -> int:
    """Delete the entries of the records `refs` (pruned); returns how many went."""
    gone = 0
    for i in range(0, len(refs), CHUNK):
        part = list(refs[i:i + CHUNK])
        gone += conn.execute(f"DELETE FROM entity_refs WHERE ref IN ({','.join('?' * len(part))})", part).rowcount
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
        file(entries, insert_rows)
        moved += len(entries)
    conn.execute(f"DROP TABLE {OLD_INDEX}")
    log.info("the entity index moved to its compact table", extra={"event": "entity_index_moved", "entries": moved})
    return moved
