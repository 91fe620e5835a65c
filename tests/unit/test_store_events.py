"""Events come back from the store exactly as they were parsed (payload, keys, headers, CDC and
coordinates), whether the store kept the payload's own JSON text or encoded the parsed payload."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from prometheus_client import generate_latest

from oncewatch.collectors.kafka_formats import TopicParser
from oncewatch.core.config import PostgresTarget, TopicConfig
from oncewatch.core.exact_json import to_json
from oncewatch.core.records import EmittedEvent, QuarantinedRecord, QuarantinedRows
from oncewatch.dashboards import metrics
from oncewatch.store import Store
from oncewatch.store.entities import NAMES
from oncewatch.store.journal import EVENT_ROW, INSERT_EVENT, events_from
from oncewatch.store.schema import aside, columns

from .previous_store import make_previous

OLD = 'events.rowid, topic, partition, "offset", timestamp_ms, timestamp_type, record_key, format, body'

PATHS = {"event_type": "type", "trade_no": "trade_no", "order_key": "order_no", "amount": "amount",
         "status": "status", "effect_id": "items.0.id"}


@dataclass(frozen=True)
class Rec:
    topic: str
    value: bytes | None
    offset: int
    key: bytes | None = None
    partition: int = 0
    timestamp: int = 1_700_000_000_123
    timestamp_type: int = 0
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def parse(fmt: str, rec: Rec) -> EmittedEvent:
    out = TopicParser(TopicConfig(name=rec.topic, format=fmt, paths=PATHS, required=()), 100_000).parse(rec)
    assert isinstance(out, EmittedEvent), out
    return out


def exact(value: Any) -> str:
    """Values that compare equal with other types (Decimal("1.10") and 1.1, 1 and True) or other
    exponents (Decimal("1.10") and Decimal("1.1")) encode differently; dict order does not count."""
    return to_json(value)


def stored(target, events: list[EmittedEvent],
           entities: list[tuple[int, str]] = ()) -> tuple[Store, list[EmittedEvent]]:
    store = Store(target)
    with store.batch() as tx:
        tx.add_events(events, entities)
    return store, store.events()


def assert_same(back: list[EmittedEvent], events: list[EmittedEvent]) -> None:
    assert back == sorted(events, key=lambda e: (e.topic, e.partition, e.offset))
    for b, e in zip(back, sorted(events, key=lambda e: (e.topic, e.partition, e.offset))):
        assert (exact(b.payload), exact(b.keys), exact(b.cdc), b.headers) == (
            exact(e.payload), exact(e.keys), exact(e.cdc), e.headers)


JSON_TEXTS = [
    # numbers exact: fractions and exponents as Decimal, big integers as int
    b'{"type": "order.paid", "order_no": "O1", "trade_no": 7, "amount": 12.50, "ratio": 1e400,'
    b' "big": 123456789012345678901234567890, "neg": -0.0, "items": [{"id": 42}], "status": "paid"}',
    # strings with escapes, non-ASCII, a JSON null and booleans; whitespace around the document
    b'  {"type": "x", "note": "tab\\t \\"q\\" \\\\ \\u00e9 \\ud83d\\ude00 \xe2\x9c\x93", "n": null, "ok": true}\n',
    # an object that looks like one of the store's own tags stays that object
    b'{"type": "tagged", "amount": "3", "money": {"$decimal": "1.5"}, "at": {"$datetime": "2026-01-01"}}',
    # not an object at all (no paths need one when none are required)... and an array payload
    b'[1, 2.5, "three"]',
]


def filed_events(store: Store) -> list[tuple[str, str]]:
    """(entity, the event's coordinates) of every event entry of the entity index."""
    return sorted((name, f"{t}/{p}@{o}") for name, t, p, o in store.conn.execute(
        f'SELECT p.prefix || n.rest, topic, partition, "offset" FROM {NAMES} JOIN event_entries r ON r.entity = n.id '
        f'JOIN (SELECT events.rowid AS id, topic, partition, "offset" FROM {events_from(store.conn)}) e '
        "ON e.id = r.event"))


def test_json_events_round_trip_exactly_with_headers_keys_and_coordinates(store_target):
    events = [parse("json", Rec("j", text, offset=i, key=b"O1" if i % 2 else None, partition=i % 2,
                                headers=[("trace", b"t-1"), ("empty", None)] if i == 0 else []))
              for i, text in enumerate(JSON_TEXTS[:3])]
    assert all(e.payload_json is not None for e in events)
    store, back = stored(store_target, events, [(0, "trade_no:7"), (2, "order_key:x")])
    assert_same(back, events)
    assert back[0].payload["ratio"] == Decimal("1e400") and isinstance(back[0].payload["neg"], Decimal)
    assert back[1].payload["money"] == {"$decimal": "1.5"}  # kept as the object it was
    assert filed_events(store) == [("order_key:x", "j/0@2"), ("trade_no:7", "j/0@0")]
    store.close()


def test_keys_of_every_kept_type_round_trip(store_target):
    text = ('{"type": "order.paid", "order_no": "订单-é", "trade_no": 1180591620717411303424, "amount": "0.10",'
            ' "status": 3, "items": [{"id": -1}]}').encode()
    events = [parse("json", Rec("j", text, offset=1, headers=[("来源", "支付".encode()), ("raw", b"\xff")]))]
    assert events[0].keys == {"event_type": "order.paid", "order_key": "订单-é", "trade_no": 2**70,
                              "amount": Decimal("0.10"), "status": 3, "effect_id": -1}
    store, back = stored(store_target, events)
    assert_same(back, events)
    assert type(back[0].keys["amount"]) is Decimal and back[0].headers == (("来源", "支付"), ("raw", "\\xff"))
    store.close()


def test_a_payload_that_is_no_object_round_trips_too(store_target):
    p = TopicParser(TopicConfig(name="j", format="json", paths={}, required=()), 1000)
    e = p.parse(Rec("j", JSON_TEXTS[3], offset=5))
    assert isinstance(e, EmittedEvent) and e.payload == [1, Decimal("2.5"), "three"]
    _, back = stored(store_target, [e])
    assert_same(back, [e])


def debezium(op: str, before: dict | None, after: dict | None) -> dict[str, Any]:
    return {"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_500, "transaction": None,
            "source": {"db": "shop", "table": "payments", "file": "binlog.000003", "pos": 4331, "row": 0,
                       "gtid": None, "snapshot": "false", "ts_ms": 1_700_000_000_000}}


def test_cdc_events_round_trip_exactly(store_target):
    row = {"id": 7, "trade_no": "T7", "order_no": "O7", "amount": "99.90", "status": "success"}
    schema = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "amount", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
         "parameters": {"scale": "2"}}]}]}
    wrapped_after = {**row, "amount": "Jwo="}  # 9994 at scale 2
    canal = {"data": [row, {**row, "id": 8, "trade_no": "T8"}], "old": [{"status": "pending"}, {"status": "pending"}],
             "database": "shop", "table": "payments", "type": "UPDATE", "isDdl": False, "pkNames": ["id"],
             "es": 1_700_000_000_000, "ts": 1_700_000_000_100, "sql": "", "id": 3,
             "mysqlType": {"amount": "decimal(12,2)"}, "sqlType": {"amount": 3}}
    key = json.dumps({"id": 7}).encode()
    ddl = {**canal, "isDdl": True, "data": None, "sql": "ALTER TABLE x"}
    events = [
        parse("debezium", Rec("d", json.dumps(debezium("u", {**row, "status": "pending"}, row)).encode(), 0, key)),
        parse("debezium", Rec("d", json.dumps({"schema": schema, "payload": debezium("c", None, wrapped_after)})
                              .encode(), 1, key)),
        parse("debezium", Rec("d", None, 2, key)),
        parse("canal", Rec("c", json.dumps(canal).encode(), 0)),
        parse("canal", Rec("c", json.dumps(ddl).encode(), 1)),
    ]
    # The wrapped envelope is not the record's text (the payload is the unwrapped part).
    assert [e.payload_json is not None for e in events] == [True, False, False, True, True]
    assert events[1].cdc["after"]["amount"] == Decimal("99.94")
    _, back = stored(store_target, events)
    assert_same(back, events)


def test_events_without_their_text_round_trip(store_target):
    """Events made elsewhere (samples, scenarios) keep Decimal, datetime and floats through the store."""
    e = EmittedEvent(topic="t", partition=1, offset=3, timestamp_ms=5, timestamp_type="CreateTime", key="k",
                     headers=(("h", "v"),), payload={"amount": Decimal("1.10"), "at": dt.datetime(2026, 1, 1, 0, 0, 1),
                                                     "f": 0.5, "n": None},
                     format="json", keys={"amount": Decimal("1.10")}, cdc=None)
    _, back = stored(store_target, [e])
    assert_same(back, [e])


def test_bodies_written_before_the_array_form_still_read(store_target):
    e = parse("json", Rec("j", JSON_TEXTS[0], offset=9, key=b"O1", headers=[("trace", b"t-1")]))
    store = Store(store_target)
    with store.batch() as tx:
        source = store.event_sources.number(tx.conn, (e.topic, e.timestamp_type, e.format))
        tx.conn.execute(f"{INSERT_EVENT}{EVENT_ROW}", (source, e.partition, e.offset, e.timestamp_ms, e.key,
                                                       to_json(e.to_dict()), None))
    assert_same(store.events(), [e])
    store.close()


def test_a_large_batch_stores_every_event_and_entity_once(store_target):
    """Batches are written several rows to a statement, the remainder row by row."""
    events = [parse("json", Rec("j", json.dumps({"type": "t", "order_no": f"O{i}", "trade_no": f"T{i // 2}"}).encode(),
                                offset=i)) for i in range(37)]
    entities = [(i, f"{k}:{events[i].keys[k]}") for i in range(37) for k in ("trade_no", "order_key")]
    store, back = stored(store_target, events, entities + entities[:3])  # a repeated entry is stored once
    assert_same(back, events)
    assert filed_events(store) == sorted((entity, f"j/0@{i}") for i, entity in entities)
    with store.batch() as tx:  # more events after the first batch: the statements are reused
        tx.add_events([parse("json", Rec("j", b'{"type": "t"}', offset=100 + i)) for i in range(20)])
    assert len(store.events()) == 57
    store.close()


def test_binlog_quarantine_is_kept_and_counted(store_target):
    store = Store(store_target)
    bad = QuarantinedRows(txid="0-1-9", binlog_file="mysql-bin.000002", event_pos=4711, table="shop.orders",
                          reason="undecodable", detail="big5 cannot decode byte(s) b'\\xf9\\xfe' of a value")
    with store.batch() as tx:
        tx.add_binlog_quarantined([bad])
        tx.add_binlog_quarantined([bad])  # a replay after a restart keeps one
    assert store.binlog_quarantined() == [bad] and store.binlog_quarantine_counts() == {"undecodable": 1}
    store.close()
    exported = generate_latest(metrics.registry(store_target)).decode()
    assert 'oncewatch_binlog_quarantined_events_total{reason="undecodable"} 1.0' in exported
    assert 'oncewatch_binlog_quarantined_events_total{reason="unparseable"} 0.0' in exported


def test_an_older_store_keeps_its_quarantine_and_gains_the_timestamp_type(store_target):
    """quarantine_raw before it had timestamp_type: a reader reads its records (type unknown) and the next
    writer adds the column, after which a record keeps its type and a header key that is not UTF-8."""
    store = Store(store_target)
    store.conn.execute("DROP TABLE quarantine_raw")
    blob = "BYTEA" if isinstance(store_target, PostgresTarget) else "BLOB"
    store.conn.execute(f'CREATE TABLE quarantine_raw (topic TEXT NOT NULL, partition INTEGER NOT NULL, "offset" '
                       f"INTEGER NOT NULL, record_key {blob}, value {blob}, headers TEXT NOT NULL, "
                       'PRIMARY KEY (topic, partition, "offset"))')
    if isinstance(store_target, PostgresTarget):
        store.conn.execute("UPDATE oncewatch_store SET schema_sha256 = 'made by an older version'")
    old = QuarantinedRecord("t", 0, 1, 1_700_000_000_000, "not_json", "Expecting value", 3, "abc", value=b"abc",
                            headers=(("trace", b"t"),))
    store.conn.execute('INSERT INTO quarantine (topic, partition, "offset", timestamp_ms, reason, detail, size, '
                       "preview, quarantined_at) VALUES (?,?,?,?,?,?,?,?,?)",
                       (old.topic, old.partition, old.offset, old.timestamp_ms, old.reason, old.detail, old.size,
                        old.preview, 1.0))
    store.conn.execute('INSERT INTO quarantine_raw (topic, partition, "offset", record_key, value, headers) '
                       "VALUES (?,?,?,?,?,?)", (old.topic, old.partition, old.offset, None, old.value,
                                                '[["trace", "dA=="]]'))
    store.close()
    reader = Store(store_target, readonly=True)
    assert reader.quarantined() == [old]
    reader.close()
    writer = Store(store_target)
    new = QuarantinedRecord("t", 0, 2, 1_700_000_000_500, "unparseable", "header key 0 is not UTF-8", 2, "{}",
                            key=b"k", value=b"{}", headers=(("\udcff\udcfekey", b"\x00v"), ("e", None)),
                            timestamp_type="LogAppendTime")
    with writer.batch() as tx:
        tx.add_quarantined([new])
    assert writer.quarantined() == [old, new]
    writer.close()


def test_an_older_stores_events_move_under_their_rowids_and_read_as_before(store_target):
    """A reader reads an older store's events as they are; its next writer moves them under the same rowids, which
    the entity index points to, and the events after them get rowids past theirs."""
    events = [parse("json", Rec(f"topic-{i % 2}", json.dumps({"type": "t", "trade_no": f"T{i}"}).encode(), offset=i))
              for i in range(30)]
    entities = [(i, f"trade_no:T{i}") for i in range(30)]
    store, _ = stored(store_target, events[:20], entities[:20])
    postgres = isinstance(store_target, PostgresTarget)
    old = store.conn.execute(f"SELECT {OLD} FROM events JOIN event_sources s ON s.id = events.source "
                             "ORDER BY events.rowid").fetchall()
    make_previous(store)
    before = filed_events(store)
    store.close()
    assert_same(Store(store_target, readonly=True).events(), events[:20])
    writer = Store(store_target)
    assert "topic" not in columns(writer.conn, "events") and aside("events") not in {
        t for (t,) in writer.conn.execute(writer.dialect.tables)}
    assert writer.conn.execute(f"SELECT {OLD} FROM events JOIN event_sources s ON s.id = events.source "
                               "ORDER BY events.rowid").fetchall() == [tuple(r) for r in old]
    assert filed_events(writer) == before
    with writer.batch() as tx:
        tx.add_events(events[20:], [(i - 20, name) for i, name in entities[20:]])
    assert_same(writer.events(), events)
    assert filed_events(writer) == sorted((name, events[i].coordinates) for i, name in entities)
    if postgres:  # the index of rowids the older table had is made for the new one
        assert writer.conn.execute("SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() AND "
                                   "tablename = 'events' AND indexname = 'events_rowid'").fetchone() is not None
    writer.close()
