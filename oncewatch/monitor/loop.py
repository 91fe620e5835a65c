"""The running monitor: readers in threads, one writer in the main thread, health every second.

Readers (oncewatch.monitor.readers) only read and put what they read on one bounded queue. The
main thread takes what is queued, has the writer commit it (oncewatch.monitor.writer), restarts
a failed reader from the checkpoint when its backoff is over, and writes the health rows that
/metrics and the pages show (oncewatch.monitor.health). /metrics is served from the store
(oncewatch.dashboards.metrics).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from oncewatch.checks.engine import Engine
from oncewatch.checks.settings import Settings
from oncewatch.collectors.binlog import BinlogCollector, Bootstrap
from oncewatch.collectors.cdc.read import CdcCollector
from oncewatch.collectors.kafka_events import KafkaEventCollector
from oncewatch.collectors.kafka_offsets import KafkaOffsetsCollector
from oncewatch.core import exposure, forkserver
from oncewatch.core.config import CdcConfig, Config, ConfigError, KafkaConfig, MySQLConfig
from oncewatch.core.names import BINLOG, CDC, KAFKA_EVENTS, KAFKA_OFFSETS
from oncewatch.core.protocol import BootstrapStatus, Item, KafkaEventsStatus, Part, ReaderFailed
from oncewatch.core.records import BinlogPosition
from oncewatch.monitor import budget
from oncewatch.monitor.budget import Budget
from oncewatch.monitor.entities import EntityIndex
from oncewatch.monitor.health import Health, Outages
from oncewatch.monitor.inbox import Inbox
from oncewatch.monitor.preflight import preflight_kafka, preflight_mysql
from oncewatch.monitor.readers import Reader, running_part
from oncewatch.monitor.remote import PartSpec, remote
from oncewatch.monitor.saver import ProcessSaver
from oncewatch.monitor.threadnames import name_os_threads
from oncewatch.monitor.writer import Writer
from oncewatch.store import Store, open_monitor

log = logging.getLogger("oncewatch.monitor")

QUEUE_RECORDS = 8000  # rows and Kafka records read and not yet applied: about 15 MB at most
BATCH_SECONDS = 0.1  # what the first record of a batch may wait for the rest: part of every detection's latency
BATCH_RECORDS = 5000
# One stream read this far ahead of the other, with this many of its records waiting in the engine for
# their counterpart, waits for the other (memory stays bounded while the monitor is behind).
LEAD_SECONDS = 10.0
LEAD_WAITING = 10_000
HEALTH_SECONDS = 1.0
# Between looks at how far the binlog is read (its end asked of the server; Kafka's, a round of admin requests,
# once a HEALTH_SECONDS): the absence rules' binlog clock moves this often while the binlog is busy. An idle
# monitor ticks its timer this often only while a verdict is due, else once a HEALTH_SECONDS (a store
# transaction each).
CLOCK_SECONDS = 0.1
PRUNE_SECONDS = 60.0  # between looks for records past the retention; slices follow each other while some remain
SERIES_SECONDS = 5.0
JOIN_SECONDS = 10.0


def serve_metrics(cfg: Config) -> Callable[[], None]:
    """/metrics on `metrics.port` (served from the store) until the returned function is called."""
    if cfg.metrics.port == 0:
        return _nothing
    from oncewatch.dashboards.metrics import serve

    try:
        server, _thread = serve(cfg.store.target, cfg.metrics.host, cfg.metrics.port,
                                paging_max=cfg.metrics.paging_max_findings)
    except OSError as exc:
        raise ConfigError(f"metrics.port: cannot listen on {cfg.metrics.host}:{cfg.metrics.port} "
                          f"({exc.strerror}); is another oncewatch running? pick a free port") from exc
    log.info("serving /metrics", extra={"event": "metrics_listening", "host": cfg.metrics.host,
                                        "port": server.server_port})

    def close() -> None:
        server.shutdown()
        server.server_close()
    return close


def _nothing() -> None:
    pass


def served_once() -> tuple[Callable[[Config], Callable[[], None]], Callable[[], None]]:
    """(serve, close): `serve` starts /metrics the first time it is called and leaves it up after that, for
    one monitor after another; `close` ends it."""
    closers: list[Callable[[], None]] = []

    def serve(cfg: Config) -> Callable[[], None]:
        if not closers:
            closers.append(serve_metrics(cfg))
        return _nothing

    def close() -> None:
        for closer in closers:
            closer()
        closers.clear()
    return serve, close


class Monitor:
    """Runs until `stop()` (or until idle, for batch audits). It holds its store alone from here until
    `close()` (StoreLockedError while another monitor runs on it)."""

    def __init__(self, cfg: Config, store: Store | None = None, outages: Outages | None = None):
        self.cfg = cfg
        self.settings = Settings.from_config(cfg)
        self.engine = Engine(self.settings)
        self.store = store or open_monitor(cfg.store.target)
        self.writer = Writer(cfg, self.store, self.engine, EntityIndex(self.settings),
                             ProcessSaver(cfg) if cfg.store.writer == "process" else None)
        self.progress = self.writer.progress
        self.queue = Inbox(QUEUE_RECORDS)
        self._stop = threading.Event()
        self._waited = False  # --until-idle has said it waits for verdicts
        # A change source without heartbeats (Canal) moves the change clock only with the commits it delivers: what
        # waits on that clock once the shop is quiet is given with its next commit, and --until-idle cannot wait it out
        self._change_clock_moves = cfg.cdc is None or cfg.cdc.mode != "source" or bool(cfg.cdc.heartbeat_topic)
        self.readers: dict[str, Reader] = {}
        self.budget = Budget(self.store, cfg.store.max_bytes) if cfg.store.max_bytes else None
        self.health = Health(self.store, self.readers, self.progress, self.engine.stats, cfg.rules, self.engine.shape,
                             outages or Outages(), self.engine.reads(), cfg.slo,
                             space=lambda: None if self.budget is None else self.budget.space,
                             writer_pid=lambda: self.writer.saver.pid)

    def close(self) -> None:
        """The store's writer process ended, the store closed and its lock given up."""
        self.writer.saver.stop()
        self.store.close()

    def stop(self) -> None:
        self._stop.set()
        for reader in self.readers.values():
            reader.stop()

    def bootstrap(self) -> BinlogPosition:
        return self.writer.bootstrap()

    # -------------------------------------------------------------- readers

    def _put(self, item: Item, reader_stop: threading.Event) -> None:
        while not (self._stop.is_set() or reader_stop.is_set()):
            if self.queue.put(item, timeout=0.5):
                return

    def _kafka_ahead(self) -> frozenset[str]:
        """The partitions read well past the binlog while many of their events wait in the engine for their
        changes: reading more of them would only add to those (memory), so they wait. Only they: one
        partition read behind the others must go on, or the Kafka clock (the slowest partition) stands
        still. Only then: while one huge transaction is read, the binlog's time stands still, and Kafka
        must still be read."""
        p = self.progress
        if p.binlog_caught_up or not p.binlog_time or len(self.engine.announcements.unmatched) <= LEAD_WAITING:
            return frozenset()
        return frozenset(key for key, ms in p.newest_event_ms.items() if ms / 1000 - p.binlog_time > LEAD_SECONDS)

    def _binlog_ahead(self) -> bool:
        """The mirror image: the binlog read well past the Kafka clock (`kafka_time`, the slowest partition,
        which the changes waiting for their events wait for), many of them waiting. Never while Kafka is
        read to its end (events late in the shop are late: waiting changes nothing), nor while its reader
        is down or disconnected (the binlog's own rules, F1, F2, F5, must go on)."""
        p = self.progress
        if (p.kafka_caught_up or p.kafka_time <= 0 or p.binlog_time - p.kafka_time <= LEAD_SECONDS
                or len(self.engine.announcements.waiting) <= LEAD_WAITING):
            return False
        kafka = running_part(self.readers, KAFKA_EVENTS)
        return kafka is not None and kafka.status().connected

    def _configure_readers(self) -> None:
        """One reader per collector; each factory starts from what the writer has committed, so a
        reader started again resumes at the checkpoint. The busy ones (the binlog tail or the CDC topics, the
        events, CDC check mode's topics) read in a process of their own (oncewatch.monitor.remote); the bootstrap,
        which reads once, and the offsets poller, every few seconds, in the reader's thread."""
        mysql, kafka, cdc = self.cfg.mysql, self.cfg.kafka, self.cfg.cdc
        factories: dict[str, Callable[[], Part]] = {BINLOG: self._change_source}
        if kafka is not None:
            factories[KAFKA_EVENTS] = lambda: self._events(kafka)
            if kafka.consumer_groups or kafka.topics:
                factories[KAFKA_OFFSETS] = lambda: KafkaOffsetsCollector(kafka)
        if cdc is not None and kafka is not None and cdc.mode == "check":
            factories[CDC] = lambda: self._cdc_copies(mysql, kafka, cdc)
        for name, factory in factories.items():
            self.readers[name] = Reader(name, factory, self._put)

    def _change_source(self) -> Part:
        """The change source from the committed position: the CDC topics in CDC mode (no bootstrap, no binlog),
        else the binlog, after a first start's bootstrap."""
        p, cdc, kafka, mysql = self.progress, self.cfg.cdc, self.cfg.kafka, self.cfg.mysql
        if cdc is not None and kafka is not None and cdc.mode == "source":
            positions, gtid = dict(p.cdc), p.binlog.gtid if p.binlog else ""
            return remote(BINLOG, PartSpec(CdcCollector, (mysql, kafka, cdc),
                                           {"positions": positions, "start_gtid": gtid}))
        if p.binlog is None:
            return Bootstrap(mysql)
        start = p.binlog
        return remote(BINLOG, PartSpec(BinlogCollector, (mysql, start), ahead_as="ahead"), ahead=self._binlog_ahead)

    def _events(self, kafka: KafkaConfig) -> Part:
        """The events collector from the committed positions, told what the reader before it knew of the broker (the
        last one of this run, or of the run before): one started while the broker is away or after it restarted
        must not take the ends it learns first for ends that vouch for what the shop's producers still hold."""
        positions = dict(self.progress.kafka) or None
        return remote(KAFKA_EVENTS, PartSpec(KafkaEventCollector, (kafka, positions),
                                             {"known": self.progress.kafka_known}, ahead_as="hold"),
                      ahead=self._kafka_ahead)

    def _cdc_copies(self, mysql: MySQLConfig, kafka: KafkaConfig, cdc: CdcConfig) -> Part:
        """CDC check mode's topics, their transactions to be checked against the binlog's."""
        positions, gtid = dict(self.progress.cdc), self.progress.cdc_gtid
        return remote(CDC, PartSpec(CdcCollector, (mysql, kafka, cdc),
                                    {"positions": positions, "start_gtid": gtid, "copies": True}))

    def _kafka_status(self) -> KafkaEventsStatus | None:
        part = self.readers[KAFKA_EVENTS].part
        status = part.status() if part is not None else None
        return status if isinstance(status, KafkaEventsStatus) else None

    # -------------------------------------------------------------- main loop

    def run(self, until_idle: float | None = None,
            metrics: Callable[[Config], Callable[[], None]] = serve_metrics) -> None:
        """Raises the collector's own error when a source refuses the monitor (exit 3 in the CLI), and
        ReaderFailedError when a reader keeps failing on a bug (exit 1). /metrics is served once the sources
        have answered and the store is read, by `metrics` (monitor.supervise keeps it up from one monitor
        to the next while the store is away); the function it returns ends it."""
        exposure.log(log, exposure.of_config(self.cfg))
        forkserver.start()  # the readers' processes come from it (`oncewatch run` has started it already)
        if self.cfg.cdc is None or self.cfg.cdc.mode == "check":  # in CDC source mode it reads no database
            preflight_mysql(self.cfg)
        preflight_kafka(self.cfg)
        self.writer.restore()
        self.writer.saver.start()
        close_metrics = metrics(self.cfg)
        self._configure_readers()
        kafka_status = self._kafka_status if KAFKA_EVENTS in self.readers else None
        for reader in self.readers.values():
            reader.start()
        last_health = last_series = last_clock = next_prune = next_budget = 0.0
        try:
            while not self._stop.is_set():
                items = self.queue.take(BATCH_SECONDS, BATCH_RECORDS)
                failures = [i for i in items if isinstance(i, ReaderFailed)]
                now = time.time()
                clock_due = now - last_clock >= CLOCK_SECONDS
                if clock_due:
                    self.health.refresh(kafka=now - last_health >= HEALTH_SECONDS)
                    last_clock = now
                if items or clock_due and (now - last_health >= HEALTH_SECONDS or self._verdict_due(now)):
                    self.writer.apply([i for i in items if not isinstance(i, ReaderFailed)], kafka_status)
                for failure in failures:
                    if failure.fatal:
                        raise failure.error
                    self.readers[failure.reader].failed(failure)
                self._tail_after_bootstrap()
                if now >= next_prune:
                    next_prune = now if self.writer.prune(now) else now + PRUNE_SECONDS
                if self.budget is not None and now >= next_budget:
                    self.writer.settle()
                    next_budget = now if self.budget.keep(now) else now + budget.LOOK_SECONDS
                for reader in self.readers.values():
                    if reader.restart_if_due(now):  # what it reads now is new: --until-idle waits for it
                        self.progress.last_change_at = now
                if now - last_health >= HEALTH_SECONDS or failures:
                    self.health.write(with_series=now - last_series >= SERIES_SECONDS)
                    name_os_threads()
                    last_series = now if now - last_series >= SERIES_SECONDS else last_series
                    last_health = now
                # Looked at on every tick of the clock, not once a HEALTH_SECONDS: an audit ends as soon as it is
                # idle; the broker is asked once more first, so that idle is as of now, not of its last round.
                if until_idle is not None and clock_due and self._idle_for(until_idle, now):
                    self.health.refresh()
                    if self._idle_for(until_idle, time.time()):
                        break
            self.writer.checkpoint()  # a clean stop leaves nothing to replay; after a crash, the last one is replayed
        finally:
            self.stop()
            for reader in self.readers.values():
                reader.join(JOIN_SECONDS)
            self.writer.saver.stop()
            self.health.write(with_series=False, stopped=True)
            close_metrics()

    def _verdict_due(self, now: float) -> bool:
        """A verdict of the engine's timer comes due by `now` (an order's stuck time, an event's grace)."""
        due = self.engine.undecided(self._change_clock_moves)[1]
        return due is not None and due <= now

    def _tail_after_bootstrap(self) -> None:
        """Once the bootstrap's last chunk is committed, the binlog tail takes its reader's place."""
        reader = self.readers[BINLOG]
        if self.progress.binlog is not None and reader.part is not None and isinstance(reader.part.status(),
                                                                                        BootstrapStatus):
            reader.stop()
            reader.join(JOIN_SECONDS)
            reader.start()
            log.info("tailing the binlog from the bootstrap's snapshot", extra={
                "event": "binlog_tail_start", "gtid": self.progress.binlog.gtid})

    def _idle_for(self, seconds: float, now: float) -> bool:
        """Nothing new for `seconds`, everything read applied, every reader running (one waiting out its
        restart backoff has not read what is left for it) and alive for `seconds` since it started (Reader.live_for),
        and every verdict of what was read given: an audit that ended with an order not yet stuck, or a change whose
        event's grace had not passed, would say nothing of them."""
        p = self.progress
        # Every reader is looked at on every tick, whatever else holds: live_for counts from the first look that
        # finds its part alive, and looked at only once the rest held, an audit waited out its idle seconds twice
        # and more (`--until-idle 3` of a quiet shop took 13 s, not 4).
        live = [r.running and r.live_for(now) >= seconds for r in self.readers.values()]
        if not (now - p.last_change_at >= seconds and self.queue.empty() and p.binlog_caught_up
                and p.kafka_caught_up and all(live)):
            return False
        undecided, due = self.engine.undecided(self._change_clock_moves)
        if undecided and not self._waited:
            self._waited = True
            log.info("idle, but facts read still wait for their verdicts: running on until they are given",
                     extra={"event": "idle_awaiting_verdicts", "undecided": undecided,
                            "next_due_in_seconds": round(max(0.0, due - now), 1) if due is not None else None})
        if not undecided and not self._change_clock_moves and (left := self.engine.undecided()[0]):
            log.warning("idle with facts whose verdicts wait on the change clock, which a change source without "
                        "heartbeats moves only with its next commit: they are left undecided",
                        extra={"event": "idle_change_clock_still", "undecided": left})
        return not undecided


__all__ = ["Monitor", "serve_metrics", "served_once"]
