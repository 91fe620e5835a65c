"""Committed transactions rebuilt from Debezium's topics: the change source of CDC mode (issue 15).

Debezium writes each captured table's changes to its own topic and, with
`provide.transaction.metadata=true`, every transaction's BEGIN and END to `<prefix>.transaction`;
each data record names its transaction (`transaction.id`, the MariaDB GTID, and `total_order`).
`Assembler` (no I/O) takes both and hands on `Transaction`s in commit order, the order of the
transaction topic, each once its END has come and every record the END counts for the watched
tables has too; the rows are those the binlog collector would give for the same transaction
(collectors.debezium_rows reads the values; a primary-key change, which Debezium writes as a delete,
a tombstone and an insert, is one update again; tombstones are dropped). A TRUNCATE is a
`SchemaChange`, as in the binlog; Debezium gives its transaction a BEGIN and no END, so a
transaction whose BEGIN is followed by another's is over there (Assembler says how its record is
placed).

A transaction whose END counts records that have not come within `grace_seconds` is handed on
with what came, and counted (`incomplete`): the stream never stops behind a lost record. A record
that cannot be read exactly is quarantined with its coordinates. `CdcCollector` reads the topics
from the offsets its caller stored (`positions()`: per partition the first record of a transaction
not yet handed on), so a restart hands nothing on twice and loses nothing.

A Kafka Connect worker restarted (killed, stopped, its task restarted) resumes from its last flushed
offset and writes again what it wrote since (issue 42). A transaction already handed on, or older
than one whose BEGIN was read, that comes again is skipped by its GTID, and counted (`replays`). One
under way comes again from where the offset lies: its BEGIN again, records of rows already held
(known by what the binlog fixes, `row_of`: skipped and counted), `total_order` from 1 again, and an END
that counts what the restarted connector wrote alone. Its records are then known to be in once the
connector has written a later transaction's records in each partition of its tables (a partition is
written in order; the transaction topic is not in order with the tables' topics, and an END can be on
it before records sent before it, which a killed worker then sends again), or after the grace. The
grace of a transaction whose records have not come runs while the connector writes (WRITING_SECONDS),
not while it is away: a worker's restart took 35 s here, and what it had not sent came after it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from oncewatch.collectors.binlog import StreamState, commit_time
from oncewatch.collectors.cdc_snapshots import SnapshotPasses
from oncewatch.collectors.debezium_rows import Undecodable, column_decoders, image, image_schema, key_columns
from oncewatch.collectors.heartbeats import HeartbeatReader
from oncewatch.collectors.kafka_client import connection
from oncewatch.core.config import CdcConfig, KafkaConfig, MySQLConfig
from oncewatch.core.gtids import GtidSet, gtid_set, gtid_text, parse
from oncewatch.core.names import UNDECODABLE, UNPARSEABLE
from oncewatch.core.protocol import CdcCounts, CdcStatus
from oncewatch.core.records import (CLOCK_BINLOG_HEADER, OP_DELETE, OP_INSERT, OP_UPDATE, BinlogPosition, CdcCopy,
                                    CdcDelivery, Heartbeat, Heartbeats, QuarantinedRows, Replay, RowChange,
                                    SchemaChange, Transaction)

log = logging.getLogger("oncewatch.collectors.cdc")

OPS = {"c": OP_INSERT, "u": OP_UPDATE, "d": OP_DELETE, "r": OP_INSERT}
NEW_KEY, OLD_KEY = "__debezium.newkey", "__debezium.oldkey"
GRACE_SECONDS = 30.0
# the connector counts as writing for this long after the last record read of its topics: the grace of a transaction
# whose records have not come runs only while it writes (a worker restarting, which can take longer than the grace,
# writes nothing, and then writes again what it had not sent)
WRITING_SECONDS = 5.0
WITHOUT_END_KEPT = 1000  # transactions handed on without an END whose rows are remembered
NO_HEARTBEATS = ("no heartbeat of the CDC connector is read: the change clock (F3, F8, F9) moves only with the "
                 "commits it delivers, and waits for the next one while the tables are quiet; give the connector "
                 "heartbeat.interval.ms and name its topic in cdc.heartbeat_topic (README, [cdc])")
TOPICS_EVERY_SECONDS = 1.0


class DataRecord(NamedTuple):
    """One Debezium data record of a watched table, read: its row, or why it could not be (a NamedTuple: one is
    made per record read, the hot path of CDC mode)."""

    topic: str
    partition: int
    offset: int
    txid: str
    order: int  # transaction.total_order: counted from 1 again by a connector restarted inside the transaction
    op: str  # c u d r t
    db: str
    table: str
    pk: tuple[Any, ...]
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    file: str
    pos: int
    header_time: float
    key_changed: str | None = None  # NEW_KEY on the delete of a primary-key change, OLD_KEY on its insert
    undecodable: str | None = None
    snapshot_last: bool = False  # the connector's snapshot ends with this record
    part: str = ""  # "topic/partition"
    row: int = 0  # source.row: the row's place in its binlog rows event (file, pos and row say which row it is)
    snapshot_first: bool = False  # the connector's snapshot of its table begins with this record


_HEAD, _PAYLOAD = b'{"schema":', b',"payload":'
_SCHEMAS_KEPT = 256
_PROBE = 48  # bytes of a schema's end that, with its length, find it in the cache


class _Source(msgspec.Struct):
    db: str = ""
    table: str = ""
    file: str = ""
    pos: int = 0
    ts_ms: int = 0
    gtid: str | None = None
    snapshot: str | bool | None = None  # "true", "last" or "false" (older connectors: a boolean)
    row: int = 0


class _Block(msgspec.Struct):
    id: str = ""
    total_order: int = 0


class _Envelope(msgspec.Struct):
    """A change event's payload, the parts oncewatch reads (msgspec skips the rest without building it)."""

    op: str
    source: _Source
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    transaction: _Block | None = None


_ENVELOPE = msgspec.json.Decoder(_Envelope)


class _Collection(msgspec.Struct):
    data_collection: str = ""
    event_count: int | None = 0


class _Marker(msgspec.Struct):
    """A transaction topic's BEGIN or END, the parts oncewatch reads."""

    status: str = ""
    id: str = ""
    data_collections: list[_Collection] | None = None


_MARKER = msgspec.json.Decoder(_Marker)


class _Schemas:
    """What a record's schema says (its columns' decoders, its key's columns), kept by the schema's bytes: a
    table's records all carry the same few kilobytes of schema, which then need not be parsed again.

    A record's schema is found in the cache by its length and its last bytes, then compared in place, byte for
    byte, with the one kept: neither copied out of the record nor hashed whole (both cost more than the rest of
    reading the record). A record whose schema differs anywhere is a miss, and its own schema is parsed."""

    def __init__(self) -> None:
        self._values: dict[tuple[int, bytes], tuple[bytes, dict[str, Any] | Undecodable]] = {}
        self._keys: dict[tuple[int, bytes], tuple[bytes, list[str]]] = {}
        self._others: dict[tuple[int, bytes], tuple[bytes, None]] = {}  # schemas only skipped (the transaction topic)
        self._last: dict[int, tuple[bytes, Any]] = {}  # per cache, the schema found last: the next record's, mostly

    @staticmethod
    def _payload_at(data: bytes) -> int:
        """Where the JsonConverter's {"schema":...,"payload":...} has its payload; -1 for another layout."""
        at = data.find(_PAYLOAD)
        return at if at > 0 and data.startswith(_HEAD) and data.endswith(b"}") else -1

    def _cached(self, cache: dict[tuple[int, bytes], tuple[bytes, Any]], data: bytes,
                parse: Callable[[Any], Any]) -> tuple[int, Any]:
        """(where the payload is, what `parse` made of the schema), or (-1, None) for another layout."""
        last = self._last.get(id(cache))
        if last is not None:  # the record has the last one's schema, followed by its payload
            at = len(_HEAD) + len(last[0])
            if data.startswith(last[0], len(_HEAD)) and data.startswith(_PAYLOAD, at) and data.startswith(_HEAD):
                return at, last[1]
        at = self._payload_at(data)
        if at < 0:
            return -1, None
        probe = (at, data[max(len(_HEAD), at - _PROBE):at])
        hit = cache.get(probe)
        if hit is None or at - len(_HEAD) != len(hit[0]) or not data.startswith(hit[0], len(_HEAD)):
            if len(cache) >= _SCHEMAS_KEPT:
                cache.clear()
            schema = data[len(_HEAD):at]
            hit = cache[probe] = (schema, parse(msgspec.json.decode(schema)))
        self._last[id(cache)] = hit
        return at, hit[1]

    def value(self, data: bytes) -> tuple[_Envelope, dict[str, Any] | Undecodable]:
        """(payload, decoders by column or why there are none)."""
        at, decoders = self._cached(self._values, data, self._decoders)
        if at < 0 or not data.endswith(b"}"):
            doc = msgspec.json.decode(data)
            if isinstance(doc, dict) and "op" in doc and "payload" not in doc:
                raise Undecodable("the record carries no schema: the connector's JsonConverter needs "
                                  "schemas.enable=true for oncewatch to read its columns exactly")
            return msgspec.convert(doc["payload"], _Envelope), self._decoders(doc.get("schema"))
        return _ENVELOPE.decode(memoryview(data)[at + len(_PAYLOAD):-1]), decoders

    def marker(self, data: bytes) -> _Marker:
        """A transaction topic record's payload, its schema skipped."""
        at, _ = self._cached(self._others, data, lambda schema: None)
        if at >= 0 and data.endswith(b"}"):
            return _MARKER.decode(memoryview(data)[at + len(_PAYLOAD):-1])
        return msgspec.convert(msgspec.json.decode(data)["payload"], _Marker)

    def key(self, data: bytes | None) -> list[str]:
        if data is None:
            return []
        at, columns = self._cached(self._keys, data, key_columns)
        return key_columns(msgspec.json.decode(data).get("schema")) if at < 0 else columns

    @staticmethod
    def _decoders(schema: Any) -> dict[str, Any] | Undecodable:
        try:
            return column_decoders(image_schema(schema))
        except Undecodable as exc:
            return exc


def read_record(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                headers: Sequence[tuple[str, bytes | None]], schemas: _Schemas | None = None,
                part: str = "") -> DataRecord | None:
    """A data record as a DataRecord; None for a tombstone. A record not in Debezium's shape is Undecodable.
    `part`: its "topic/partition", where the caller has it made already."""
    if value is None:
        return None
    schemas = schemas or _Schemas()
    part = part or f"{topic}/{partition}"
    try:
        payload, decoders = schemas.value(value)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError, AttributeError) as exc:
        raise Undecodable(f"not a Debezium change event with its schema ({type(exc).__name__}: {exc})") from None
    source, op, tx = payload.source, payload.op, payload.transaction
    txid = (tx.id if tx is not None else "") or source.gtid or ""
    key_changed = None
    for name, _ in headers:  # almost always none: only a primary-key change is marked
        if name in (NEW_KEY, OLD_KEY):
            key_changed = name
    order = tx.total_order if tx is not None else 0
    last = op == "r" and source.snapshot == "last"
    first = op == "r" and source.snapshot in ("first", "first_in_data_collection")
    undecodable = None
    pk: tuple[Any, ...] = ()
    before = after = None
    if op != "t":
        try:
            if isinstance(decoders, Undecodable):
                raise decoders
            before = None if payload.before is None else image(payload.before, decoders)
            after = None if payload.after is None else image(payload.after, decoders)
            columns = schemas.key(key)
            row = after if after is not None else before or {}
            pk = tuple(row.get(c) for c in columns)
        except Undecodable as exc:
            before = after = None
            undecodable = str(exc)
        except (msgspec.DecodeError, AttributeError) as exc:
            before = after = None
            undecodable = f"the record key is not Debezium's ({exc})"
    return DataRecord(topic, partition, offset, txid, order, op, source.db, source.table, pk, before, after,
                      source.file, source.pos, source.ts_ms / 1000, key_changed, undecodable, last, part,
                      source.row, first)


class Unreadable:
    """Records of the CDC topics that cannot be read exactly: logged and counted by their Kafka coordinates, and
    kept in quarantine with the next transaction handed on (either format's assembler)."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.records = 0
        self.held: list[QuarantinedRows] = []

    def add(self, part: str, offset: int, table: str, reason: str, detail: str) -> None:
        self.records += 1
        at = f"{part}@{offset}"
        log.error(self.message, extra={"event": "cdc_record_unreadable", "at": at, "reason": reason,
                                       "detail": detail})
        self.held.append(QuarantinedRows(txid="", binlog_file=part, event_pos=offset, table=table, reason=reason,
                                         detail=f"{at}: {detail}"))

    def take(self) -> list[QuarantinedRows]:
        out, self.held = self.held, []
        return out


class ReplayRuns:
    """Records read again (a connector restart replays what it wrote since its last offset flush), as runs per
    partition: a run grows while its partition gives replayed records and ends at the first that is not."""

    def __init__(self) -> None:
        self.records = 0
        self.current: dict[str, Replay] = {}  # per partition, the run it is in, if any
        self.grown: dict[str, Replay] = {}  # the runs that grew since the last take()

    def replayed(self, partition: str, offset: int, txid: str) -> None:
        self.records += 1
        run = self.current.get(partition)
        run = (Replay(partition, offset, offset, 1, txid, txid) if run is None
               else run._replace(last=offset, records=run.records + 1, last_gtid=txid))
        self.current[partition] = self.grown[partition] = run

    def ended(self, partition: str) -> None:
        """A record of `partition` that is not a replay."""
        self.current.pop(partition, None)

    def take(self) -> tuple[Replay, ...]:
        out, self.grown = tuple(self.grown.values()), {}
        return out


def row_of(record: DataRecord) -> tuple[Any, ...]:
    """Which binlog row a record is: what the binlog fixes for it, the same when a restarted connector writes it
    again (its `total_order` and Kafka offset are not). A primary-key change's delete and insert share the row."""
    return record.db, record.table, record.file, record.pos, record.row, record.op


@dataclass
class _Open:
    records: list[DataRecord] = field(default_factory=list)
    expected: int | None = None  # from the END: records of the watched tables; None: no END came
    ended_at: float = 0.0
    ended_writing: float = 0.0  # the Assembler's `writing` then
    over: bool = False  # its END came, or the next transaction's BEGIN: it is in `ends`
    rows: set[tuple[Any, ...]] = field(default_factory=set)  # row_of each record in `records`
    # the connector was restarted inside it: its BEGIN came again, or records of it did. The END then counts only
    # what the last connector run wrote, from `total_order` 1 again, not every record of it (Assembler.ready)
    restarted: bool = False
    top_order: int = 0  # the highest total_order of its records, replayed ones too
    tables: set[str] = field(default_factory=set)  # "schema.table" of the watched tables its END names

    def add(self, record: DataRecord) -> bool:
        """Holds `record`; False when it holds that row already (the connector wrote it again)."""
        self.top_order = max(self.top_order, record.order)
        row = row_of(record)
        if row in self.rows:
            self.restarted = True
            return False
        self.rows.add(row)
        self.records.append(record)
        return True

    def short(self) -> bool:
        """Records its END counts have not come (yet)."""
        if self.expected is None:
            return False
        return self.top_order < self.expected if self.restarted else len(self.records) < self.expected


class Assembler:
    """Transaction-topic and data records in, Transactions in commit order out (no I/O).

    Feed a whole poll's records, then take `ready()`: a transaction without an END (its BEGIN followed
    by another's) goes in its place with the records that came by then, and one of its records that
    comes later still goes on, at once and out of its place, counted in `late`."""

    def __init__(self, cfg: MySQLConfig, start_gtid: str = "", grace_seconds: float = GRACE_SECONDS,
                 prefix: str = "", heartbeat_topic: str = ""):
        """`heartbeat_topic`: the connector's heartbeats (cdc.heartbeat_topic), read as a sign that it writes."""
        self.cfg = cfg
        self.grace = grace_seconds
        self.prefix = prefix
        self.transaction_topic = f"{prefix}.transaction"
        self.heartbeat_topic = heartbeat_topic
        self.schemas = _Schemas()
        self.done = gtid_set(start_gtid)
        self.done_text = gtid_text(self.done)  # kept with `done`: every transaction's position carries it
        self.open: dict[str, _Open] = {}
        self.ends: deque[str] = deque()  # transactions over (an END, or the next one's BEGIN), in commit order
        self.begun: str | None = None  # the newest BEGIN's transaction while its END has not come
        self.newest: GtidSet = {}  # per GTID domain, the newest transaction whose BEGIN was read (older: replays)
        # per partition, the newest transaction (domain, sequence) a record of it belongs to: the connector writes a
        # partition in order, so every record it wrote there of an older transaction is in
        self.newest_in: dict[str, tuple[int, int]] = {}
        self.parts_of: dict[str, set[str]] = {}  # "schema.table" -> the partitions its records came in
        # recent ones handed on that had no END, each with the rows it held (row_of): a record of one that comes later
        # is late, or written again by a restarted connector
        self.without_end: OrderedDict[str, set[tuple[Any, ...]]] = OrderedDict()
        self.incomplete = self.late = self.resnapshots = 0
        self.resnapshotting = False  # the records read last were of a new snapshot (logged at its first)
        self.snapshot_passes = SnapshotPasses()  # the first snapshot's rows, while it may be taken again
        self.resumed = bool(self.done)  # changes were streamed before this reader's start
        self.streamed_in: set[str] = set()  # the partitions that gave a streamed change
        self.level_at = float("-inf")  # the last time some topic was not read to its end (ready's `behind`)
        self.fed_at = float("-inf")  # the last time a record was read
        self.writing = 0.0  # seconds the connector has been writing (WRITING_SECONDS), as of `writing_at`
        self.writing_at: float | None = None
        self.replays = ReplayRuns()
        # per partition, offsets of records held in `open`, and of the BEGINs of transactions not handed on yet
        self.pending: dict[str, OrderedDict[int, None]] = {}
        self.begins: dict[str, tuple[str, int]] = {}  # txid -> where its BEGIN is, until it is handed on
        self.unreadable = Unreadable("a CDC record is not a Debezium change event with its schema; kept in quarantine")
        self._commit_time_columns: dict[Any, Any] = {}  # (schema, table) -> its [mysql.commit_time_columns] entry
        self._watched: dict[str, bool] = {}  # "schema.table" of an END's data collection -> watched or not
        # where the topics are read on from after the transaction being handed on (the collector's positions)
        self.offsets: Callable[[], dict[str, int]] = dict

    def topics(self) -> list[str]:
        """The transaction topic, the watched tables' and the connector's heartbeats' (`heartbeat.interval.ms`; read
        where the connector writes them: an idle connector's records that it is alive, WRITING_SECONDS)."""
        beats = [self.heartbeat_topic] if self.heartbeat_topic else []
        return [self.transaction_topic, *beats] + [f"{self.prefix}.{e}" for e in self.cfg.tables]

    def counts(self) -> CdcCounts:
        """What the source's health row and /metrics count."""
        return CdcCounts(incomplete_transactions=self.incomplete, replayed_records=self.replays.records,
                         late_records=self.late, unreadable_records=self.unreadable.records,
                         open_transactions=len(self.open))

    def feed(self, topic: str, partition: int, rec: Any, now: float, part: str = "") -> list[Transaction]:
        """One Kafka record of the topics (kafka-python's ConsumerRecord): what it lets go on at once; `part`: its
        "topic/partition", where the caller has it made already."""
        self.fed_at = now
        if topic == self.heartbeat_topic:
            return []
        try:
            if topic == self.transaction_topic:
                if rec.value is not None:
                    self.on_transaction(self.schemas.marker(rec.value), now, (part or f"{topic}/{partition}",
                                                                               rec.offset))
                return []
            record = read_record(topic, partition, rec.offset, rec.key, rec.value, rec.headers, self.schemas, part)
        except (Undecodable, msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError) as exc:
            self.unreadable.add(part or f"{topic}/{partition}", rec.offset, topic, UNPARSEABLE, str(exc))
            return []
        return [] if record is None else list(self.on_record(record))

    @property
    def waiting(self) -> bool:
        """Records read whose transaction is not handed on yet."""
        return bool(self.open)

    def _seen(self, txid: str) -> bool:
        gtid = parse(txid)
        return gtid is not None and gtid[0] in self.done and gtid[2] <= self.done[gtid[0]][1]

    def _replayed(self, txid: str) -> bool:
        """`txid` was handed on, or is older than a transaction whose BEGIN was read while it is neither under way
        nor waiting: the connector, restarted, reads the binlog again from before it (from before this reader's
        start, too, where that began from the topics' ends)."""
        if self._seen(txid):
            return True
        gtid = parse(txid)
        newest = self.newest.get(gtid[0]) if gtid is not None else None
        return (newest is not None and gtid is not None and gtid[2] < newest[1] and txid != self.begun
                and txid not in self.open)

    def on_transaction(self, payload: dict[str, Any] | _Marker, now: float,
                       where: tuple[str, int] | None = None) -> None:
        """A BEGIN or END of the transaction topic (its payload as read, or as a dict); `where`: its ("topic/partition",
        offset), held as where a restart reads from until its transaction is handed on: its END may be read before
        its records are, and a restart from past it would wait for that END for good."""
        marker = payload if isinstance(payload, _Marker) else msgspec.convert(payload, _Marker)
        txid = marker.id
        self.fed_at = now
        if marker.status == "BEGIN":
            again = self.open.get(txid)
            if txid == self.begun or self._replayed(txid) or (again is not None and again.over):
                # written again by a restarted connector, which reads the binlog again from its last flushed offset:
                # the transaction under way comes again from there, and is not over
                for under_way in {self.begun, txid if again is not None else None} - {None}:
                    self._restarted(self.open.setdefault(under_way, _Open()), now)
                return
            if self.begun is not None:  # DDL, a TRUNCATE, or one no captured table took part in
                self._over(self.begun, None, now)
            self.begun = txid
            gtid = parse(txid)
            if gtid is not None:
                self.newest[gtid[0]] = gtid[1:]
            if self.begun is not None and where is not None:
                self.begins[txid] = where
                self.pending.setdefault(where[0], OrderedDict())[where[1]] = None
            return
        if marker.status != "END" or self._replayed(txid):
            return
        if txid == self.begun:
            self.begun = None
        watched = self._watched
        expected = 0
        for c in marker.data_collections or ():
            name = c.data_collection
            is_watched = watched.get(name)
            if is_watched is None:
                is_watched = watched[name] = self.cfg.watched.qualified(name) is not None
            expected += (c.event_count or 0) if is_watched else 0
        self._over(txid, expected, now, {c.data_collection for c in marker.data_collections or ()
                                         if watched.get(c.data_collection)})

    def _over(self, txid: str, expected: int | None, now: float, tables: set[str] | None = None) -> None:
        """`txid` is over: in `ends`, once. A marker of it that comes again (its END after the next BEGIN placed
        it, as the topic's history of connector restarts has it) only gives it the END's count."""
        tx = self.open.setdefault(txid, _Open())
        if tx.over:
            tx.expected = expected if expected is not None else tx.expected
            self._restarted(tx, now)
            return
        tx.expected, tx.ended_at, tx.ended_writing, tx.over = expected, now, self.writing, True
        tx.tables |= tables or set()
        self.ends.append(txid)

    def _restarted(self, tx: _Open, now: float) -> None:
        """A marker of `tx` came again: the connector, restarted, writes it again, so its grace begins again."""
        tx.restarted = True
        tx.ended_at, tx.ended_writing = now, self.writing

    def on_record(self, record: DataRecord) -> Iterator[Transaction]:
        if record.op == "r":  # the connector's snapshot: no transaction, a row of the tables as they were
            name = f"snapshot:{record.db}.{record.table}"
            # a new snapshot of tables whose changes were streamed since the first (in this partition, which the
            # connector writes in order, or before this reader's start): rows known. The first snapshot's rows may still
            # be read after a change another partition streamed: the partitions are read each at its own pace
            if self.resumed or record.part in self.streamed_in:
                if not self.resnapshotting:
                    self.resnapshotting = True
                    log.warning("the connector takes a new snapshot of tables it streamed (its offsets lost, or "
                                "snapshot.mode when_needed); its rows are taken as known, and counted as replays: "
                                "a change it did not stream before the snapshot is not applied",
                                extra={"event": "cdc_snapshot_again", "at": f"{record.part}@{record.offset}"})
                self.resnapshots += 1
                self.replays.replayed(record.part, record.offset, name)
                return
            if self.snapshot_passes.again(record):  # a worker stopped during the snapshot: taken again
                self.replays.replayed(record.part, record.offset, name)
                return
            self.replays.ended(record.part)
            yield self._transaction(name, [record], snapshot_last=record.snapshot_last)
            return
        self.resnapshotting = False
        if record.part not in self.streamed_in:
            self.streamed_in.add(record.part)
            self.snapshot_passes.streamed(f"{record.db}.{record.table}")
        gtid = parse(record.txid)
        if gtid is not None:
            newest = self.newest_in.get(record.part)
            if newest is None or newest[0] != gtid[0] or newest[1] < gtid[2]:
                self.newest_in[record.part] = (gtid[0], gtid[2])
        table = f"{record.db}.{record.table}"
        if record.part not in self.parts_of.get(table, ()):
            self.parts_of.setdefault(table, set()).add(record.part)
        tx = self.open.get(record.txid)
        handed = self.without_end.get(record.txid) if tx is None else None
        if tx is not None:
            if tx.add(record):
                self._hold(record)
            else:
                self.replays.replayed(record.part, record.offset, record.txid)
        elif handed is not None and row_of(record) not in handed:
            self.late += 1
            log.error("a record of a CDC transaction without an END came after the transactions behind it; handed "
                      "on out of its place", extra={"event": "cdc_record_late", "gtid": record.txid,
                                                    "at": f"{record.topic}/{record.partition}@{record.offset}"})
            handed.add(row_of(record))
            yield self._transaction(record.txid, [record], first_row=len(handed) - 1)
        elif handed is not None or self._replayed(record.txid):
            self.replays.replayed(record.part, record.offset, record.txid)
        else:
            tx = self.open[record.txid] = _Open()
            tx.add(record)
            self._hold(record)

    def replay_notice(self) -> Transaction | None:
        """An empty transaction carrying the replays read since the last one handed on, if there are any."""
        return self._transaction("", []) if self.replays.grown else None

    def ready(self, now: float, behind: bool = False) -> Iterator[Transaction]:
        """Transactions over whose records are all in, oldest first; one waiting past the grace goes as it is.
        `behind`: some topic is not read to its end yet, so a record not read may simply be further on: the grace
        runs only from when every topic is read to its end (a monitor catching up reads the small transaction
        topic far ahead of the tables' topics, and its transactions would all go incomplete)."""
        if behind:
            self.level_at = now
        if self.writing_at is not None:
            self.writing += max(0.0, min(now, self.fed_at + WRITING_SECONDS) - self.writing_at)
        self.writing_at = now
        while self.ends:
            txid = self.ends[0]
            tx = self.open[txid]
            short = tx.short()
            if short or tx.restarted:
                # its records may still come: every topic is read to its end, and the connector wrote a later
                # transaction's records in each partition of its tables, or the grace passed without that
                waited = min(now - max(tx.ended_at, self.level_at), self.writing - tx.ended_writing)
                if behind or (waited < self.grace and not self._written_past(txid, tx)):
                    return
            if short:
                self.incomplete += 1
                log.error("a CDC transaction's END counts records that did not come; handed on without them",
                          extra={"event": "cdc_transaction_incomplete", "gtid": txid, "expected": tx.expected,
                                 "came": len(tx.records)})
            if tx.expected is None:
                self.without_end[txid] = tx.rows
                if len(self.without_end) > WITHOUT_END_KEPT:
                    self.without_end.popitem(last=False)
            self.ends.popleft()
            del self.open[txid]
            for r in tx.records:
                self.pending[r.part].pop(r.offset, None)
            begun = self.begins.pop(txid, None)
            if begun is not None:
                self.pending[begun[0]].pop(begun[1], None)
            self._advance(txid)
            # in binlog order: a restarted connector numbers `total_order` from 1 again
            yield self._transaction(txid, sorted(tx.records, key=lambda r: (r.pos, r.row)), expected=tx.expected)

    def _written_past(self, txid: str, tx: _Open) -> bool:
        """The connector wrote a transaction after `txid` in every partition of its tables (those of its records and
        those its END names), so no more of it is to come; true at once of one with nothing of the watched tables."""
        parts = {r.part for r in tx.records}.union(*(self.parts_of.get(t, {""}) for t in tx.tables))
        gtid = parse(txid)
        return not parts or gtid is not None and all(
            (newest := self.newest_in.get(p)) is not None and newest[0] == gtid[0] and newest[1] > gtid[2]
            for p in parts)

    def first_pending(self) -> dict[str, int]:
        """Per partition ("topic/partition"), the offset of its first record of a transaction not handed on yet."""
        return {key: next(iter(offsets)) for key, offsets in self.pending.items() if offsets}

    def _hold(self, record: DataRecord) -> None:
        # records come in offset order per partition, so each partition's first is its oldest; a record not
        # replayed ends its partition's run of replays
        self.replays.ended(record.part)
        self.pending.setdefault(record.part, OrderedDict())[record.offset] = None

    def _advance(self, txid: str) -> None:
        gtid = parse(txid)
        if gtid is not None and not self._seen(txid):  # not a MariaDB GTID: nothing to resume by
            self.done[gtid[0]] = gtid[1:]
            self.done_text = gtid_text(self.done)

    def _transaction(self, txid: str, records: list[DataRecord], snapshot_last: bool = False,
                     expected: int | None = None, first_row: int = 0) -> Transaction:
        """`first_row`: the first row's row_index (a late record's: after those of its transaction handed on)."""
        rows: list[RowChange] = []
        bad = self.unreadable.take()
        changes: list[SchemaChange] = []
        merged = _merge_key_changes(records) if any(r.key_changed for r in records) else records
        last = records[-1] if records else None
        header = 0.0
        for r in records:
            header = r.header_time if r.header_time > header else header
        columns_of = self._commit_time_columns
        for r in merged:
            if r.undecodable is not None or r.op == "t":
                table = f"{r.db}.{r.table}"
            if r.undecodable is not None:
                # kept by the record's Kafka coordinates: the rows of one binlog event share its position
                bad.append(QuarantinedRows(txid=txid, binlog_file=f"{r.topic}/{r.partition}", event_pos=r.offset,
                                           table=table, reason=UNDECODABLE,
                                           detail=f"{r.topic}/{r.partition}@{r.offset} ({r.file}:{r.pos}): "
                                                  f"{r.undecodable}"))
                continue
            if r.op == "t":
                changes.append(SchemaChange(table=table, kind="truncate", statement=f"TRUNCATE {table} (from CDC)",
                                            columns={}, txid=txid, binlog_file=r.file, pos=r.pos))
                continue
            columns = columns_of.get((r.db, r.table), columns_of)
            if columns is columns_of:
                columns = columns_of[(r.db, r.table)] = self.cfg.commit_time_columns.get(
                    self.cfg.watched.entry(r.db, r.table))
            when, clock = commit_time(r.after, columns, r.header_time, CLOCK_BINLOG_HEADER)
            op = r.op  # RowChange's fields in order (positional: one is made per row)
            rows.append(RowChange(r.db, r.table, OPS[op], r.pk, r.before if op == "u" or op == "d" else None,
                                  r.after if op != "d" else None, txid,
                                  r.offset if op == "r" else first_row + len(rows), r.file,
                                  r.pos, when, clock, op == "r"))
        position = BinlogPosition(gtid=self.done_text, file=last.file if last else "",
                                  pos=last.pos if last else 0)
        snapshot = bool(records) and records[0].op == "r"
        first = records[0] if records else None
        delivery = CdcDelivery(offsets=self.offsets(), txid="" if snapshot else txid, expected=expected,
                               records=len(records),
                               first_record=f"{first.topic}/{first.partition}@{first.offset}" if first else "",
                               replays=self.replays.take())
        return Transaction(rows=tuple(rows), position=position, commit_time=header, quarantined=tuple(bad),
                           schema_changes=tuple(changes), snapshot=snapshot, complete=not snapshot or snapshot_last,
                           cdc=delivery)


def _merge_key_changes(records: list[DataRecord]) -> list[DataRecord]:
    """A primary-key change (the delete marked NEW_KEY, then the insert marked OLD_KEY) as one update, as the
    binlog has it."""
    out: list[DataRecord] = []
    for r in records:
        prev = out[-1] if out else None
        if (r.key_changed == OLD_KEY and r.op == "c" and prev is not None and prev.key_changed == NEW_KEY
                and prev.op == "d" and (prev.db, prev.table) == (r.db, r.table)):
            out[-1] = prev._replace(op="u", after=r.after, pk=r.pk, key_changed=None)
            continue
        out.append(r)
    return out


class CdcCollector:
    """Reads a CDC pipeline's topics for the watched tables and yields committed Transactions, each with how it
    was delivered (`cdc`: the offsets to store beside it, its END's count, replays read since the one before).

    `positions` is what the caller stored with the last transaction ({} on a first start: the topics'
    beginnings, the connector's snapshot first), `start_gtid` the GTID set handed on by then. The format's
    assembler (`ASSEMBLERS`: Debezium's here, Canal's in collectors.canal) makes transactions of the records.
    `status()` says what the pages and /metrics show (CdcStatus: the binlog collector's fields, with this
    source's counts in `cdc`). Call `stop()` from another thread to end `transactions()`.

    With `cdc.heartbeat_topic` the connector's heartbeats are read too (collectors.heartbeats): those read by the
    time every topic is read to its end and every transaction of the poll handed on wait in `take_heartbeats()`."""

    def __init__(self, cfg: MySQLConfig, kafka: KafkaConfig, cdc: CdcConfig, *,
                 positions: dict[str, int] | None = None, start_gtid: str = "", copies: bool = False):
        """`copies`: `items` hands on each transaction as a `CdcCopy` (check mode: checked against the binlog's,
        whose clock the server's binlog end gives) and no heartbeats."""
        from oncewatch.collectors.canal import CanalAssembler

        self.cfg = cfg
        self.copies = copies
        self.kafka = kafka
        self.format = cdc.format
        self.from_latest = cdc.start_from == "latest" and not positions  # a first start, at the topics' ends
        self.assembler: Assembler | CanalAssembler = (
            CanalAssembler(cfg, cdc.topics, cdc.transaction_grace_seconds, cdc.time_zone) if cdc.format == "canal"
            else Assembler(cfg, start_gtid, cdc.transaction_grace_seconds, cdc.topic_prefix,
                           cdc.heartbeat_topic if cdc.format == "debezium" else ""))
        self.next: dict[str, int] = dict(positions or {})  # per "topic/partition": the next offset to read
        self.assembler.offsets = self.positions
        self.state = StreamState(last_position=BinlogPosition(gtid=start_gtid) if start_gtid else None)
        self.caught_up = False  # every partition read to its end and no transaction waiting for records
        self.heartbeats = HeartbeatReader(cdc.heartbeat_topic) if cdc.heartbeat_topic and cdc.format == "debezium" \
            else None
        if self.heartbeats is None:
            log.warning(NO_HEARTBEATS, extra={"event": "cdc_without_heartbeats", "format": cdc.format})
        self._heartbeats_seen = False  # the heartbeat topic exists (until it does, a warning at each start)
        self._beats: list[Heartbeat] = []  # placed, not yet taken by the caller
        self._stop = threading.Event()

    def start(self) -> None:
        """Nothing to connect ahead: `items` makes its consumer, and closes it as it ends."""

    def items(self, stop: threading.Event) -> Iterator[Transaction | CdcCopy | Heartbeats]:
        """In source mode the transactions with the connector's heartbeats behind those handed on before them (the
        change clock); in check mode (`copies`) the transactions as CdcCopys. Ends once `stop()` is called."""
        for tx in self.transactions(idle=True):
            if tx is not None:
                yield CdcCopy(tx) if self.copies else tx
            beats = self.take_heartbeats()
            if beats and not self.copies:
                yield Heartbeats(tuple(beats))

    def alive_at(self) -> float | None:
        return self.state.last_alive

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """The consumer is closed when `transactions()` ends."""

    def topics(self) -> list[str]:
        return self.assembler.topics()

    def take_heartbeats(self) -> list[Heartbeat]:
        """The heartbeats placed since the last call: every transaction the connector wrote before them is handed
        on already (they come once `transactions()` has yielded the last of its poll)."""
        beats, self._beats = self._beats, []
        return beats

    def positions(self) -> dict[str, int]:
        """Per partition, where a restart reads from: the first record of a transaction not handed on yet."""
        return {**self.next, **self.assembler.first_pending()}

    def status(self) -> CdcStatus:
        hb = self.heartbeats
        return CdcStatus(**vars(self.state), source=self.format, topics=tuple(self.topics()),
                         cdc=self.assembler.counts(), heartbeat_topic=hb.topic if hb else None,
                         heartbeats_read=hb.read if hb else 0, heartbeats_unreadable=hb.unreadable if hb else 0,
                         caught_up=self.caught_up)

    def transactions(self, poll_ms: int = 200, idle: bool = False) -> Iterator[Transaction | None]:
        """`idle`: also None after every poll that handed nothing on (a caller that marks its clock while the
        topics are quiet, in the same thread as what it hands on)."""
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        consumer = KafkaConsumer(**connection(self.kafka), enable_auto_commit=False,
                                 group_id=None, auto_offset_reset="earliest", client_id=f"{self.kafka.client_id}-cdc",
                                 request_timeout_ms=int(self.kafka.request_timeout_seconds * 1000) + 1000)
        a = self.assembler
        hb = self.heartbeats
        try:
            assigned: set[Any] = set()
            checked = 0.0
            if not self.next:  # a first start: its position is stored at once, so the next start goes on from here
                assigned, checked = self._assign(consumer, assigned), time.monotonic()
                yield self._handed_on(Transaction(rows=(), position=BinlogPosition(gtid=gtid_text(a.done)),
                                                  commit_time=0.0), time.time())
            while not self._stop.is_set():
                try:
                    if time.monotonic() - checked >= TOPICS_EVERY_SECONDS:  # a table's topic: at its first change
                        assigned, checked = self._assign(consumer, assigned), time.monotonic()
                    batches = consumer.poll(timeout_ms=poll_ms)
                except KafkaError as exc:
                    self._disconnected(exc)
                    self._stop.wait(1.0)
                    continue
                now = self.state.last_alive = time.time()
                if not self.state.connected:
                    self.state.connected, self.state.disconnected_since, self.state.last_error = True, None, None
                handed: list[Transaction] = []
                for tp, records in batches.items():
                    key, topic, partition, feed = f"{tp.topic}/{tp.partition}", tp.topic, tp.partition, a.feed
                    self.state.events_read += len(records)
                    for rec in records:
                        self.next[key] = rec.offset + 1  # before feed: what it hands on is stored with it
                        if hb is not None and topic == hb.topic:
                            hb.on_heartbeat(rec)
                            feed(topic, partition, rec, now, key)  # the connector writes: a grace runs on
                            continue
                        out = feed(topic, partition, rec, now, key)
                        if out:
                            handed += out
                        if hb is not None:
                            hb.on_record(rec.timestamp, self._open_after(topic))
                # a partition's high watermark is known once a fetch of it has come back: before that (just
                # started, or just assigned) nothing says it is read to its end
                read_to_end = all((end := consumer.highwater(tp)) is not None and consumer.position(tp) >= end
                                  for tp in assigned)
                handed += a.ready(now, behind=not read_to_end)
                notice = None if handed else a.replay_notice()
                handed += [notice] if notice is not None else []
                # caught up once every transaction of this poll is handed on, not while the first is: a caller that
                # marks its clock at caught_up (a group's change router) would vouch for the rest not yet handed
                caught_up = not a.waiting and read_to_end
                if handed:
                    self.caught_up = False
                for tx in handed:
                    yield self._handed_on(tx, now)
                self.caught_up = caught_up
                if caught_up and hb is not None:
                    self._beats += hb.take()
                if idle and not handed:
                    yield None
        finally:
            consumer.close()

    def _handed_on(self, tx: Transaction, now: float) -> Transaction:
        s = self.state
        s.last_position, s.last_event_time = tx.position, tx.commit_time or s.last_event_time
        s.seconds_behind = max(0.0, now - tx.commit_time) if tx.commit_time else s.seconds_behind
        s.rows_read += len(tx.rows)
        s.transactions_read += tx.complete
        return tx if tx.cdc is not None else dataclasses.replace(tx, cdc=CdcDelivery(self.positions()))

    def _open_after(self, topic: str) -> bool | None:
        """After a record of `topic` fed: whether a transaction of the connector is open, if it was a marker."""
        a = self.assembler
        return a.begun is not None if isinstance(a, Assembler) and topic == a.transaction_topic else None

    def _disconnected(self, exc: BaseException) -> None:
        if self.state.connected or self.state.disconnected_since is None:
            self.state.disconnected_since = time.time()
        self.state.connected = False
        self.state.last_error = f"{type(exc).__name__}: {exc}"
        self.state.reconnects += 1
        log.warning("CDC topics cannot be read", extra={"event": "cdc_disconnected", "error": self.state.last_error})

    def _assign(self, consumer: Any, assigned: set[Any]) -> set[Any]:
        """Every partition of the topics that exist now, each read on from where it was (or from the start)."""
        from kafka import TopicPartition

        latest, self.from_latest = self.from_latest, False  # only what is there at the first look
        consumer.topics()  # refreshes the client's metadata: topics made since
        parts = {TopicPartition(t, p) for t in self.topics() for p in consumer.partitions_for_topic(t) or ()}
        hb = self.heartbeats
        if hb is not None and not self._heartbeats_seen:
            self._heartbeats_seen = any(tp.topic == hb.topic for tp in parts)
            if not self._heartbeats_seen and not assigned:  # once a start, not at every look
                log.warning(NO_HEARTBEATS, extra={"event": "cdc_without_heartbeats", "topic": hb.topic})
        if parts == assigned:
            return assigned
        consumer.assign(sorted(parts))
        for tp in parts:
            key = f"{tp.topic}/{tp.partition}"
            at = self.next.get(key)
            if at is not None:
                consumer.seek(tp, at)
            elif latest:  # the topics there at a first start from "latest"
                consumer.seek_to_end(tp)
                self.next[key] = consumer.position(tp)
            else:  # the topics there at a first start from "earliest", and any made since
                consumer.seek_to_beginning(tp)
                self.next[key] = consumer.position(tp)
        return parts
