"""The store's bulky values packed with a dictionary trained on its own data (issue 47) read back as they were
written: before the dictionary and after it, across a rolled-back training, and as an older version left them."""

from __future__ import annotations

import pytest

from devservices.samples import Shop, order, payment, shipment
from oncewatch.core.config import PostgresTarget
from oncewatch.core.exact_json import flat_json
from oncewatch.store import Store
from oncewatch.store.packing import PackedValueError, Packer
from oncewatch.store.schema import PACKED_COLUMNS, columns

TRAIN_AFTER = 60


def traffic(n: int, shop: Shop | None = None):
    shop = shop or Shop()
    txs = [shop.tx(1000.0 + i, order(f"O{i}", "paid", was="pending"), payment(f"T{i}", f"O{i}", "success"),
                   shipment(f"S{i}", f"T{i}")) for i in range(n)]
    events = [shop.event("order.paid", 1000.0 + i, order_no=f"O{i}", trade_no=f"T{i}") for i in range(n)]
    return [r for t in txs for r in t.rows], events


def stored_images(store: Store) -> list[bytes]:
    return [bytes(v) for (v,) in store.conn.execute("SELECT after_row FROM row_changes ORDER BY seq")]


def test_rows_and_events_read_back_as_written_before_and_after_the_dictionary(store_target) -> None:
    store = Store(store_target)
    store.packer.train_samples = TRAIN_AFTER
    rows, events = traffic(100)
    with store.batch() as tx:
        tx.add_row_changes(rows[:150])
        tx.add_events(events)
    with store.batch() as tx:
        tx.add_row_changes(rows[150:])
    assert store.row_changes() == rows
    assert store.events() == sorted(events, key=lambda e: (e.topic, e.partition, e.offset))
    ids = dict(store.conn.execute("SELECT kind, id FROM dictionaries"))
    assert sorted(ids) == ["event", "row"]
    images = stored_images(store)
    # the images kept as text while the dictionary was learned were packed with it in the same transaction
    assert {v[0] for v in images} == {ids["row"]}
    assert {bytes(v)[0] for (v,) in store.conn.execute("SELECT body FROM events")} == {ids["event"]}
    packed = sum(map(len, images))
    text = sum(len(flat_json(r.after)) for r in rows)
    assert packed < text / 2, (packed, text)
    reader = Store(store_target, readonly=True)  # a reader learns the dictionaries from the store
    assert reader.row_changes() == rows


def test_text_kept_before_the_dictionary_in_committed_transactions_is_packed_once_it_is_trained(store_target) -> None:
    store = Store(store_target)
    store.packer.train_samples = TRAIN_AFTER
    rows, events = traffic(60)
    for i in range(0, 30, 10):  # 30 rows, 40 images: not yet enough to train on
        with store.batch() as tx:
            tx.add_row_changes(rows[i:i + 10])
    assert {v[0] for v in stored_images(store)} == {0}
    with store.batch() as tx:
        tx.add_row_changes(rows[30:])
    (row,), = store.conn.execute("SELECT id FROM dictionaries WHERE kind = 'row'")
    assert {v[0] for v in stored_images(store)} == {row}
    assert {bytes(v)[0] for (v,) in store.conn.execute(
        "SELECT before_row FROM row_changes WHERE before_row IS NOT NULL")} == {row}
    assert store.row_changes() == rows
    assert Store(store_target, readonly=True).row_changes() == rows
    if not isinstance(store_target, PostgresTarget):
        # written again, not updated in place: the pages the text filled are free for the next rows
        assert store.conn.execute("PRAGMA freelist_count").fetchone()[0] > 0


def test_a_dictionary_whose_transaction_rolled_back_is_trained_again(store_target) -> None:
    store = Store(store_target)
    store.packer.train_samples = TRAIN_AFTER
    rows, _ = traffic(60)
    with pytest.raises(RuntimeError), store.batch() as tx:
        tx.add_row_changes(rows[:TRAIN_AFTER + 10])
        raise RuntimeError("the writer failed after the dictionary was trained")
    assert store.conn.execute("SELECT COUNT(*) FROM dictionaries").fetchone()[0] == 0
    with store.batch() as tx:
        tx.add_row_changes(rows)
    assert store.row_changes() == rows
    assert store.conn.execute("SELECT COUNT(*) FROM dictionaries").fetchone()[0] == 1
    assert Store(store_target, readonly=True).row_changes() == rows


def test_text_an_older_version_wrote_reads_as_it_was() -> None:
    packer = Packer(conn=None)
    assert packer.unpack('{"a":1}') == '{"a":1}'  # SQLite: the text column as it was
    assert packer.unpack(b'{"a":1}') == '{"a":1}'  # PostgreSQL: that column made bytea
    assert packer.unpack(b'\x00{"a":1}') == '{"a":1}'
    assert packer.unpack(None) is None


def test_a_value_whose_dictionary_is_gone_is_a_clear_error(tmp_path) -> None:
    path = str(tmp_path / "s.db")
    store = Store(path)
    store.packer.train_samples = TRAIN_AFTER
    rows, _ = traffic(40)
    with store.batch() as tx:
        tx.add_row_changes(rows)
    with store.batch() as tx:
        tx.conn.execute("DELETE FROM dictionaries")
    with pytest.raises(PackedValueError, match="dictionary 1, which the store does not hold"):
        Store(path, readonly=True).row_changes()


def test_an_older_store_keeps_its_text_values_and_packs_the_new_ones(store_target) -> None:
    """Row images, event bodies and engine entries an older version kept as text (text columns in PostgreSQL,
    which the next writer makes bytea), in row changes that held their schema, table, op, binlog file and commit
    clock in every row, read back as they were, before the next writer moves them and after, beside the values
    packed after them."""
    store = Store(store_target)
    postgres = isinstance(store_target, PostgresTarget)
    store.conn.execute("DROP TABLE row_changes")
    store.conn.execute(OLDER_ROW_CHANGES.replace("BLOB", "TEXT" if postgres else "BLOB"))
    if postgres:
        for table, column in PACKED_COLUMNS:
            if table != "row_changes":
                store.conn.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE text")
        store.conn.execute("UPDATE oncewatch_store SET schema_sha256 = 'made by an older version'")
    rows, _ = traffic(40)
    old = rows[:5]
    for seq, r in enumerate(old, 1):
        store.conn.execute("INSERT INTO row_changes (seq, txid, row_index, schema_name, table_name, op, pk, before_row, "
                           "after_row, binlog_file, end_pos, commit_time, commit_clock, snapshot) VALUES "
                           "(?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           (seq, r.txid, r.row_index, r.schema, r.table, r.op, flat_json(r.pk),
                            None if r.before is None else flat_json(r.before), flat_json(r.after), r.binlog_file,
                            r.end_pos, r.commit_time, r.commit_clock, 0))
    store.close()
    assert Store(store_target, readonly=True).row_changes() == old
    writer = Store(store_target)
    assert "schema_name" not in columns(writer.conn, "row_changes")
    assert writer.row_changes() == old
    writer.packer.train_samples = TRAIN_AFTER
    with writer.batch() as tx:
        tx.add_row_changes(rows[5:])
    assert writer.row_changes() == rows
    assert Store(store_target, readonly=True).row_changes() == rows


# row_changes as a version before issue 47's row_sources made it
OLDER_ROW_CHANGES = """CREATE TABLE row_changes (seq INTEGER PRIMARY KEY, txid TEXT NOT NULL, row_index INTEGER NOT NULL,
    schema_name TEXT NOT NULL, table_name TEXT NOT NULL, op TEXT NOT NULL, pk TEXT NOT NULL, before_row BLOB,
    after_row BLOB, binlog_file TEXT NOT NULL, end_pos INTEGER NOT NULL, commit_time REAL NOT NULL,
    commit_clock TEXT NOT NULL, snapshot INTEGER NOT NULL DEFAULT 0, UNIQUE (txid, row_index, snapshot))"""
