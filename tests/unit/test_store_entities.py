"""The entity index, each name kept once under a number (issue 47): what a store made before kept moves over when its
first writer of this version opens it, the drill-down finds the same records, entries and names go with their
records, and a transaction rolled back leaves no number the writer goes on using."""

from __future__ import annotations

import pytest

from devservices.samples import Shop, shipment
from oncewatch.core.config import PostgresTarget
from oncewatch.store import Store, queries, retention
from oncewatch.store.entities import NAMES, pack_numbers, unpack_numbers
from oncewatch.store.schema import aside

from .previous_store import make_previous


def filed(store: Store) -> list[tuple[str, int]]:
    """(name, ref) of every entry: a row change's seq, minus an event's rowid."""
    return sorted(store.conn.execute(
        f"SELECT p.prefix || n.rest, e.ref FROM {NAMES} JOIN entity_entries e ON e.entity = n.id UNION ALL "
        f"SELECT p.prefix || n.rest, -e.event FROM {NAMES} JOIN event_entries e ON e.entity = n.id"))


@pytest.mark.parametrize("old", ["entity_index", "entity_refs"])
def test_an_older_stores_index_moves_over_and_finds_the_same_records(store_target, old) -> None:
    shop, store = Shop(), Store(store_target)
    txs = [shop.tx(1000.0 + i, shipment(f"S{i}", f"T{i}")) for i in range(5)]
    events = [shop.event("shipment.created", 1000.0 + i, order_no=f"T{i}") for i in range(5)]
    with store.batch() as tx:
        for t in txs:
            tx.add_row_changes(t.rows)
        tx.add_events(events)
        rowids = [r for (r,) in tx.conn.execute('SELECT rowid FROM events ORDER BY "offset"')]
        tx.conn.execute("DELETE FROM events WHERE \"offset\" = 4")  # an event pruned: its old entry is left behind
    # the index as a version before kept it
    if old == "entity_index":
        store.conn.execute("CREATE TABLE entity_index (entity TEXT NOT NULL, kind TEXT NOT NULL, ref TEXT NOT NULL, "
                           "PRIMARY KEY (entity, kind, ref))")
        entries = [(f"trade_no:T{i}", "row_change", str(i + 1)) for i in range(5)] + \
            [(f"trade_no:T{i}", "event", e.coordinates) for i, e in enumerate(events)]
    else:
        store.conn.execute("CREATE TABLE entity_refs (entity TEXT NOT NULL, ref INTEGER NOT NULL, "
                           "PRIMARY KEY (entity, ref))")
        entries = [(f"trade_no:T{i}", i + 1) for i in range(5)] + \
            [(f"trade_no:T{i}", -rowid) for i, rowid in enumerate(rowids[:4])]
    store.conn.executemany(f"INSERT INTO {old} VALUES ({','.join('?' * len(entries[0]))})", entries)
    if isinstance(store_target, PostgresTarget):
        store.conn.execute("UPDATE oncewatch_store SET schema_sha256 = 'made by an older version'")
    store.close()
    writer = Store(store_target)
    tables = {t for (t,) in writer.conn.execute(writer.dialect.tables)}
    assert old not in tables
    assert writer.count("entity_entries") == 5 and writer.count("event_entries") == 4  # 4 events still kept
    assert writer.count("entity_names") == 5
    found = queries.timeline(writer, "T1")
    assert [r.after["shipment_id"] for r in found.rows] == ["S1"]
    assert [e.offset for e in found.events] == [1]
    assert queries.timeline(writer, "T4").events == []
    assert {k: len(v) for k, v in queries.rows_by_entity(writer, ["trade_no:T0", "trade_no:T9"]).items()} == {
        "trade_no:T0": 1}
    with writer.batch() as tx:  # filed again after the move: under the number the move gave
        tx.add_row_changes(shop.tx(2000.0, shipment("S9", "T0")).rows, [(0, "trade_no:T0")])
    assert writer.count("entity_names") == 5
    assert len(queries.rows_by_entity(writer, ["trade_no:T0"])["trade_no:T0"]) == 2
    writer.close()


def test_the_entries_and_names_of_pruned_records_go_with_them(store_target) -> None:
    shop, store = Shop(), Store(store_target)
    with store.batch() as tx:
        tx.add_row_changes(shop.tx(1000.0, shipment("S1", "T1")).rows, [(0, "trade_no:T1"), (0, "pk:a:1")])
        tx.add_row_changes(shop.tx(5000.0, shipment("S2", "T1")).rows, [(0, "trade_no:T1"), (0, "pk:a:2")])
        tx.add_events([shop.event("shipment.created", 1000.0, order_no="T1")], [(0, "trade_no:T1")])
    assert retention.prune(store, 2000.0)["entity_index"] == 3
    assert filed(store) == [("pk:a:2", 2), ("trade_no:T1", 2)]
    assert {n for (n,) in store.conn.execute(f"SELECT p.prefix || n.rest FROM {NAMES}")} == {"pk:a:2", "trade_no:T1"}
    assert [r.after["shipment_id"] for r in queries.rows_by_entity(store, ["trade_no:T1"])["trade_no:T1"]] == ["S2"]
    with store.batch() as tx:  # a name whose records all went, met again: numbered anew, and found
        tx.add_row_changes(shop.tx(6000.0, shipment("S3", "T3")).rows, [(0, "pk:a:1")])
    assert [r.after["shipment_id"] for r in queries.rows_by_entity(store, ["pk:a:1"])["pk:a:1"]] == ["S3"]
    store.close()


def test_names_numbered_in_a_transaction_rolled_back_are_numbered_again(store_target) -> None:
    shop, store = Shop(), Store(store_target)
    with pytest.raises(RuntimeError, match="the batch failed"):
        with store.batch() as tx:
            tx.add_row_changes(shop.tx(1000.0, shipment("S1", "T1")).rows, [(0, "trade_no:T1")])
            raise RuntimeError("the batch failed")
    with store.batch() as tx:
        tx.add_row_changes(shop.tx(1000.0, shipment("S1", "T1")).rows, [(0, "trade_no:T1"), (0, "pk:a:1")])
    assert filed(store) == [("pk:a:1", 1), ("trade_no:T1", 1)]
    assert store.count("entity_names") == 2
    store.close()


def test_an_older_stores_names_whole_move_under_the_same_numbers(store_target) -> None:
    """Issue 47: a store made before kept each name whole in entity_names; its first writer of this version keeps
    each prefix once ('pk:shop.shipments:', 'trade_no:') and the rest beside its number, the entries untouched."""
    shop, store = Shop(), Store(store_target)
    with store.batch() as tx:
        for i in range(5):
            tx.add_row_changes(shop.tx(1000.0 + i, shipment(f"S{i}", f"T{i}")).rows,
                               [(0, f"trade_no:T{i}"), (0, f"pk:shop.shipments:S{i}")])
    want = filed(store)
    names = store.conn.execute(f"SELECT n.id, p.prefix || n.rest FROM {NAMES}").fetchall()
    store.conn.execute("DROP TABLE entity_names")
    store.conn.execute("DELETE FROM entity_prefixes")
    store.conn.execute("CREATE TABLE entity_names (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)")
    store.conn.executemany("INSERT INTO entity_names (id, name) VALUES (?, ?)", names)
    if isinstance(store_target, PostgresTarget):
        store.conn.execute("UPDATE oncewatch_store SET schema_sha256 = 'made by an older version'")
    store.close()
    writer = Store(store_target)
    assert filed(writer) == want and len(want) == 10
    assert sorted(p for (p,) in writer.conn.execute("SELECT prefix FROM entity_prefixes")) == [
        "pk:shop.shipments:", "trade_no:"]
    assert [r.after["shipment_id"] for r in queries.timeline(writer, "T3").rows] == ["S3"]
    with writer.batch() as tx:  # filed again: under the number it had
        tx.add_row_changes(shop.tx(2000.0, shipment("S9", "T3")).rows, [(0, "trade_no:T3")])
    assert writer.count("entity_names") == 10
    assert len(queries.rows_by_entity(writer, ["trade_no:T3"])["trade_no:T3"]) == 2
    writer.close()


def test_an_older_stores_event_entries_move_to_their_own_table(store_target) -> None:
    """Issue 47: a store made before filed an event's entries in entity_entries under minus its rowid, beside the
    row changes' seqs; its first writer of this version moves them to event_entries, where the drill-down finds
    them, and the index of the rows' entries holds rows alone."""
    shop, store = Shop(), Store(store_target)
    with store.batch() as tx:
        for i in range(3):
            tx.add_row_changes(shop.tx(1000.0 + i, shipment(f"S{i}", f"T{i}")).rows, [(0, f"trade_no:T{i}")])
        tx.add_events([shop.event("shipment.created", 1000.0 + i, order_no=f"T{i}") for i in range(3)],
                      [(i, f"trade_no:T{i}") for i in range(3)])
    want = filed(store)
    store.conn.execute("INSERT INTO entity_entries (entity, ref) SELECT entity, -event FROM event_entries")
    store.conn.execute("DELETE FROM event_entries")
    as_older(store)
    store.close()
    writer = Store(store_target)
    assert filed(writer) == want and len(want) == 6
    assert (writer.count("entity_entries"), writer.count("event_entries")) == (3, 3)
    assert [e.keys["order_key"] for e in queries.timeline(writer, "T2").events] == ["T2"]
    assert_records_numbered(writer)
    writer.close()


def as_older(store: Store) -> None:
    """The store as a version before the records kept their entities' numbers left it: the entries' indexes by
    record, and no numbers in the records."""
    store.conn.execute("CREATE INDEX IF NOT EXISTS entity_entries_ref ON entity_entries (ref)")
    store.conn.execute("CREATE INDEX IF NOT EXISTS event_entries_event ON event_entries (event)")
    store.conn.execute("UPDATE row_changes SET entities = NULL")
    store.conn.execute("UPDATE events SET entities = NULL")
    if store.dialect.name == "postgresql":
        store.conn.execute("UPDATE oncewatch_store SET schema_sha256 = 'made by an older version'")


def assert_records_numbered(store: Store) -> None:
    """Every record keeps the numbers of the entities it is filed under, and no index of entries by record is
    left."""
    for table, column, records, key in (("entity_entries", "ref", "row_changes", "seq"),
                                        ("event_entries", "event", "events", "rowid")):
        entries: dict[int, list[int]] = {}
        for value, number in store.conn.execute(f"SELECT {column}, entity FROM {table}"):
            entries.setdefault(value, []).append(number)
        kept = {value: sorted(unpack_numbers(packed)) for value, packed in store.conn.execute(
            f"SELECT {key}, entities FROM {records}") if packed is not None}
        assert kept == {value: sorted(numbers) for value, numbers in entries.items()}, table
        assert store.conn.execute(store.dialect.index_named, (f"{table}_{column}",)).fetchone() is None


def test_a_store_whose_entries_were_indexed_by_record_gives_its_records_their_numbers(store_target) -> None:
    """The store of the version before: the entries found by record through an index of their own; its first writer
    of this version gives each record the numbers it is filed under and drops those indexes, and the drill-down,
    the timeline and retention work on it as on a new one."""
    shop, store = Shop(), Store(store_target)
    rows = []
    with store.batch() as tx:
        for i in range(4):
            t = shop.tx(1000.0 + i, shipment(f"S{i}", f"T{i}"))
            rows += t.rows
            tx.add_row_changes(t.rows, [(0, f"trade_no:T{i}"), (0, f"pk:shipments:S{i}")])
        tx.add_events([shop.event("shipment.created", 1000.0 + i, order_no=f"T{i}") for i in range(4)],
                      [(i, f"trade_no:T{i}") for i in range(4)])
    want = filed(store)
    make_previous(store)
    store.close()
    older = Store(store_target, readonly=True)  # a reader before the writer: through the index by record
    assert [r.after["shipment_id"] for r in queries.timeline(older, "T1").rows] == ["S1"]
    older.close()
    writer = Store(store_target)
    assert filed(writer) == want
    assert_records_numbered(writer)
    assert writer.row_changes() == rows and aside("row_changes") not in {
        t for (t,) in writer.conn.execute(writer.dialect.tables)}
    with writer.batch() as tx:  # no UNIQUE (txid, row_index, snapshot) is left: nothing reads by it
        tx.add_row_changes(rows[:1])
    found = queries.timeline(writer, "T1")
    assert [r.after["shipment_id"] for r in found.rows] == ["S1"] and [e.offset for e in found.events] == [1]
    retention.prune(writer, 1002.5)  # the records of T0, T1 and T2 and their entries go
    assert sorted(name for name, _ in filed(writer)) == ["pk:shipments:S3", "trade_no:T3", "trade_no:T3"]
    writer.close()


def test_a_records_numbers_read_back_as_kept() -> None:
    numbers = [1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 1 << 40, 5]
    assert unpack_numbers(pack_numbers(numbers)) == numbers
    assert len(pack_numbers([2_097_151])) == 3 and pack_numbers([]) is None and unpack_numbers(None) == []
