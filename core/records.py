"""The plain records that flow through oncewatch (docs/architecture.md §3).

Collectors produce `RowChange`, `EmittedEvent`, `QuarantinedRecord` and offset snapshots;
checks turn them into `Finding`s. Values inside rows keep their exact Python types
(Decimal money, datetime with milliseconds, None); `oncewatch.core.exact_json` round-trips them
through the store without losing precision.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from decimal import Decimal
from statistics import pstdev
from typing import Any, NamedTuple

from oncewatch.core.names import partition_key

# Which clock gave a commit time (docs/architecture.md §6), best first.
CLOCK_GTID_COMMIT_TS = "gtid_commit_ts"
CLOCK_ROW_COLUMN = "row_column"
CLOCK_BINLOG_HEADER = "binlog_header"
CLOCK_READ_TIME = "read_time"

OP_INSERT = "insert"
OP_UPDATE = "update"
OP_DELETE = "delete"


class Packed(tuple[Any, ...]):
    """A tuple of records that is pickled once: what it was first pickled to, or unpickled from, it pickles to again.

    A transaction's rows and a poll's events are built as one in a reader's process (oncewatch.monitor.remote) and
    cross pickled to the judge's, which reads them and hands them on, as they are, in its checkpoints to the store's
    writer process (oncewatch.monitor.saver): the judge does not pickle them again, which was a sixth of its thread
    (bench/monitor_throughput.py --writer process). Equal to the plain tuple of the same records."""

    def __reduce__(self) -> tuple[Any, ...]:
        packed = self.__dict__.get("packed")
        if packed is None:
            packed = self.__dict__["packed"] = pickle.dumps(tuple(self), pickle.HIGHEST_PROTOCOL)
        return _unpacked, (packed,)


def _unpacked(packed: bytes) -> Packed:
    records = Packed(pickle.loads(packed))
    records.__dict__["packed"] = packed
    return records


@dataclass(frozen=True)
class BinlogPosition:
    """Where the binlog collector resumes: after the last fully handled transaction.

    `gtid` is MariaDB's `@@gtid_binlog_pos` style set ("0-1-123"); `file`/`pos` are the
    binlog coordinates of the end of the same transaction, kept for evidence and display.
    A transaction too large to hold is handed on in fragments: after one that is not its last,
    `within_gtid` names that transaction and `within_rows` counts its rows handed on so far,
    which a resume skips (`gtid` still ends before it).
    """

    gtid: str
    file: str = ""
    pos: int = 0
    within_gtid: str = ""
    within_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"gtid": self.gtid, "file": self.file, "pos": self.pos}
        if self.within_gtid:
            d |= {"within_gtid": self.within_gtid, "within_rows": self.within_rows}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BinlogPosition:
        return cls(gtid=str(d["gtid"]), file=str(d.get("file", "")), pos=int(d.get("pos", 0)),
                   within_gtid=str(d.get("within_gtid", "")), within_rows=int(d.get("within_rows", 0)))


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row of one committed transaction (slots: a transaction's worth of them is held at a time)."""

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

    def __reduce__(self) -> tuple[Any, ...]:
        # What a reader's process sends the monitor, a row at a time: by its fields, a third of the cost of the
        # slots' default (oncewatch.monitor.remote).
        return RowChange, (self.schema, self.table, self.op, self.pk, self.before, self.after, self.txid,
                           self.row_index, self.binlog_file, self.end_pos, self.commit_time, self.commit_clock,
                           self.snapshot)

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
class QuarantinedRows:
    """A binlog rows event of a watched table that could not be decoded (a string its charset
    cannot hold, say): kept with its coordinates so a person can read it with mysqlbinlog."""

    txid: str  # the transaction's GTID
    binlog_file: str
    event_pos: int  # the rows event's end position in binlog_file
    table: str  # schema.table
    reason: str  # names.BINLOG_QUARANTINE_REASONS
    detail: str


@dataclass(frozen=True)
class SchemaChange:
    """A DDL statement on a watched table, with the table's columns as the server has them after
    it ({} when the table is gone): what checks.shape judges."""

    table: str  # schema.table
    kind: str  # "alter", "rename", "drop", "truncate", "create"
    statement: str  # the statement, cut to 500 characters
    columns: dict[str, str]  # column -> information_schema DATA_TYPE
    txid: str
    binlog_file: str
    pos: int


class Replay(NamedTuple):
    """Records of one CDC partition read again after a connector restart (transactions already delivered), one
    run of them: from `first` to `last` offset, `records` of them, of the transactions `first_gtid`..`last_gtid`."""

    partition: str  # "topic/partition"
    first: int
    last: int
    records: int
    first_gtid: str
    last_gtid: str


@dataclass(frozen=True)
class CdcDelivery:
    """How a CDC pipeline delivered one transaction (collectors.cdc): the topics' offsets to resume from after it,
    its GTID, the records its END counted for the watched tables (None: no END, a TRUNCATE's or the snapshot's), the
    records that came, where its first came at ("topic/partition@offset"), and the replays read since the
    transaction before it."""

    offsets: dict[str, int]
    txid: str = ""  # its GTID ("" for the snapshot's and for a notice of replays alone)
    expected: int | None = None
    records: int = 0
    first_record: str = ""
    replays: tuple[Replay, ...] = ()
    # the newest commit time delivered before it, where the deliveries before it went elsewhere (checks.shards)
    delivered_until: float = 0.0

    @property
    def incomplete(self) -> bool:
        return self.expected is not None and self.records < self.expected


@dataclass(frozen=True)
class Transaction:
    """The rows of one committed transaction and the position right after its commit; rows events
    that could not be decoded are in `quarantined` instead, DDL on watched tables in `schema_changes`.

    A transaction of more rows than the collector holds at once comes as fragments in binlog order,
    every one but the last with `complete=False` and a position `within` it (BinlogPosition); a
    fragment's `commit_time` is the binlog header time of its last rows event, since the commit's
    own is not read yet. A bootstrap comes the same way: chunks of the watched tables' rows
    (`snapshot`), the last one `complete` with the snapshot's position, where the tail starts.
    From a CDC pipeline (collectors.cdc) `position` holds the GTID set handed on and the source's
    coordinates, and `cdc` how the pipeline delivered it (CdcDelivery)."""

    rows: tuple[RowChange, ...]
    position: BinlogPosition
    commit_time: float
    quarantined: tuple[QuarantinedRows, ...] = ()
    schema_changes: tuple[SchemaChange, ...] = ()
    complete: bool = True
    snapshot: bool = False
    cdc: CdcDelivery | None = None


@dataclass(frozen=True)
class CdcCopy:
    """CDC check mode: a transaction as the CDC pipeline delivered it, beside the binlog's (which the rules read):
    checked against it by checks.pipeline, not fed to the rules."""

    tx: Transaction


@dataclass(frozen=True)
class Heartbeat:
    """A CDC connector's heartbeat (Debezium's `__debezium-heartbeat.<prefix>`), read once every record the
    connector wrote before it is read: the time it was written (its `ts_ms`, the connector's clock), how many
    records of the topics read were written between the heartbeat before it and it (by their Kafka timestamps, a
    tie counted in; -1 when no heartbeat before it was read), whether a transaction of the connector was begun
    and not ended when it was written, and if so for how long (seconds, by Kafka timestamps) the connector had
    then written nothing read: Debezium writes a BEGIN and no END for a DDL, so an open transaction that stays
    quiet may be over. `ended`: the binlog time of the newest transaction END the connector wrote before it (0: none
    read yet), a transaction that touched no captured table included."""

    at: float
    between: int
    open: bool
    open_quiet: float = 0.0
    ended: float = 0.0


@dataclass(frozen=True)
class Heartbeats:
    """CDC source mode: heartbeats read, queued behind every transaction handed on before them (checks.clocks
    turns them into the change clock)."""

    beats: tuple[Heartbeat, ...]


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
        return f"{partition_key(self.topic, self.partition)}@{self.offset}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic, "partition": self.partition, "offset": self.offset,
            "timestamp_ms": self.timestamp_ms, "timestamp_type": self.timestamp_type,
            "key": self.key, "headers": [list(h) for h in self.headers], "payload": self.payload,
            "format": self.format, "keys": self.keys, "cdc": self.cdc,
        }



@dataclass(frozen=True)
class QuarantinedRecord:
    """A Kafka record that could not be parsed: kept with its reason and its bytes, never dropped."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    reason: str
    detail: str
    size: int
    preview: str
    # The record as it came, so nothing is lost (a too_large one's value is left on the broker: its
    # coordinates find it there). A header key that is not UTF-8 holds its bytes in surrogate escapes:
    # `key.encode("utf-8", "surrogateescape")` gives them back.
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_type: str | None = None  # CreateTime | LogAppendTime; None when unknown (a batch that failed its CRC)


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


VERDICT_VERIFIED = "verified"
VERDICT_VIOLATED = "violated"
VERDICT_PENDING = "pending"


@dataclass(frozen=True)
class TradeVerdict:
    """Whether one successful payment (a trade_no) happened exactly once (issue 45): verified once its order has one
    successful payment, each configured effect exists once and every change that must be announced was, within the
    rules' graces and with no finding touching it; violated from the first finding that touches it (`rule`);
    pending while a grace still runs. `amount` is the paid amount in the shop's unit (None when not configured),
    `committed_at` the payment's commit time and `reached_at` when the verdict was reached (None while pending).
    Times are the stream clocks the rules judge by (checks.verdicts), never the host's."""

    trade_no: str
    order_id: str | None
    amount: Decimal | None
    verdict: str
    rule: str | None
    committed_at: float
    reached_at: float | None
    verified_at: float | None = None  # when it was verified, kept when a later finding violated it


@dataclass(frozen=True)
class PartitionStatus:
    """Where the events collector stands on one partition: the next offset it reads, and the end
    offset last learned with when it was learned (every record produced before `end_at` is below
    `end`). The Kafka clock of the absence rules is made of these (oncewatch.checks.clocks)."""

    topic: str
    partition: int
    position: int
    end: int
    end_at: float

    @property
    def key(self) -> str:
        return partition_key(self.topic, self.partition)


# ---------------------------------------------------------------- offsets snapshots

@dataclass(frozen=True)
class PartitionRange:
    """The offsets one watched partition holds on the broker: earliest kept, end (next to write)."""

    topic: str
    partition: int
    earliest: int
    end: int


@dataclass(frozen=True)
class GroupPartition:
    """One consumer group on one partition. `committed` is None where the group never committed
    there (Kafka's -1): then lag and lag_seconds are None too, never 0."""

    topic: str
    partition: int
    committed: int | None
    lag: int | None
    lag_seconds: float | None


@dataclass(frozen=True)
class GroupOffsets:
    """A watched consumer group: Kafka's state name (Stable, Empty, ...) and its partitions."""

    group: str
    state: str | None
    partitions: tuple[GroupPartition, ...]

    @property
    def total_lag(self) -> int:
        """Records behind over all its partitions whose lag is known (F11's reading of the group)."""
        return sum(p.lag for p in self.partitions if p.lag is not None)

    def lags_by_topic(self) -> dict[str, list[int]]:
        """The known lags of each topic, in partition order (partitions without a commit left out)."""
        out: dict[str, list[int]] = {}
        for p in self.partitions:
            if p.lag is not None:
                out.setdefault(p.topic, []).append(p.lag)
        return out

    def skew_by_topic(self) -> dict[str, Skew]:
        """F12's reading per topic, for topics with at least two partitions whose lag is known (one
        partition cannot be uneven)."""
        return {topic: Skew.of(lags) for topic, lags in self.lags_by_topic().items() if len(lags) >= 2}


class Skew(NamedTuple):
    """How uneven one group's lag is across a topic's partitions: the population standard deviation
    (the seed article's measure, in records) and that deviation over the mean lag (relative: about
    0 when every partition lags alike, as in a stall of the whole group; about 1.4 for one of
    three partitions stuck while the others keep up)."""

    stddev: float
    relative: float

    @classmethod
    def of(cls, lags: list[int]) -> Skew:
        sd, mean = pstdev(lags), sum(lags) / len(lags)
        return cls(sd, sd / mean if mean else 0.0)


@dataclass(frozen=True)
class OffsetsSnapshot:
    """One poll of the offsets collector: watched partitions' ranges, watched groups' commits.

    `error` says what could not be read (the rest is what could); `polled_at` is when it was
    taken, so a reading that stopped coming shows its age."""

    polled_at: float
    error: str | None
    partitions: tuple[PartitionRange, ...] = ()
    groups: tuple[GroupOffsets, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"polled_at": self.polled_at, "error": self.error,
                "partitions": [p.__dict__.copy() for p in self.partitions],
                "groups": [{"group": g.group, "state": g.state, "partitions": [p.__dict__.copy() for p in g.partitions]}
                           for g in self.groups]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OffsetsSnapshot:
        return cls(polled_at=float(d.get("polled_at") or 0.0), error=d.get("error"),
                   partitions=tuple(PartitionRange(p["topic"], p["partition"], p["earliest"], p["end"])
                                    for p in d.get("partitions", ())),
                   groups=tuple(GroupOffsets(g["group"], g.get("state"), tuple(
                       GroupPartition(p["topic"], p["partition"], p.get("committed"), p.get("lag"),
                                      p.get("lag_seconds")) for p in g.get("partitions", ())))
                       for g in d.get("groups", ())))
