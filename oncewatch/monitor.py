"""The running monitor: collectors in reader threads, one writer that feeds the engine and the store.

Reader threads only read (the binlog collector, the Kafka events and offsets collectors) and
put what they read on one bounded queue. The main thread is the store's only writer: it takes
what is queued, feeds the engine, and writes the records, the engine's state, the findings and
*both* checkpoints in one store transaction (DESIGN §7), so a kill -9 at any instant resumes
with nothing lost and nothing doubled. Health of every part goes to the store every second for
/metrics and the pages; /metrics itself is served from the store (dashboards.metrics).
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from oncewatch.checks.engine import Engine
from oncewatch.checks.settings import Settings
from oncewatch.collectors.binlog import BinlogCollector, BinlogError, bootstrap, connect
from oncewatch.collectors.kafka_events import EventBatch, KafkaEventCollector, KafkaEventsError, PartitionStatus
from oncewatch.collectors.kafka_offsets import KafkaOffsetsCollector
from oncewatch.core.histogram import delay_p99
from oncewatch.store import engine_state
from oncewatch.core.config import Config, ConfigError
from oncewatch.core.records import BinlogPosition, EmittedEvent, Finding, RowChange, Transaction
from oncewatch.store import Batch, Store

log = logging.getLogger("oncewatch.monitor")

BINLOG_CHECKPOINT = "binlog"
KAFKA_CHECKPOINT = "kafka_events"
QUEUE_SIZE = 512
BATCH_SECONDS = 0.25
BATCH_RECORDS = 5000
KAFKA_LEAD_SECONDS = 10.0
HEALTH_SECONDS = 1.0
SERIES_SECONDS = 5.0
# Young generation collected every 50,000 allocations instead of 700, the whole heap a tenth as
# often: see tune_gc.
GC_THRESHOLDS = (50_000, 20, 100)

REQUIRED_BINLOG_SETTINGS = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
                            "binlog_row_metadata": "FULL"}


class MonitorError(RuntimeError):
    """The monitor cannot go on; the message says why and what to do."""


class SourceUnavailableError(MonitorError):
    """A source cannot be reached or refuses the monitor's account at start-up."""


def preflight_mysql(cfg: Config) -> None:
    """Check, before reading anything, that the server is reachable, lets the monitor in, has the
    binlog settings the collector relies on and has every watched table."""
    import pymysql

    m = cfg.mysql
    try:
        conn = connect(m)
    except pymysql.err.OperationalError as exc:
        code = exc.args[0] if exc.args else None
        if code == 1045:
            raise SourceUnavailableError(
                f"MySQL at {m.host}:{m.port} refused user {m.user!r} (wrong password or no such account); "
                f"check mysql.password_env / mysql.password_file") from exc
        raise SourceUnavailableError(f"cannot reach MySQL at {m.host}:{m.port} ({exc.args[-1]}); check "
                                     f"mysql.host and mysql.port and that the server runs") from exc
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN (%s, %s, %s, %s)",
                        tuple(REQUIRED_BINLOG_SETTINGS))
            found = {k.lower(): str(v).upper() for k, v in cur.fetchall()}
            for name, want in REQUIRED_BINLOG_SETTINGS.items():
                if found.get(name) != want:
                    raise SourceUnavailableError(f"MySQL at {m.host}:{m.port} has {name}={found.get(name)}; "
                                                 f"oncewatch needs {name}={want} (see README)")
            for table in m.tables:
                schema, name = table.split(".")
                try:
                    cur.execute(f"SELECT 1 FROM `{schema}`.`{name}` LIMIT 0")
                except pymysql.err.MySQLError as exc:
                    raise ConfigError(f"mysql.tables: {table} does not exist or user {m.user!r} may not "
                                      f"SELECT it ({exc.args[-1]})") from exc
    finally:
        conn.close()


def preflight_kafka(cfg: Config) -> None:
    """The brokers answer (topics that do not exist yet are waited for, not an error)."""
    from kafka import errors as kerrors

    from oncewatch.collectors.kafka_events import admin_client

    if cfg.kafka is None:
        return
    try:
        admin_client(cfg.kafka).close()
    except kerrors.KafkaError as exc:
        raise SourceUnavailableError(f"cannot reach Kafka at {', '.join(cfg.kafka.bootstrap_servers)} "
                                     f"({type(exc).__name__}); check kafka.bootstrap_servers") from exc


def tune_gc() -> None:
    """The monitor's collector settings, for its whole process (set by `oncewatch run`).

    Every record read allocates a handful of dicts that die within the batch, and the engine keeps
    a large, long-lived state that every full collection walks. Almost none of it forms reference
    cycles, so reference counting frees it and the cycle collector mostly finds nothing: running
    it far less often saves about a tenth of the cost of reading a Kafka record (bench/kafka_ingest.py)
    and lets at most 50,000 young objects of cyclic garbage wait a little longer."""
    gc.set_threshold(*GC_THRESHOLDS)


def kafka_watermark(partitions: Iterable[PartitionStatus], applied: dict[str, int], newest_ms: dict[str, int],
                    previous: float) -> float:
    """The Kafka clock of the absence rules while the stream is busy: a time such that every event
    stamped earlier has been applied (F7 judges a change's event lost once this passes its grace).

    A partition applied up to its last known end vouches for everything produced before that end
    was learned; one still behind vouches up to the newest event applied from it. A partition
    with nothing applied since start vouches for nothing, and the clock stays at `previous`.
    Under steady traffic the stream is never "caught up" at the instant it is asked, so without
    the first rule the clock would stand still and lost events would never be judged."""
    marks: list[float] = []
    for part in partitions:
        key = f"{part.topic}/{part.partition}"
        if applied.get(key, 0) >= part.end:
            marks.append(part.end_at)
        elif key in newest_ms:
            marks.append(newest_ms[key] / 1000)
        else:
            return previous
    return min(marks, default=previous)


@dataclass(frozen=True)
class _Fatal:
    error: BaseException


@dataclass(frozen=True)
class _Offsets:
    snapshot: dict[str, Any]


@dataclass
class Progress:
    """What the writer has committed so far: for --until-idle, the engine's clocks and the health row."""

    last_change_at: float = field(default_factory=time.time)
    binlog_time: float = 0.0
    kafka_time: float = 0.0
    newest_event_ms: dict[str, int] = field(default_factory=dict)  # "topic/partition" -> newest timestamp read
    binlog_caught_up: bool = False
    kafka_caught_up: bool = False
    applied_gtid: str | None = None  # the binlog position the engine and the store have taken in
    applied_kafka: dict[str, int] = field(default_factory=dict)  # likewise, "topic/partition" -> next offset


class EntityIndex:
    """Which drill-down entities ('trade_no:T1', 'order_key:O1') a row or an event belongs to."""

    def __init__(self, settings: Settings):
        d = settings.domain
        self.columns: dict[str, list[tuple[str, str]]] = {}
        if d.orders:
            self.columns.setdefault(d.orders.table, []).append(("order_key", d.orders.key_column))
        if d.payments:
            self.columns.setdefault(d.payments.table, []).extend(
                [("trade_no", d.payments.trade_no_column), ("order_key", d.payments.order_column)])
        for effect in d.effects:
            self.columns.setdefault(effect.table, []).append(("trade_no", effect.trade_no_column))

    def of_row(self, row: RowChange) -> list[str]:
        image = row.row
        return [f"pk:{row.qualified_table}:{'/'.join(str(v) for v in row.pk)}"] + [
            f"{kind}:{image[col]}" for kind, col in self.columns.get(row.qualified_table, ())
            if image.get(col) is not None]

    @staticmethod
    def of_event(event: EmittedEvent) -> list[str]:
        return [f"{kind}:{event.keys[kind]}" for kind in ("trade_no", "order_key") if event.keys.get(kind) is not None]


class Monitor:
    """Runs until `stop()` (or until idle, for batch audits)."""

    def __init__(self, cfg: Config, store: Store | None = None):
        self.cfg = cfg
        self.store = store or Store(cfg.store.path)
        self.settings = Settings.from_config(cfg)
        self.engine = Engine(self.settings)
        self.index = EntityIndex(self.settings)
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=QUEUE_SIZE)
        self._stop = threading.Event()
        self.progress = Progress()
        self.binlog: BinlogCollector | None = None
        self.kafka: KafkaEventCollector | None = None
        self.offsets: KafkaOffsetsCollector | None = None
        self.started_at = time.time()
        self._last_offsets: dict[str, Any] | None = None

    def stop(self) -> None:
        self._stop.set()
        if self.binlog:
            self.binlog.stop()

    # -------------------------------------------------------------- start-up

    def restore(self) -> BinlogPosition:
        """Engine state and positions from the store; a bootstrap of the watched tables on the first run."""
        saved_state = engine_state.load(self.store)
        if saved_state is not None:
            self.engine.restore(saved_state)
        self.progress.applied_kafka = self.store.checkpoint(KAFKA_CHECKPOINT) or {}
        saved = self.store.checkpoint(BINLOG_CHECKPOINT)
        position = BinlogPosition.from_dict(saved) if saved is not None else self.bootstrap()
        self.progress.applied_gtid = position.gtid
        return position

    def bootstrap(self) -> BinlogPosition:
        log.info("bootstrapping watched tables", extra={"event": "bootstrap_start",
                                                         "tables": list(self.cfg.mysql.tables)})
        rows: list[RowChange] = []

        def take(chunk: list[RowChange]) -> None:
            rows.extend(chunk)

        snap = bootstrap(self.cfg.mysql, on_rows=take)
        with self.store.batch() as tx:
            self._write_rows(tx, rows)
            self.engine.on_transaction(Transaction(rows=tuple(rows), position=snap.position,
                                                   commit_time=snap.taken_at))
            tx.set_checkpoint(BINLOG_CHECKPOINT, snap.position.to_dict())
            self._write_engine(tx)
        log.info("bootstrap done", extra={"event": "bootstrap_done", "gtid": snap.position.gtid, "rows": len(rows)})
        return snap.position

    # -------------------------------------------------------------- readers

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self.queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _binlog_reader(self, collector: BinlogCollector) -> None:
        try:
            for tx in collector.transactions():
                self._put(tx)
        except BinlogError as exc:
            self._put(_Fatal(exc))

    def _kafka_ahead(self) -> bool:
        """Kafka read well past the binlog: its events would only wait in the engine for their changes
        (memory) and crowd the queue the binlog reader needs, so the Kafka reader pauses."""
        p = self.progress
        newest = max(p.newest_event_ms.values(), default=0) / 1000
        return not p.binlog_caught_up and p.binlog_time > 0 and newest - p.binlog_time > KAFKA_LEAD_SECONDS

    def _kafka_reader(self, collector: KafkaEventCollector) -> None:
        try:
            while not self._stop.is_set():
                if self._kafka_ahead():
                    self._stop.wait(0.2)
                    continue
                batch = collector.poll(timeout_ms=500, max_records=2000)
                if batch.events or batch.quarantined or batch.positions_changed:
                    self._put(batch)
        except KafkaEventsError as exc:
            self._put(_Fatal(exc))

    def _offsets_reader(self, collector: KafkaOffsetsCollector) -> None:
        collector.run(self._stop, lambda snap: self._put(_Offsets(snap)))

    # -------------------------------------------------------------- writer

    def _write_rows(self, tx: Batch, rows: list[RowChange] | tuple[RowChange, ...]) -> None:
        tx.add_row_changes(rows, [(i, k) for i, r in enumerate(rows) for k in self.index.of_row(r)])

    def _write_engine(self, tx: Batch) -> None:
        changed = self.engine.drain()
        if changed:
            # --until-idle waits for findings to settle too: a new finding or a changed status counts,
            # a standing one refreshed by the next offsets reading (F11, F12) does not.
            if tx.status_changes(changed):
                self.progress.last_change_at = time.time()
        tx.upsert_findings(changed)
        engine_state.save(tx, self.engine.state_delta())
        tx.set_state("engine_stats", self.engine.stats())

    def _apply(self, items: list[Any]) -> None:
        binlog_at: BinlogPosition | None = None
        kafka_at: dict[str, int] | None = None
        with self.store.batch() as tx:
            for item in items:
                if isinstance(item, Transaction):
                    self.engine.on_transaction(item)
                    if item.rows:
                        self._write_rows(tx, item.rows)
                        self.progress.last_change_at = time.time()
                    self.progress.binlog_time = max(self.progress.binlog_time, item.commit_time)
                    binlog_at = item.position
                    self.progress.applied_gtid = item.position.gtid
                elif isinstance(item, EventBatch):
                    self.engine.on_events(item.events)
                    tx.add_events(item.events, [(i, k) for i, e in enumerate(item.events)
                                                for k in self.index.of_event(e)])
                    tx.add_quarantined(item.quarantined)
                    for e in item.events:
                        key = f"{e.topic}/{e.partition}"
                        self.progress.newest_event_ms[key] = max(self.progress.newest_event_ms.get(key, 0),
                                                                 e.timestamp_ms)
                    if item.events or item.quarantined:
                        self.progress.last_change_at = time.time()
                    kafka_at = item.positions
                    self.progress.applied_kafka = item.positions
                elif isinstance(item, _Offsets):
                    self.engine.on_offsets(item.snapshot)
                    self._last_offsets = item.snapshot
            self._tick()
            if binlog_at is not None:
                tx.set_checkpoint(BINLOG_CHECKPOINT, binlog_at.to_dict())
            if kafka_at is not None:
                tx.set_checkpoint(KAFKA_CHECKPOINT, kafka_at)
            self._write_engine(tx)

    def _tick(self) -> None:
        now = time.time()
        p = self.progress
        binlog_time = now if p.binlog_caught_up else p.binlog_time
        if self.kafka is None or p.kafka_caught_up:
            kafka_time = now
        else:
            kafka_time = kafka_watermark(self.kafka.status.partitions, p.applied_kafka, p.newest_event_ms,
                                         p.kafka_time)
        p.kafka_time = max(p.kafka_time, kafka_time)
        self.engine.tick(now, binlog_time, p.kafka_time)

    def _drain_queue(self) -> list[Any]:
        """What is queued, up to BATCH_SECONDS of waiting or BATCH_RECORDS records: one store transaction."""
        items: list[Any] = []
        records = 0
        deadline = time.monotonic() + BATCH_SECONDS
        while records < BATCH_RECORDS:
            try:
                item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            items.append(item)
            records += len(item.rows) if isinstance(item, Transaction) else (
                len(item.events) + len(item.quarantined) if isinstance(item, EventBatch) else 1)
        return items

    # -------------------------------------------------------------- health

    def _refresh_caught_up(self) -> None:
        p = self.progress
        p.binlog_caught_up = self._binlog_caught_up()
        p.kafka_caught_up = self.kafka is None or self._kafka_caught_up()

    def _kafka_caught_up(self) -> bool:
        """Read to the end *and applied*: records the reader holds or has queued are not yet seen by
        the engine, and judging absence before they are would fire F7 on events in flight."""
        k = self.kafka
        if not (k.status.connected and k.caught_up()):
            return False
        applied = self.progress.applied_kafka
        return all(applied.get(f"{part.topic}/{part.partition}", 0) >= part.end for part in k.status.partitions)

    def _binlog_caught_up(self) -> bool:
        b = self.binlog
        if b is None or not b.status.connected or b.status.last_position is None:
            return False
        try:
            server = b.current_server_position()
        except Exception:  # noqa: BLE001 - a server we cannot ask is not caught up with
            return False
        return server.gtid == self.progress.applied_gtid

    def _write_health(self, with_series: bool) -> None:
        p = self.progress
        if self.binlog:
            self.store.set_health("binlog", self.binlog.status.as_dict())
        if self.kafka:
            self.store.set_health("kafka_events", self.kafka.status.as_dict())
        if self._last_offsets is not None:
            self.store.set_health("kafka_offsets", self._last_offsets)
        self.store.set_health("monitor", {"started_at": self.started_at, "pid": os.getpid(),
                                          "binlog_time": p.binlog_time, "kafka_time": p.kafka_time,
                                          "caught_up": p.binlog_caught_up and p.kafka_caught_up})
        if with_series:
            with self.store.batch() as tx:
                tx.add_series(self._series_points(time.time()))

    def _series_points(self, now: float) -> list[tuple[str, dict[str, str], float, float]]:
        stats = self.engine.stats()
        points = [("backlog", {"table": t}, now, float(n)) for t, n in stats.get("backlog_by_table", {}).items()]
        p99 = delay_p99(stats)
        if p99 is not None:
            points.append(("delay_p99", {}, now, p99))
        for g in (self._last_offsets or {}).get("groups", []):
            by_topic: dict[str, list[int]] = {}
            for part in g.get("partitions", []):
                if part.get("lag") is not None:
                    by_topic.setdefault(part["topic"], []).append(part["lag"])
            points += [("group_lag", {"group": g["group"], "topic": t}, now, float(sum(lags)))
                       for t, lags in by_topic.items()]
        return points

    # -------------------------------------------------------------- main loop

    def _start_readers(self, start: BinlogPosition) -> list[threading.Thread]:
        self.binlog = BinlogCollector(self.cfg.mysql, start)
        threads = [threading.Thread(target=self._binlog_reader, args=(self.binlog,), name="binlog", daemon=True)]
        if self.cfg.kafka is not None:
            self.kafka = KafkaEventCollector(self.cfg.kafka, self.store.checkpoint(KAFKA_CHECKPOINT))
            threads.append(threading.Thread(target=self._kafka_reader, args=(self.kafka,), name="kafka-events",
                                            daemon=True))
            if self.cfg.kafka.consumer_groups or self.cfg.kafka.topics:
                self.offsets = KafkaOffsetsCollector(self.cfg.kafka)
                threads.append(threading.Thread(target=self._offsets_reader, args=(self.offsets,),
                                                name="kafka-offsets", daemon=True))
        for t in threads:
            t.start()
        return threads

    def _serve_metrics(self) -> Callable[[], None]:
        if self.cfg.metrics.port == 0:
            return lambda: None
        from oncewatch.dashboards.metrics import serve

        try:
            server, _thread = serve(self.cfg.store.path, self.cfg.metrics.host, self.cfg.metrics.port)
        except OSError as exc:
            raise ConfigError(f"metrics.port: cannot listen on {self.cfg.metrics.host}:{self.cfg.metrics.port} "
                              f"({exc.strerror}); is another oncewatch running? pick a free port") from exc
        log.info("serving /metrics", extra={"event": "metrics_listening", "host": self.cfg.metrics.host,
                                            "port": server.server_port})

        def close() -> None:
            server.shutdown()
            server.server_close()
        return close

    def run(self, until_idle: float | None = None) -> None:
        preflight_mysql(self.cfg)
        preflight_kafka(self.cfg)
        start = self.restore()
        close_metrics = self._serve_metrics()
        threads = self._start_readers(start)
        last_health = last_series = 0.0
        try:
            while not self._stop.is_set():
                items = self._drain_queue()
                fatal = next((i for i in items if isinstance(i, _Fatal)), None)
                if fatal:
                    raise fatal.error
                now = time.time()
                if now - last_health >= HEALTH_SECONDS:
                    self._refresh_caught_up()
                if items or now - last_health >= HEALTH_SECONDS:
                    self._apply(items)
                if now - last_health >= HEALTH_SECONDS:
                    self._write_health(with_series=now - last_series >= SERIES_SECONDS)
                    last_series = now if now - last_series >= SERIES_SECONDS else last_series
                    last_health = now
                    if until_idle is not None and self._idle_for(until_idle, now):
                        break
        finally:
            self.stop()
            for t in threads:
                t.join(timeout=10)
            for c in (self.kafka, self.offsets):
                if c is not None:
                    c.close()
            self._write_health(with_series=False)
            close_metrics()

    def _idle_for(self, seconds: float, now: float) -> bool:
        p = self.progress
        return (now - p.last_change_at >= seconds and self.queue.empty()
                and p.binlog_caught_up and p.kafka_caught_up)




__all__ = ["Monitor", "MonitorError", "SourceUnavailableError", "preflight_mysql", "preflight_kafka"]
