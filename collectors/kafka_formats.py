"""Turns one raw Kafka record into an `EmittedEvent` or a `QuarantinedRecord`; no I/O.

One `TopicParser` per configured topic, chosen by its `format`:

- `json`: an application event. `TopicConfig.paths` maps logical keys (event_type, trade_no,
  order_key, effect_id, amount, status) to dotted payload paths (`a.b.0.c`: list items by index);
  the values found go into `EmittedEvent.keys`. Numbers are parsed exactly (`Decimal`), so an
  amount never passes through a float.
- `debezium`: Debezium's change-event envelope, with or without the JsonConverter's
  `schema`/`payload` wrapper. `cdc` holds `op` (c/u/d/r/t/m mapped to insert/update/delete/read/
  truncate/message), `snapshot`, `db`, `table`, `before`, `after`, `pk` (the record key's payload),
  the whole `source` (file, pos, gtid, row, ts_ms, ...), the envelope `ts_ms` and `transaction`.
  With the schema wrapper, precise decimals (`org.apache.kafka.connect.data.Decimal`, base64 bytes)
  are decoded to `Decimal`. A tombstone (null value after a delete) is an event, not an error: it
  is what Debezium documents, and it carries the deleted row's key; its `cdc.op` is "tombstone".
- `canal`: Canal's FlatMessage. One Kafka record may carry several rows of one statement; it stays
  ONE `EmittedEvent` (the store keys events by topic/partition/offset, and one record is one
  delivery) whose `cdc["rows"]` lists every row as {index, before, after, old, pk, keys}. Canal's
  `old` holds only the changed columns, so `before` is rebuilt as data[i] overlaid with old[i].
  A row is addressed as `<event coordinates>#<index>`; `keys` mirrors row 0 for the common
  one-row case. DDL records (`isDdl`) become events with op "ddl" and no rows.

For CDC topics the configured paths are looked up in each row image (after, or before for a
delete). Anything that does not fit is quarantined with a short reason code (REASONS) and a
detail that says what was wrong, never raised.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

import msgspec

from oncewatch.core.config import TopicConfig
from oncewatch.core.domain import in_unit
from oncewatch.core.exact_json import decimal_shift, parse_exact_json, to_json
from oncewatch.core.names import (MISSING_PATH, NOT_JSON, NOT_UTF8, NULL_VALUE, QUARANTINE_REASONS, TOO_LARGE,
                                  UNPARSEABLE, WRONG_TYPE)
from oncewatch.core.paths import compile_path, lookup
from oncewatch.core.records import OP_DELETE, OP_INSERT, OP_UPDATE, EmittedEvent, QuarantinedRecord

log = logging.getLogger("oncewatch.collectors.kafka_formats")

REASONS = QUARANTINE_REASONS

OP_READ = "read"
OP_TRUNCATE = "truncate"
OP_MESSAGE = "message"
OP_TOMBSTONE = "tombstone"
OP_DDL = "ddl"

DEBEZIUM_OPS = {"c": OP_INSERT, "u": OP_UPDATE, "d": OP_DELETE, "r": OP_READ, "t": OP_TRUNCATE, "m": OP_MESSAGE}
CANAL_OPS = {"INSERT": OP_INSERT, "UPDATE": OP_UPDATE, "DELETE": OP_DELETE}
TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}
PREVIEW_BYTES = 160
CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"


class RawRecord(Protocol):
    """What the parser reads of a record: kafka-python's ConsumerRecord has these attributes."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]


class Rejected(Exception):
    """A record does not fit its topic's format; becomes a QuarantinedRecord."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# msgspec's compiled decoder reads a record's bytes, checking their UTF-8, in about a third of the
# time of the stdlib's scanner. It gives the same document: its float_hook sees each fraction's
# own text, so a Decimal comes out exactly as `parse_exact_json` makes it, and integers of any size
# stay exact. It refuses NaN and Infinity as `parse_exact_json` does.
_FAST_JSON = msgspec.json.Decoder(float_hook=Decimal)


def decode_json(data: bytes) -> tuple[Any, str]:
    """The document (numbers exact, see `parse_exact_json`) and the text it was parsed from."""
    try:
        return _FAST_JSON.decode(data), data.decode("utf-8")
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        pass  # the stdlib decides what msgspec refuses: its result, or a specific reason
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejected(NOT_UTF8, f"invalid UTF-8 at byte {exc.start}") from None
    try:
        doc = parse_exact_json(text)
    except ValueError as exc:
        raise Rejected(NOT_JSON, str(exc)[:200]) from None
    except RecursionError:
        raise Rejected(NOT_JSON, "nested too deeply to read (thousands of levels of arrays or objects)") from None
    try:
        to_json(doc).encode("utf-8")
    except UnicodeEncodeError as exc:
        # JSON's grammar lets "\ud800" through, but half a UTF-16 pair is no character: the store
        # (UTF-8 text) could not keep the document, so the record waits in quarantine instead.
        raise Rejected(NOT_UTF8, f"a \\u{ord(exc.object[exc.start]):04x} escape is half of a UTF-16 surrogate "
                                 f"pair, not a character") from None
    return doc, text


def preview(data: bytes | None) -> str:
    """The first bytes as printable text: control characters and bad UTF-8 escaped."""
    if not data:
        return ""
    text = data[:PREVIEW_BYTES].decode("utf-8", "backslashreplace")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)


# ---------------------------------------------------------------- key extraction

def _identifier(value: Any) -> Any:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return value
    raise TypeError("expected a string or an integer")


def _text(value: Any) -> str:
    if isinstance(value, str) and value:
        return value
    raise TypeError("expected a non-empty string")


def _amount(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, str, Decimal)):
        raise TypeError("expected a decimal number or a numeric string")
    try:
        amount = Decimal(value.strip()) if isinstance(value, str) else Decimal(value)
    except InvalidOperation:
        raise TypeError("expected a decimal number or a numeric string") from None
    if not amount.is_finite():
        raise TypeError("expected a finite number")
    return amount


# How each logical key must look: the types a value is kept as, as it is, and the converter of
# any other value (TypeError when it does not fit). Ids keep their JSON type (matching normalises
# both sides).
_ID = (frozenset({str, int}), _identifier)
KEY_TYPES: dict[str, tuple[frozenset[type], Callable[[Any], Any]]] = {
    "event_type": (frozenset(), _text), "trade_no": _ID, "order_key": _ID, "effect_id": _ID,
    "amount": (frozenset(), _amount), "status": _ID,
}


@dataclass(frozen=True)
class KeyExtractor:
    """Pulls the configured keys out of a document (a JSON payload or a CDC row image)."""

    # (key, dotted path, compiled path, the path's one dict key if it is one, *KEY_TYPES[key])
    paths: tuple[tuple[str, str, tuple[str | int, ...], str | None, frozenset[type], Callable[[Any], Any]], ...]
    required: frozenset[str]
    # a composite key: (key, its dotted paths, their compiled paths); its value is the tuple of its parts
    composites: tuple[tuple[str, tuple[str, ...], tuple[tuple[str | int, ...], ...]], ...] = ()

    @classmethod
    def of(cls, topic: TopicConfig) -> KeyExtractor:
        paths, composites = [], []
        for k, p in topic.paths.items():
            if not isinstance(p, str):
                composites.append((k, p, tuple(map(compile_path, p))))
                continue
            compiled = compile_path(p)
            top = compiled[0] if len(compiled) == 1 and isinstance(compiled[0], str) else None
            kept, convert = KEY_TYPES[k]
            if k == "amount" and topic.amount_scale != 1:
                scale = topic.amount_scale
                convert = lambda value, unscaled=convert: in_unit(unscaled(value), scale)  # noqa: E731
            paths.append((k, p, compiled, top, kept, convert))
        return cls(tuple(paths), frozenset(topic.required), tuple(composites))

    def extract(self, doc: Any, where: str = "payload") -> dict[str, Any]:
        # Runs for every record: a top-level path is one dict lookup, and a value of a type kept
        # as it is needs no converter call.
        keys: dict[str, Any] = {}
        is_dict = isinstance(doc, dict)
        for name, dotted, path, top, kept, convert in self.paths:
            value = doc.get(top) if is_dict and top is not None else lookup(doc, path)
            if value is None:
                if name in self.required:
                    raise Rejected(MISSING_PATH, f"{name}: no value at {where} path {dotted!r}")
                continue
            if type(value) in kept:
                keys[name] = value
                continue
            try:
                keys[name] = convert(value)
            except TypeError as exc:
                hint = (" (Debezium's precise decimals need the schema wrapper, or set the connector's "
                        "decimal.handling.mode=string)") if name == "amount" and isinstance(value, str) else ""
                raise Rejected(WRONG_TYPE, f"{name}: {exc} at {where} path {dotted!r}, got "
                                           f"{_short(value)}{hint}") from None
        for name, dotted_parts, parts in self.composites:
            values = tuple(lookup(doc, path) for path in parts)
            if None in values:
                if name in self.required:
                    missing = dotted_parts[values.index(None)]
                    raise Rejected(MISSING_PATH, f"{name}: no value at {where} path {missing!r} (a part of the key)")
                continue
            for dotted, value in zip(dotted_parts, values):
                if isinstance(value, bool) or not isinstance(value, (str, int)):
                    raise Rejected(WRONG_TYPE, f"{name}: expected a string or an integer at {where} path {dotted!r} "
                                               f"(a part of the key), got {_short(value)}")
            keys[name] = values
        return keys


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------- formats

def _require(doc: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str,
             optional: bool = False) -> Any:
    value = doc.get(name)
    if value is None:
        if optional:
            return None
        raise Rejected(MISSING_PATH, f"{what}: no {name!r}")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise Rejected(WRONG_TYPE, f"{what}: {name!r} must be {names}, got {_short(value)}")
    return value


def _unwrap(doc: Any) -> tuple[Any, dict[str, Any] | None]:
    """The JsonConverter's {"schema": ..., "payload": ...} wrapper, if there is one."""
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc and len(doc) == 2:
        schema = doc["schema"] if isinstance(doc["schema"], dict) else None
        return doc["payload"], schema
    return doc, None


def _schema_fields(node: dict[str, Any], where: str) -> list[dict[str, Any]]:
    fields = node.get("fields") or []
    if not isinstance(fields, list) or not all(isinstance(f, dict) for f in fields):
        raise Rejected(WRONG_TYPE, f"debezium schema: {where}.fields must be a list of objects, got {_short(fields)}")
    return fields


def _decimal_columns(schema: dict[str, Any] | None, field_name: str) -> dict[str, Any]:
    """Columns of `before`/`after` holding Connect decimals: {column: scale, or None for variable}."""
    if not schema:
        return {}
    for f in _schema_fields(schema, "schema"):
        if f.get("field") == field_name:
            out = {}
            for col in _schema_fields(f, field_name):
                if col.get("name") not in (CONNECT_DECIMAL, VARIABLE_SCALE_DECIMAL):
                    continue
                name = col.get("field")
                if not isinstance(name, str):
                    raise Rejected(WRONG_TYPE, f"debezium schema: a decimal of {field_name} has no 'field' name")
                if col["name"] == VARIABLE_SCALE_DECIMAL:
                    out[name] = None
                    continue
                parameters = col.get("parameters") or {}
                scale = parameters.get("scale", 0) if isinstance(parameters, dict) else None
                try:
                    out[name] = int(scale)  # Connect writes parameters as strings: "2"
                except (TypeError, ValueError):
                    raise Rejected(WRONG_TYPE, f"debezium schema: {field_name}.{name} has decimal scale "
                                               f"{_short(scale)}, not an integer") from None
            return out
    return {}


def _connect_decimal(encoded: str, scale: int) -> Decimal:
    unscaled = int.from_bytes(base64.b64decode(encoded, validate=True), "big", signed=True)
    return decimal_shift(Decimal(unscaled), -scale)


def _decode_decimals(row: dict[str, Any] | None, columns: dict[str, Any], where: str) -> dict[str, Any] | None:
    if not row or not columns:
        return row
    out = dict(row)
    for col, scale in columns.items():
        value = out.get(col)
        try:
            if scale is not None and isinstance(value, str):
                out[col] = _connect_decimal(value, scale)
            elif scale is None and isinstance(value, dict):
                out[col] = _connect_decimal(value["value"], int(value["scale"]))
        except (binascii.Error, KeyError, TypeError, ValueError):
            raise Rejected(WRONG_TYPE, f"{where}.{col}: not a Connect decimal ({_short(value)})") from None
    return out


def record_size(rec: RawRecord) -> int:
    """What a record asks the monitor to hold: its value, key and headers (an 8 MB key counts too)."""
    size = len(rec.value or b"") + len(rec.key or b"")
    for k, v in rec.headers or ():
        size += len(k) + len(v or b"")
    return size


class TopicParser:
    """Parses the records of one configured topic; `parse` never raises for bad input."""

    def __init__(self, topic: TopicConfig, max_record_bytes: int):
        self.topic = topic
        self.max_record_bytes = max_record_bytes
        self.keys = KeyExtractor.of(topic)
        self.format = topic.format
        self._parse_value = {"json": self._json, "debezium": self._debezium, "canal": self._canal}[topic.format]

    def parse(self, rec: RawRecord) -> EmittedEvent | QuarantinedRecord:
        try:
            size = record_size(rec)
            if size > self.max_record_bytes:
                raise Rejected(TOO_LARGE, f"{size} bytes of value, key and headers, more than "
                                          f"kafka.max_record_bytes = {self.max_record_bytes}")
            payload, keys, cdc, text = self._parse_value(rec)
        except Rejected as exc:
            return self.quarantined(rec, exc.reason, exc.detail)
        except Exception as exc:  # noqa: BLE001 - one record the parser did not foresee must not stop the stream
            # A gap in the checks above (a bug to report), not the producer's fault alone: loud, with
            # the traceback, and the record kept aside like any other so the stream goes on.
            log.exception("kafka record broke the parser", extra={
                "event": "kafka_parser_failed", "topic": rec.topic, "partition": rec.partition, "offset": rec.offset})
            return self.quarantined(rec, UNPARSEABLE, f"the {self.format} parser failed: {type(exc).__name__}: "
                                                      f"{str(exc)[:200]}")
        key, headers = rec.key, rec.headers
        if headers:
            headers = tuple((k, "" if v is None else v.decode("utf-8", "backslashreplace")) for k, v in headers)
        # Positional, in EmittedEvent's field order: keyword binding costs a tenth of parsing a record.
        return EmittedEvent(
            rec.topic, rec.partition, rec.offset, rec.timestamp,
            TIMESTAMP_TYPES.get(rec.timestamp_type, "NoTimestampType"),
            None if key is None else key.decode("utf-8", "backslashreplace"),
            headers or (), payload, self.format, keys, cdc, text)

    @staticmethod
    def quarantined(rec: RawRecord, reason: str, detail: str) -> QuarantinedRecord:
        """The record kept aside as it came, with why (a too_large one without its value)."""
        value = rec.value
        too_large = reason == TOO_LARGE  # its bytes stay on the broker: holding them is what the cap prevents
        return QuarantinedRecord(topic=rec.topic, partition=rec.partition, offset=rec.offset,
                                 timestamp_ms=rec.timestamp, reason=reason, detail=detail,
                                 size=len(value) if value is not None else 0, preview=preview(value),
                                 key=None if too_large else rec.key, value=None if too_large else value,
                                 headers=() if too_large else tuple(rec.headers or ()),
                                 timestamp_type=TIMESTAMP_TYPES.get(rec.timestamp_type, "NoTimestampType"))

    # ------------------------------------------------------------ json

    # Each format returns (payload, keys, cdc, the payload's JSON text if it is exactly the payload).

    def _json(self, rec: RawRecord) -> tuple[Any, dict[str, Any], None, str]:
        if rec.value is None:
            raise Rejected(NULL_VALUE, "the record has no value (a tombstone) on a json topic")
        payload, text = decode_json(rec.value)
        if self.keys.paths and not isinstance(payload, dict):
            raise Rejected(WRONG_TYPE, f"payload must be a JSON object, got {type(payload).__name__}")
        return payload, self.keys.extract(payload), None, text

    # ------------------------------------------------------------ debezium

    def _record_key(self, rec: RawRecord) -> Any:
        """The Debezium record key's payload (the primary key), or None when it is not JSON."""
        if rec.key is None:
            return None
        try:
            return _unwrap(decode_json(rec.key)[0])[0]
        except Rejected:
            return None

    def _debezium(self, rec: RawRecord) -> tuple[Any, dict[str, Any], dict[str, Any], str | None]:
        pk = self._record_key(rec)
        doc, text = decode_json(rec.value) if rec.value is not None else (None, None)
        envelope, schema = _unwrap(doc)
        if envelope is None:  # a tombstone has no source block: its table is the topic's, <prefix>.<db>.<table>
            parts = rec.topic.split(".")
            db, table = (parts[-2], parts[-1]) if len(parts) >= 3 else (None, None)
            return None, {}, {"op": OP_TOMBSTONE, "snapshot": False, "db": db, "table": table, "before": None,
                              "after": None, "pk": pk, "source": None, "ts_ms": None, "transaction": None}, None
        if not isinstance(envelope, dict):
            raise Rejected(WRONG_TYPE, f"debezium envelope must be a JSON object, got {type(envelope).__name__}")
        raw_op = _require(envelope, "op", str, "debezium envelope")
        if raw_op not in DEBEZIUM_OPS:
            raise Rejected(WRONG_TYPE, f"debezium envelope: unknown op {raw_op!r} (expected c, u, d, r, t or m)")
        op = DEBEZIUM_OPS[raw_op]
        source = _require(envelope, "source", dict, "debezium envelope")
        before = _require(envelope, "before", dict, "debezium envelope", optional=op != OP_DELETE)
        after = _require(envelope, "after", dict, "debezium envelope",
                         optional=op not in (OP_INSERT, OP_UPDATE, OP_READ))
        before = _decode_decimals(before, _decimal_columns(schema, "before"), "before")
        after = _decode_decimals(after, _decimal_columns(schema, "after"), "after")
        image = after if after is not None else before
        keys = self.keys.extract(image, "after" if after is not None else "before") if image is not None else {}
        cdc = {"op": op, "snapshot": raw_op == "r", "db": source.get("db"), "table": source.get("table"),
               "before": before, "after": after, "pk": pk, "source": source, "ts_ms": envelope.get("ts_ms"),
               "transaction": envelope.get("transaction")}
        return envelope, keys, cdc, text if envelope is doc else None

    # ------------------------------------------------------------ canal

    def _canal(self, rec: RawRecord) -> tuple[Any, dict[str, Any], dict[str, Any], str]:
        if rec.value is None:
            raise Rejected(NULL_VALUE, "the record has no value (a tombstone) on a canal topic")
        msg, text = decode_json(rec.value)
        if not isinstance(msg, dict):
            raise Rejected(WRONG_TYPE, f"canal FlatMessage must be a JSON object, got {type(msg).__name__}")
        what = "canal FlatMessage"
        is_ddl = _require(msg, "isDdl", bool, what)
        raw_type = _require(msg, "type", str, what)
        database = _require(msg, "database", str, what)
        table = _require(msg, "table", str, what, optional=is_ddl)
        pk_names = _require(msg, "pkNames", list, what, optional=True) or []
        if not all(isinstance(n, str) for n in pk_names):
            raise Rejected(WRONG_TYPE, f"{what}: 'pkNames' must be a list of column names, got {_short(pk_names)}")
        cdc = {"op": OP_DDL if is_ddl else CANAL_OPS.get(raw_type), "snapshot": False, "db": database,
               "table": table, "ddl": is_ddl, "type": raw_type, "sql": msg.get("sql"), "pk_names": pk_names,
               "es": msg.get("es"), "ts": msg.get("ts"), "id": msg.get("id"), "gtid": msg.get("gtid"),
               "mysql_types": msg.get("mysqlType"), "sql_types": msg.get("sqlType"), "rows": []}
        if is_ddl:
            return msg, {}, cdc, text
        if cdc["op"] is None:
            raise Rejected(WRONG_TYPE, f"{what}: type {raw_type!r} is neither INSERT, UPDATE nor DELETE "
                                       f"and isDdl is false")
        data = _require(msg, "data", list, what)
        if not data or not all(isinstance(r, dict) for r in data):
            raise Rejected(WRONG_TYPE, f"{what}: 'data' must be a non-empty list of row objects")
        old: list[Any] = []
        if cdc["op"] == OP_UPDATE:
            old = _require(msg, "old", list, what)
            if len(old) != len(data) or not all(isinstance(r, dict) for r in old):
                raise Rejected(WRONG_TYPE, f"{what}: 'old' has {len(old)} entries for {len(data)} rows; "
                                           f"cannot tell which old values belong to which row")
        cdc["rows"] = [self._canal_row(i, row, old[i] if old else None, cdc["op"], pk_names)
                       for i, row in enumerate(data)]
        return msg, cdc["rows"][0]["keys"], cdc, text

    def _canal_row(self, index: int, row: dict[str, Any], old: dict[str, Any] | None, op: str,
                   pk_names: list[str]) -> dict[str, Any]:
        if op == OP_DELETE:
            before, after = row, None
        elif op == OP_UPDATE:
            before, after = {**row, **(old or {})}, row
        else:
            before, after = None, row
        return {"index": index, "before": before, "after": after, "old": old,
                "pk": {n: row.get(n) for n in pk_names},
                "keys": self.keys.extract(row, f"data[{index}]")}


__all__ = ["TopicParser", "RawRecord", "Rejected", "KeyExtractor", "REASONS", "decode_json", "preview",
           "NOT_UTF8", "NOT_JSON", "NULL_VALUE", "MISSING_PATH", "WRONG_TYPE", "TOO_LARGE",
           "OP_READ", "OP_TRUNCATE", "OP_MESSAGE", "OP_TOMBSTONE", "OP_DDL"]
