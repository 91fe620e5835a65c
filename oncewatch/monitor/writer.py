"""The judge: feeds what the readers read to the engine and hands what it applied to the store with its checkpoints.

The engine judges every batch as it comes (`apply`); the store keeps up on a cadence. A checkpoint
(oncewatch.monitor.checkpoints) is one store transaction, written by the saver (oncewatch.monitor.saver: the judge
itself, or with `[store] writer = "process"` a process of its own while the rules go on), holding the raw records
read since the last one, their entity index, the engine's state delta, the findings and trade verdicts it drained
and the read positions (docs/architecture.md §7), so a kill -9 at any instant resumes from the last checkpoint with
nothing lost and nothing doubled: what was read since is read and judged again, the findings are the same by id and
verdicts only move forward. A checkpoint is taken every `[store] checkpoint_seconds` (0: every batch), at once when
a batch drains a new or changed finding (a finding is never shown before the records and the state behind it are
saved, nor held back by the cadence), after each fragment of a transaction too large to hold and each chunk of a
bootstrap, when CHECKPOINT_RECORDS records wait for it, and at a clean stop (`checkpoint`). Between checkpoints a
batch writes only what the engine's spilled state drops (engine_state.ColdEntries), each its own short transaction,
once the checkpoint in flight is written. Saving the state once a second rather than every batch writes an entry
changed several times in that second once, and one put and gone within it never (issue 44). `Progress` is what has
been applied: the positions a restarted reader resumes from, and the clocks of the absence rules.

A first start's bootstrap comes through `apply` too, chunk by chunk, each with a checkpoint, while Kafka
is read and health written: a bootstrap of millions of rows is not one store transaction held for
minutes with nothing else moving. Until its last chunk the store says a bootstrap is under way
(`BOOTSTRAP`); a start that finds it so empties the store, which held nothing else, and bootstraps
again (a consistent snapshot cannot be resumed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from oncewatch.checks.clocks import BinlogEnd, binlog_watermark, heartbeat_watermark, kafka_watermark
from oncewatch.checks.engine import Engine
from oncewatch.collectors.binlog import bootstrap
from oncewatch.collectors.kafka_events import EventBatch
from oncewatch.core.config import Config
from oncewatch.core.gtids import gtid_set
from oncewatch.core.names import (BINLOG_CHECKPOINT, BOOTSTRAP, CDC_CHECKPOINT, CDC_GTID_CHECKPOINT,
                                  KAFKA_CHECKPOINT, KAFKA_KNOWN_CHECKPOINT, partition_key)
from oncewatch.core.protocol import BrokerKnown, KafkaEventsStatus
from oncewatch.core.records import (BinlogPosition, CdcCopy, EmittedEvent, Finding, Heartbeat, Heartbeats,
                                    OffsetsSnapshot, QuarantinedRecord, QuarantinedRows, RowChange,
                                    TradeVerdict, Transaction)
from oncewatch.monitor.checkpoints import Checkpoint, write
from oncewatch.monitor.entities import EntityIndex
from oncewatch.monitor.saver import InlineSaver, ProcessSaver
from oncewatch.store import Store, engine_state, retention
from oncewatch.store.codec import known_from_value, known_value

log = logging.getLogger("oncewatch.monitor.writer")

# Raw records held for the next checkpoint at most: a checkpoint comes sooner when this many wait (memory).
CHECKPOINT_RECORDS = 50_000

Applied = Transaction | CdcCopy | Heartbeats | EventBatch | OffsetsSnapshot


@dataclass
class Progress:
    """What the writer has committed so far, and the clocks derived from it."""

    last_change_at: float = field(default_factory=time.time)  # for --until-idle
    binlog_time: float = 0.0
    kafka_time: float = 0.0
    newest_event_ms: dict[str, int] = field(default_factory=dict)  # partition key -> newest timestamp applied
    binlog_caught_up: bool = False
    kafka_caught_up: bool = False
    binlog: BinlogPosition | None = None  # the binlog position the engine and the store have taken in
    cdc: dict[str, int] = field(default_factory=dict)  # CDC mode: the CDC topics' offsets taken in
    cdc_gtid: str = ""  # CDC check mode: the GTID set the CDC topics delivered (in source mode, `binlog`'s)
    kafka: dict[str, int] = field(default_factory=dict)  # likewise, partition key -> next offset
    kafka_known: BrokerKnown | None = None  # what the events reader last knew of the broker, for the next reader
    offsets: OffsetsSnapshot | None = None  # the last offsets snapshot applied
    binlog_ends: list[BinlogEnd] = field(default_factory=list)  # the server's binlog ends probed, not yet applied
    bootstrapped_rows: int = 0  # rows of the watched tables applied by the bootstrap under way
    heartbeat: Heartbeat | None = None  # CDC source mode: the connector's last heartbeat applied


@dataclass
class Unsaved:
    """What the engine has applied since the last checkpoint and the store is still to save with it."""

    # in batches as read (a transaction's rows, a poll's events: core.records.Packed from a reader's process)
    rows: list[Sequence[RowChange]] = field(default_factory=list)
    events: list[Sequence[EmittedEvent]] = field(default_factory=list)
    records: int = 0  # rows and events in them
    binlog_quarantined: list[QuarantinedRows] = field(default_factory=list)
    quarantined: list[QuarantinedRecord] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    verdicts: list[TradeVerdict] = field(default_factory=list)
    checkpoints: dict[str, Any] = field(default_factory=dict)  # checkpoint name -> the position read to
    states: dict[str, Any] = field(default_factory=dict)  # state name -> its value, None to clear it


class Writer:
    """`saver` writes the checkpoints (oncewatch.monitor.saver): the writer itself, by default."""

    def __init__(self, cfg: Config, store: Store, engine: Engine, index: EntityIndex,
                 saver: InlineSaver | ProcessSaver | None = None):
        self.cfg = cfg
        self.unended_seconds = cfg.cdc.unended_transaction_seconds if cfg.cdc else 0.0  # for the CDC change clock
        self.store = store
        self.engine = engine
        self.index = index
        self.saver = saver or InlineSaver(store, index, cfg.slo.within_seconds)
        self.progress = Progress()
        self.unsaved = Unsaved()
        self.saved_at = time.monotonic()
        self._forgotten = store.entity_ids.forgotten  # names retention had deleted at the last checkpoint
        engine.memory.spill_to(engine_state.ColdEntries(store, self.saver.settle, self.saver.handed),
                                cfg.store.memory_entries)

    # -------------------------------------------------------------- start-up

    def restore(self) -> BinlogPosition | None:
        """Engine state and positions from the store; None when the watched tables are to be bootstrapped
        first (a new store, or one whose first bootstrap was interrupted: emptied here)."""
        interrupted = self.store.state(BOOTSTRAP)
        if interrupted is not None:
            log.warning("the first bootstrap of this store was interrupted; the store is emptied and the "
                        "bootstrap begun again", extra={"event": "bootstrap_redone", **interrupted})
            with self.store.batch() as tx:
                tx.empty()
        saved_state = engine_state.load(self.store, self.engine.memory.hot_limits())
        if saved_state is not None:
            self.engine.restore(saved_state)
        self.progress.kafka = self.store.checkpoint(KAFKA_CHECKPOINT) or {}
        known = self.store.checkpoint(KAFKA_KNOWN_CHECKPOINT)
        self.progress.kafka_known = known_from_value(known) if known is not None else None
        self.progress.cdc = self.store.checkpoint(CDC_CHECKPOINT) or {}
        self.progress.cdc_gtid = (self.store.checkpoint(CDC_GTID_CHECKPOINT) or {}).get("gtid", "")
        saved = self.store.checkpoint(BINLOG_CHECKPOINT)
        self.progress.binlog = BinlogPosition.from_dict(saved) if saved is not None else None
        return self.progress.binlog

    def bootstrap(self) -> BinlogPosition:
        """`oncewatch bootstrap`: the watched tables' current rows into the engine and the store, streamed in
        chunks inside one store transaction that ends with the binlog checkpoint of the snapshot, so that a
        kill before the end leaves the store as it was. The engine's state is saved after every chunk, so
        that its spilled spaces can forget what is saved (memory stays bounded whatever the tables' size)."""
        log.info("bootstrapping watched tables", extra={"event": "bootstrap_start",
                                                         "tables": list(self.cfg.mysql.tables)})
        count = 0
        with self.store.batch() as tx:
            for snapshot in bootstrap(self.cfg.mysql):
                self.engine.on_transaction(snapshot)
                count += len(snapshot.rows)
                self.unsaved.rows.append(snapshot.rows)
                self.unsaved.findings.extend(self.engine.drain())
                self.unsaved.verdicts.extend(self.engine.drain_verdicts())
                write(tx, self._take(), self.index, self.cfg.slo.within_seconds)
            position = snapshot.position
            tx.set_checkpoint(BINLOG_CHECKPOINT, position.to_dict())
        log.info("bootstrap done", extra={"event": "bootstrap_done", "gtid": position.gtid, "rows": count})
        return position

    # -------------------------------------------------------------- batches

    def apply(self, items: Iterable[Applied], kafka_status: Callable[[], KafkaEventsStatus | None] | None) -> None:
        """`items` in order through the engine and a tick of its timer, ending with a checkpoint handed to the saver
        when one is due (see above). `kafka_status` gives the events collector's status, None while it has none
        (None without Kafka)."""
        p, u = self.progress, self.unsaved
        due = False
        self.saver.settle(block=False)
        if self.saver.changed():
            p.last_change_at = time.time()
        for item in items:
            if isinstance(item, Transaction):
                self.engine.on_transaction(item)
                if item.rows:
                    u.rows.append(item.rows)
                    u.records += len(item.rows)
                    p.last_change_at = time.time()
                u.binlog_quarantined.extend(item.quarantined)
                p.binlog_time = max(p.binlog_time, item.commit_time)
                if item.cdc is not None:
                    p.cdc = item.cdc.offsets
                    u.checkpoints[CDC_CHECKPOINT] = p.cdc
                # A bootstrap's chunk, and a fragment of a transaction too large to hold, is saved with the state
                # it made as it comes: a kill resumes after the last one, inside the snapshot or transaction.
                due = due or item.snapshot or not item.complete
                if item.snapshot:
                    p.bootstrapped_rows += len(item.rows)
                    u.states[BOOTSTRAP] = {"gtid": item.position.gtid, "rows": p.bootstrapped_rows}
                    if not item.complete:
                        continue
                    u.states[BOOTSTRAP] = None
                    log.info("bootstrap done", extra={"event": "bootstrap_done", "gtid": item.position.gtid,
                                                      "rows": p.bootstrapped_rows})
                p.binlog = item.position
                u.checkpoints[BINLOG_CHECKPOINT] = p.binlog.to_dict()
            elif isinstance(item, Heartbeats):
                vouched, p.heartbeat = heartbeat_watermark(item.beats, p.heartbeat, self.unended_seconds)
                p.binlog_time = max(p.binlog_time, vouched or 0.0)
            elif isinstance(item, CdcCopy):
                self.engine.on_cdc_copy(item.tx)
                u.binlog_quarantined.extend(item.tx.quarantined)
                if item.tx.cdc is not None:
                    p.cdc = item.tx.cdc.offsets
                    u.checkpoints[CDC_CHECKPOINT] = p.cdc
                p.cdc_gtid = item.tx.position.gtid
                u.checkpoints[CDC_GTID_CHECKPOINT] = {"gtid": p.cdc_gtid}
            elif isinstance(item, EventBatch):
                self.engine.on_events(item.events)
                if item.events:
                    u.events.append(item.events)
                    u.records += len(item.events)
                u.quarantined.extend(item.quarantined)
                for e in item.events:
                    key = partition_key(e.topic, e.partition)
                    p.newest_event_ms[key] = max(p.newest_event_ms.get(key, 0), e.timestamp_ms)
                if item.events or item.quarantined:
                    p.last_change_at = time.time()
                p.kafka = item.positions
                u.checkpoints[KAFKA_CHECKPOINT] = p.kafka
            else:
                self.engine.on_offsets(item)
                p.offsets = item
        self._tick(kafka_status)
        u.findings.extend(self.engine.drain())
        # drained every batch all the same: undrained, they would ride in every state delta
        u.verdicts.extend(self.engine.drain_verdicts())
        if (due or u.findings or u.records >= CHECKPOINT_RECORDS
                or time.monotonic() - self.saved_at >= self.cfg.store.checkpoint_seconds):
            self._checkpoint()

    def checkpoint(self) -> None:
        """What was applied since the last checkpoint saved now, and written (a monitor that stops cleanly)."""
        self._checkpoint()
        self.settle()

    def settle(self) -> None:
        """The checkpoint in flight written (before the store is used beside the saver: retention, the budget)."""
        self.saver.settle()
        if self.saver.changed():
            self.progress.last_change_at = time.time()

    def prune(self, now: float) -> bool:
        """One slice of retention (store.retention); True while older records remain to be pruned."""
        hours = self.cfg.store.retention_hours
        if not hours:
            return False
        self.settle()
        pruned = retention.prune(self.store, now - hours * 3600)
        if any(pruned.values()):
            log.debug("pruned", extra={"event": "pruned", **pruned})
        return any(pruned.values())

    def caught_up_clock(self, now: float) -> float:
        """The change clock once the change source is read to its end: now from the binlog (its end was just asked
        of the server); from a CDC pipeline's topics, only what the connector vouched for, the commits it delivered
        and its heartbeats (checks.clocks.heartbeat_watermark): topics read to their ends say nothing of the
        database when the connector is paused or behind, and the host's clock is never taken for it."""
        cdc = self.cfg.cdc
        return self.progress.binlog_time if cdc is not None and cdc.mode == "source" else now

    def _tick(self, kafka_status: Callable[[], KafkaEventsStatus | None] | None) -> None:
        now = time.time()
        p = self.progress
        status = kafka_status() if kafka_status is not None else None
        # Kept from a connected reader only: one starting again says nothing yet, and what the reader before it knew
        # of the broker is what it was given (oncewatch.monitor.loop), checkpointed for the monitor's next run.
        if status is not None and status.connected and status.known != p.kafka_known:
            p.kafka_known = status.known
            self.unsaved.checkpoints[KAFKA_KNOWN_CHECKPOINT] = known_value(status.known)
        if p.binlog_ends and p.binlog is not None:
            covered, p.binlog_ends = binlog_watermark(p.binlog_ends, gtid_set(p.binlog.gtid))
            p.binlog_time = max(p.binlog_time, covered or 0.0)
        binlog_time = max(self.caught_up_clock(now), p.binlog_time) if p.binlog_caught_up else p.binlog_time
        if kafka_status is None or p.kafka_caught_up:
            kafka_time = now
        else:
            partitions = status.partitions if status is not None else ()
            settling = status is not None and status.known.settle_until > now
            kafka_time = kafka_watermark(partitions, p.kafka, p.newest_event_ms, p.kafka_time, settling)
        p.kafka_time = max(p.kafka_time, kafka_time)
        self.engine.tick(now, binlog_time, p.kafka_time)

    def _take(self) -> Checkpoint:
        """What was applied since the last checkpoint, and the engine's state as of now."""
        u, self.unsaved = self.unsaved, Unsaved()
        forgotten, self._forgotten = self._forgotten, self.store.entity_ids.forgotten
        return Checkpoint(rows=u.rows, binlog_quarantined=u.binlog_quarantined, events=u.events,
                          quarantined=u.quarantined, positions=u.checkpoints, states=u.states, findings=u.findings,
                          verdicts=u.verdicts, delta=self.engine.state_delta(),
                          stats=self.engine.stats(), names_pruned=forgotten != self._forgotten, at=time.time())

    def _checkpoint(self) -> None:
        """Everything applied since the last checkpoint handed to the saver: the raw records, the findings and
        verdicts, the engine's state and the positions it has read to."""
        self.saver.save(self._take())
        self.saved_at = time.monotonic()
