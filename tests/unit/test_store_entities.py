"""The entity index with the records' numbers (issue 47): what a store made before kept moves over when its first
writer of this version opens it, the drill-down finds the same records, and entries go with their records."""

from __future__ import annotations

from devservices.samples import Shop, shipment
from oncewatch.core.config import PostgresTarget
from oncewatch.store import Store, queries, retention


def test_an_older_stores_text_index_moves_over_and_finds_the_same_records(store_target) -> None:
    shop, store = Shop(), Store(store_target)
    txs = [shop.tx(1000.0 + i, shipment(f"S{i}", f"T{i}")) for i in range(5)]
    events = [shop.event("shipment.created", 1000.0 + i, order_no=f"T{i}") for i in range(5)]
    with store.batch() as tx:
        for t in txs:
            tx.add_row_changes(t.rows)
        tx.add_events(events)
        tx.conn.execute("DELETE FROM events WHERE \"offset\" = 4")  # an event pruned: its old entry is left behind
    # the index as the version before kept it
    store.conn.execute("CREATE TABLE entity_index (entity TEXT NOT NULL, kind TEXT NOT NULL, ref TEXT NOT NULL, "
                       "PRIMARY KEY (entity, kind, ref))")
    old = [(f"trade_no:T{i}", "row_change", str(i + 1)) for i in range(5)] + \
        [(f"trade_no:T{i}", "event", e.coordinates) for i, e in enumerate(events)]
    store.conn.executemany("INSERT INTO entity_index (entity, kind, ref) VALUES (?, ?, ?)", old)
    if isinstance(store_target, PostgresTarget):
        store.conn.execute("UPDATE oncewatch_store SET schema_sha256 = 'made by an older version'")
    store.close()
    writer = Store(store_target)
    tables = {t for (t,) in writer.conn.execute(writer.dialect.tables)}
    assert "entity_index" not in tables
    assert writer.count("entity_refs") == 9  # 5 rows, 4 events still kept
    found = queries.timeline(writer, "T1")
    assert [r.after["shipment_id"] for r in found.rows] == ["S1"]
    assert [e.offset for e in found.events] == [1]
    assert queries.timeline(writer, "T4").events == []
    assert {k: len(v) for k, v in queries.rows_by_entity(writer, ["trade_no:T0", "trade_no:T9"]).items()} == {
        "trade_no:T0": 1}
    writer.close()


def test_the_entries_of_pruned_records_go_with_them(store_target) -> None:
    shop, store = Shop(), Store(store_target)
    with store.batch() as tx:
        tx.add_row_changes(shop.tx(1000.0, shipment("S1", "T1")).rows, [(0, "trade_no:T1"), (0, "pk:a:1")])
        tx.add_row_changes(shop.tx(5000.0, shipment("S2", "T1")).rows, [(0, "trade_no:T1"), (0, "pk:a:2")])
        tx.add_events([shop.event("shipment.created", 1000.0, order_no="T1")], [(0, "trade_no:T1")])
    assert retention.prune(store, 2000.0)["entity_index"] == 3
    assert sorted(store.conn.execute("SELECT entity, ref FROM entity_refs")) == [("pk:a:2", 2), ("trade_no:T1", 2)]
    assert [r.after["shipment_id"] for r in queries.rows_by_entity(store, ["trade_no:T1"])["trade_no:T1"]] == ["S2"]
    store.close()
