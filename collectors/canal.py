"""Committed transactions rebuilt from Canal's FlatMessages: CDC mode's change source with `[cdc] format = "canal"`.

Canal (alibaba/canal) run with `canal.serverMode = kafka` and `canal.mq.flatMessage = true` writes each rows
event of the binlog as one JSON FlatMessage to the topics of `canal.mq.topic` (or its dynamic topics):
`database`, `table`, `type` (INSERT, UPDATE, DELETE; TRUNCATE and other DDL with `isDdl`), `es` (the event's
execute time, ms), `id` (the batch it was sent in), `pkNames`, `mysqlType` (each column's declared type),
`data` (the rows, every value as text or null: after the change, before it for a DELETE) and `old` (per row of
an UPDATE, the changed columns' values before it). `CanalAssembler` (no I/O) reads them into the binlog
collector's rows and values, exactly (`canal_values`); a value that cannot be read exactly (a geometry, a
type this does not know) is quarantined with its Kafka coordinates, never passed on as text.

What a FlatMessage does not carry, and what follows for the rules:
- No transaction boundaries: Canal's FlatMessage conversion drops the TRANSACTIONBEGIN/END entries.
  Consecutive messages of one partition with the same batch `id` and `es` are taken as one transaction,
  handed on once a message of another comes or `grace_seconds` pass without one. Two transactions of one
  batch committed in the same millisecond are then one, and one whose rows events fall in two batches two;
  partitions are not ordered against each other (Canal spreads tables or keys over them).
- No GTID and no binlog position: a transaction is known by its first message's Kafka coordinates
  ("topic/partition@offset"), which are also its rows' evidence; the checkpoint is the topics' offsets.
- No replay marker: a message equal to one of the last `REPLAY_WINDOW` read (same table, type, `es`,
  `data` and `old`; a batch id and build time `ts` are new after a Canal restart) is a replay, counted in
  runs as Debezium's are, and not applied twice.
- TIMESTAMP values are written in the Canal server's zone (`[cdc] time_zone`, UTC by default).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import re
import struct
import zoneinfo
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec

from oncewatch.collectors.binlog import commit_time
from oncewatch.collectors.cdc.counts import ReplayRuns, Unreadable
from oncewatch.collectors.debezium_rows import Undecodable
from oncewatch.core.config import MySQLConfig
from oncewatch.core.names import UNDECODABLE, UNPARSEABLE
from oncewatch.core.protocol import CdcCounts
from oncewatch.core.records import (CLOCK_BINLOG_HEADER, OP_DELETE, OP_INSERT, OP_UPDATE, BinlogPosition, CdcDelivery,
                                    RowChange, SchemaChange, Transaction)

OPS = {"INSERT": OP_INSERT, "UPDATE": OP_UPDATE, "DELETE": OP_DELETE}
REPLAY_WINDOW = 100_000  # messages whose digest is kept to tell a replay
_TYPE = re.compile(r"^\s*([a-z]+)\s*(?:\(([^)]*)\))?\s*(unsigned)?", re.I)
_TIME = re.compile(r"^(-)?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?$")
_ZERO_DATE = "0000-00-00"

Decode = Callable[[str], Any]


def _float32(text: str) -> float:
    """A FLOAT column as the binlog holds it: the 4-byte float, widened (Java printed its shortest text)."""
    return struct.unpack("<f", struct.pack("<f", float(text)))[0]


def _date(text: str) -> dt.date | None:
    return None if text.startswith(_ZERO_DATE) else dt.date.fromisoformat(text)


def _datetime(text: str) -> dt.datetime | None:
    return None if text.startswith(_ZERO_DATE) else dt.datetime.fromisoformat(text)


def _timestamp(zone: dt.tzinfo) -> Decode:
    def decode(text: str) -> dt.datetime | None:
        local = _datetime(text)
        if local is None:
            return None
        return local.replace(tzinfo=zone).astimezone(dt.timezone.utc).replace(tzinfo=None)
    return decode


def _time(text: str) -> dt.timedelta:
    m = _TIME.match(text)
    if m is None:
        raise ValueError("not [-]HH:MM:SS[.ffffff]")
    sign, hours, minutes, seconds, frac = m.groups()
    value = dt.timedelta(hours=int(hours), minutes=int(minutes), seconds=int(seconds),
                         microseconds=int((frac or "0").ljust(6, "0")))
    return -value if sign else value


def _bits(length: int) -> Decode:
    return lambda text: format(int(text), f"0{length}b")[-length:]


def _set(text: str) -> set[str] | None:
    return set(text.split(",")) if text else None


def _latin1(text: str) -> bytes:
    return text.encode("iso-8859-1")  # Canal writes a binary value's bytes as ISO-8859-1 text


_TEXT = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "json")
_BYTES = ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")
_INTS = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year")


def decoder(mysql_type: str, zone: dt.tzinfo) -> Decode:
    """How to read a column's text, from its declared type ("decimal(10,2)", "bigint(20) unsigned")."""
    m = _TYPE.match(mysql_type or "")
    name, params = (m.group(1).lower(), m.group(2)) if m else ("", None)
    if name in _INTS:
        return int
    if name in ("decimal", "numeric"):
        return Decimal
    if name == "float":
        return _float32
    if name in ("double", "real"):
        return float
    if name in _TEXT:
        return str
    if name in _BYTES:
        return _latin1
    if name == "set":
        return _set
    if name == "bit":
        return _bits(int(params or 1))
    if name == "date":
        return _date
    if name == "datetime":
        return _datetime
    if name == "timestamp":
        return _timestamp(zone)
    if name == "time":
        return _time
    raise Undecodable(f"MySQL type {mysql_type!r} is not read exactly by oncewatch")


def canal_values(row: dict[str, Any], mysql_types: dict[str, str], zone: dt.tzinfo) -> dict[str, Any]:
    """A FlatMessage row (text values) as the binlog collector's values; Undecodable names the column."""
    out = {}
    for column, text in row.items():
        if text is None:
            out[column] = None
            continue
        try:
            out[column] = decoder(mysql_types.get(column, ""), zone)(text)
        except Undecodable as exc:
            raise Undecodable(f"column {column}: {exc}") from None
        except (InvalidOperation, OverflowError, TypeError, ValueError) as exc:
            raise Undecodable(f"column {column}: {str(text)[:40]!r} does not read as "
                              f"{mysql_types.get(column)} ({exc})") from None
    return out


@dataclass
class _Held:
    """The transaction a partition is reading: its messages' rows so far."""

    key: tuple[Any, Any]  # (batch id, es)
    first: str  # "topic/partition@offset" of its first message
    first_offset: int
    es: int
    rows: list[RowChange] = field(default_factory=list)
    changes: list[SchemaChange] = field(default_factory=list)
    messages: int = 0
    last_at: float = 0.0


class CanalAssembler:
    """FlatMessages in, Transactions out (no I/O); the interface collectors.cdc.CdcCollector reads through."""

    def __init__(self, cfg: MySQLConfig, topics: tuple[str, ...], grace_seconds: float = 1.0,
                 time_zone: str = "UTC"):
        self.cfg = cfg
        self._topics = list(topics)
        self.grace = grace_seconds
        self.zone = zoneinfo.ZoneInfo(time_zone)
        self.done: dict[int, tuple[int, int]] = {}  # no GTIDs: the position's set stays empty
        self.held: dict[str, _Held] = {}  # per partition
        self.replays = ReplayRuns()
        self.seen: OrderedDict[bytes, None] = OrderedDict()  # digests of the last REPLAY_WINDOW messages
        self.unreadable = Unreadable("a Canal record cannot be read exactly; kept in quarantine")
        self.ddl_records = 0
        self.offsets: Callable[[], dict[str, int]] = dict  # the collector's positions, once the transaction is gone

    def topics(self) -> list[str]:
        return self._topics

    def counts(self) -> CdcCounts:
        return CdcCounts(replayed_records=self.replays.records, unreadable_records=self.unreadable.records,
                         open_transactions=len(self.held), ddl_records=self.ddl_records)

    @property
    def waiting(self) -> bool:
        return bool(self.held)

    def first_pending(self) -> dict[str, int]:
        return {key: h.first_offset for key, h in self.held.items()}

    def replay_notice(self) -> Transaction | None:
        return self._transaction(None, "") if self.replays.grown else None

    def feed(self, topic: str, partition: int, rec: Any, now: float, part: str = "") -> list[Transaction]:
        key = part or f"{topic}/{partition}"
        at = f"{key}@{rec.offset}"
        try:
            msg = msgspec.json.decode(rec.value) if rec.value is not None else None
            if not isinstance(msg, dict) or not isinstance(msg.get("isDdl"), bool) or "database" not in msg:
                raise Undecodable("not a Canal FlatMessage (an object with isDdl, database, table, type, data)")
        except (msgspec.DecodeError, Undecodable) as exc:
            self.unreadable.add(key, rec.offset, topic, UNPARSEABLE, str(exc))
            return []
        digest = hashlib.blake2b(repr([msg.get(k) for k in ("database", "table", "type", "isDdl", "es", "sql", "data",
                                                          "old")]).encode(), digest_size=16).digest()
        if digest in self.seen:
            self.replays.replayed(key, rec.offset, at)
            return []
        self.seen[digest] = None
        if len(self.seen) > REPLAY_WINDOW:
            self.seen.popitem(last=False)
        self.replays.ended(key)
        out: list[Transaction] = []
        held = self.held.get(key)
        batch = (msg.get("id"), msg.get("es"))
        if held is not None and held.key != batch:
            out.append(self._hand_on(key))
            held = None
        table = self.cfg.watched.qualified(f"{msg.get('database')}.{msg.get('table')}")
        if msg["isDdl"]:
            if msg.get("type") == "TRUNCATE" and table is not None:
                held = held or self._hold(key, batch, at, rec.offset, msg, now)
                held.changes.append(SchemaChange(
                    table=f"{msg['database']}.{msg['table']}", kind="truncate", statement=str(msg.get("sql"))[:500],
                    columns={}, txid=held.first, binlog_file=key, pos=rec.offset))
            else:
                self.ddl_records += 1
            return out
        op = OPS.get(msg.get("type"))
        if table is None:
            return out
        try:
            if op is None:
                raise Undecodable(f"type {msg.get('type')!r} is neither INSERT, UPDATE nor DELETE")
            rows = self._rows(msg, op, key, rec.offset, at)
        except (Undecodable, TypeError, AttributeError, KeyError) as exc:
            self.unreadable.add(key, rec.offset, f"{msg['database']}.{msg['table']}", UNDECODABLE, str(exc))
            return out
        held = held or self._hold(key, batch, at, rec.offset, msg, now)
        held.rows.extend(rows)
        held.messages += 1
        held.last_at = now
        return out

    def _rows(self, msg: dict[str, Any], op: str, key: str, offset: int, txid: str) -> list[RowChange]:
        types = msg.get("mysqlType") or {}
        data, old = msg["data"], msg.get("old") or []
        if not isinstance(data, list) or (op == OP_UPDATE and len(old) != len(data)):
            raise Undecodable("'data' is not a list of rows, or 'old' has not one entry per row of an UPDATE")
        columns = self.cfg.commit_time_columns.get(self.cfg.watched.entry(msg["database"], msg["table"]))
        pk_names = msg.get("pkNames") or []
        out = []
        for i, raw in enumerate(data):
            row = canal_values(raw, types, self.zone)
            before = {**row, **canal_values(old[i], types, self.zone)} if op == OP_UPDATE else (
                row if op == OP_DELETE else None)
            after = None if op == OP_DELETE else row
            when, clock = commit_time(after, columns, (msg.get("es") or 0) / 1000, CLOCK_BINLOG_HEADER)
            out.append(RowChange(schema=msg["database"], table=msg["table"], op=op,
                                 pk=tuple(row.get(n) for n in pk_names), before=before, after=after, txid=txid,
                                 row_index=0, binlog_file=key, end_pos=offset, commit_time=when, commit_clock=clock))
        return out

    def _hold(self, key: str, batch: tuple[Any, Any], at: str, offset: int, msg: dict[str, Any],
              now: float) -> _Held:
        held = self.held[key] = _Held(key=batch, first=at, first_offset=offset, es=int(msg.get("es") or 0),
                                      last_at=now)
        return held

    def ready(self, now: float, behind: bool = False) -> Iterator[Transaction]:
        """The partitions' transactions no message has joined for `grace_seconds`; none while `behind` (a topic not
        read to its end: their next message may be further on; a partition's next batch ends one anyway)."""
        if behind:
            return
        for key in [k for k, h in self.held.items() if now - h.last_at >= self.grace]:
            yield self._hand_on(key)

    def _hand_on(self, key: str) -> Transaction:
        return self._transaction(self.held.pop(key), key)

    def _transaction(self, held: _Held | None, key: str) -> Transaction:
        """`held` handed on (None: an empty one, carrying the replays read since the last)."""
        bad = self.unreadable.take()
        if held is None:
            return Transaction(rows=(), position=BinlogPosition(gtid="", file=key), commit_time=0.0,
                               quarantined=tuple(bad), cdc=CdcDelivery(offsets=self.offsets(),
                                                                       replays=self.replays.take()))
        rows = tuple(dataclasses.replace(r, txid=held.first, row_index=i) for i, r in enumerate(held.rows))
        return Transaction(rows=rows, position=BinlogPosition(gtid="", file=key, pos=held.first_offset),
                           commit_time=held.es / 1000, quarantined=tuple(bad), schema_changes=tuple(held.changes),
                           cdc=CdcDelivery(offsets=self.offsets(), txid=held.first, records=held.messages,
                                           first_record=held.first, replays=self.replays.take()))
