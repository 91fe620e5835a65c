"""collectors.canal: Canal's FlatMessages (in the shape Canal's MQ producer documents: every value as text, the
declared types in mysqlType) read into the binlog collector's values and made transactions again."""

from __future__ import annotations

import datetime as dt
import json
from collections import namedtuple
from decimal import Decimal

import pytest

from oncewatch.collectors.canal import CanalAssembler, canal_values
from oncewatch.collectors.debezium_rows import Undecodable
from oncewatch.core.config import parse
from oncewatch.core.records import OP_DELETE, OP_UPDATE

CFG = parse({"mysql": {"tables": ["shop.orders", "shop.payments"]},
             "kafka": {"bootstrap_servers": ["127.0.0.1:9092"],
                       "topics": [{"name": "events", "format": "json", "required": []}]},
             "cdc": {"format": "canal", "topics": ["canal.shop"]}})
Record = namedtuple("Record", "offset value")
UTC = dt.timezone.utc


def flat(table: str = "orders", type_: str = "INSERT", data=None, old=None, es: int = 1_700_000_000_000,
         batch: int = 1, **extra) -> dict:
    """A FlatMessage as Canal writes it."""
    data = data if data is not None else [{"order_no": "O1", "status": "pending", "amount": "10.50"}]
    return {"data": data, "database": "shop", "es": es, "id": batch, "isDdl": False,
            "mysqlType": {"order_no": "varchar(32)", "status": "varchar(16)", "amount": "decimal(10,2)"},
            "old": old, "pkNames": ["order_no"], "sql": "", "sqlType": {"order_no": 12, "status": 12, "amount": 3},
            "table": table, "ts": es + 35, "type": type_, **extra}


def feed(a: CanalAssembler, *messages, at: int = 0, now: float = 0.0) -> list:
    out = []
    for i, m in enumerate(messages):
        out += a.feed("canal.shop", 0, Record(at + i, None if m is None else json.dumps(m).encode()), now)
    return out


def test_every_type_reads_as_the_binlog_collector_reads_it():
    types = {"i": "int(11)", "u": "bigint(20) unsigned", "y": "year(4)", "d": "decimal(40,12)", "f": "float",
             "g": "double", "s": "varchar(20)", "e": "enum('a','b')", "j": "json", "b": "varbinary(8)",
             "st": "set('x','y','z')", "none": "set('x')", "bit": "bit(4)", "da": "date", "z": "date",
             "dt": "datetime(3)", "ts": "timestamp(6)", "t": "time(2)", "n": "int(11)"}
    row = {"i": "-7", "u": "18446744073709551615", "y": "2024", "d": "-1234567890123456789012345678.123456789012",
           "f": "0.1", "g": "0.1", "s": "ü 中", "e": "b", "j": '{"a": 1}', "b": "\x00\xff\x10", "st": "x,z",
           "none": "", "bit": "5", "da": "2024-02-29", "z": "0000-00-00", "dt": "2024-01-02 03:04:05.123",
           "ts": "2024-01-02 11:04:05.000001", "t": "-838:59:59.5", "n": None}
    values = canal_values(row, types, dt.timezone(dt.timedelta(hours=8)))
    assert values == {
        "i": -7, "u": 2**64 - 1, "y": 2024, "d": Decimal("-1234567890123456789012345678.123456789012"),
        "f": 0.10000000149011612, "g": 0.1, "s": "ü 中", "e": "b", "j": '{"a": 1}', "b": b"\x00\xff\x10",
        "st": {"x", "z"}, "none": None, "bit": "0101", "da": dt.date(2024, 2, 29), "z": None,
        "dt": dt.datetime(2024, 1, 2, 3, 4, 5, 123000), "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 1),
        "t": -dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=500000), "n": None}
    assert str(values["d"]) == "-1234567890123456789012345678.123456789012"  # every digit


@pytest.mark.parametrize("types, row, message", [
    ({"p": "point"}, {"p": "\x00\x01"}, r"column p: MySQL type 'point' is not read exactly"),
    ({"i": "int(11)"}, {"i": "x"}, r"column i: 'x' does not read as int\(11\)"),
    ({"t": "time"}, {"t": "10h"}, r"column t: '10h' does not read as time"),
])
def test_a_value_that_cannot_be_read_exactly_is_undecodable(types, row, message):
    with pytest.raises(Undecodable, match=message):
        canal_values(row, types, UTC)


def test_messages_of_one_batch_and_execute_time_are_one_transaction_in_order():
    a = CanalAssembler(CFG.mysql, ("canal.shop",), grace_seconds=1.0)
    assert feed(a, flat(), flat("payments", data=[{"order_no": "O1", "status": "paid", "amount": "10.50"}])) == []
    assert a.first_pending() == {"canal.shop/0": 0}  # a restart reads the held transaction again
    (first,) = feed(a, flat(es=1_700_000_001_000), at=2)  # another execute time: the first is over
    assert [(r.table, r.row_index, r.txid) for r in first.rows] == [("orders", 0, "canal.shop/0@0"),
                                                                  ("payments", 1, "canal.shop/0@0")]
    assert first.commit_time == 1_700_000_000.0 and first.rows[0].after["amount"] == Decimal("10.50")
    assert first.rows[0].coordinates == "canal.shop/0:0#canal.shop/0@0/0" and first.cdc.records == 2
    assert list(a.ready(0.5)) == []
    (second,) = a.ready(1.0)  # no message joined it within the grace
    assert second.rows[0].txid == "canal.shop/0@2" and not a.waiting


def test_an_update_s_before_image_is_its_row_with_the_old_values_and_a_delete_s_is_its_row():
    a = CanalAssembler(CFG.mysql, ("canal.shop",))
    feed(a, flat(type_="UPDATE", data=[{"order_no": "O1", "status": "paid", "amount": "10.50"}],
                 old=[{"status": "pending"}]),
         flat(type_="DELETE", data=[{"order_no": "O2", "status": "closed", "amount": "1.00"}]))
    (tx,) = a.ready(10.0)
    update, delete = tx.rows
    assert (update.op, update.before["status"], update.after["status"], update.pk) == (OP_UPDATE, "pending", "paid",
                                                                                     ("O1",))
    assert (delete.op, delete.before["order_no"], delete.after) == (OP_DELETE, "O2", None)


def test_unreadable_records_are_quarantined_by_their_coordinates_and_the_rest_goes_on():
    a = CanalAssembler(CFG.mysql, ("canal.shop",))
    bad_value = flat(data=[{"order_no": "O1", "status": "x", "amount": "ten"}])
    feed(a, None, {"no": "canal"}, bad_value, flat(data=[{"order_no": "O3", "status": "pending", "amount": "1"}]))
    (tx,) = a.ready(10.0)
    assert [r.pk for r in tx.rows] == [("O3",)]
    assert [(q.binlog_file, q.event_pos, q.reason) for q in tx.quarantined] == [
        ("canal.shop/0", 0, "unparseable"), ("canal.shop/0", 1, "unparseable"), ("canal.shop/0", 2, "undecodable")]
    assert "column amount: 'ten' does not read as decimal(10,2)" in tx.quarantined[2].detail
    assert a.counts().unreadable_records == 3


def test_a_message_sent_again_after_a_canal_restart_is_a_replay_not_a_second_change():
    a = CanalAssembler(CFG.mysql, ("canal.shop",))
    assert feed(a, flat(), flat("payments")) == []
    assert feed(a, flat(batch=7, ts=5), flat("payments", batch=7, ts=9), at=2) == []  # a new batch id and build time
    (first,) = feed(a, flat(data=[{"order_no": "O9", "status": "pending", "amount": "2.00"}], batch=8), at=4)
    (second,) = a.ready(10.0)
    assert len(first.rows) == 2 and [r.pk for r in second.rows] == [("O9",)]  # the replayed rows applied once
    assert a.counts().replayed_records == 2
    assert [(r.first, r.last, r.records) for r in first.cdc.replays] == [(2, 3, 2)]


def test_a_truncate_of_a_watched_table_is_a_schema_change_and_other_ddl_is_counted():
    a = CanalAssembler(CFG.mysql, ("canal.shop",))
    feed(a, {"database": "shop", "table": "orders", "isDdl": True, "type": "TRUNCATE", "sql": "TRUNCATE orders",
             "es": 1, "id": 5, "data": None},
         {"database": "shop", "table": "orders", "isDdl": True, "type": "ALTER", "sql": "ALTER TABLE orders ...",
          "es": 1, "id": 5, "data": None})
    (tx,) = a.ready(10.0)
    assert [(c.kind, c.table) for c in tx.schema_changes] == [("truncate", "shop.orders")]
    assert a.counts().ddl_records == 1


def test_canal_config_names_its_topics_and_cannot_check_a_pipeline():
    from oncewatch.core.sections import ConfigError

    base = {"mysql": {"tables": ["shop.orders"]}, "kafka": CFG_KAFKA}
    with pytest.raises(ConfigError, match=r"^cdc\.topics: missing"):
        parse({**base, "cdc": {"format": "canal"}})
    with pytest.raises(ConfigError, match=r"^cdc\.topic_prefix: Canal's topics are named"):
        parse({**base, "cdc": {"format": "canal", "topics": ["t"], "topic_prefix": "x"}})
    with pytest.raises(ConfigError, match=r"^cdc\.mode: Canal's FlatMessage carries no GTID"):
        parse({"mysql": {**base["mysql"], "user": "u", "password_env": "X"}, "kafka": CFG_KAFKA,
               "cdc": {"format": "canal", "topics": ["t"], "mode": "check"}})
    with pytest.raises(ConfigError, match=r"^cdc\.time_zone: 'Mars/Olympus' is not an IANA time zone"):
        parse({**base, "cdc": {"format": "canal", "topics": ["t"], "time_zone": "Mars/Olympus"}})


CFG_KAFKA = {"bootstrap_servers": ["127.0.0.1:9092"], "topics": [{"name": "events", "format": "json", "required": []}]}
