"""The monitor's health, judged and written for /metrics and the pages (one store row per component).

Each part's row (core.protocol.ComponentHealth) is its status beside its reader's health (running, failures, the
last failure, when the loop last showed life), so a dead reader reads as down and its silence
as staleness, whatever its part said last. The monitor's row (MonitorHealth) carries the verdict
(oncewatch.monitor.verdict) and how far behind each stream is; `refresh` judges whether each
stream is read to its very end and applied, which the absence rules' clocks follow.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymysql

from oncewatch.collectors.binlog import TRANSPORT_ERRORS
from oncewatch.core import forkserver
from oncewatch.core.config import SloConfig
from oncewatch.core.domain import Rules
from oncewatch.core.gtids import gtid_set
from oncewatch.core.histogram import delay_p99
from oncewatch.core.names import BINLOG, KAFKA_EVENTS, MONITOR
from oncewatch.core.protocol import (BinlogStatus, BinlogTail, CdcStatus, ComponentHealth, EventSource,
                                     KafkaEventsStatus, MonitorHealth, Slo, StoreSpace)
from oncewatch.monitor.readers import Reader, running_part
from oncewatch.monitor.remote import process_cpu_seconds
from oncewatch.monitor.verdict import judge
from oncewatch.monitor.writer import Progress
from oncewatch.store import Store

# The server's binlog ends kept while the tail reads behind them: at one probe a CLOCK_SECONDS, the last 15 s
# (a tail further behind moves its clock by the transactions' own times meanwhile).
BINLOG_ENDS_KEPT = 150
DELAY_WINDOW_SECONDS = 60.0  # the dashboard's p99 event delay is of the pairs matched this recently

log = logging.getLogger("oncewatch.monitor.health")


def thresholds(rules: Rules) -> dict[str, dict[str, float]]:
    """The [rules] thresholds by rule, published on /metrics so the alert rules compare with them."""
    return {"F3": {"stuck_pending_seconds": rules.stuck_pending_seconds},
            "F7": {"missing_event_grace_seconds": rules.missing_event_grace_seconds},
            "F8": {"orphan_event_grace_seconds": rules.orphan_event_grace_seconds},
            "F10": {"event_delay_seconds": rules.event_delay_seconds},
            "F11": {"offset_drift_threshold": float(rules.offset_drift_threshold)},
            "F12": {"partition_skew_threshold": rules.partition_skew_threshold,
                    "partition_skew_relative": rules.partition_skew_relative},
            "F13": {"cdc_lost_grace_seconds": rules.cdc_lost_grace_seconds,
                    "cdc_position_gap_threshold": float(rules.cdc_position_gap_threshold)}}


@dataclass
class Outages:
    """The times this process lost a server it cannot go on without (its store's PostgreSQL, then started again
    from the checkpoint by monitor.supervise; a group's Kafka broker at its start), and how long the server was
    away in all: the gap, on /metrics. And the times the store's writer process died (`writer_deaths`,
    oncewatch.monitor.saver), each also followed by a start from the checkpoint."""

    count: int = 0
    seconds: float = 0.0
    down_since: float | None = None
    writer_deaths: int = 0

    def begin(self, now: float) -> bool:
        """True at the start of an outage (not for each failed try while it lasts)."""
        if self.down_since is not None:
            return False
        self.down_since = now
        self.count += 1
        return True

    def end(self, now: float) -> float | None:
        """The outage's length, once the server answers again (None when there was none)."""
        if self.down_since is None:
            return None
        gap, self.down_since = now - self.down_since, None
        self.seconds += gap
        return gap


class Health:
    def __init__(self, store: Store, readers: dict[str, Reader], progress: Progress, stats: Any, rules: Rules,
                 shape: Callable[[], list[dict[str, Any]]], outages: Outages,
                 reads: dict[str, list[str]] | None = None, slo: SloConfig = SloConfig(),
                 space: Callable[[], StoreSpace | None] = lambda: None,
                 writer_pid: Callable[[], int | None] = lambda: None):
        self.store = store
        self.writer_pid = writer_pid  # the store's writer process (oncewatch.monitor.saver), None while none runs
        self.space = space  # the store against its budget (oncewatch.monitor.budget), None without one
        self.slo = slo  # published on /metrics beside the verdicts, for the burn-rate alerts
        self.outages = outages
        self.shape = shape  # the engine's standing shape problems (checks.shape)
        self.reads = reads or {}  # rule -> the watched tables whose configured columns it reads (Engine.reads)
        self.rules = rules
        self.readers = readers
        self.progress = progress
        self.stats = stats  # the engine's stats(), called when series are written
        self.started_at = time.time()
        self.probe_error: str | None = None
        self._delays: deque[tuple[float, dict[str, Any]]] = deque()  # (when, delay histograms then)

    # -------------------------------------------------------------- caught up

    def refresh(self, *, kafka: bool = True) -> None:
        """Whether each stream is read to its end; `kafka=False` asks only the binlog's server (one quick query:
        asking the broker takes a round of admin requests, which the writer waits for)."""
        p = self.progress
        p.binlog_caught_up = self._binlog_caught_up()
        if kafka:
            p.kafka_caught_up = KAFKA_EVENTS not in self.readers or self._kafka_caught_up()

    def _kafka_caught_up(self) -> bool:
        """Read to the end *and applied*: records the reader holds or has queued are not yet seen by
        the engine, and judging absence before they are would fire F7 on events in flight."""
        kafka = running_part(self.readers, KAFKA_EVENTS)
        if not isinstance(kafka, EventSource) or not (kafka.status().connected and kafka.caught_up()):
            return False
        status = kafka.status()  # after the broker was asked: the ends it learned
        applied = self.progress.kafka  # a partition not in it has no position committed yet, even an empty one
        return isinstance(status, KafkaEventsStatus) and all(
            part.key in applied and applied[part.key] >= part.end for part in status.partitions)

    def _binlog_caught_up(self) -> bool:
        source = running_part(self.readers, BINLOG)
        status = source.status() if source is not None else None
        if isinstance(status, CdcStatus):  # CDC mode: its topics read to their ends, and all of it applied
            return (status.connected and status.caught_up and self.progress.binlog is not None
                    and status.last_position is not None and status.last_position.gtid == self.progress.binlog.gtid)
        if not isinstance(source, BinlogTail) or not isinstance(status, BinlogStatus):  # none, or the bootstrap
            return False
        if not status.connected or status.last_position is None or self.progress.binlog is None:
            return False
        asked_at = time.time()
        try:
            server = source.current_server_position()
        except TRANSPORT_ERRORS as exc:  # a server we cannot ask is not caught up with
            self._probe_failed(exc)
            return False
        self.probe_error = None
        if server.gtid == self.progress.binlog.gtid:
            return True
        # not yet: once applied, this end vouches for the binlog up to `asked_at` (checks.clocks.binlog_watermark)
        ends = self.progress.binlog_ends
        ends.append((asked_at, gtid_set(server.gtid)))
        del ends[:-BINLOG_ENDS_KEPT]
        return False

    def _probe_failed(self, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if error != self.probe_error:
            log.warning("cannot ask MySQL for its binlog position", extra={
                "event": "binlog_probe_failed", "error": error, "code": exc.args[0] if isinstance(
                    exc, pymysql.err.MySQLError) and exc.args else None})
        self.probe_error = error

    # -------------------------------------------------------------- rows

    def lag_seconds(self, now: float) -> dict[str, float]:
        """How far behind each stream is applied: 0 when read to its end, else the age of the commit time
        (binlog) or of the Kafka clock reached. A CDC source's is always its change clock's age: its topics read
        to their ends say nothing of the database while the connector is paused or behind."""
        p = self.progress
        reader = self.readers.get(BINLOG)
        vouched = reader is not None and reader.part is not None and isinstance(reader.part.status(), CdcStatus)
        lags = {"binlog": 0.0 if p.binlog_caught_up and not vouched else max(0.0, now - p.binlog_time)}
        if KAFKA_EVENTS in self.readers:
            lags["kafka"] = 0.0 if p.kafka_caught_up else max(0.0, now - p.kafka_time)
        return lags

    def write(self, with_series: bool, stopped: bool = False) -> None:
        """The collectors' rows and the monitor's verdict; `stopped`: the last row of a monitor that stops,
        which says so rather than "failing" because its readers are down."""
        p = self.progress
        now = time.time()
        rows = {name: ComponentHealth(reader.part.status(), reader.health())
                for name, reader in self.readers.items() if reader.part is not None}
        for name, row in rows.items():
            self.store.set_health(name, row)
        shape = self.shape()
        space = self.space()
        v = judge(now, rows, self.lag_seconds(now), caught_up_seconds=self.rules.caught_up_seconds, shape=shape,
                  reads=self.reads, stopped=stopped, space=space)
        self.store.set_health(MONITOR, MonitorHealth(
            started_at=self.started_at, pid=os.getpid(), binlog_time=p.binlog_time, kafka_time=p.kafka_time,
            caught_up=v.caught_up, verdict=v.verdict, reasons=v.reasons, lag_seconds=v.lag_seconds, blind_rules=v.blind,
            blind_tables=v.blind_tables, rule_tables={r: tuple(t) for r, t in self.reads.items()},
            shape_problems=tuple(shape), probe_error=self.probe_error, store_outages=self.outages.count,
            store_outage_seconds=self.outages.seconds, store_writer_deaths=self.outages.writer_deaths,
            thresholds=thresholds(self.rules),
            slo=Slo(self.slo.objective, self.slo.within_seconds), store_space=space,
            cpu_seconds=time.process_time(),
            forkserver_cpu_seconds=process_cpu_seconds(pid) if (pid := forkserver.pid()) is not None else None,
            store_writer_cpu_seconds=process_cpu_seconds(pid) if (pid := self.writer_pid()) is not None else None))
        if with_series:
            with self.store.batch() as tx:
                tx.add_series(self._series_points(time.time()))

    def _series_points(self, now: float) -> list[tuple[str, dict[str, str], float, float]]:
        """The dashboard's time series: backlog per table, the p99 event delay of the pairs matched in the
        last DELAY_WINDOW_SECONDS (not since the start: a burst of late events must show), and per
        consumer group and topic its lag, the spread of its partitions' lag (F12's stddev) and their mean lag (F12's
        second test compares the spread with a share of it); in CDC check mode
        the CDC topics' position gap behind the binlog (the Drift page's chart)."""
        stats = self.stats()
        points = [("backlog", {"table": t}, now, float(n)) for t, n in stats.get("backlog_by_table", {}).items()]
        # a copy: the engine counts on in the same dicts
        delay = {clock: {"buckets": dict(h["buckets"])} for clock, h in stats.get("delay", {}).items()}
        self._delays.append((now, {"delay": delay}))
        while len(self._delays) > 1 and self._delays[1][0] <= now - DELAY_WINDOW_SECONDS:
            self._delays.popleft()
        p99 = delay_p99(stats, self._delays[0][1] if len(self._delays) > 1 else None)
        if p99 is not None:
            points.append(("delay_p99", {}, now, p99))
        pipeline = stats.get("pipeline") or {}
        if pipeline.get("against_binlog"):  # CDC check mode: how far the CDC topics are behind the binlog
            points.append(("cdc_position_gap", {"unit": "bytes"}, now, float(pipeline["position_gap"])))
        for g in self.progress.offsets.groups if self.progress.offsets else ():
            points += [("group_lag", {"group": g.group, "topic": t}, now, float(sum(lags)))
                       for t, lags in g.lags_by_topic().items()]
            points += [("lag_stddev", {"group": g.group, "topic": t}, now, skew.stddev)
                       for t, skew in g.skew_by_topic().items()]
            # F12's second test compares the spread with a share of the mean lag: the Drift page draws that line
            points += [("lag_mean", {"group": g.group, "topic": t}, now, sum(lags) / len(lags))
                       for t, lags in g.lags_by_topic().items()]
        return points
