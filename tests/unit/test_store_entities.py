"""The entity index as numbers (issue 47): what a store made before kept as text moves over when its first writer
of this version opens it, the drill-down finds the same records, and names go with their last entry."""

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


def test_a_name_goes_with_its_last_entry(store_target) -> None:
    shop, store = Shop(), Store(store_target)
    with store.batch() as tx:
        first = tx.add_row_changes(shop.tx(1000.0, shipment("S1", "T1")).rows, [(0, "trade_no:T1"), (0, "order_key:1")])
        tx.add_row_changes(shop.tx(5000.0, shipment("S2", "T1")).rows, [(0, "trade_no:T1"), (0, "pk:a:2")])
    assert first == [1]
    retention.prune(store, 2000.0)
    names = sorted(n for (n,) in store.conn.execute("SELECT name FROM entity_names"))
    assert names == ["trade_no:T1"]  # T1 still has the newer row; a row's own entity keeps no name
    assert [r.after["shipment_id"] for r in queries.rows_by_entity(store, ["pk:a:2"])["pk:a:2"]] == ["S2"]
    assert [r.after["shipment_id"] for r in queries.rows_by_entity(store, ["trade_no:T1"])["trade_no:T1"]] == ["S2"]
    store.close()


def test_a_name_is_stored_again_after_its_transaction_rolled_back_or_retention_took_it(store_target) -> None:
    """The writer stores an entity's name once while it knows it is stored: not when the transaction that stored
    it rolled back, nor once retention deleted it with its last entry."""
    shop, store = Shop(), Store(store_target)
    try:
        with store.batch() as tx:
            tx.add_row_changes(shop.tx(1000.0, shipment("S1", "T1")).rows, [(0, "trade_no:T1")])
            raise RuntimeError("the writer failed")
    except RuntimeError:
        pass
    with store.batch() as tx:
        tx.add_row_changes(shop.tx(1001.0, shipment("S2", "T1")).rows, [(0, "trade_no:T1")])
    assert queries.timeline(store, "T1").entities and \
        store.conn.execute("SELECT name FROM entity_names").fetchall() == [("trade_no:T1",)]
    retention.prune(store, 5000.0)  # its only record goes, and the name with it
    assert store.conn.execute("SELECT COUNT(*) FROM entity_names").fetchone()[0] == 0
    with store.batch() as tx:
        tx.add_row_changes(shop.tx(6000.0, shipment("S3", "T1")).rows, [(0, "trade_no:T1")])
    assert store.conn.execute("SELECT name FROM entity_names").fetchall() == [("trade_no:T1",)]
    assert [r.after["shipment_id"] for r in queries.timeline(store, "T1").rows] == ["S3"]
    store.close()
