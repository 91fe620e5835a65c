"""collectors.cdc: Debezium's records read exactly, and with the transaction topic made committed transactions again,
in commit order."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from oncewatch.collectors.cdc import NEW_KEY, OLD_KEY, Assembler, DataRecord, Schemas, read_record
from oncewatch.collectors.debezium_rows import Undecodable
from oncewatch.core.config import parse

CFG = parse({"mysql": {"user": "u", "password_env": "NONE", "tables": ["shop.orders", "shop.payments"]}}).mysql


def record(txid: str, order: int, op: str = "c", table: str = "orders", offset: int = 0, **kw) -> DataRecord:
    row = {"order_no": f"O{order}", "status": "pending"}
    base = dict(topic=f"cdc.shop.{table}", partition=0, offset=offset, txid=txid, order=order, op=op, db="shop",
                table=table, pk=(row["order_no"],), before=row if op in ("u", "d") else None,
                after=row if op in ("c", "u", "r") else None, file="binlog.000001", pos=100 + order, header_time=1.0,
                part=f"cdc.shop.{table}/0")
    return DataRecord(**{**base, **kw})


def end(txid: str, **counts: int) -> dict:
    return {"status": "END", "id": txid, "event_count": sum(counts.values()),
            "data_collections": [{"data_collection": f"shop.{t}", "event_count": n} for t, n in counts.items()]}


def begin(txid: str) -> dict:
    return {"status": "BEGIN", "id": txid, "event_count": None}


def feed(a: Assembler, *items, now: float = 0.0) -> list:
    out = []
    for item in items:
        if isinstance(item, DataRecord):
            out += list(a.on_record(item))
        else:
            a.on_transaction(item, now)
    return out + list(a.ready(now))


def test_a_transaction_waits_for_every_record_its_end_counts_then_goes_in_commit_order():
    a = Assembler(CFG)
    assert feed(a, begin("0-1-1"), end("0-1-1", orders=2, refunds=5), record("0-1-1", 1)) == []  # refunds unwatched
    assert feed(a, begin("0-1-2"), end("0-1-2", payments=1), record("0-1-2", 1, table="payments")) == []  # behind 1
    # where a restart would read from: the first record of each partition not handed on
    assert a.first_pending() == {"cdc.shop.orders/0": 0, "cdc.shop.payments/0": 0}
    out = feed(a, record("0-1-1", 2, offset=1))
    assert a.first_pending() == {}
    assert [[r.pk for r in t.rows] for t in out] == [[("O1",), ("O2",)], [("O1",)]]
    assert [t.position.gtid for t in out] == ["0-1-1", "0-1-2"]
    assert [r.row_index for r in out[0].rows] == [0, 1]


def test_records_that_never_come_end_the_wait_after_the_grace_counted():
    a = Assembler(CFG, grace_seconds=5)
    assert feed(a, begin("0-1-1"), end("0-1-1", orders=2), record("0-1-1", 1), now=0.0) == []
    assert feed(a, now=4.9) == []
    out = feed(a, now=5.1)
    assert len(out) == 1 and len(out[0].rows) == 1 and a.incomplete == 1


def test_a_replay_after_a_restart_is_skipped_and_counted():
    a = Assembler(CFG, start_gtid="0-1-7")
    assert feed(a, begin("0-1-7"), end("0-1-7", orders=1), record("0-1-7", 1)) == []
    assert a.replays.records == 1 and not a.open
    assert len(feed(a, begin("0-1-8"), end("0-1-8", orders=1), record("0-1-8", 1))) == 1


def test_a_restart_reads_again_the_begin_of_a_transaction_whose_end_came_before_its_records():
    """Debezium's END may be read before the transaction's records (another topic, fetched later): where a restart
    reads from holds its BEGIN until it is handed on, or the restarted reader would wait for that END for good."""
    tx_topic = "cdc.transaction/0"
    a = Assembler(CFG)
    a.on_transaction(begin("0-1-1"), 0.0, (tx_topic, 0))
    a.on_transaction(end("0-1-1", orders=1), 0.0, (tx_topic, 1))
    a.on_transaction(begin("0-1-2"), 0.0, (tx_topic, 2))
    a.on_transaction(end("0-1-2", orders=1), 0.0, (tx_topic, 3))
    handed = feed(a, record("0-1-1", 1, offset=0))
    assert [t.position.gtid for t in handed] == ["0-1-1"]
    assert a.first_pending() == {tx_topic: 2}  # 0-1-2's BEGIN: its record is not read yet
    restarted = Assembler(CFG, start_gtid=handed[0].position.gtid)
    restarted.on_transaction(begin("0-1-2"), 0.0, (tx_topic, 2))
    restarted.on_transaction(end("0-1-2", orders=1), 0.0, (tx_topic, 3))
    assert [t.position.gtid for t in feed(restarted, record("0-1-2", 2, offset=1))] == ["0-1-2"]
    assert restarted.first_pending() == {} and not restarted.waiting


def test_a_primary_key_change_is_one_update_and_tombstones_take_no_place():
    a = Assembler(CFG)
    gone = record("0-1-1", 1, op="d", key_changed=NEW_KEY)
    came = record("0-1-1", 2, op="c", key_changed=OLD_KEY)._replace(pk=("O9",),
                                                                    after={"order_no": "O9", "status": "pending"})
    (tx,) = feed(a, begin("0-1-1"), end("0-1-1", orders=2), gone, came)
    (row,) = tx.rows
    assert (row.op, row.pk, row.before["order_no"], row.after["order_no"]) == ("update", ("O9",), "O1", "O9")


def test_a_delete_is_timed_by_the_binlog_not_by_its_row_s_time_column():
    """The deleted row's commit-time column says when the row was written; the delete is as late as its header."""
    timed = parse({"mysql": {"user": "u", "password_env": "NONE", "tables": ["shop.orders"],
                             "commit_time_columns": {"shop.orders": "updated_at"}}}).mysql
    row = {"order_no": "O1", "status": "pending", "updated_at": dt.datetime(2026, 1, 2, 3, 4, 5, 250000)}
    written = record("0-1-1", 1, after=row, header_time=1767323045.0)
    gone = record("0-1-2", 1, op="d", before=row, header_time=1767323100.0)
    txs = feed(Assembler(timed), begin("0-1-1"), end("0-1-1", orders=1), written, begin("0-1-2"),
               end("0-1-2", orders=1), gone)
    assert [(r.op, r.commit_time, r.commit_clock) for t in txs for r in t.rows] == [
        ("insert", 1767323045.25, "row_column"), ("delete", 1767323100.0, "binlog_header")]


def test_a_transaction_without_an_end_goes_in_its_place_with_what_came_and_a_late_record_still_goes():
    a = Assembler(CFG)
    truncate = record("0-1-2", 1, op="t", pk=(), before=None, after=None)
    out = feed(a, begin("0-1-1"), end("0-1-1", orders=1), record("0-1-1", 1), begin("0-1-2"), truncate,
               begin("0-1-3"), end("0-1-3", orders=1), record("0-1-3", 1, offset=2))
    assert [(t.position.gtid, [c.kind for c in t.schema_changes], len(t.rows)) for t in out] == [
        ("0-1-1", [], 1), ("0-1-2", ["truncate"], 0), ("0-1-3", [], 1)]
    # one whose record was not in yet goes on without it, and the record goes on when it comes, counted
    out = feed(a, begin("0-1-4"), begin("0-1-5"), end("0-1-5", orders=1), record("0-1-5", 1, offset=3))
    assert [t.position.gtid for t in out] == ["0-1-4", "0-1-5"] and not out[0].schema_changes
    (late,) = feed(a, record("0-1-4", 1, op="t", pk=(), before=None, after=None))
    assert [c.kind for c in late.schema_changes] == ["truncate"] and a.late == 1


def test_an_undecodable_record_is_quarantined_with_its_coordinates():
    a = Assembler(CFG)
    bad = record("0-1-1", 1, undecodable="column g: Debezium type io.debezium.data.geometry.Geometry is not read")
    (tx,) = feed(a, begin("0-1-1"), end("0-1-1", orders=1), bad)
    (q,) = tx.quarantined
    assert not tx.rows and q.table == "shop.orders" and "cdc.shop.orders/0@0" in q.detail and "Geometry" in q.detail


# A record in the shape the Debezium MariaDB connector 3.5 writes with the JsonConverter's schemas (fields cut
# to a few of each kind), as read from the dev connector.
FIELDS = [{"type": "string", "optional": False, "field": "order_no"},
          {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
           "parameters": {"scale": "2", "connect.decimal.precision": "12"}, "field": "amount"},
          {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "version": 1, "field": "at"},
          {"type": "string", "optional": True, "name": "io.debezium.data.EnumSet", "version": 1,
           "parameters": {"allowed": "a,b"}, "field": "tags"}]
SOURCE = {"version": "3.5.0.Final", "connector": "mariadb", "name": "cdc", "ts_ms": 1796182975000, "snapshot": "false",
          "db": "shop", "table": "orders", "server_id": 1, "gtid": "0-1-9", "file": "binlog.000038", "pos": 729334104,
          "row": 0}


def debezium(after: dict, fields=FIELDS) -> tuple[bytes, bytes]:
    schema = {"type": "struct", "fields": [{"type": "struct", "fields": fields, "optional": True, "field": "before"},
                                           {"type": "struct", "fields": fields, "optional": True, "field": "after"}]}
    payload = {"before": None, "after": after, "source": SOURCE, "op": "c", "ts_ms": 1796182975100,
               "transaction": {"id": "0-1-9", "total_order": 1, "data_collection_order": 1}}
    key = {"schema": {"type": "struct", "fields": [FIELDS[0]]}, "payload": {"order_no": after["order_no"]}}
    return (json.dumps(key, separators=(",", ":")).encode(),
            json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode())


def test_a_debezium_record_reads_as_the_binlog_s_values_and_its_schema_is_parsed_once():
    schemas = Schemas()
    key, value = debezium({"order_no": "O1", "amount": "BBo=", "at": 1767323045678, "tags": "a,b"})
    r = read_record("cdc.shop.orders", 0, 7, key, value, [], schemas)
    assert (r.txid, r.order, r.pk, r.file, r.pos) == ("0-1-9", 1, ("O1",), "binlog.000038", 729334104)
    assert r.after == {"order_no": "O1", "amount": Decimal("10.50"), "at": dt.datetime(2026, 1, 2, 3, 4, 5, 678000),
                       "tags": {"a", "b"}}
    key2, value2 = debezium({"order_no": "O2", "amount": "/w==", "at": None, "tags": ""})
    r2 = read_record("cdc.shop.orders", 0, 8, key2, value2, [], schemas)
    assert r2.after == {"order_no": "O2", "amount": Decimal("-0.01"), "at": None, "tags": None}
    assert len(schemas._values) == 1 and len(schemas._keys) == 1
    assert read_record("cdc.shop.orders", 0, 9, key, None, []) is None  # a tombstone


def test_what_cannot_be_read_exactly_says_why():
    geometry = [*FIELDS, {"type": "struct", "optional": True, "name": "io.debezium.data.geometry.Geometry",
                          "field": "where", "fields": []}]
    key, value = debezium({"order_no": "O1", "amount": "BBo=", "at": 1, "tags": "a", "where": None}, geometry)
    assert "io.debezium.data.geometry.Geometry" in read_record("t", 0, 0, key, value, []).undecodable
    key, value = debezium({"order_no": "O1", "amount": "not base64!", "at": 1, "tags": "a"})
    assert "column amount" in read_record("t", 0, 0, key, value, []).undecodable
    without_schema = json.dumps({"before": None, "after": {"order_no": "O1"}, "source": SOURCE, "op": "c"}).encode()
    with pytest.raises(Undecodable, match="schemas.enable=true"):
        read_record("t", 0, 0, None, without_schema, [])
    with pytest.raises(Undecodable, match="not a Debezium change event"):
        read_record("t", 0, 0, None, b"[1, 2]", [])


def test_records_of_either_topic_not_in_debezium_s_shape_are_quarantined_and_the_stream_goes_on():
    from collections import namedtuple

    rec = namedtuple("Record", "offset key value headers")
    a = Assembler(CFG, prefix="cdc")
    end_wrapped = json.dumps({"schema": {"type": "struct"}, "payload": end("0-1-1", orders=1)}).encode()
    assert a.feed("cdc.transaction", 0, rec(7, None, b'{"schema":{},"payload":{"status":1}}', []), 0.0) == []
    assert a.feed("cdc.shop.orders", 0, rec(3, None, b"not json", []), 0.0) == []
    a.on_transaction(begin("0-1-1"), 0.0)
    assert a.feed("cdc.transaction", 0, rec(8, None, end_wrapped, []), 0.0) == []
    (tx,) = feed(a, record("0-1-1", 1))  # the END read through its schema wrapper counts one record
    assert [(q.binlog_file, q.event_pos, q.reason) for q in tx.quarantined] == [
        ("cdc.transaction/0", 7, "unparseable"), ("cdc.shop.orders/0", 3, "unparseable")]
    assert a.counts().unreadable_records == 2


def test_markers_written_again_by_a_restarted_connector_give_each_transaction_once():
    """The transaction topic's history holds what connector restarts wrote: a BEGIN again inside its transaction,
    an END after the next transaction's BEGIN. Each transaction is handed on once, with the END's count."""
    a = Assembler(CFG)
    out = feed(a, begin("0-1-1"), begin("0-1-1"), record("0-1-1", 1), begin("0-1-2"), end("0-1-1", orders=2),
               record("0-1-1", 2, offset=1), end("0-1-2", orders=1), record("0-1-2", 1, offset=2))
    assert [(t.cdc.txid, len(t.rows), t.cdc.expected) for t in out] == [("0-1-1", 2, 2), ("0-1-2", 1, 1)]
    assert not a.open and not a.ends


def test_every_end_read_gives_its_binlog_time_one_of_tables_not_captured_and_a_replay_too():
    """The change clock's mark of how far the connector has read (checks.clocks.heartbeat_watermark): an END of a
    transaction that touched no captured table is the only one a shop busy elsewhere gives."""
    a = Assembler(CFG)
    assert a.newest_end == 0.0
    feed(a, begin("0-1-1"), {**end("0-1-1", orders=1), "ts_ms": 5000}, record("0-1-1", 1))
    assert a.newest_end == 5.0
    feed(a, begin("0-1-2"), {"status": "END", "id": "0-1-2", "ts_ms": 7000, "event_count": 0, "data_collections": []})
    assert a.newest_end == 7.0
    feed(a, {**end("0-1-1", orders=1), "ts_ms": 5000})  # written again by a restarted connector: no step back
    assert a.newest_end == 7.0


def test_while_a_topic_is_read_behind_its_end_no_transaction_is_judged_incomplete():
    """A monitor catching up reads the small transaction topic far ahead of the tables' topics: the grace runs from
    when every topic is read to its end, not from the END."""
    a = Assembler(CFG, grace_seconds=5)
    a.on_transaction(begin("0-1-1"), 0.0)
    a.on_transaction(end("0-1-1", orders=1), 0.0)
    assert list(a.ready(100.0, behind=True)) == [] and a.incomplete == 0
    assert list(a.ready(104.0)) == []  # read to the end at 100: its grace runs from there
    assert len(feed(a, record("0-1-1", 1), now=104.5)) == 1 and a.incomplete == 0
    a.on_transaction(begin("0-1-2"), 110.0)
    a.on_transaction(end("0-1-2", orders=1), 110.0)
    assert len(list(a.ready(115.1))) == 1 and a.incomplete == 1  # read to the end, and its record never came


def test_a_connector_restarted_inside_a_transaction_gives_each_row_once_in_binlog_order():
    """Issue 42: the restarted connector writes the transaction's BEGIN again and its rows from its last flushed
    offset on, `total_order` from 1 again, and an END counting only those. The rows written again are replays; the
    transaction waits until the connector has written a later one in its table's partition."""
    a = Assembler(CFG, start_gtid="0-1-6")
    first = [record("0-1-7", i + 1, offset=i, pos=100, row=i) for i in range(4)]
    assert feed(a, begin("0-1-7"), *first) == []
    again = [record("0-1-7", i + 1, offset=4 + i, pos=100, row=2 + i) for i in range(4)]  # rows 2..5
    assert feed(a, begin("0-1-7"), *again, end("0-1-7", orders=4)) == []
    assert a.replays.records == 2  # rows 2 and 3 came again
    (tx,) = feed(a, begin("0-1-8"), record("0-1-8", 1, offset=8, pos=300), end("0-1-8", orders=1))[:1]
    assert [r.row_index for r in tx.rows] == list(range(6)) and not tx.cdc.incomplete
    assert [r.end_pos for r in tx.rows] == [100] * 6 and a.incomplete == 0


def test_a_begin_of_an_older_transaction_is_a_replay_and_does_not_end_the_one_under_way():
    """The connector restarted from before the transaction under way: the BEGIN of one before it (handed on, or
    from before this reader's start) comes first. It must not end the one under way, whose records then come again."""
    a = Assembler(CFG)
    assert feed(a, begin("0-1-7"), record("0-1-7", 1, offset=0, pos=100)) == []
    assert feed(a, begin("0-1-6"), end("0-1-6", orders=1), record("0-1-6", 1, offset=1, pos=50)) == []
    out = feed(a, begin("0-1-7"), record("0-1-7", 1, offset=2, pos=100), record("0-1-7", 2, offset=3, pos=101),
               end("0-1-7", orders=2), begin("0-1-8"), record("0-1-8", 1, offset=4, pos=200), end("0-1-8", orders=1))
    assert [(t.position.gtid, len(t.rows)) for t in out] == [("0-1-7", 2), ("0-1-8", 1)]
    assert a.replays.records == 2 and a.late == 0  # 0-1-6's record and 0-1-7's first row


def test_a_late_record_takes_a_row_index_of_its_own_and_one_written_again_is_a_replay():
    a = Assembler(CFG)
    out = feed(a, begin("0-1-4"), record("0-1-4", 1, offset=0, pos=10), begin("0-1-5"), end("0-1-5", orders=1),
               record("0-1-5", 1, offset=1, pos=20))
    assert [t.position.gtid for t in out] == ["0-1-4", "0-1-5"]
    (late,) = feed(a, record("0-1-4", 2, offset=2, pos=11))
    assert [r.row_index for r in late.rows] == [1] and a.late == 1
    assert feed(a, record("0-1-4", 2, offset=3, pos=11)) == [] and a.replays.records == 1


def test_the_grace_of_records_not_come_runs_only_while_the_connector_writes():
    """A worker killed after its END went out, before the records sent before it did, restarts (35 s once here) and
    sends them then: while it writes nothing its transaction is not judged incomplete."""
    a = Assembler(CFG, grace_seconds=10)
    assert feed(a, begin("0-1-1"), end("0-1-1", orders=2), record("0-1-1", 1, offset=0), now=0.0) == []
    assert feed(a, now=60.0) == [] and a.incomplete == 0  # away a minute: it wrote for 5 s of it
    # written again after its restart: its BEGIN, the record that came, the one that did not
    assert feed(a, begin("0-1-1"), record("0-1-1", 1, offset=1), record("0-1-1", 2, offset=2), now=61.0) == []
    out = feed(a, begin("0-1-2"), end("0-1-2", orders=1), record("0-1-2", 1, offset=3), now=62.0)
    assert [(t.position.gtid, len(t.rows)) for t in out] == [("0-1-1", 2), ("0-1-2", 1)]
    assert a.incomplete == 0 and a.replays.records == 1


def test_a_new_snapshot_of_tables_already_streamed_is_counted_as_replays_and_not_applied():
    a = Assembler(CFG)
    (first,) = feed(a, record("", 1, op="r", offset=0))
    assert first.snapshot and len(first.rows) == 1
    assert len(feed(a, begin("0-1-5"), end("0-1-5", orders=1), record("0-1-5", 2, offset=1))) == 1
    assert feed(a, record("", 1, op="r", offset=2), record("", 2, op="r", offset=3, snapshot_last=True)) == []
    assert a.replays.records == 2 and a.resnapshots == 2


def test_a_snapshot_taken_again_from_its_start_gives_each_row_once_and_counts_the_rest_as_replays():
    """A worker stopped during the connector's first snapshot: at its restart the snapshot begins again (each table
    at a record marked `first`), and the rows of the pass before come again at new offsets. Those unchanged are replays; one that
    changed in between, or one the pass before never reached, is taken in; equal rows of a table without a key
    stay as many as the table holds. After the first streamed change a snapshot is the other case (above)."""
    a = Assembler(CFG)
    pending = {"order_no": "O2", "status": "pending"}
    paid = {"order_no": "O2", "status": "paid"}
    twin = {"note": "same"}
    first_pass = [record("", 1, op="r", offset=0, snapshot_first=True), record("", 2, op="r", offset=1, after=pending),
                  record("", 0, op="r", table="payments", pk=(), after=twin, offset=0, snapshot_first=True),
                  record("", 0, op="r", table="payments", pk=(), after=twin, offset=1)]
    assert [len(tx.rows) for tx in feed(a, *first_pass)] == [1, 1, 1, 1]
    second_pass = [record("", 1, op="r", offset=2, snapshot_first=True), record("", 2, op="r", offset=3, after=paid),
                   record("", 0, op="r", table="payments", pk=(), after=twin, offset=2, snapshot_first=True),
                   record("", 0, op="r", table="payments", pk=(), after=twin, offset=3),
                   record("", 3, op="r", offset=4, snapshot_last=True)]
    taken = feed(a, *second_pass)
    assert [r.after for tx in taken for r in tx.rows] == [paid, record("", 3).after]
    assert taken[-1].complete and a.replays.records == 3
    feed(a, begin("0-1-5"), end("0-1-5", orders=1), record("0-1-5", 4, offset=5))
    assert list(a.snapshot_passes.taken) == ["shop.payments"]  # the orders stream: their snapshot's rows forgotten


def test_the_first_snapshot_s_rows_read_after_a_change_another_table_streamed_are_taken_in():
    """A monitor reading the topics from their start reads each partition at its own pace: a transaction of the
    payments alone is handed on while orders of the first snapshot are still to be read. Those are taken in; a
    snapshot after a change streamed in the same partition is a new one (rows known)."""
    a = Assembler(CFG)
    feed(a, record("", 1, op="r", offset=0, snapshot_first=True))
    assert len(feed(a, begin("0-1-5"), end("0-1-5", payments=1), record("0-1-5", 9, table="payments"))) == 1
    assert [len(tx.rows) for tx in feed(a, record("", 2, op="r", offset=1, snapshot_last=True))] == [1]
    assert feed(a, record("", 9, op="r", table="payments", offset=1)) == [] and a.resnapshots == 1


def test_a_keyed_row_of_a_snapshot_taken_again_is_a_replay_before_its_table_s_first_record_of_the_pass_is_read():
    """The topics' partitions are read each at its own pace: the second pass's payments may be read before its
    orders, whose record marked `first` begins the pass. A keyed row seen before is a replay all the same."""
    a = Assembler(CFG)
    row = {"order_no": "P1", "status": "success"}
    feed(a, record("", 1, op="r", offset=0, snapshot_first=True),
         record("", 1, op="r", table="payments", after=row, pk=("P1",), offset=0, snapshot_first=True))
    assert feed(a, record("", 1, op="r", table="payments", after=row, pk=("P1",), offset=1, snapshot_first=True),
                record("", 1, op="r", offset=1, snapshot_first=True)) == []
    assert a.replays.records == 2
