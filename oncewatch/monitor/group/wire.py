"""What travels on the internal topic: a shard's part of a transaction, an event, a clock mark.

Each message names its source (`"cdc"` for the change source, "topic/partition" for an event partition) and its
place in it (`seq`), so that a judge applies each source's messages once, in order, whatever a router replays
after it restarts or loses its sources to another instance: a judge keeps, per source, the highest `seq` applied
(checks nothing else: a router writes one source's messages in its order).

The wire is msgpack (msgspec), each message a positional array: records are built from tuples in one C call
instead of a dict per field in exact JSON (issue 44: the group spent three times the lone monitor's CPU per
record, mostly publishing every record again). Values msgpack has no type for (Decimal money, datetimes, dates,
times, durations, sets) travel as msgpack extensions and come back as they left. An event's payload travels as the
JSON text it was read from (`EmittedEvent.payload_json`) when it has it: the router forwards the bytes it read
instead of encoding the parsed payload again, and the judge's store keeps that text as it is.

Messages travel in batches, one record of the internal topic holding those a router wrote to one shard since the
last (`Batch`, `decode`): Kafka's cost is per record, far above a message's. A record starts with WIRE_VERSION, so
that an instance of another version says so instead of misreading it.

- `Part`: a shard's part of a transaction (checks.shards.Router.split) and the watch start, if it set it; `seq`
  counts the change source's transactions (the router's, carried in its checkpoint).
- `Event`: an event, `seq` its offset.
- `Mark`: a source vouches that every message it has written is stamped before `at` (a router's clock: the newest
  commit handed on, or now when read to the end; an event partition's kafka_watermark), with `partitions` the
  number of partitions of its topic, so a judge knows when every source of its Kafka clock has spoken.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Callable
from dataclasses import astuple, dataclass
from decimal import Decimal
from typing import Any

import msgspec

from oncewatch.core.exact_json import parse_exact_json
from oncewatch.core.records import (BinlogPosition, CdcDelivery, EmittedEvent, QuarantinedRows, Replay, RowChange,
                                    SchemaChange, Transaction)

CDC_SOURCE = "cdc"
WIRE_VERSION = 2  # 1: exact JSON, a dict per message (before issue 44)
_PART, _EVENT, _MARK = 0, 1, 2
_DECIMAL, _DATETIME, _DATE, _TIME, _TIMEDELTA, _SET, _FROZENSET = range(1, 8)


class WireError(ValueError):
    """A message on the internal topic that this version cannot read."""


@dataclass(frozen=True)
class Part:
    seq: int
    tx: Transaction
    watch_start: float | None = None
    source: str = CDC_SOURCE


@dataclass(frozen=True)
class Event:
    source: str
    seq: int
    event: EmittedEvent


@dataclass(frozen=True)
class Mark:
    source: str
    seq: int
    at: float
    partitions: int = 1


Message = Part | Event | Mark

# ------------------------------------------------------------------ values msgpack has no type for

_NATIVE = frozenset({str, int, float, bool, type(None), bytes})
_PACKERS: dict[type, Callable[[Any], msgspec.msgpack.Ext]] = {
    Decimal: lambda v: msgspec.msgpack.Ext(_DECIMAL, str(v).encode()),
    dt.datetime: lambda v: msgspec.msgpack.Ext(_DATETIME, v.isoformat().encode()),
    dt.date: lambda v: msgspec.msgpack.Ext(_DATE, v.isoformat().encode()),
    dt.time: lambda v: msgspec.msgpack.Ext(_TIME, v.isoformat().encode()),
    dt.timedelta: lambda v: msgspec.msgpack.Ext(_TIMEDELTA, struct.pack(">iiI", v.days, v.seconds, v.microseconds)),
    set: lambda v: msgspec.msgpack.Ext(_SET, _ENCODER.encode([_exact(x) for x in v])),
    frozenset: lambda v: msgspec.msgpack.Ext(_FROZENSET, _ENCODER.encode([_exact(x) for x in v])),
}


def _exact(value: Any) -> Any:
    """`value` with what msgpack would turn into a string (Decimal, datetimes...) made an extension."""
    kind = type(value)
    if kind in _NATIVE:
        return value
    if kind is dict:
        return {k: v if type(v) in _NATIVE else _exact(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [v if type(v) in _NATIVE else _exact(v) for v in value]
    packer = _PACKERS.get(kind)
    if packer is None:
        raise TypeError(f"the group's wire carries no value of type {kind.__name__}")
    return packer(value)


def _unpack(code: int, data: memoryview) -> Any:
    raw = bytes(data)
    if code == _DECIMAL:
        return Decimal(raw.decode())
    if code == _DATETIME:
        return dt.datetime.fromisoformat(raw.decode())
    if code == _DATE:
        return dt.date.fromisoformat(raw.decode())
    if code == _TIME:
        return dt.time.fromisoformat(raw.decode())
    if code == _TIMEDELTA:
        days, seconds, micro = struct.unpack(">iiI", raw)
        return dt.timedelta(days=days, seconds=seconds, microseconds=micro)
    if code == _SET:
        return set(_DECODER.decode(raw))
    if code == _FROZENSET:
        return frozenset(_DECODER.decode(raw))
    raise WireError(f"an internal-topic value of unknown extension {code}: every instance of a group must run the "
                    "same oncewatch version")


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(ext_hook=_unpack)

# ------------------------------------------------------------------ messages as arrays


def _row(r: RowChange) -> list[Any]:
    before, after = r.before, r.after
    return [r.schema, r.table, r.op, _exact(r.pk), None if before is None else _exact(before),
            None if after is None else _exact(after), r.txid, r.row_index, r.binlog_file, r.end_pos, r.commit_time,
            r.commit_clock, r.snapshot]


def _tx(tx: Transaction) -> list[Any]:
    d, p = tx.cdc, tx.position
    return [[_row(r) for r in tx.rows], [p.gtid, p.file, p.pos, p.within_gtid, p.within_rows], tx.commit_time,
            [astuple(q) for q in tx.quarantined], [_exact(astuple(c)) for c in tx.schema_changes], tx.complete,
            tx.snapshot,
            None if d is None else [d.offsets, d.txid, d.expected, d.records, d.first_record,
                                    [list(r) for r in d.replays], d.delivered_until]]


def _untx(t: list[Any]) -> Transaction:
    rows, position, commit_time, quarantined, schema_changes, complete, snapshot, cdc = t
    return Transaction(
        rows=tuple(RowChange(s, tb, op, tuple(pk), before, after, *rest) for s, tb, op, pk, before, after, *rest
                   in rows),
        position=BinlogPosition(*position), commit_time=commit_time,
        quarantined=tuple(QuarantinedRows(*q) for q in quarantined),
        schema_changes=tuple(SchemaChange(*c) for c in schema_changes), complete=complete, snapshot=snapshot,
        cdc=None if cdc is None else CdcDelivery(cdc[0], cdc[1], cdc[2], cdc[3], cdc[4],
                                                 tuple(Replay(*r) for r in cdc[5]), cdc[6]))


def _event(e: EmittedEvent) -> list[Any]:
    # the text read from Kafka when the payload was parsed from it alone: forwarded as it came
    text = e.payload_json
    return [e.topic, e.partition, e.offset, e.timestamp_ms, e.timestamp_type, e.key, e.headers, text,
            _exact(e.payload) if text is None else None, e.format, _exact(e.keys),
            None if e.cdc is None else _exact(e.cdc)]


def _unevent(v: list[Any]) -> EmittedEvent:
    topic, partition, offset, ts, ts_type, key, headers, text, payload, fmt, keys, cdc = v
    return EmittedEvent(topic, partition, offset, ts, ts_type, key, tuple(map(tuple, headers)),
                        payload if text is None else parse_exact_json(text), fmt, keys, cdc, text)


def encode(message: Message) -> bytes:
    """One message, to be sent in a `Batch`."""
    if isinstance(message, Part):
        body = [_PART, message.source, message.seq, _tx(message.tx), message.watch_start]
    elif isinstance(message, Event):
        body = [_EVENT, message.source, message.seq, _event(message.event)]
    else:
        body = [_MARK, message.source, message.seq, message.at, message.partitions]
    return _ENCODER.encode(body)


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


class Batch:
    """Messages (each `encode`d) for one shard, as the value of one internal-topic record: [WIRE_VERSION,
    [message, ...]], the array's items joined as they were encoded."""

    _HEAD = _array_header(2) + _ENCODER.encode(WIRE_VERSION)

    def __init__(self) -> None:
        self.encoded: list[bytes] = []
        self.size = 0

    def add(self, encoded: bytes) -> None:
        self.encoded.append(encoded)
        self.size += len(encoded)

    def value(self) -> bytes:
        return b"".join((self._HEAD, _array_header(len(self.encoded)), *self.encoded))


def batch(encoded: list[bytes]) -> bytes:
    """`encoded` messages as one internal-topic record's value."""
    b = Batch()
    for e in encoded:
        b.add(e)
    return b.value()


def decode(value: bytes) -> list[Message]:
    """The messages of one internal-topic record (`Batch`)."""
    try:
        version, bodies = _DECODER.decode(value)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        raise WireError(f"an internal-topic record this oncewatch cannot read ({type(exc).__name__}: {exc}): every "
                        "instance of a group must run the same oncewatch version") from exc
    if version != WIRE_VERSION or not isinstance(bodies, list):
        raise WireError(f"an internal-topic record of wire version {version!r}, this oncewatch reads {WIRE_VERSION}: "
                        "every instance of a group must run the same oncewatch version")
    return [_message(body) for body in bodies]


def _message(body: Any) -> Message:
    try:
        kind, source, seq, *rest = body
        if kind == _PART:
            tx, watch_start = rest
            return Part(seq, _untx(tx), watch_start, source)
        if kind == _EVENT:
            event, = rest
            return Event(source, seq, _unevent(event))
        if kind == _MARK:
            at, partitions = rest
            return Mark(source, seq, at, partitions)
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"an internal-topic message this oncewatch cannot read ({type(exc).__name__}: {exc}): "
                        "every instance of a group must run the same oncewatch version") from exc
    raise WireError(f"an internal-topic message of unknown kind {kind!r}: every instance of a group must run the "
                    "same oncewatch version")


def group_name(group: str, what: str) -> str:
    """One of the group's names on Kafka: its topics RECORDS (a partition per shard) and LEASE (one partition: whoever
    the routers' group gives it reads the change source), its consumer groups JUDGES and ROUTERS."""
    return f"oncewatch.{group}.{what}"


RECORDS, LEASE, JUDGES, ROUTERS = "records", "lease", "judges", "routers"
