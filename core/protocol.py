"""The typed values that cross a box, apart from the records (oncewatch.core.records): what each running part
says of itself (its status), what its reader says (its health), the health rows the monitor writes for
/metrics and the pages, the items on the monitor's queue, and the one lifecycle every part that reads follows.

Statuses are frozen snapshots: a part keeps its own mutable state and hands out a new value from `status()`,
so a value read by another thread, written to the store or compared in a test never changes under it. The
store encodes and decodes them (oncewatch.store.codec); the dashboards read their fields.

Sections, each appended to on its own: collectors' statuses, readers' health, health rows, queue items,
the lifecycle, a group's parts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

from oncewatch.core.records import (BinlogPosition, CdcCopy, EmittedEvent, Heartbeats, OffsetsSnapshot,
                                    PartitionStatus, QuarantinedRecord, Transaction)

# ---------------------------------------------------------------- collectors' statuses


@dataclass(frozen=True)
class BinlogStatus:
    """The binlog collector's (collectors.binlog): the stream, where it stands, what it read."""

    connected: bool = False
    seconds_behind: float | None = None
    last_position: BinlogPosition | None = None
    last_event_time: float | None = None
    last_alive: float | None = None  # any event or heartbeat from the server, or a reconnect attempt
    last_error: str | None = None
    disconnected_since: float | None = None
    reconnects: int = 0
    rows_read: int = 0
    transactions_read: int = 0
    events_read: int = 0  # every event the server sent, handed on or skipped: a replay would show as a jump


@dataclass(frozen=True)
class BootstrapStatus(BinlogStatus):
    """The first bootstrap's, in the binlog tail's place until the tail can start (collectors.binlog.bootstrap):
    the rows of the watched tables read so far and the table it reads now."""

    connected: bool = True
    bootstrapping: bool = True
    bootstrap_rows: int = 0
    bootstrap_table: str = ""


@dataclass(frozen=True)
class CdcCounts:
    """What became of the CDC topics' records (collectors.cdc's assemblers)."""

    incomplete_transactions: int = 0
    replayed_records: int = 0
    late_records: int = 0
    unreadable_records: int = 0
    open_transactions: int = 0
    ddl_records: int = 0  # Canal's DDL records read (a Debezium source counts none)


@dataclass(frozen=True)
class CdcStatus(BinlogStatus):
    """The CDC reader's (collectors.cdc): the binlog collector's fields for the transactions it hands on, with
    its format, topics, counts and the connector's heartbeats read."""

    source: str = ""  # the format: debezium or canal
    topics: tuple[str, ...] = ()
    cdc: CdcCounts = CdcCounts()
    heartbeat_topic: str | None = None
    heartbeats_read: int = 0
    heartbeats_unreadable: int = 0
    caught_up: bool = False  # every partition read to its end and no transaction waiting for records


@dataclass(frozen=True)
class Gap:
    """Offsets of a partition that were gone from the broker before the monitor read them."""

    topic: str
    partition: int
    from_offset: int
    to_offset: int
    kind: str  # "deleted" (retention ran ahead of the monitor) | "truncated" (the log shrank under it)
    at: float


class EndKnown(NamedTuple):
    """An events reader's last learned end of one partition ('topic/partition'), the partition's leader epoch then,
    and the end it holds, not vouched for since the broker restarted (None when it holds none)."""

    partition: str
    end: int
    epoch: int | None
    held: int | None = None


@dataclass(frozen=True)
class BrokerKnown:
    """What an events reader knew of the broker, handed to the reader after it: the same reader's process started
    again, the monitor's next run (its checkpoint), a group's partition moved to another router. A broker that
    restarted, or went away and came back, is then seen as the reader before would have seen it, not taken for a
    broker whose ends vouch for everything stamped before they were learned (collectors.kafka_events._learn)."""

    ends: tuple[EndKnown, ...] = ()
    settle_until: float = 0.0  # the broker was away: no end vouches before this time


@dataclass(frozen=True)
class KafkaEventsStatus:
    """The events collector's (collectors.kafka_events), for the health row, /metrics and the pages. `state`
    says in words what it does, as of when the status was taken."""

    connected: bool = False
    state: str = "connecting"
    last_error: str | None = None
    disconnected_since: float | None = None
    reconnects: int = 0
    records_read: int = 0
    events_read: int = 0
    waiting_for: tuple[str, ...] = ()
    partitions: tuple[PartitionStatus, ...] = ()
    gaps: tuple[Gap, ...] = ()
    known: BrokerKnown = BrokerKnown()  # the ends learned, their epochs, those held, and how long they settle

    @property
    def held(self) -> tuple[str, ...]:
        """The partitions whose end is not vouched for since their broker restarted."""
        return tuple(e.partition for e in self.known.ends if e.held is not None)

    @property
    def caught_up(self) -> bool:
        """Every assigned partition read to its last known end (see `KafkaEventCollector.caught_up`)."""
        return self.connected and all(p.position >= p.end for p in self.partitions)

    def unread(self) -> int:
        """Records on the watched partitions not read yet."""
        return sum(max(0, p.end - p.position) for p in self.partitions)


# The offsets poller's status is its last poll: OffsetsSnapshot (core.records), polled_at 0.0 before the first.
NO_OFFSETS = OffsetsSnapshot(polled_at=0.0, error=None)

Status = BinlogStatus | KafkaEventsStatus | OffsetsSnapshot


# ---------------------------------------------------------------- readers' health


class ReaderHealth(NamedTuple):
    """A reader's side of its part's health row (oncewatch.monitor.readers): whether its thread runs, its
    failures, when its part last showed life, and the CPU its part's process used (a part read in a process of
    its own, oncewatch.monitor.remote; None for one read in a thread of the monitor's process)."""

    running: bool = True
    failures: int = 0
    last_failure: str | None = None
    alive_at: float | None = None
    restart_at: float | None = None
    cpu_seconds: float | None = None


# ---------------------------------------------------------------- health rows


@dataclass(frozen=True)
class ComponentHealth:
    """One running part's health row: its status and its reader's health. `up`: its reader running and the part
    connected (the offsets poller: answered), as last reported."""

    status: Status
    reader: ReaderHealth = ReaderHealth()

    @property
    def up(self) -> bool:
        if not self.reader.running:
            return False
        if isinstance(self.status, OffsetsSnapshot):
            return self.status.error is None
        return self.status.connected

    @property
    def alive_at(self) -> float | None:
        return self.reader.alive_at


@dataclass(frozen=True)
class Slo:
    """The [slo] objective the monitor runs with, published for the burn-rate alerts."""

    objective: float
    within_seconds: float


@dataclass(frozen=True)
class StoreSpace:
    """The store against its disk budget (`[store] max_bytes`), as the monitor last measured it: bytes in use, the
    budget, when raw records were last pruned for it, and whether the budget is spent on what is never pruned (the
    engine's open state, the findings) with no raw record left to prune."""

    used_bytes: int
    max_bytes: int
    pruned_at: float | None = None
    exhausted: bool = False


@dataclass(frozen=True)
class MonitorHealth:
    """The monitor's own row: its verdict on itself (oncewatch.monitor.verdict), how far each stream is read,
    what cannot judge now, and the thresholds it runs with. `shape_problems` are checks.shape's, as it gives them."""

    started_at: float
    pid: int
    binlog_time: float
    kafka_time: float
    caught_up: bool
    verdict: str
    reasons: tuple[str, ...] = ()
    lag_seconds: dict[str, float] = field(default_factory=dict)
    blind_rules: tuple[str, ...] = ()
    blind_tables: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rule_tables: dict[str, tuple[str, ...]] = field(default_factory=dict)
    shape_problems: tuple[dict[str, object], ...] = ()
    probe_error: str | None = None
    store_outages: int = 0
    store_outage_seconds: float = 0.0
    store_writer_deaths: int = 0  # the store's writer process died, and the monitor started again from the checkpoint
    thresholds: dict[str, dict[str, float]] = field(default_factory=dict)
    slo: Slo | None = None
    store_space: StoreSpace | None = None  # None without a budget
    cpu_seconds: float | None = None  # the monitor's own process: the rules, the store, the readers in threads
    forkserver_cpu_seconds: float | None = None  # the process the readers' processes are forked from
    store_writer_cpu_seconds: float | None = None  # the process that writes the checkpoints (oncewatch.monitor.saver)

    def cannot_judge(self) -> tuple[str, ...]:
        """The rules blind everywhere, then per rule the tables a shape problem blinds it for ("F7 on t")."""
        return (*self.blind_rules, *(f"{rule} on {', '.join(tables)}" for rule, tables in self.blind_tables.items()
                                     if rule not in self.blind_rules))


@dataclass(frozen=True)
class RoutersHealth:
    """A group member's routers, as its health row says: the partitions they read, whether one reads the change
    source, the messages written to the internal topic, the change source's transactions handed on."""

    partitions: tuple[str, ...] = ()
    change_source: bool = False
    written: int = 0
    change_transactions: int = 0
    records: int = 0  # the internal-topic records that carried the messages written (batches)
    stale_positions: int = 0  # change source positions refused: another router had stored it further


@dataclass(frozen=True)
class ShardHealth:
    """A shard a group member judges: what it applied and repeated, its offset, its clocks."""

    records: int = 0
    repeated: int = 0
    offset: int = 0
    binlog_time: float = 0.0
    kafka_time: float = 0.0


@dataclass(frozen=True)
class GroupMemberHealth:
    """One member of a group ([group]): its share of the work and its outages (oncewatch.monitor.group.run)."""

    at: float
    member: str
    shards: dict[str, ShardHealth] = field(default_factory=dict)
    routers: RoutersHealth = RoutersHealth()
    fenced: int = 0
    applied: int = 0
    rejoins: int = 0
    store_outages: int = 0
    store_outage_seconds: float = 0.0
    kafka_outages: int = 0
    kafka_outage_seconds: float = 0.0
    purged: int = 0  # internal records deleted once every shard had committed past them (the leader's)
    purge_failures: int = 0


Health = ComponentHealth | MonitorHealth | GroupMemberHealth


@dataclass(frozen=True)
class HealthRow:
    """A health row as the store hands it out: the component's name, its health, when it was written."""

    component: str
    health: Health
    updated_at: float


# ---------------------------------------------------------------- queue items


@dataclass(frozen=True)
class EventBatch:
    """What one poll of the events collector read. `positions` covers every assigned partition, not only those
    read."""

    events: tuple[EmittedEvent, ...]
    quarantined: tuple[QuarantinedRecord, ...]
    positions: dict[str, int]
    positions_changed: bool  # write the checkpoint even with no records (e.g. a first start at "latest")


@dataclass(frozen=True)
class ReaderFailed:
    """Put on the queue by a reader whose loop raised; everything it read before is ahead of it. `fatal`: the
    part's own error (a person has to act), not a bug."""

    reader: str
    error: BaseException
    at: float
    fatal: bool = False


Item = Transaction | CdcCopy | Heartbeats | EventBatch | OffsetsSnapshot | ReaderFailed


# ---------------------------------------------------------------- the lifecycle


@runtime_checkable
class Part(Protocol):
    """Every running part that reads: configured by its constructor (no I/O), then `start()` (connects),
    `items(stop)` (what it reads, until `stop` is set, in the thread that calls it), `stop()` (from any thread),
    `close()` (drops its connections), and `status()` at any time."""

    def start(self) -> None: ...

    def items(self, stop: threading.Event) -> Iterator[Item]: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...

    def status(self) -> Status: ...

    def alive_at(self) -> float | None:
        """When it last showed life (a read, a poll that returned, a server heartbeat, a pause while ahead)."""


@runtime_checkable
class BinlogTail(Part, Protocol):
    """A part that can ask its server where the binlog ends now (the binlog collector): how far is left to read."""

    def current_server_position(self) -> BinlogPosition: ...


@runtime_checkable
class EventSource(Part, Protocol):
    """A part that can ask its broker whether every partition it reads is read to its end (the events collector)."""

    def caught_up(self, timeout_ms: int | None = None) -> bool: ...


# ---------------------------------------------------------------- group
# A group's parts (oncewatch.monitor.group, each a GroupPart): each one's status, as GroupMember.status() gathers
# them; its health row (GroupMemberHealth, above) is made of them.


@dataclass(frozen=True)
class ShardStatus:
    """One shard a member judges: its work, what it skipped as written again, how far it read, its clocks."""

    shard: int
    records: int
    repeated: int
    offset: int
    binlog_time: float
    kafka_time: float


@dataclass(frozen=True)
class JudgesStatus:
    """A member's judges: its shards, the shards it lost to another owner's newer claim, its share of the work, and
    (as the leader's) the internal records purged once every shard had committed past them, and purges refused."""

    running: bool
    shards: tuple[ShardStatus, ...]
    fenced: int
    applied: int
    rejoins: int
    purged: int = 0
    purge_failures: int = 0


@dataclass(frozen=True)
class RoutersStatus:
    """A member's routers: the sources it reads (event partitions, the lease), what it wrote to the internal
    topic (messages, and the records that carried them), and the change source's positions it was refused
    storing (another router had stored it further: this one had lost the lease)."""

    running: bool
    partitions: tuple[str, ...]
    change_source: bool
    written: int
    records: int
    change_transactions: int
    rejoins: int
    stale_positions: int = 0


@dataclass(frozen=True)
class OffsetsPollerStatus:
    """The consumer groups' offsets poller: the snapshots it handed the leader shard."""

    running: bool
    snapshots: int


@dataclass(frozen=True)
class GroupMemberStatus:
    """One group instance, every part of it, and the outages it lived through."""

    at: float
    member: str
    judges: JudgesStatus
    routers: RoutersStatus
    offsets: OffsetsPollerStatus
    store_outages: int
    store_outage_seconds: float
    kafka_outages: int
    kafka_outage_seconds: float
