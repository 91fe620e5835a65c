"""The plain records that flow through oncewatch (DESIGN §3).

Collectors produce `RowChange`, `EmittedEvent`, `QuarantinedRecord` and offset snapshots;
checks turn them into `Finding`s. Values inside rows keep their exact Python types
(Decimal money, datetime with milliseconds, None); `to_json`/`from_json` round-trip them
through the store without losing precision.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

# Which clock gave a commit time (DESIGN §6), best first.
CLOCK_GTID_COMMIT_TS = "gtid_commit_ts"
CLOCK_ROW_COLUMN = "row_column"
CLOCK_BINLOG_HEADER = "binlog_header"
CLOCK_READ_TIME = "read_time"

OP_INSERT = "insert"
OP_UPDATE = "update"
OP_DELETE = "delete"


@dataclass(frozen=True)
class BinlogPosition:
    """Where a fully handled transaction ended: the resume point of the binlog collector.

    `gtid` is MariaDB's `@@gtid_binlog_pos` style set ("0-1-123"); `file`/`pos` are the
    binlog coordinates of the end of the same transaction, kept for evidence and display.
    """

    gtid: str
    file: str = ""
    pos: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"gtid": self.gtid, "file": self.file, "pos": self.pos}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BinlogPosition:
        return cls(gtid=str(d["gtid"]), file=str(d.get("file", "")), pos=int(d.get("pos", 0)))


@dataclass(frozen=True)
class RowChange:
    """One row of one committed transaction."""

    schema: str
    table: str
    op: str
    pk: tuple[Any, ...]
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    txid: str
    row_index: int
    binlog_file: str
    end_pos: int
    commit_time: float
    commit_clock: str
    snapshot: bool = False

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def row(self) -> dict[str, Any]:
        """The row as it is after the change (before, for a delete)."""
        return self.after if self.after is not None else (self.before or {})

    @property
    def coordinates(self) -> str:
        return f"{self.binlog_file}:{self.end_pos}#{self.txid}/{self.row_index}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema, "table": self.table, "op": self.op, "pk": list(self.pk),
            "before": self.before, "after": self.after, "txid": self.txid,
            "row_index": self.row_index, "binlog_file": self.binlog_file, "end_pos": self.end_pos,
            "commit_time": self.commit_time, "commit_clock": self.commit_clock,
            "snapshot": self.snapshot,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RowChange:
        return cls(**{**d, "pk": tuple(d["pk"])})


@dataclass(frozen=True)
class Transaction:
    """The rows of one committed transaction and the position right after its commit."""

    rows: tuple[RowChange, ...]
    position: BinlogPosition
    commit_time: float


@dataclass(frozen=True, init=False)
class EmittedEvent:
    """One Kafka record, parsed, with the entity keys extracted through the config.

    For CDC formats (`debezium`, `canal`) `cdc` holds the change the record describes:
    op, before, after, source coordinates (db, table, file, pos, gtid, row, ts_ms).
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    timestamp_type: str
    key: str | None
    headers: tuple[tuple[str, str], ...]
    payload: Any
    format: str
    keys: dict[str, Any] = field(default_factory=dict)  # an empty dict when given None
    cdc: dict[str, Any] | None = None
    # The JSON text the payload was parsed from, set only where `payload` is exactly
    # `parse_exact_json(payload_json)`: the store keeps this text instead of encoding the payload
    # again (most of the cost of storing an event). Not part of the event's value.
    payload_json: str | None = field(default=None, compare=False, repr=False)

    def __init__(self, topic: str, partition: int, offset: int, timestamp_ms: int, timestamp_type: str,
                 key: str | None, headers: tuple[tuple[str, str], ...], payload: Any, format: str,
                 keys: dict[str, Any] | None = None, cdc: dict[str, Any] | None = None,
                 payload_json: str | None = None):
        # One per Kafka record read: setting the whole instance dict at once costs half of the
        # generated frozen __init__, which calls object.__setattr__ once per field.
        object.__setattr__(self, "__dict__", {
            "topic": topic, "partition": partition, "offset": offset, "timestamp_ms": timestamp_ms,
            "timestamp_type": timestamp_type, "key": key, "headers": headers, "payload": payload, "format": format,
            "keys": {} if keys is None else keys, "cdc": cdc, "payload_json": payload_json})

    @property
    def coordinates(self) -> str:
        return f"{self.topic}/{self.partition}@{self.offset}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic, "partition": self.partition, "offset": self.offset,
            "timestamp_ms": self.timestamp_ms, "timestamp_type": self.timestamp_type,
            "key": self.key, "headers": [list(h) for h in self.headers], "payload": self.payload,
            "format": self.format, "keys": self.keys, "cdc": self.cdc,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EmittedEvent:
        return cls(**{**d, "headers": tuple(tuple(h) for h in d["headers"])})


@dataclass(frozen=True)
class QuarantinedRecord:
    """A Kafka record that could not be parsed: kept with its reason, never dropped."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    reason: str
    detail: str
    size: int
    preview: str


@dataclass(frozen=True)
class Evidence:
    """One fact behind a finding: a row change, an event or an offset reading."""

    kind: str  # "row_change" | "event" | "offsets"
    coordinates: str
    time: float
    values: dict[str, Any]


@dataclass(frozen=True)
class Finding:
    id: str
    rule: str
    name: str
    severity: str
    keys: dict[str, Any]
    summary: str
    first_seen: float
    last_seen: float
    evidence: tuple[Evidence, ...]
    status: str = "open"
    resolved_at: float | None = None
    resolution: str | None = None


# ---------------------------------------------------------------- exact JSON

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
