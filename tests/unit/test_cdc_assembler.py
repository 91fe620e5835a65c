"""collectors.cdc.Assembler: Debezium's records and transaction topic in, committed transactions out, in order."""

from __future__ import annotations

import dataclasses

from oncewatch.collectors.cdc import NEW_KEY, OLD_KEY, Assembler, DataRecord
from oncewatch.core.config import parse

CFG = parse({"mysql": {"user": "u", "password_env": "NONE", "tables": ["shop.orders", "shop.payments"]}}).mysql


def record(txid: str, order: int, op: str = "c", table: str = "orders", offset: int = 0, **kw) -> DataRecord:
    row = {"order_no": f"O{order}", "status": "pending"}
    base = dict(topic=f"cdc.shop.{table}", partition=0, offset=offset, txid=txid, order=order, op=op, db="shop",
                table=table, pk=(row["order_no"],), before=row if op in ("u", "d") else None,
                after=row if op in ("c", "u", "r") else None, file="binlog.000001", pos=100 + order, header_time=1.0)
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
    out = feed(a, record("0-1-1", 2, offset=1))
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
    assert a.replayed == 1 and not a.open
    assert len(feed(a, begin("0-1-8"), end("0-1-8", orders=1), record("0-1-8", 1))) == 1


def test_a_primary_key_change_is_one_update_and_tombstones_take_no_place():
    a = Assembler(CFG)
    gone = record("0-1-1", 1, op="d", key_changed=NEW_KEY)
    came = dataclasses.replace(record("0-1-1", 2, op="c", key_changed=OLD_KEY), pk=("O9",),
                               after={"order_no": "O9", "status": "pending"})
    (tx,) = feed(a, begin("0-1-1"), end("0-1-1", orders=2), gone, came)
    (row,) = tx.rows
    assert (row.op, row.pk, row.before["order_no"], row.after["order_no"]) == ("update", ("O9",), "O1", "O9")


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
