"""The entity index: the row changes and events each drill-down entity ('trade_no:T1', 'pk:shop.shipments:7') is
filed under (oncewatch.monitor.entities says which), so the drill-down finds them without a scan.

Each entity's name is kept once, in `entity_names`, under a number given in the order names are first seen; an
entry is that number and the record's: a row change's seq in `entity_entries`, an event's rowid in `event_entries`
(callers see one number, a ref: the seq, or minus the rowid). A record keeps the numbers it is filed under itself
(`entities`, `pack_numbers`): a timeline walks from it to its entities by them, and retention deletes its entries by
them. An index of the entries by record did both before, at three times the room (10 bytes an entry and its index,
against 3 a number). Stores made before kept their events' entries in `entity_entries` under minus the rowid, or
the entries found by record through `entity_entries_ref` and `event_entries_event`; their first writer of this
version moves them (`move_event_entries`) and gives their records their numbers (`number_records`). Numbers in
first-seen order keep a shop's entries an append, as its ids come in order; a number hashed from the name took a
third less room but landed each entry anywhere in the index, at 2.5 times the judge's CPU. The store's one writer
of records (the monitor, under its lock) gives the numbers, as it gives row changes their seq, and keeps the names
it has numbered in `EntityIds`. A name is kept as its prefix's number (up to its last ':', 'pk:shop.orders:', kept once
in `entity_prefixes`) and the rest. Stores made before kept the name in every entry (`entity_index`, with the kind
and the record's coordinates as text, then `entity_refs`), or whole in `entity_names`; their first writer of this
version moves them here (`move_old_index`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from oncewatch.core.names import split_partition_key
from oncewatch.store.dialect import Connection, Dialect
from oncewatch.store.journal import events_from
from oncewatch.store.numbered import Numbered, prefix_and_rest
from oncewatch.store.schema import aside, columns, in_key_order, move_rows

log = logging.getLogger(__name__)

CHUNK = 500  # names or refs to a statement
T = TypeVar("T")
OLD_INDEXES = ("entity_index", "entity_refs")  # the name in every entry: (entity, kind, ref text), (entity, ref)
OLD_NAMES = aside("entity_names")  # an older store's entity_names (id, name whole), set aside (schema.set_older_aside)
MOVE_CHUNK = 50_000
CACHED = 100_000  # names the writer keeps the numbers of (about 15 MiB); a name not kept is looked up
# Batch.insert_rows: (head, one row's placeholders, rows per statement, rows, tail)
InsertRows = Callable[[str, str, int, list[tuple[Any, ...]], str], None]


def _chunks(values: Sequence[T]) -> Iterator[tuple[list[T], str]]:
    """`values` CHUNK at a time, each with the placeholders of its IN list."""
    for i in range(0, len(values), CHUNK):
        part = list(values[i:i + CHUNK])
        yield part, ",".join("?" * len(part))


def event_ref(rowid: int) -> int:
    """The entity index's number for the event at `rowid` (row changes are their seq)."""
    return -rowid


def event_rowid(ref: int) -> int:
    """The inverse of `event_ref`."""
    return -ref


def split_name(name: str) -> tuple[str, str]:
    """(prefix, rest) of an entity's name: the prefix up to its last ':', kept once in entity_prefixes."""
    return prefix_and_rest(name, ":")


NAMES = "entity_names n JOIN entity_prefixes p ON p.id = n.prefix"  # `p.prefix || n.rest`: a name whole


def _named(conn: Connection, names: Sequence[str], columns: str, tail: str = "") -> Iterator[tuple[Any, ...]]:
    """(name, *columns) of each of `names` stored (found by their rests, and those of other prefixes left out)."""
    wanted = set(names)
    rests = sorted({split_name(name)[1] for name in wanted})
    for part, marks in _chunks(rests):
        for row in conn.execute(f"SELECT p.prefix || n.rest, {columns} FROM {NAMES}{tail} WHERE n.rest IN ({marks})",
                                part):
            if row[0] in wanted:
                yield row


class EntityIds:
    """The writer's numbers of entity names: the committed ones it has met (the most recent CACHED), and those its
    open transaction gave, kept apart until it commits (a transaction rolled back leaves no name in the store)."""

    def __init__(self) -> None:
        self.known: dict[str, int] = {}
        self.pending: dict[str, int] = {}
        self.prefixes = Numbered("entity_prefixes", ("prefix",))
        self.forgotten = 0  # names forgotten so far (`forget`)

    def of(self, conn: Connection, names: Iterable[str], insert_rows: InsertRows) -> dict[str, int]:
        """The number of each of `names`, a new name numbered (and stored) in the order first met."""
        out: dict[str, int] = {}
        missing = []
        for name in dict.fromkeys(names):
            number = self.known.get(name) or self.pending.get(name)
            if number is None:
                missing.append(name)
            else:
                out[name] = number
        for name, number in _named(conn, missing, "n.id"):
            out[name] = self.known[name] = number
        new = [name for name in missing if name not in out]
        if new:
            (last,), = conn.execute("SELECT COALESCE(MAX(id), 0) FROM entity_names")
            numbered = [(last + 1 + i, name) for i, name in enumerate(new)]
            self.store_names(conn, numbered, insert_rows)
            for number, name in numbered:
                out[name] = self.pending[name] = number
        return out

    def store_names(self, conn: Connection, numbered: Iterable[tuple[int, str]], insert_rows: InsertRows) -> None:
        """Each (number, name) stored in entity_names as the number, its prefix's number and the rest."""
        rows = [(number, self.prefixes.number(conn, (prefix,)), rest)
                for number, (prefix, rest) in ((number, split_name(name)) for number, name in numbered)]
        insert_rows("INSERT INTO entity_names (id, prefix, rest) VALUES ", "(?,?,?)", 50, rows, "")

    def committed(self) -> None:
        self.known.update(self.pending)
        self.pending.clear()
        self.prefixes.committed()
        if len(self.known) > CACHED:  # the most recently numbered half kept: a shop's records come name by name
            self.known = dict(list(self.known.items())[-CACHED // 2:])

    def rolled_back(self) -> None:
        self.pending.clear()
        self.prefixes.rolled_back()

    def forget(self, names: Iterable[str]) -> None:
        """Names deleted from the store (their records all pruned): met again, they are numbered anew."""
        for name in names:
            self.known.pop(name, None)
            self.pending.pop(name, None)
            self.forgotten += 1

    def clear(self) -> None:
        """Every committed number forgotten: names another connection pruned (the monitor's retention, beside its
        store's writer process) are numbered anew when met again, the others looked up."""
        self.known.clear()


class Entries(NamedTuple):
    """A table of entries: its record column, that column as a ref in SQL, and the records' own table and key."""

    table: str
    column: str
    as_ref: str
    records: str
    key: str
    by_record: str  # the index by record an older layout kept (`number_records` drops it)


ENTRIES = (Entries("entity_entries", "ref", "e.ref", "row_changes", "seq", "entity_entries_ref"),
           Entries("event_entries", "event", "-e.event", "events", "rowid", "event_entries_event"))


def pack_numbers(numbers: Sequence[int]) -> bytes | None:
    """A record's entity numbers as it keeps them (None: none): each in 7-bit groups, the high bit set on all but
    the last of its groups (LEB128), 3 bytes for a number below two million."""
    if not numbers:
        return None
    out = bytearray()
    for n in numbers:
        while n > 0x7F:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        out.append(n)
    return bytes(out)


def unpack_numbers(packed: bytes | None) -> list[int]:
    """The inverse of `pack_numbers`."""
    numbers, n, shift = [], 0, 0
    for byte in packed or b"":
        n |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            numbers.append(n)
            n, shift = 0, 0
    return numbers


def by_table(refs: Iterable[int]) -> Iterator[tuple[Entries, list[int]]]:
    """Each table of ENTRIES with the values, in its record column, of those of `refs` it holds."""
    refs = sorted(set(refs))
    yield ENTRIES[0], [ref for ref in refs if ref > 0]
    yield ENTRIES[1], [event_rowid(ref) for ref in reversed(refs) if ref < 0]


def numbers_of(conn: Connection, ids: EntityIds, named: Iterable[tuple[int, str]], insert_rows: InsertRows
               ) -> dict[int, list[int]]:
    """Of (record, name) pairs, each record's entity numbers, each once; a new name numbered (and stored) in the
    order first met. What the record keeps (`pack_numbers`) and is filed under (`file`)."""
    named = list(named)
    number = ids.of(conn, (name for _, name in named), insert_rows)
    out: dict[int, list[int]] = {}
    for record, name in named:
        numbers = out.setdefault(record, [])
        if number[name] not in numbers:
            numbers.append(number[name])
    return out


def by_table_pairs(numbered: Iterable[tuple[int, int]]) -> Iterator[tuple[Entries, list[tuple[int, int]]]]:
    """Each table of ENTRIES with the (entity number, record column's value) pairs, of (number, ref) pairs, it
    holds."""
    rows: list[tuple[int, int]] = []
    events: list[tuple[int, int]] = []
    for number, ref in numbered:
        (rows if ref > 0 else events).append((number, abs(ref)))
    return zip(ENTRIES, (rows, events))


def file(numbered: Iterable[tuple[int, int]], insert_rows: InsertRows) -> None:
    """File each record `ref` under the entity number of (number, ref) pairs; `insert_rows`: Batch.insert_rows."""
    for entries, filed in by_table_pairs(numbered):
        insert_rows(f"INSERT INTO {entries.table} (entity, {entries.column}) VALUES ", "(?,?)", 50, filed,
                    " ON CONFLICT DO NOTHING")


def file_named(conn: Connection, ids: EntityIds, entries: list[tuple[str, int]], insert_rows: InsertRows) -> None:
    """File each record `ref` under the entity `name` of (name, ref) pairs (an older store's index moved)."""
    number = ids.of(conn, (name for name, _ in entries), insert_rows)
    file(((number[name], ref) for name, ref in entries), insert_rows)


def refs_of(conn: Connection, names: Iterable[str]) -> dict[str, list[int]]:
    """The refs filed under each of `names` (a name with none is not in the answer)."""
    out: dict[str, list[int]] = {}
    names = sorted(set(names))
    for entries in ENTRIES:
        for name, value in _named(conn, names, entries.as_ref, f" JOIN {entries.table} e ON e.entity = n.id"):
            out.setdefault(name, []).append(value)
    return out


def names_of(conn: Connection, refs: Iterable[int]) -> set[str]:
    """Every entity the records `refs` are filed under: the numbers each record keeps, or in an older store not
    moved yet (its writer not started since), its index of entries by record."""
    out: set[str] = set()
    numbers: set[int] = set()
    for entries, values in by_table(refs):
        kept = "entities" in columns(conn, entries.records)
        for part, marks in _chunks(values):
            if kept:
                for (packed,) in conn.execute(
                        f"SELECT entities FROM {entries.records} WHERE {entries.key} IN ({marks})", part):
                    numbers.update(unpack_numbers(packed))
            else:
                out.update(name for (name,) in conn.execute(
                    f"SELECT p.prefix || n.rest FROM {NAMES} JOIN {entries.table} e ON e.entity = n.id "
                    f"WHERE e.{entries.column} IN ({marks})", part))
    for part, marks in _chunks(sorted(numbers)):
        out.update(name for (name,) in conn.execute(f"SELECT p.prefix || n.rest FROM {NAMES} WHERE n.id IN ({marks})",
                                                    part))
    return out


def forget(conn: Connection, ids: EntityIds, pruned: Sequence[tuple[int, bytes | None]]) -> int:
    """Delete the entries of the records pruned, (ref, the numbers it kept) pairs, and the names left with none;
    returns how many entries went."""
    gone, numbers = 0, set()
    for entries, pairs in by_table_pairs((n, ref) for ref, packed in pruned for n in unpack_numbers(packed)):
        for i in range(0, len(pairs), CHUNK):
            part = pairs[i:i + CHUNK]
            deleted = conn.execute(f"DELETE FROM {entries.table} WHERE (entity, {entries.column}) IN "
                                   f"(VALUES {','.join(['(?,?)'] * len(part))}) RETURNING entity",
                                   [v for pair in part for v in pair]).fetchall()
            gone += len(deleted)
            numbers.update(number for (number,) in deleted)
    for part, marks in _chunks(sorted(numbers)):
        deleted = conn.execute(
            f"DELETE FROM entity_names WHERE id IN ({marks}) AND NOT EXISTS "
            "(SELECT 1 FROM entity_entries e WHERE e.entity = entity_names.id) AND NOT EXISTS "
            "(SELECT 1 FROM event_entries e WHERE e.entity = entity_names.id) RETURNING prefix, rest", part).fetchall()
        if deleted:
            prefixes = ids.prefixes.values_of(conn, {prefix for prefix, _ in deleted})
            ids.forget(prefixes[prefix][0] + rest for prefix, rest in deleted)
    return gone


def older_by_record(conn: Connection, dialect: Dialect) -> bool:
    """Whether the store keeps the entries' indexes by record of an older layout (before any move)."""
    return any(conn.execute(dialect.index_named, (entries.by_record,)).fetchone() is not None for entries in ENTRIES)


def numbers_by_record(conn: Connection, entries: Entries, low: int, high: int) -> dict[int, bytes | None]:
    """The packed numbers of each record from `low` to `high` (its record column's values) filed in `entries`: what
    an older store's record, moved or numbered, is given to keep."""
    kept: dict[int, list[int]] = {}
    for value, number in conn.execute(f"SELECT {entries.column}, entity FROM {entries.table} WHERE {entries.column} "
                                      f">= ? AND {entries.column} <= ? ORDER BY {entries.column}, entity", (low, high)):
        kept.setdefault(value, []).append(number)
    return {value: pack_numbers(numbers) for value, numbers in kept.items()}


def number_records(conn: Connection) -> int:
    """An older store's records not given the numbers they are filed under by their move (those whose entries were
    moved after them), given them from the entries, a range of MOVE_CHUNK records at a time, inside the caller's
    transaction; the indexes of entries by record, which found them, then dropped. Returns the records whose entries
    were read."""
    numbered = 0
    for entries in ENTRIES:
        conn.execute(f"CREATE INDEX IF NOT EXISTS {entries.by_record} ON {entries.table} ({entries.column})")
        (low, high), = conn.execute(f"SELECT MIN({entries.column}), MAX({entries.column}) FROM {entries.table}")
        for start in range(low or 0, (high or 0) + 1, MOVE_CHUNK):
            kept = numbers_by_record(conn, entries, start, start + MOVE_CHUNK - 1)
            conn.executemany(f"UPDATE {entries.records} SET entities = ? WHERE {entries.key} = ? AND entities IS NULL",
                             [(packed, value) for value, packed in kept.items()])
            numbered += len(kept)
        conn.execute(f"DROP INDEX {entries.by_record}")
    if numbered:
        log.info("an older store's records keep the numbers of their entities", extra={
            "event": "records_numbered", "records": numbered})
    return numbered


def move_old_index(conn: Connection, tables_sql: str, ids: EntityIds, insert_rows: InsertRows) -> int:
    """An older store's index, with the name in every entry, filed here and dropped, inside the caller's
    transaction, MOVE_CHUNK entries at a time; returns the entries moved. `tables_sql`: the dialect's query of the
    store's tables. `entity_index` (entity, kind 'row_change' or 'event', ref the seq or 'topic/partition@offset'):
    an entry whose event is no longer kept is left out, as retention would have pruned it; `entity_refs` (entity,
    ref as here)."""
    tables = {t for (t,) in conn.execute(tables_sql)}
    if OLD_NAMES in tables:
        _move_old_names(conn, ids, insert_rows)
    moved = 0
    for old in OLD_INDEXES:
        if old not in tables:
            continue
        columns = "entity, kind, ref" if old == "entity_index" else "entity, ref"
        start: tuple[Any, ...] = ("", "", "") if old == "entity_index" else ("", -1 << 62)
        for rows in in_key_order(conn, old, columns, start, MOVE_CHUNK):
            entries = [e for e in (_entry(conn, row) for row in rows) if e is not None]
            file_named(conn, ids, entries, insert_rows)
            moved += len(entries)
        conn.execute(f"DROP TABLE {old}")
    if moved:
        log.info("the entity index moved to its numbered tables", extra={"event": "entity_index_moved",
                                                                         "entries": moved})
    return moved


def move_event_entries(conn: Connection) -> int:
    """An older store's events' entries, in entity_entries under minus their rowid, moved to event_entries inside
    the caller's transaction; returns how many. Looked for in a store that has entity_entries_ref (one step into
    it): the stores that kept events' entries there had it."""
    if conn.execute("SELECT 1 FROM entity_entries WHERE ref < 0 LIMIT 1").fetchone() is None:
        return 0
    (moved,), = conn.execute("SELECT COUNT(*) FROM entity_entries WHERE ref < 0")
    conn.execute("INSERT INTO event_entries (entity, event) SELECT entity, -ref FROM entity_entries WHERE ref < 0 "
                 "ORDER BY -ref ON CONFLICT DO NOTHING")
    conn.execute("DELETE FROM entity_entries WHERE ref < 0")
    log.info("an older store's events' entity entries moved to their own table", extra={
        "event": "event_entries_moved", "entries": moved})
    return moved


def _move_old_names(conn: Connection, ids: EntityIds, insert_rows: InsertRows) -> None:
    """An older store's names, whole in every row of entity_names (set aside as OLD_NAMES), moved under the same
    numbers, each as its prefix's number and the rest, and OLD_NAMES dropped."""
    move_rows(conn, OLD_NAMES, "id", (-1,), MOVE_CHUNK, "name",
              lambda rows: ids.store_names(conn, rows, insert_rows), "entity_names_moved")


def _entry(conn: Connection, row: tuple[Any, ...]) -> tuple[str, int] | None:
    """(name, ref) of an older index's entry; None for an event no longer kept."""
    if len(row) == 2:
        return row[0], int(row[1])
    name, kind, ref = row
    if kind == "row_change":
        return name, int(ref)
    topic_partition, offset = ref.rsplit("@", 1)
    topic, partition = split_partition_key(topic_partition)
    found = conn.execute(f'SELECT events.rowid FROM {events_from(conn)} WHERE topic = ? AND partition = ? '
                         'AND "offset" = ?', (topic, partition, int(offset))).fetchone()
    return None if found is None else (name, event_ref(found[0]))
