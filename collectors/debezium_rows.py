"""A Debezium data record's row images as the binlog collector reads them: the same Python values, exactly.

The Debezium MariaDB connector with the JsonConverter's schemas (`schemas.enable=true`) writes each
column in a Connect type named by its schema; this maps each to the value pymysqlreplication gives
for the column (collectors.row_images holds that one to the library):

- DECIMAL (`org.apache.kafka.connect.data.Decimal`: base64 two's complement, the scale in the schema)
  -> Decimal with the column's scale;
- DATETIME (`io.debezium.time.Timestamp` ms, `MicroTimestamp` us, `NanoTimestamp`) -> naive datetime;
  TIMESTAMP (`ZonedTimestamp`, ISO in UTC) -> naive datetime in UTC; DATE (`Date`, days) -> date;
  TIME (`MicroTime` us, `Time` ms, `NanoTime`) -> timedelta; YEAR (`Year`) -> int;
- ENUM -> str, SET (`EnumSet`) -> set of str (None when empty), BIT (`Bits`, little-endian bytes) ->
  the library's '0'/'1' text, BIT(1) (a boolean) -> '1' or '0'; JSON -> its text;
- unnamed ints, floats and strings as they are, unnamed bytes from base64.

Anything else (a geometry, a type a newer connector adds, a DECIMAL without its schema) cannot be
read exactly: `Undecodable` names the column and its type, and the caller quarantines the record
rather than pass a value on as text. Two connector settings are needed because nothing in a record
says they are off: `decimal.handling.mode=precise` (its default; `string` and `double` make a DECIMAL
an unnamed string or a float), and `bigint.unsigned.handling.mode=precise` (an int64 reads 2**64-1
as -1); BIGINT UNSIGNED then reads as a Decimal of scale 0.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from oncewatch.core.exact_json import decimal_shift

Decode = Callable[[Any], Any]

EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"


class Undecodable(ValueError):
    """A column of a Debezium record that cannot be read back exactly."""


def _bytes(value: Any) -> bytes:
    return base64.b64decode(value, validate=True)


def _decimal(scale: int) -> Decode:
    def decode(value: Any) -> Decimal:
        return decimal_shift(Decimal(int.from_bytes(_bytes(value), "big", signed=True)), -scale)
    return decode


def _zoned(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value).astimezone(dt.timezone.utc).replace(tzinfo=None)


def _enum_set(value: str) -> set[str] | None:
    return set(value.split(",")) if value else None


def _bits(length: int) -> Decode:
    def decode(value: Any) -> str:
        return format(int.from_bytes(_bytes(value), "little"), f"0{length}b")[-length:]
    return decode


MEMO = 4096  # values a memoized decoder keeps before it starts afresh


def _memo(decode: Decode) -> Decode:
    """`decode` with what it gave kept by its input: a stream's times and prices repeat (a batch written in one
    millisecond, the same amounts), and the values are immutable, so one may be handed out many times."""
    seen: dict[Any, Any] = {}

    def memo(value: Any) -> Any:
        out = seen.get(value)
        if out is None:
            if len(seen) >= MEMO:
                seen.clear()
            out = seen[value] = decode(value)
        return out
    return memo


_NAMED: dict[str, Callable[[dict[str, Any]], Decode]] = {
    "io.debezium.time.Timestamp": lambda f: _memo(lambda v: EPOCH + dt.timedelta(milliseconds=v)),
    "io.debezium.time.MicroTimestamp": lambda f: _memo(lambda v: EPOCH + dt.timedelta(microseconds=v)),
    "io.debezium.time.NanoTimestamp": lambda f: _memo(lambda v: EPOCH + dt.timedelta(microseconds=v // 1000)),
    "io.debezium.time.ZonedTimestamp": lambda f: _memo(_zoned),
    "io.debezium.time.Date": lambda f: _memo(lambda v: EPOCH_DATE + dt.timedelta(days=v)),
    "io.debezium.time.MicroTime": lambda f: lambda v: dt.timedelta(microseconds=v),
    "io.debezium.time.Time": lambda f: lambda v: dt.timedelta(milliseconds=v),
    "io.debezium.time.NanoTime": lambda f: lambda v: dt.timedelta(microseconds=v // 1000),
    "io.debezium.time.Year": lambda f: int,
    "io.debezium.data.Json": lambda f: str,
    "io.debezium.data.Enum": lambda f: str,
    "io.debezium.data.EnumSet": lambda f: _enum_set,
    "io.debezium.data.Bits": lambda f: _bits(int((f.get("parameters") or {}).get("length", 1))),
    CONNECT_DECIMAL: lambda f: _memo(_decimal(int((f.get("parameters") or {}).get("scale", 0)))),
}
# `int` and `str` here are not called: `image` takes a JSON integer or string as it is, once its type is checked
_PLAIN: dict[str, Decode] = {
    "int8": int, "int16": int, "int32": int, "int64": int, "float": float, "double": float, "string": str,
    "bytes": _bytes, "boolean": lambda v: "1" if v else "0",  # BIT(1)
}


def column_decoders(fields: list[dict[str, Any]]) -> dict[str, Decode]:
    """Per column of a row image's struct schema (`before`/`after`), how to read its values; Undecodable for
    a column no decoder reads exactly."""
    out: dict[str, Decode] = {}
    for f in fields:
        name, kind, semantic = f.get("field"), f.get("type"), f.get("name")
        if semantic is not None:
            if semantic not in _NAMED:
                raise Undecodable(f"column {name}: Debezium type {semantic} is not read exactly by oncewatch")
            out[name] = _NAMED[semantic](f)
        elif kind in _PLAIN:
            out[name] = _PLAIN[kind]
        else:
            raise Undecodable(f"column {name}: Connect type {kind!r} is not read exactly by oncewatch")
    return out


def image(row: dict[str, Any] | None, decoders: dict[str, Decode]) -> dict[str, Any] | None:
    """A row image with every value read; Undecodable names the column whose value does not fit its type."""
    if row is None:
        return None
    out = {}
    for column, value in row.items():
        decode = decoders.get(column)
        if value is None or ((decode is str or decode is int) and value.__class__ is decode):
            out[column] = value  # nearly every value: nothing to convert (a call per value cost a fifth of a record)
            continue
        if decode is None:
            raise Undecodable(f"column {column}: not in the record's schema")
        try:
            out[column] = decode(value)
        except (binascii.Error, InvalidOperation, OverflowError, TypeError, ValueError) as exc:
            raise Undecodable(f"column {column}: {str(value)[:40]!r} does not read as its type ({exc})") from None
    return out


def image_schema(envelope_schema: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The fields of the `after` (else `before`) struct of a value schema; Undecodable without one."""
    if not isinstance(envelope_schema, dict):
        raise Undecodable("the record carries no schema: the connector's JsonConverter needs schemas.enable=true "
                          "for oncewatch to read its columns exactly")
    for part in ("after", "before"):
        for f in envelope_schema.get("fields") or []:
            if isinstance(f, dict) and f.get("field") == part and isinstance(f.get("fields"), list):
                return f["fields"]
    raise Undecodable("the record's schema has no before/after struct")


def key_columns(key_schema: dict[str, Any] | None) -> list[str]:
    """The primary key's columns in their order, from the record key's schema ([] for a table without one)."""
    if not isinstance(key_schema, dict):
        return []
    return [f["field"] for f in key_schema.get("fields") or [] if isinstance(f, dict) and "field" in f]
