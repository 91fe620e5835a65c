"""Parsing of json, Debezium and Canal records into EmittedEvent / QuarantinedRecord, no broker.

The Debezium and Canal records are shaped as those projects document them: every envelope and
source field of the Debezium MySQL connector, the JsonConverter schema/payload wrapper, the
tombstone that follows a delete; Canal's FlatMessage with several rows and `old` holding only the
changed columns.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncewatch.collectors.kafka_formats import Rejected, TopicParser, decode_json
from oncewatch.core.config import TopicConfig
from oncewatch.core.exact_json import parse_exact_json
from oncewatch.core.records import EmittedEvent, QuarantinedRecord

PATHS = {"event_type": "type", "trade_no": "payment.trade_no", "order_key": "order_no", "effect_id": "items.0.id",
         "amount": "payment.amount", "status": "status"}


@dataclass(frozen=True)
class Rec:
    value: bytes | None
    key: bytes | None = None
    topic: str = "t"
    partition: int = 1
    offset: int = 7
    timestamp: int = 1_700_000_000_123
    timestamp_type: int = 0
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def raw(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def parser(fmt: str, paths: dict[str, str] | None = None, required: tuple[str, ...] = (),
           max_bytes: int = 10_000) -> TopicParser:
    return TopicParser(TopicConfig(name="t", format=fmt, paths=paths or {}, required=required), max_bytes)


def event(p: TopicParser, rec: Rec) -> EmittedEvent:
    out = p.parse(rec)
    assert isinstance(out, EmittedEvent), out
    return out


def quarantined(p: TopicParser, rec: Rec) -> QuarantinedRecord:
    out = p.parse(rec)
    assert isinstance(out, QuarantinedRecord), out
    return out


# ---------------------------------------------------------------- json

def test_json_event_keys_exact_amount_and_coordinates():
    body = b'{"type": "order.paid", "order_no": "O1", "status": "paid", "items": [{"id": 42}],' \
           b' "payment": {"trade_no": "T1", "amount": 19.99}}'
    e = event(parser("json", PATHS, ("event_type",)),
              Rec(body, key=b"O1", headers=[("trace", b"abc"), ("empty", None)]))
    assert e.keys == {"event_type": "order.paid", "trade_no": "T1", "order_key": "O1", "effect_id": 42,
                      "amount": Decimal("19.99"), "status": "paid"}
    assert type(e.keys["amount"]) is Decimal and e.payload["payment"]["amount"] == Decimal("19.99")
    assert (e.topic, e.partition, e.offset, e.coordinates) == ("t", 1, 7, "t/1@7")
    assert (e.timestamp_ms, e.timestamp_type, e.key, e.format, e.cdc) == (1_700_000_000_123, "CreateTime", "O1",
                                                                          "json", None)
    assert e.headers == (("trace", "abc"), ("empty", ""))


def test_json_amount_from_string_and_optional_keys_absent():
    e = event(parser("json", PATHS), Rec(raw({"type": "x", "payment": {"amount": " 100.10 "}, "status": None})))
    assert e.keys == {"event_type": "x", "amount": Decimal("100.10")}


@pytest.mark.parametrize("value, reason, detail", [
    (b"\xff\xfe{}", "not_utf8", "invalid UTF-8 at byte 0"),
    (b"{not json", "not_json", "Expecting property name"),
    (b'{"amount": NaN}', "not_json", "NaN is not a JSON number"),
    (None, "null_value", "tombstone"),
    (raw({"order_no": "O1"}), "missing_path", "event_type: no value at payload path 'type'"),
    (raw({"type": None}), "missing_path", "event_type"),
    (raw({"type": "x", "payment": {"amount": "12,50"}}), "wrong_type", "amount: expected a decimal number"),
    (raw({"type": "x", "payment": {"amount": True}}), "wrong_type", "amount"),
    (raw({"type": "x", "payment": {"amount": "Infinity"}}), "wrong_type", "finite"),
    (raw({"type": "x", "order_no": {"nested": 1}}), "wrong_type", "order_key: expected a string or an integer"),
    (raw({"type": 5}), "wrong_type", "event_type: expected a non-empty string"),
    (raw([1, 2]), "wrong_type", "payload must be a JSON object"),
    (b"[" * 4000 + b"]" * 4000, "not_json", "nested too deeply"),
])
def test_json_garbage_is_quarantined_with_reason(value, reason, detail):
    q = quarantined(parser("json", PATHS, ("event_type",)), Rec(value))
    assert q.reason == reason and detail in q.detail
    assert (q.topic, q.partition, q.offset, q.timestamp_ms) == ("t", 1, 7, 1_700_000_000_123)
    assert q.size == (len(value) if value else 0)


def reference_decode(data: bytes) -> tuple[str, Any]:
    """What the stdlib makes of a record: ("ok", (document, text)) or ("rejected", reason)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "rejected", "not_utf8"
    try:
        doc = parse_exact_json(text)
    except ValueError:
        return "rejected", "not_json"
    if any(isinstance(leaf, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in leaf) for leaf in _leaves(doc)):
        return "rejected", "not_utf8"  # a lone surrogate escape: no text the store could keep
    return "ok", (doc, text)


def outcome(data: bytes) -> tuple[str, Any]:
    try:
        return "ok", decode_json(data)
    except Rejected as exc:
        return "rejected", exc.reason


JSON_TEXTS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.decimals(allow_nan=False, allow_infinity=False).map(lambda d: json.dumps(d, default=str)).map(json.loads),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
).flatmap(lambda doc: st.sampled_from([json.dumps(doc), json.dumps(doc, ensure_ascii=False),
                                       json.dumps(doc, indent=1)]))


@settings(max_examples=400, deadline=None)
@given(st.one_of(JSON_TEXTS.map(lambda t: t.encode("utf-8", "surrogatepass")),
                 st.binary(max_size=40),
                 st.text(alphabet='[]{}":,.-+eE0123456789 \\u00dfnulltrueNaIfy', max_size=30).map(str.encode)))
def test_decoding_a_record_gives_what_the_stdlib_gives(data):
    """The compiled decoder's document, numbers and refusals are the stdlib's, on any bytes."""
    mine, ref = outcome(data), reference_decode(data)
    assert mine == ref
    if mine[0] == "ok":
        assert [type(v) for v in _leaves(mine[1][0])] == [type(v) for v in _leaves(ref[1][0])]


def test_a_lone_surrogate_escape_is_quarantined_and_a_pair_is_read():
    q = quarantined(parser("json", PATHS, ("event_type",)), Rec(b'{"type": "x", "order_no": "O\\udc00"}'))
    assert (q.reason, q.detail) == ("not_utf8", "a \\udc00 escape is half of a UTF-16 surrogate pair, not a character")
    assert event(parser("json", PATHS), Rec(b'{"type": "x", "order_no": "\\ud83d\\ude00"}')).keys["order_key"] == "\U0001f600"


def _leaves(doc: Any) -> list[Any]:
    if isinstance(doc, dict):
        return [x for k, v in doc.items() for x in (k, *_leaves(v))]
    if isinstance(doc, list):
        return [x for v in doc for x in _leaves(v)]
    return [doc]


def test_too_large_is_quarantined_before_decoding_with_safe_preview():
    value = b"\x00\x01binary\xff" + b"x" * 500
    q = quarantined(parser("json", PATHS, max_bytes=100), Rec(value))
    assert (q.reason, q.size) == ("too_large", len(value)) and "more than kafka.max_record_bytes = 100" in q.detail
    assert q.preview.startswith("\\x00\\x01binary\\xff") and q.preview.isprintable() and len(q.preview) < 200


# ---------------------------------------------------------------- debezium (MySQL connector)

SOURCE = {"version": "2.5.0.Final", "connector": "mysql", "name": "shopdb", "ts_ms": 1_700_000_000_000,
          "snapshot": "false", "db": "shop", "sequence": None, "table": "payments", "server_id": 223344,
          "gtid": "3e11fa47-71ca-11e1-9e33-c80aa9429562:23", "file": "mysql-bin.000003", "pos": 4331, "row": 0,
          "thread": 36, "query": None}
BEFORE = {"id": 1001, "trade_no": "T9", "order_no": "O9", "status": "pending", "amount": "25.50"}
AFTER = {**BEFORE, "status": "success"}
KEY = {"schema": {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}],
                  "optional": False, "name": "shopdb.shop.payments.Key"}, "payload": {"id": 1001}}
CDC_PATHS = {"trade_no": "trade_no", "order_key": "order_no", "status": "status", "amount": "amount"}


def envelope(op: str, before: dict | None, after: dict | None, **source: Any) -> dict[str, Any]:
    return {"before": before, "after": after, "source": {**SOURCE, **source}, "op": op,
            "ts_ms": 1_700_000_000_845, "transaction": None}


def row_schema(name: str, amount: dict[str, Any]) -> dict[str, Any]:
    return {"type": "struct", "optional": True, "name": "shopdb.shop.payments.Value", "field": name, "fields": [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "string", "optional": False, "field": "trade_no"},
        {"type": "string", "optional": False, "field": "order_no"},
        {"type": "string", "optional": False, "field": "status"},
        {"field": "amount", **amount}]}


def wrapped(env: dict[str, Any], amount: dict[str, Any]) -> dict[str, Any]:
    source_fields = [{"type": "string", "optional": False, "field": f} for f in SOURCE]
    return {"schema": {"type": "struct", "optional": False, "name": "shopdb.shop.payments.Envelope", "fields": [
        row_schema("before", amount), row_schema("after", amount),
        {"type": "struct", "fields": source_fields, "optional": False, "name": "io.debezium.connector.mysql.Source",
         "field": "source"},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        {"type": "struct", "optional": True, "name": "event.block", "field": "transaction", "fields": [
            {"type": "string", "optional": False, "field": "id"},
            {"type": "int64", "optional": False, "field": "total_order"},
            {"type": "int64", "optional": False, "field": "data_collection_order"}]}]},
        "payload": env}


def test_debezium_update_with_before_and_all_source_fields():
    e = event(parser("debezium", CDC_PATHS, ("trade_no",)), Rec(raw(envelope("u", BEFORE, AFTER)), key=raw(KEY)))
    assert e.format == "debezium" and e.coordinates == "t/1@7"
    assert e.keys == {"trade_no": "T9", "order_key": "O9", "status": "success", "amount": Decimal("25.50")}
    assert e.cdc == {"op": "update", "snapshot": False, "db": "shop", "table": "payments", "before": BEFORE,
                     "after": AFTER, "pk": {"id": 1001}, "source": SOURCE, "ts_ms": 1_700_000_000_845,
                     "transaction": None}
    assert (e.cdc["source"]["file"], e.cdc["source"]["pos"], e.cdc["source"]["row"], e.cdc["source"]["gtid"]) == (
        "mysql-bin.000003", 4331, 0, SOURCE["gtid"])


def test_debezium_create_snapshot_read_and_delete_ops():
    p = parser("debezium", CDC_PATHS)
    created = event(p, Rec(raw(envelope("c", None, BEFORE))))
    read = event(p, Rec(raw(envelope("r", None, BEFORE, snapshot="true"))))
    deleted = event(p, Rec(raw(envelope("d", AFTER, None, pos=4696))))
    assert (created.cdc["op"], created.cdc["snapshot"], created.cdc["pk"]) == ("insert", False, None)
    assert (read.cdc["op"], read.cdc["snapshot"]) == ("read", True)
    assert (deleted.cdc["op"], deleted.cdc["before"], deleted.cdc["after"]) == ("delete", AFTER, None)
    assert deleted.keys["status"] == "success"  # keys of a delete come from the before image


def test_debezium_tombstone_is_an_event_with_the_deleted_key():
    e = event(parser("debezium", CDC_PATHS, ("trade_no",)), Rec(None, key=raw(KEY), offset=8))
    assert (e.payload, e.keys, e.coordinates) == (None, {}, "t/1@8")
    assert e.cdc == {"op": "tombstone", "snapshot": False, "db": None, "table": None, "before": None, "after": None,
                     "pk": {"id": 1001}, "source": None, "ts_ms": None, "transaction": None}


def test_a_debezium_tombstone_takes_its_table_from_the_topic():
    e = event(parser("debezium", CDC_PATHS), Rec(None, key=raw(KEY), topic="cdc.shop.orders"))
    assert (e.cdc["op"], e.cdc["db"], e.cdc["table"]) == ("tombstone", "shop", "orders")


def test_debezium_schema_wrapper_decodes_precise_decimals():
    cents = base64.b64encode((2550).to_bytes(2, "big", signed=True)).decode()
    negative = base64.b64encode((-1).to_bytes(1, "big", signed=True)).decode()
    env = envelope("u", {**BEFORE, "amount": negative}, {**AFTER, "amount": cents})
    env["transaction"] = {"id": "tx-1", "total_order": 3, "data_collection_order": 1}
    decimal = {"type": "bytes", "optional": False, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
               "parameters": {"scale": "2", "connect.decimal.precision": "10"}}
    e = event(parser("debezium", CDC_PATHS), Rec(raw(wrapped(env, decimal))))
    assert e.cdc["after"]["amount"] == Decimal("25.50") and e.cdc["before"]["amount"] == Decimal("-0.01")
    assert e.keys["amount"] == Decimal("25.50") and e.cdc["transaction"]["id"] == "tx-1"


def test_debezium_variable_scale_decimal():
    value = {"scale": 3, "value": base64.b64encode((12345).to_bytes(2, "big", signed=True)).decode()}
    variable = {"type": "struct", "optional": True, "name": "io.debezium.data.VariableScaleDecimal", "fields": [
        {"type": "int32", "optional": False, "field": "scale"}, {"type": "bytes", "optional": False, "field": "value"}]}
    e = event(parser("debezium", CDC_PATHS), Rec(raw(wrapped(envelope("c", None, {**AFTER, "amount": value}), variable))))
    assert e.keys["amount"] == Decimal("12.345")


def test_debezium_wrapped_tombstone_payload_and_wrapped_string_decimals():
    assert event(parser("debezium"), Rec(raw({"schema": None, "payload": None}))).cdc["op"] == "tombstone"
    e = event(parser("debezium", CDC_PATHS), Rec(raw(wrapped(envelope("u", BEFORE, AFTER), {"type": "string"}))))
    assert e.keys["amount"] == Decimal("25.50") and e.cdc["source"] == SOURCE


@pytest.mark.parametrize("doc, reason, detail", [
    ({"before": None, "after": AFTER, "source": SOURCE}, "missing_path", "no 'op'"),
    (envelope("x", None, AFTER), "wrong_type", "unknown op 'x'"),
    ({**envelope("c", None, AFTER), "source": None}, "missing_path", "no 'source'"),
    (envelope("c", None, None), "missing_path", "no 'after'"),
    (envelope("d", None, None), "missing_path", "no 'before'"),
    (envelope("u", BEFORE, {**AFTER, "amount": "ATg="}), "wrong_type", "decimal.handling.mode=string"),
    (envelope("u", BEFORE, {**AFTER, "trade_no": None}), "missing_path", "trade_no: no value at after path"),
    ("just a string", "wrong_type", "envelope must be a JSON object"),
])
def test_debezium_bad_envelopes_are_quarantined(doc, reason, detail):
    q = quarantined(parser("debezium", CDC_PATHS, ("trade_no",)), Rec(raw(doc)))
    assert q.reason == reason and detail in q.detail


# ---------------------------------------------------------------- canal FlatMessage

MYSQL_TYPES = {"id": "bigint(20)", "trade_no": "varchar(64)", "order_no": "varchar(64)", "status": "varchar(16)",
               "amount": "decimal(10,2)"}
SQL_TYPES = {"id": -5, "trade_no": 12, "order_no": 12, "status": 12, "amount": 3}


def flat(type_: str, data: list[dict] | None, old: list[dict] | None = None, **extra: Any) -> dict[str, Any]:
    return {"data": data, "database": "shop", "es": 1_700_000_000_000, "id": 9, "isDdl": False,
            "mysqlType": MYSQL_TYPES, "old": old, "pkNames": ["id"], "sql": "", "sqlType": SQL_TYPES,
            "table": "payments", "ts": 1_700_000_000_798, "type": type_, **extra}


ROW1 = {"id": "1", "trade_no": "T1", "order_no": "O1", "status": "success", "amount": "10.00"}
ROW2 = {"id": "2", "trade_no": "T2", "order_no": "O2", "status": "success", "amount": "20.50"}


def test_canal_update_of_two_rows_is_one_event_with_rebuilt_before_images():
    msg = flat("UPDATE", [ROW1, ROW2], [{"status": "pending"}, {"status": "pending", "amount": "20.00"}])
    e = event(parser("canal", CDC_PATHS, ("trade_no",)), Rec(raw(msg)))
    assert e.format == "canal" and e.coordinates == "t/1@7" and e.payload == msg
    assert e.keys == {"trade_no": "T1", "order_key": "O1", "status": "success", "amount": Decimal("10.00")}
    rows = e.cdc.pop("rows")
    assert e.cdc == {"op": "update", "snapshot": False, "db": "shop", "table": "payments", "ddl": False,
                     "type": "UPDATE", "sql": "", "pk_names": ["id"], "es": 1_700_000_000_000, "ts": 1_700_000_000_798,
                     "id": 9, "gtid": None, "mysql_types": MYSQL_TYPES, "sql_types": SQL_TYPES}
    assert rows == [
        {"index": 0, "before": {**ROW1, "status": "pending"}, "after": ROW1, "old": {"status": "pending"},
         "pk": {"id": "1"}, "keys": {"trade_no": "T1", "order_key": "O1", "status": "success",
                                     "amount": Decimal("10.00")}},
        {"index": 1, "before": {**ROW2, "status": "pending", "amount": "20.00"}, "after": ROW2,
         "old": {"status": "pending", "amount": "20.00"}, "pk": {"id": "2"},
         "keys": {"trade_no": "T2", "order_key": "O2", "status": "success", "amount": Decimal("20.50")}}]


def test_canal_insert_and_delete():
    p = parser("canal", CDC_PATHS)
    inserted = event(p, Rec(raw(flat("INSERT", [ROW1]))))
    deleted = event(p, Rec(raw(flat("DELETE", [ROW2]))))
    assert [(r["before"], r["after"], r["pk"]) for r in inserted.cdc["rows"]] == [(None, ROW1, {"id": "1"})]
    assert inserted.cdc["op"] == "insert"
    assert [(r["before"], r["after"], r["old"]) for r in deleted.cdc["rows"]] == [(ROW2, None, None)]
    assert deleted.cdc["op"] == "delete" and deleted.keys["trade_no"] == "T2"


def test_canal_ddl_is_an_event_without_rows():
    msg = {"data": None, "database": "shop", "es": 1_700_000_000_000, "id": 10, "isDdl": True, "mysqlType": None,
           "old": None, "pkNames": None, "sql": "ALTER TABLE payments ADD COLUMN note TEXT", "sqlType": None,
           "table": "payments", "ts": 1_700_000_000_100, "type": "ALTER"}
    e = event(parser("canal", CDC_PATHS, ("trade_no",)), Rec(raw(msg)))
    assert (e.cdc["op"], e.cdc["rows"], e.cdc["sql"], e.keys) == ("ddl", [], msg["sql"], {})


@pytest.mark.parametrize("msg, reason, detail", [
    (flat("UPDATE", [ROW1, ROW2], [{"status": "pending"}]), "wrong_type", "'old' has 1 entries for 2 rows"),
    (flat("UPDATE", [ROW1], None), "missing_path", "no 'old'"),
    (flat("INSERT", None), "missing_path", "no 'data'"),
    (flat("INSERT", []), "wrong_type", "non-empty list"),
    (flat("QUERY", [ROW1]), "wrong_type", "neither INSERT, UPDATE nor DELETE"),
    ({k: v for k, v in flat("INSERT", [ROW1]).items() if k != "isDdl"}, "missing_path", "no 'isDdl'"),
    (flat("INSERT", [ROW1], database=5), "wrong_type", "'database' must be str"),
    (flat("INSERT", [ROW1, {**ROW2, "trade_no": None}]), "missing_path", "trade_no: no value at data[1] path"),
])
def test_canal_bad_messages_are_quarantined(msg, reason, detail):
    q = quarantined(parser("canal", CDC_PATHS, ("trade_no",)), Rec(raw(msg)))
    assert q.reason == reason and detail in q.detail


def test_canal_tombstone_is_quarantined():
    assert quarantined(parser("canal"), Rec(None)).reason == "null_value"


# ---------------------------------------------------------------- poison records: quarantined, never raised

def decimal_schema(**column: Any) -> dict[str, Any]:
    return wrapped(envelope("u", BEFORE, AFTER), {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                                                  **column})


@pytest.mark.parametrize("doc, detail", [
    (decimal_schema(parameters={"scale": "two"}), "before.amount has decimal scale 'two', not an integer"),
    (decimal_schema(parameters=["2"]), "before.amount has decimal scale None"),
    ({"schema": {"type": "struct", "fields": ["x"]}, "payload": envelope("u", BEFORE, AFTER)},
     "schema.fields must be a list of objects"),
    ({"schema": {"type": "struct", "fields": [{"field": "after", "fields": 3}]}, "payload": envelope("c", None, AFTER)},
     "after.fields must be a list of objects"),
    ({"schema": {"type": "struct", "fields": [{"field": "after", "fields": [
        {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal"}]}]}, "payload": envelope("c", None, AFTER)},
     "a decimal of after has no 'field' name"),
])
def test_debezium_schemas_found_by_experiment_are_quarantined(doc, detail):
    q = quarantined(parser("debezium", CDC_PATHS), Rec(raw(doc)))
    assert (q.reason, q.offset) == ("wrong_type", 7) and detail in q.detail, q.detail


def test_canal_pk_names_that_are_not_names_are_quarantined():
    q = quarantined(parser("canal", CDC_PATHS), Rec(raw(flat("INSERT", [ROW1], pkNames=[{}]))))
    assert q.reason == "wrong_type" and "'pkNames' must be a list of column names" in q.detail


def test_a_parser_failure_nobody_foresaw_is_quarantined_and_logged(monkeypatch, caplog):
    p = parser("json", PATHS)
    monkeypatch.setattr(p, "_parse_value", lambda rec: {}["boom"])
    q = quarantined(p, Rec(raw({"type": "x"}), offset=41))
    assert (q.reason, q.offset, q.partition) == ("unparseable", 41, 1)
    assert q.detail == "the json parser failed: KeyError: 'boom'"
    failed = [r for r in caplog.records if getattr(r, "event", None) == "kafka_parser_failed"]
    assert failed and failed[0].exc_info and failed[0].offset == 41


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats(allow_nan=False),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                     max_size=4), max_leaves=12)
ROWISH = st.dictionaries(st.sampled_from(["id", "trade_no", "order_no", "amount"]), JSONISH, max_size=4) | JSONISH
DECIMAL_COLUMN = st.fixed_dictionaries(
    {"name": st.sampled_from(["org.apache.kafka.connect.data.Decimal", "io.debezium.data.VariableScaleDecimal"])},
    optional={"field": st.sampled_from(["amount", "id"]) | JSONISH,
              "parameters": st.fixed_dictionaries({"scale": st.sampled_from(["2", 2]) | JSONISH}) | JSONISH})
SCHEMA = st.fixed_dictionaries({"fields": st.lists(st.fixed_dictionaries(
    {"field": st.sampled_from(["before", "after"]), "fields": st.lists(DECIMAL_COLUMN | JSONISH, max_size=2) | JSONISH})
    | JSONISH, max_size=3) | JSONISH}) | JSONISH
DEBEZIUM = st.fixed_dictionaries({"schema": SCHEMA, "payload": st.fixed_dictionaries(
    {"op": st.sampled_from(["c", "u", "d", "r"]) | JSONISH, "source": st.just(SOURCE) | JSONISH,
     "before": ROWISH, "after": ROWISH})}) | JSONISH
CANAL = st.fixed_dictionaries(
    {"isDdl": st.just(False) | JSONISH, "type": st.sampled_from(["INSERT", "UPDATE", "DELETE"]) | JSONISH,
     "database": st.just("shop") | JSONISH, "table": st.just("payments") | JSONISH,
     "data": st.lists(ROWISH, max_size=2) | JSONISH, "old": st.lists(ROWISH, max_size=2) | JSONISH,
     "pkNames": st.lists(st.just("id") | JSONISH, max_size=2) | JSONISH}) | JSONISH
SHAPES = {"json": JSONISH, "debezium": DEBEZIUM, "canal": CANAL}


@settings(max_examples=400, deadline=None)
@given(data=st.data(), fmt=st.sampled_from(sorted(SHAPES)))
def test_no_shape_of_record_makes_a_parser_raise_or_fail(data, fmt):
    """Any JSON document in the envelope's own field names is an event or a quarantined record with
    a reason of the checks themselves: none reaches the catch-all (which would mean a gap in them)."""
    doc = data.draw(SHAPES[fmt])
    out = parser(fmt, CDC_PATHS if fmt != "json" else PATHS).parse(Rec(raw(doc)))
    if isinstance(out, QuarantinedRecord):
        assert out.reason != "unparseable", out.detail


def test_the_size_cap_counts_the_key_and_the_headers_too():
    p = parser("json", PATHS, max_bytes=100)
    big_key = quarantined(p, Rec(raw({"type": "x"}), key=b"k" * 200))
    big_header = quarantined(p, Rec(raw({"type": "x"}), headers=[("h", b"v" * 200)]))
    assert (big_key.reason, big_header.reason) == ("too_large", "too_large")
    assert "value, key and headers" in big_key.detail and big_key.key is None and big_header.headers == ()
    assert isinstance(p.parse(Rec(raw({"type": "x"}), key=b"k" * 10, headers=[("h", b"v")])), EmittedEvent)
