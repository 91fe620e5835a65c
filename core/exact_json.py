"""JSON that keeps a record's values exact, for the store (to_json/from_json) and for input (parse_exact_json).

Decimal money, datetimes with microseconds, dates, bytes travel as one-key tagged objects
({"$decimal": "12.50"}); keys starting with "$" are reserved for the tags. `plain()` gives the
JSON-friendly view people read (exports, pages).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable, Iterable
from decimal import MAX_PREC, Context, Decimal
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

import msgspec

_EVERY_DIGIT = Context(prec=MAX_PREC)


def decimal_shift(value: Decimal, places: int) -> Decimal:
    """`value` times 10**places with every digit kept: Decimal's own `scaleb` rounds to its context's 28
    digits, so a DECIMAL(40,12) lost its last places."""
    return value.scaleb(places, _EVERY_DIGIT)


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"$timedelta": value.total_seconds()}
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"cannot store a value of type {type(value).__name__}")


def _hook(obj: dict[str, Any]) -> Any:
    """Tagged values back to their types. A one-key object whose key is a tag but whose value does
    not parse is left as it is: keys starting with "$" are reserved for the tags (see to_json)."""
    if len(obj) == 1:
        try:
            return _untag(obj)
        except (TypeError, ValueError):
            return obj
    return obj


def _untag(obj: dict[str, Any]) -> Any:
    (tag, raw), = obj.items()
    if tag == "$decimal":
        return Decimal(raw)
    if tag == "$datetime":
        return dt.datetime.fromisoformat(raw)
    if tag == "$date":
        return dt.date.fromisoformat(raw)
    if tag == "$timedelta":
        return dt.timedelta(seconds=raw)
    if tag == "$bytes":
        return base64.b64decode(raw)
    return obj


def _chunker(sort_keys: bool) -> Callable[[Any, int], Iterable[str]]:
    """One encoder for all calls (json.dumps builds a new one per call, which costs more than
    encoding a small record), without circular-reference bookkeeping (a cycle is a RecursionError)."""
    if c_make_encoder is None:  # an interpreter without the C accelerator
        return json.JSONEncoder(default=_default, separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=False,
                                check_circular=False).iterencode
    return c_make_encoder(None, _default, encode_basestring, None, ":", ",", sort_keys, False, True)


_CHUNKERS = {order: _chunker(order) for order in (True, False)}
JSON_DECODER = json.JSONDecoder(object_hook=_hook)  # `from_json`'s; its raw_decode reads a value inside a text


def to_json(value: Any, *, sort_keys: bool = True) -> str:
    """JSON that keeps Decimal, datetime, date, bytes exact (tagged objects). Keys are sorted
    unless the text is only ever parsed back (`sort_keys=False` is cheaper)."""
    return "".join(_CHUNKERS[sort_keys](value, 0))


_FLAT = msgspec.json.Encoder(order="sorted")
_PLAIN = frozenset({str, int, bool, type(None)})
_DATETIME_TAGS: dict[dt.datetime, dict[str, str]] = {}  # a stream's times repeat: a batch is written in one second
_DATETIME_TAGS_KEPT = 4096


def _flat_tag(value: Any) -> Any:
    if type(value) is dt.datetime and value.tzinfo is None:  # an aware time equals others of another text
        tag = _DATETIME_TAGS.get(value)
        if tag is None:
            if len(_DATETIME_TAGS) >= _DATETIME_TAGS_KEPT:
                _DATETIME_TAGS.clear()
            tag = _DATETIME_TAGS[value] = {"$datetime": value.isoformat()}
        return tag
    if isinstance(value, (Decimal, dt.date, bytes, bytearray)):  # tags holding text
        return _default(value)
    raise TypeError("to_json's own path")  # a float, or a tag holding one (a timedelta), is written by repr


def flat_json(value: dict[str, Any] | list[Any] | tuple[Any, ...]) -> str:
    """`to_json(value)`, the same text, for a flat dict or list (a row image, a key) in a third of the time:
    msgspec encodes, and only the tagged values are touched in Python. Anything else (a nested value, a
    float, an int beyond 64 bits) is left to `to_json`."""
    try:
        if type(value) is dict:
            plain: Any = {k: v if type(v) in _PLAIN else _flat_tag(v) for k, v in value.items()}
        else:
            plain = [v if type(v) in _PLAIN else _flat_tag(v) for v in value]
        return _FLAT.encode(plain).decode()
    except (TypeError, OverflowError, msgspec.EncodeError):
        return to_json(value)


def from_json(text: str) -> Any:
    return JSON_DECODER.decode(text)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_EXACT = json.JSONDecoder(parse_float=Decimal, parse_constant=_reject_constant)
_scan_exact = _EXACT.scan_once


def parse_exact_json(text: str) -> Any:
    """Standard JSON as received from outside, every number exact: fractions become Decimal,
    never float, and NaN/Infinity are refused (ValueError). No tags are read: a payload object
    {"$decimal": "1"} stays that object."""
    # Called for every Kafka record: scan a text without surrounding whitespace in one C call;
    # anything else (whitespace, trailing data, no value) takes the full decoder and its errors.
    try:
        value, end = _scan_exact(text, 0)
    except StopIteration:
        end = -1
    return value if end == len(text) else _EXACT.decode(text)


def plain(value: Any) -> Any:
    """A JSON-friendly view for people (exports, pages): Decimal as its exact string, etc."""
    return json.loads(json.dumps(value, default=lambda v: str(v) if not isinstance(v, (bytes, bytearray))
                                 else base64.b64encode(bytes(v)).decode()))
