"""Prometheus exposition of the store: a collector that reads it at scrape time, and `serve()`.

Every value comes from the health rows, the engine stats and the findings the monitor keeps in
the store, read through a fresh read-only connection per scrape, so /metrics can be served by
the monitor itself or by a separate process. Labels are bounded: collector, table, topic,
partition, group, clock, rule, severity, reason; a finding's id and entity (its trade_no, order...)
only on oncewatch_finding_paging, one series per finding that pages, at most metrics.paging_max_findings.
"""

from __future__ import annotations

import re
import socket
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from itertools import chain
from socketserver import ThreadingMixIn
from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from oncewatch import __version__
from oncewatch.core import histogram, names
from oncewatch.core.config import MetricsConfig, PostgresTarget
from oncewatch.core.protocol import (BinlogStatus, CdcStatus, ComponentHealth, GroupMemberHealth, KafkaEventsStatus,
                                     MonitorHealth, Status)
from oncewatch.core.records import OffsetsSnapshot
from oncewatch.dashboards import probes, views
from oncewatch.store import StoreError, retention, verdicts
from oncewatch.store.group import shard_checkpoints

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464
# F10-F12 page on their readings (the oncewatch-drift alerts), not on each finding they keep; F15 is info.
PAGED_BY_READINGS = ("F10", "F11", "F12")
PAGED_BY_FINDING = tuple(r for r, rule in names.RULES.items() if r not in PAGED_BY_READINGS and rule.severity != "info")


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"oncewatch_{name}", doc, labels=list(labels))


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(f"oncewatch_{name}", doc, labels=list(labels))


def _binlog(status: Status) -> Iterator[Metric]:
    if not isinstance(status, BinlogStatus):
        return
    behind = _gauge("binlog_behind_seconds", "How far the binlog tail is behind the server's newest event.")
    if status.seconds_behind is not None:
        behind.add_metric([], status.seconds_behind)
    yield behind
    position = status.last_position
    file_number = _gauge("binlog_file_number", "Sequence number of the binlog file of the last handled transaction.")
    offset = _gauge("binlog_position_bytes", "Offset inside that binlog file of the end of the last transaction.")
    gtid = _gauge("binlog_gtid_sequence", "GTID sequence number reached, per replication domain.", ("domain",))
    if position is not None:
        match = re.search(r"(\d+)$", position.file)
        if match:
            file_number.add_metric([], int(match.group(1)))
        offset.add_metric([], position.pos)
        # MariaDB's domain-server-sequence triples; anything else is left out rather than fail the scrape.
        for domain, seq in re.findall(r"(?:^|,)\s*(\d+)-\d+-(\d+)", position.gtid):
            gtid.add_metric([domain], int(seq))
    yield from (file_number, offset, gtid)
    transactions = _counter("binlog_transactions_read", "Committed transactions read from the binlog.")
    transactions.add_metric([], status.transactions_read)
    events = _counter("binlog_events_read", "Binlog events the server sent, handed on or skipped: after a reconnect "
                      "it grows by what came after the checkpoint, never by a replay.")
    events.add_metric([], status.events_read)
    yield transactions
    yield events
    if isinstance(status, CdcStatus):  # CDC source mode: the change source's own counts
        yield from _cdc(status)


def _cdc(status: Status) -> Iterator[Metric]:
    """The CDC topics' reader's counts (collectors.cdc): the binlog component's in source mode, its own in check
    mode."""
    if not isinstance(status, CdcStatus):
        return
    counts = status.cdc
    cdc = _counter("cdc_records", "CDC mode: records of the CDC topics by what became of them: replayed (a "
                   "transaction already handed on, read again after a connector restart), late (of a transaction "
                   "without an END, after the ones behind it), unreadable (not a Debezium change event with its "
                   "schema: quarantined).", ("kind",))
    for kind, n in (("replayed", counts.replayed_records), ("late", counts.late_records),
                    ("unreadable", counts.unreadable_records)):
        cdc.add_metric([kind], n)
    incomplete = _counter("cdc_incomplete_transactions", "CDC mode: transactions whose END counted records "
                          "that did not come within cdc.transaction_grace_seconds, handed on without them.")
    incomplete.add_metric([], counts.incomplete_transactions)
    waiting = _gauge("cdc_open_transactions", "CDC mode: transactions read in part, waiting for their END or "
                     "their records.")
    waiting.add_metric([], counts.open_transactions)
    yield from (cdc, incomplete, waiting)


def _pipeline(stats: dict[str, Any]) -> Iterator[Metric]:
    """CDC check mode (checks.pipeline): how far the CDC topics are behind the binlog."""
    p = stats.get("pipeline") or {}
    if not p.get("against_binlog"):
        return
    for name, key, doc in (
            ("cdc_pipeline_lag_transactions", "lag_transactions", "Binlog transactions of the watched tables the CDC "
             "topics have not delivered yet (within rules.cdc_lost_grace_seconds; past it they are F13 findings)."),
            ("cdc_pipeline_lag_rows", "lag_rows", "Their rows."),
            ("cdc_pipeline_lag_seconds", "lag_seconds", "How long the oldest of them has waited for its copy, on the "
             "binlog's clock (0: none waits)."),
            ("cdc_position_gap_bytes", "position_gap", "Bytes of binlog from the oldest transaction the CDC topics "
             "have not delivered to the newest the monitor read (the binlog-to-CDC position difference; alert above "
             "rules.cdc_position_gap_threshold).")):
        gauge = _gauge(name, doc)
        gauge.add_metric([], p.get(key, 0))
        yield gauge
    before = _counter("cdc_transactions_before_start", "CDC check mode: transactions on the CDC topics from before "
                      "the binlog position the monitor started at, not judged.")
    before.add_metric([], p.get("before_start", 0))
    yield before


def _quarantine(counts: dict[tuple[str, str], int], events: Status | None) -> Metric:
    """The store's quarantine by topic and reason (so it survives a restart); every reason of every
    watched topic from the first scrape on, so increase() sees the first one."""
    quarantined = _counter("kafka_quarantined_records", "Kafka records that could not be parsed, kept aside in "
                           "the store (`oncewatch quarantine` lists them).", ("topic", "reason"))
    read = events.partitions if isinstance(events, KafkaEventsStatus) else ()
    topics = {p.topic for p in read} | {topic for topic, _ in counts}
    for topic in sorted(topics):
        for reason in dict.fromkeys([*names.QUARANTINE_REASONS, *sorted(r for t, r in counts if t == topic)]):
            quarantined.add_metric([topic, reason], counts.get((topic, reason), 0))
    return quarantined


def _binlog_quarantine(counts: dict[str, int]) -> Metric:
    quarantined = _counter("binlog_quarantined_events", "Binlog rows events of watched tables that could not be "
                           "decoded, kept aside in the store with their coordinates (`oncewatch quarantine`).",
                           ("reason",))
    for reason in dict.fromkeys([*names.BINLOG_QUARANTINE_REASONS, *sorted(counts)]):
        quarantined.add_metric([reason], counts.get(reason, 0))
    return quarantined


def _kafka_events(status: Status) -> Iterator[Metric]:
    read_offset = _gauge("kafka_read_offset", "Next offset the monitor will read, per watched partition.",
                         ("topic", "partition"))
    for p in status.partitions if isinstance(status, KafkaEventsStatus) else ():
        read_offset.add_metric([p.topic, str(p.partition)], p.position)
    yield read_offset


def _kafka_offsets(snapshot: Status) -> Iterator[Metric]:
    if not isinstance(snapshot, OffsetsSnapshot):
        return
    earliest = _gauge("kafka_earliest_offset", "Earliest offset still on the broker.", ("topic", "partition"))
    end = _gauge("kafka_end_offset", "End offset (next offset to be written).", ("topic", "partition"))
    for p in snapshot.partitions:
        earliest.add_metric([p.topic, str(p.partition)], p.earliest)
        end.add_metric([p.topic, str(p.partition)], p.end)
    yield from (earliest, end)
    labels = ("group", "topic", "partition")
    committed = _gauge("consumer_group_committed_offset", "Offset the group committed.", labels)
    lag = _gauge("consumer_group_lag", "Records between the group's commit and the end offset.", labels)
    lag_seconds = _gauge("consumer_group_lag_seconds", "Age of the oldest record the group has not committed, "
                         "estimated from the end offset history.", labels)
    uncommitted = _gauge("consumer_group_partitions_uncommitted", "Partitions the group never committed on "
                         "(no lag can be given for them).", ("group", "topic"))
    missing: dict[tuple[str, str], int] = {}
    for r in views.lag_rows(snapshot):
        key = [r.group, r.topic, str(r.partition)]
        missing.setdefault((r.group, r.topic), 0)
        if r.committed is None:
            missing[(r.group, r.topic)] += 1
            continue
        committed.add_metric(key, r.committed)
        if r.lag is not None:
            lag.add_metric(key, r.lag)
        if r.lag_seconds is not None:
            lag_seconds.add_metric(key, r.lag_seconds)
    for (group, topic), n in sorted(missing.items()):
        uncommitted.add_metric([group, topic], n)
    stddev = _gauge("consumer_group_lag_stddev", "Population standard deviation of partition lag (F12).",
                    ("group", "topic"))
    relative = _gauge("consumer_group_lag_relative_stddev", "That standard deviation over the mean partition lag "
                      "(F12: near 0 when every partition lags alike, as in a stall of the whole group).",
                      ("group", "topic"))
    for s in views.lag_skew(snapshot):
        stddev.add_metric([s.group, s.topic], s.stddev)
        relative.add_metric([s.group, s.topic], s.relative)
    yield from (committed, lag, lag_seconds, uncommitted, stddev, relative)


def _monitor(monitor: MonitorHealth) -> Iterator[Metric]:
    started = _gauge("monitor_start_time_seconds", "When the monitor process started (unix time).")
    started.add_metric([], monitor.started_at)
    caught_up = _gauge("monitor_caught_up", "1 when both streams are read to within rules.caught_up_seconds.")
    caught_up.add_metric([], 1 if monitor.caught_up else 0)
    verdict = _gauge("monitor_verdict", "1 for the monitor's verdict (healthy, degraded, failing; stopped once it "
                     "stopped), 0 for the others; the reasons are on the dashboard's Overview.", ("verdict",))
    for name in names.VERDICTS:
        verdict.add_metric([name], 1 if monitor.verdict == name else 0)
    lag = _gauge("stream_lag_seconds", "How far behind the monitor has applied each stream (0: read to its end).",
                 ("stream",))
    for stream, seconds in sorted(monitor.lag_seconds.items()):
        lag.add_metric([stream], seconds)
    stream_time = _gauge("stream_time_seconds", "Commit or record time reached in each stream (unix time).",
                         ("stream",))
    for stream, at in (("binlog", monitor.binlog_time), ("kafka", monitor.kafka_time)):
        if at:
            stream_time.add_metric([stream], at)
    threshold = _gauge("rule_threshold", "The monitor's [rules] thresholds, which the alert rules compare with.",
                       ("rule", "threshold"))
    for rule, values in sorted(monitor.thresholds.items()):
        for name, v in sorted(values.items()):
            threshold.add_metric([rule, name], v)
    judging = _gauge("rule_can_judge", "1 when the rule sees every stream it reads and the columns it reads of "
                     "`table` (one series per watched table whose columns the config names for it, none for a rule "
                     "that reads no table); 0: it is blind (unknown) there, its silence means nothing.",
                     ("rule", "table"))
    for rule, table, judges in can_judge(monitor):
        judging.add_metric([rule, table], int(judges))
    outages = _counter("store_outages", "Times this monitor process lost its store's server (PostgreSQL) and started "
                       "again from the checkpoint once it answered.")
    outages.add_metric([], monitor.store_outages)
    away = _counter("store_outage_seconds", "Seconds this monitor process's store was away, in all (the gap; the "
                    "records of that time are read after it, from the checkpoint).")
    away.add_metric([], monitor.store_outage_seconds)
    deaths = _counter("store_writer_deaths", "Times this monitor process's store writer process ([store] writer = "
                      "\"process\") died without a word (out of memory, killed) and the monitor started again from the "
                      "last checkpoint written.")
    deaths.add_metric([], monitor.store_writer_deaths)
    yield from (started, caught_up, verdict, lag, stream_time, threshold, judging, outages, away, deaths)


def can_judge(monitor: MonitorHealth) -> Iterator[tuple[str, str, bool]]:
    """(rule, table, judges) of the monitor's health row: a rule blind everywhere (a stream it reads unseen)
    judges no table; one a shape problem blinds for some tables judges the others."""
    blind = set(monitor.blind_rules)
    for rule in names.RULES:
        shaped = set(monitor.blind_tables.get(rule, ()))
        for table in sorted(set(monitor.rule_tables.get(rule, ())) | shaped) or [""]:
            yield rule, table, rule not in blind and table not in shaped


def _engine(stats: dict[str, Any], counts: list[tuple[str, str, str, int]]) -> Iterator[Metric]:
    backlog = _gauge("backlog_changes", "Committed changes still within their grace, waiting for their Kafka event "
                     "(those past it are F7 findings).", ("table",))
    for table, n in sorted(stats.get("backlog_by_table", {}).items()):
        backlog.add_metric([table], n)
    yield backlog
    delay = HistogramMetricFamily("oncewatch_event_delay_seconds", "Kafka time minus commit time of matched "
                                  "change/event pairs, by the commit clock used.", labels=["clock"])
    for clock, buckets in histogram.delay_buckets(stats).items():
        delay.add_metric([clock], [(b if b == "+Inf" else floatToGoString(float(b)), n) for b, n in buckets],
                         stats["delay"][clock]["sum"])
    yield delay
    open_ = _gauge("findings_open", "Findings whose fact still stands (not resolved), reviewed or not.",
                   ("rule", "severity"))
    for (rule, severity), n in sorted(views.standing(counts).items()):
        open_.add_metric([rule, severity], n)
    yield open_
    found = _counter("findings_found", "Findings found since the store was created, by rule.", ("rule",))
    # Every rule is present from the start so that increase() sees the first finding of a rule.
    for rule in views.RULES:
        found.add_metric([rule], stats.get("found_total", {}).get(rule, 0))
    yield found
    dropped = _counter("engine_horizon_dropped", "Open state dropped, by space: older than rules.horizon_seconds "
                       "(reason=age) or over rules.horizon_max_entries (reason=count).", ("space", "reason"))
    for space, reasons in sorted(stats.get("horizon_dropped", {}).items()):
        for reason, n in sorted(reasons.items()):
            dropped.add_metric([space, reason], n)
    yield dropped
    suppressed = _counter("findings_suppressed", "What a rule blind to a shape change (a configured column "
                          "dropped, renamed or retyped) would have raised meanwhile, by rule.", ("rule",))
    for rule in views.RULES:
        suppressed.add_metric([rule], stats.get("suppressed_total", {}).get(rule, 0))
    yield suppressed
    truncated = _counter("tables_truncated", "TRUNCATEs of a watched table seen: every row of it gone (its pending "
                         "orders and duplicated effects end).", ("table",))
    for table, n in sorted(stats.get("truncated_total", {}).items()):
        truncated.add_metric([table], n)
    yield truncated
    shape = _gauge("shape_problem", "1 per configured column a DDL broke (the health reasons say how); the rules "
                   "reading it (`rules`) cannot judge that table until it is put back.",
                   ("table", "config_key", "rules"))
    for p in stats.get("shape_problems", []):
        shape.add_metric([p["table"], p["config_key"], ",".join(p["rules"])], 1)
    yield shape


def _verdicts(totals: dict[str, Any], pending: int, monitor: MonitorHealth | None) -> Iterator[Metric]:
    """The verdict per trade (issue 45) from the store's running totals, which carry on across a restart; and the
    objective the burn-rate alerts compare with (the monitor's [slo])."""
    verified = _counter("trades_verified", "Successful payments (trades) verified exactly once: one success for "
                        "their order, each effect once, every change announced, no finding, within the graces.")
    verified.add_metric([], totals["verified"])
    violated = _counter("trades_violated", "Successful payments a finding touched, by the first rule that did (a "
                        "verified one a later finding touches counts here too).", ("rule",))
    for rule in dict.fromkeys([*(f"F{i}" for i in range(1, 11)), *sorted(totals["violated"])]):
        violated.add_metric([rule], totals["violated"].get(rule, 0))
    pending_ = _gauge("trades_pending", "Successful payments whose verdict is still to come (a grace still runs, or "
                      "an effect's row is still to be written).")
    pending_.add_metric([], pending)
    yield from (verified, violated, pending_)
    for name, key, doc in (
            ("amount_verified", "amount_verified", "Money of the verified trades, in the shop's unit."),
            ("amount_violated", "amount_violated", "Money of the violated trades, in the shop's unit."),
            ("amount_verified_late", "amount_late", "Money of the trades verified later than slo.within_seconds "
             "after their commit (bad events of the SLO, as the violated ones are)."),
            ("amount_reversed", "amount_reversed", "Money of the trades verified, then violated by a later finding: "
             "in both totals above, so the SLO counts it once in its denominator.")):
        counter = _counter(name, doc)
        counter.add_metric([], float(totals[key]))
        yield counter
    h = totals["seconds"]
    running, buckets = 0, []
    for bound, n in zip((*(floatToGoString(b) for b in verdicts.SECONDS_BUCKETS), "+Inf"), h["counts"]):
        running += n
        buckets.append((bound, running))
    seconds = HistogramMetricFamily("oncewatch_verification_seconds", "From a payment's commit to its verdict "
                                    "(verified or violated), on the stream clocks the rules judge by.")
    seconds.add_metric([], buckets, h["sum"])
    yield seconds
    slo = monitor.slo if monitor is not None else None
    if slo is not None:
        for name, value, doc in (("slo_objective", slo.objective, "The share of money to verify within "
                                  "slo.within_seconds (the [slo] objective): what the burn-rate alerts burn."),
                                 ("slo_within_seconds", slo.within_seconds, "The objective's time from commit to "
                                  "verdict.")):
            gauge = _gauge(name, doc)
            gauge.add_metric([], value)
            yield gauge


def _lifecycle(counts: list[tuple[str, str, str, int]]) -> Metric:
    """The store's findings by lifecycle status: the paging alerts follow status="open" (neither
    acknowledged nor closed), so an alert ends when someone acts or the fact ends."""
    by_status = _gauge("findings_by_status", "Findings in the store by rule, severity and lifecycle status (open: "
                       "nobody has acknowledged or closed it yet).", ("rule", "severity", "status"))
    for rule, severity, status, n in counts:
        by_status.add_metric([rule, severity, status], n)
    return by_status


def _paging(listed: list[tuple[str, str, str, dict[str, Any]]], total: int) -> Iterator[Metric]:
    """A series per finding that pages, so that its alert ends when that one finding is acknowledged, closed or
    resolved, and a new one notifies while others of its rule fire; bounded, with the rest counted."""
    finding = _gauge("finding_paging", "1 for each finding that pages: open (nobody has acknowledged or closed it) "
                     "and above info, of a rule paged per finding (not F10-F12, which page on their readings); the "
                     "oldest metrics.paging_max_findings of them.", ("rule", "severity", "finding", "entity"))
    for fid, rule, severity, keys in listed:
        # The CDC pipeline's findings (F13, F14, F16) are of a transaction, which no drill-down entity names.
        finding.add_metric([rule, severity, fid, views.entity_of(keys) or str(keys.get("gtid", ""))], 1)
    overflow = _gauge("findings_paging_overflow", "Findings that page but have no series of their own: those past "
                      "the oldest metrics.paging_max_findings.")
    overflow.add_metric([], total - len(listed))
    yield from (finding, overflow)


def _pruned(pruned: dict[str, int]) -> Metric:
    counter = _counter("store_pruned_rows", "Raw records pruned from the store past store.retention_hours, by "
                       "table (findings keep their own evidence).", ("table",))
    for table, n in pruned.items():
        counter.add_metric([table], n)
    return counter


def _budget(pruned: dict[str, int], pruned_at: float | None, used: int | None,
            monitor: MonitorHealth | None) -> Iterator[Metric]:
    """The store against its disk budget (store.max_bytes, oncewatch.monitor.budget)."""
    counter = _counter("store_budget_pruned_rows", "Raw records pruned from the store to keep it within "
                       "store.max_bytes, by table, whatever their age (findings keep their own evidence).", ("table",))
    for table, n in pruned.items():
        counter.add_metric([table], n)
    yield counter
    last = _gauge("store_budget_pruned_last_timestamp_seconds", "When raw records were last pruned for "
                  "store.max_bytes (0: never).")
    last.add_metric([], pruned_at or 0.0)
    yield last
    if used is not None:
        in_use = _gauge("store_used_bytes", "Bytes of the store's file in use (free pages and the WAL left out): what "
                        "store.max_bytes budgets.")
        in_use.add_metric([], used)
        yield in_use
    space = monitor.store_space if monitor is not None else None
    budget = _gauge("store_max_bytes", "store.max_bytes as the monitor runs with it (0: no budget).")
    budget.add_metric([], space.max_bytes if space else 0)
    exhausted = _gauge("store_budget_exhausted", "1 while the engine's open state and the findings, which are never "
                       "pruned, alone fill store.max_bytes: raise it.")
    exhausted.add_metric([], int(bool(space and space.exhausted)))
    yield from (budget, exhausted)


def _health(health: dict[str, views.Component]) -> Iterator[Metric]:
    updated = _gauge("health_updated_timestamp_seconds", "When the monitor last wrote this component's health "
                     "(unix time); an old value means a stale monitor.", ("component",))
    for name, c in sorted(health.items()):
        updated.add_metric([name], c.updated_at)
    yield updated
    up = _gauge("collector_up", "1 when the collector's reader runs and it is connected (the offsets poller: "
                "answered).", ("collector",))
    records = _counter("collector_records_read", "Records read: binlog rows, Kafka records.", ("collector",))
    reconnects = _counter("collector_reconnects", "Reconnections after a lost connection.", ("collector",))
    failures = _counter("collector_failures", "Unexpected errors that ended the collector's reader (a bug; the "
                        "reader is restarted from the checkpoint, a few times at most).", ("collector",))
    alive = _gauge("collector_last_alive_timestamp_seconds", "When the collector's reader last showed life: a "
                   "read, a poll that returned, a server heartbeat (unix time); old means stuck or dead.",
                   ("collector",))
    cpu = _counter("cpu_seconds", "CPU time (user + system) of each part of the monitor: the readers that run in a "
                   "process of their own (the binlog or CDC topics, Kafka events, CDC check mode's topics), the "
                   "monitor's own process (part=\"monitor\": the rules, the readers in threads), the process that "
                   "writes its checkpoints into the store (part=\"store\": the raw records, the engine's state, the "
                   "findings) and the process the others are forked from (part=\"forkserver\": its imports, then a "
                   "fork a start). A process's starts again from 0 when it is started again.", ("part",))
    if (monitor := views.monitor_of(health)) is not None:
        for part, seconds in ((names.MONITOR, monitor.cpu_seconds), (names.FORKSERVER, monitor.forkserver_cpu_seconds),
                              (names.STORE_WRITER, monitor.store_writer_cpu_seconds)):
            if seconds is not None:
                cpu.add_metric([part], seconds)
    for name in names.COLLECTORS:
        row = health[name].health if name in health else None
        if not isinstance(row, ComponentHealth):
            continue
        up.add_metric([name], 1 if row.up else 0)
        failures.add_metric([name], row.reader.failures)
        if row.reader.alive_at is not None:
            alive.add_metric([name], row.reader.alive_at)
        if row.reader.cpu_seconds is not None:
            cpu.add_metric([name], row.reader.cpu_seconds)
        status = row.status
        if isinstance(status, BinlogStatus):  # the offsets poller reads no records
            records.add_metric([name], status.rows_read)
        elif isinstance(status, KafkaEventsStatus):
            records.add_metric([name], status.records_read)
        if not isinstance(status, OffsetsSnapshot):
            reconnects.add_metric([name], status.reconnects)
    yield from (up, records, reconnects, failures, alive, cpu)
    parts = {names.BINLOG: _binlog, names.KAFKA_EVENTS: _kafka_events, names.KAFKA_OFFSETS: _kafka_offsets,
             names.CDC: _cdc}
    for name, metrics in parts.items():
        if (status := views.status_of(health, name)) is not None:
            yield from metrics(status)
    if monitor is not None:
        yield from _monitor(monitor)


def _members(members: dict[str, GroupMemberHealth]) -> Iterator[Metric]:
    """Instances of a group ([group]): each one's share of the work, as its health row says."""
    seen = _gauge("group_member_updated_timestamp_seconds", "When the group member last wrote its health (unix time); "
                  "one stopped or killed keeps its last time (its shards and sources are others' by then).",
                  ("member",))
    owned = _gauge("group_member_shards", "Shards the member judges now.", ("member",))
    change = _gauge("group_member_change_source", "1 when the member reads the change source (the CDC topics).",
                    ("member",))
    partitions = _gauge("group_member_event_partitions", "Event partitions the member reads now.", ("member",))
    applied = _counter("group_member_records_applied", "Rows and events this member's process applied (its share "
                       "of the work).", ("member",))
    written = _counter("group_member_messages_written", "Messages this member's process wrote to the internal "
                       "topic.", ("member",))
    fenced = _counter("group_member_fenced", "Commits this member's process lost to another that had taken the "
                      "shard (it then drops the shard).", ("member",))
    rejoins = _counter("group_member_rejoins", "Times one of this member's consumers was found left outside its "
                       "Kafka group (no assignment 20 s after a rebalance began) and was made again.", ("member",))
    outages = _counter("group_member_store_outages", "Times this member's process lost the store and started again "
                       "from the store's commits once it answered.", ("member",))
    away = _counter("group_member_store_outage_seconds", "Seconds this member's process was without its store, in "
                    "all (the gap; what came meanwhile is read after it).", ("member",))
    kafka = _counter("group_member_kafka_outages", "Times this member's process found the Kafka broker away as it "
                     "started, and waited for it.", ("member",))
    kafka_away = _counter("group_member_kafka_outage_seconds", "Seconds this member's process waited for the Kafka "
                          "broker as it started, in all.", ("member",))
    purged = _counter("group_member_purged_records", "Records of the group's internal topic this member deleted as the "
                      "owner of shard 0, once every shard had committed past them.", ("member",))
    purge_failures = _counter("group_member_purge_failures", "Purges of the internal topic the broker refused (tried "
                              "again at the next).", ("member",))
    stale = _counter("group_member_stale_positions", "Change source positions this member's router was refused "
                     "storing: another router had stored the source further (this one had lost the lease).",
                     ("member",))
    for name, v in sorted(members.items()):
        seen.add_metric([name], v.at)
        owned.add_metric([name], len(v.shards))
        change.add_metric([name], 1 if v.routers.change_source else 0)
        partitions.add_metric([name], views.event_partitions(v))
        applied.add_metric([name], v.applied)
        written.add_metric([name], v.routers.written)
        fenced.add_metric([name], v.fenced)
        rejoins.add_metric([name], v.rejoins)
        outages.add_metric([name], v.store_outages)
        away.add_metric([name], v.store_outage_seconds)
        kafka.add_metric([name], v.kafka_outages)
        kafka_away.add_metric([name], v.kafka_outage_seconds)
        purged.add_metric([name], v.purged)
        purge_failures.add_metric([name], v.purge_failures)
        stale.add_metric([name], v.routers.stale_positions)
    yield from (seen, owned, change, partitions, applied, written, fenced, rejoins, outages, away, kafka, kafka_away,
                purged, purge_failures, stale)


def _shards(shards: dict[int, dict[str, Any]]) -> Iterator[Metric]:
    """A group's shards, whoever owns them now (their last commits)."""
    committed = _gauge("group_shard_committed_timestamp_seconds", "When the shard's findings, state and offset were "
                       "last committed (unix time): old means no member judges it.", ("shard",))
    owner = _gauge("group_shard_owner", "1 for the member that last committed the shard.", ("shard", "member"))
    records = _counter("group_shard_records_applied", "Rows and events the shard applied, by all its owners.",
                       ("shard",))
    repeated = _counter("group_shard_repeated", "Messages a router wrote again (after a restart or a move) that the "
                        "shard did not apply twice.", ("shard",))
    lag = _gauge("group_shard_lag_messages", "Internal-topic messages written for the shard and not yet committed.",
                 ("shard",))
    clock = _gauge("group_shard_clock_seconds", "How far each of the shard's clocks has been vouched (unix time): the "
                   "change source's and the Kafka events'.", ("shard", "clock"))
    for shard, c in shards.items():
        label = str(shard)
        committed.add_metric([label], c["committed_at"])
        if c.get("owner"):
            owner.add_metric([label, c["owner"]], 1)
        records.add_metric([label], c["records"])
        repeated.add_metric([label], c["repeated"])
        lag.add_metric([label], max(0, c["end"] - c["offset"]))
        clock.add_metric([label, "binlog"], c["binlog_time"])
        clock.add_metric([label, "kafka"], c["kafka_time"])
    yield from (committed, owner, records, repeated, lag, clock)


class StoreCollector(Collector):
    """Reads the store at scrape time. A store that cannot be read gives `oncewatch_store_up 0` alone.

    A member of a group ([group]) serves its own row (`member`) and, while `wide()` (it owns the leader shard), the
    store's: every member's and shard's, the findings and the group's engine stats, so that of the members scraped
    exactly one pages for a finding; those carry `instance="group/<group>"` (_as_instance)."""

    def __init__(self, target: str | PostgresTarget, member: str | None = None,
                 wide: Callable[[], bool] = lambda: True, group: str | None = None,
                 paging_max: int = MetricsConfig.paging_max_findings):
        self.target, self.member, self.wide, self.group, self.paging_max = target, member, wide, group, paging_max

    def collect(self) -> Iterator[Metric]:
        store_up = _gauge("store_up", "1 when the monitor's store could be read for this scrape.")
        try:
            with closing(views.open_store(self.target)) as store:
                health = views.components(store, time.time())
                stats = views.engine_stats(store)
                counts = store.finding_counts()
                quarantine = store.quarantine_counts()
                binlog_quarantine = store.binlog_quarantine_counts()
                pruned = retention.pruned_total(store)
                budget_pruned = retention.pruned_total(store, for_budget=True)
                budget_at = retention.budget_pruned_at(store)
                used = store.used_bytes()
                shards = shard_checkpoints(store)
                paging = store.paging_findings(PAGED_BY_FINDING, self.paging_max)
                totals, pending = verdicts.totals(store), verdicts.pending(store)
        except (StoreError, sqlite3.Error):  # missing, not yet initialised, or unreadable
            store_up.add_metric([], 0)
            yield store_up
            return
        store_up.add_metric([], 1)
        yield store_up
        build = _gauge("build_info", "Always 1; the version of the oncewatch that serves these metrics.", ("version",))
        build.add_metric([__version__], 1)
        yield build
        members = {name: member for name, (_, member) in views.members_of(health).items()}
        if not self.wide():
            yield from _members({self.member: members[self.member]} if self.member in members else {})
            return
        wide = chain(_members(members), _shards(shards)) if members or shards else iter(())
        wide = chain(wide, _health(health), [
            _quarantine(quarantine, views.status_of(health, names.KAFKA_EVENTS)),
            _binlog_quarantine(binlog_quarantine)], _engine(stats, counts), _pipeline(stats), [_lifecycle(counts),
                                                                                             _pruned(pruned)],
            _paging(*paging), _budget(budget_pruned, budget_at, used, views.monitor_of(health)),
            _verdicts(totals, pending, views.monitor_of(health)))
        yield from wide if self.group is None else _as_instance(wide, f"group/{self.group}")


def _as_instance(families: Iterable[Metric], instance: str) -> Iterator[Metric]:
    """The store's series with an `instance` of their own: a group's, whichever member serves them (the one owning
    shard 0, which changes as the group rebalances). Scraped with `honor_labels: true`, an alert on them stays one
    alert across such a move instead of ending on the old member and firing again on the new."""
    for family in families:
        labelled = Metric(family.name, family.documentation, family.type, family.unit)
        labelled.samples = [s._replace(labels={**s.labels, "instance": instance}) for s in family.samples]
        yield labelled


def registry(target: str | PostgresTarget, member: str | None = None,
             wide: Callable[[], bool] = lambda: True, group: str | None = None,
             paging_max: int = MetricsConfig.paging_max_findings) -> CollectorRegistry:
    """A registry holding only the store collector (no process/platform metrics of the server)."""
    reg = CollectorRegistry()
    reg.register(StoreCollector(target, member, wide, group, paging_max))
    return reg


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds up the monitor's exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Scrapes and probes come every few seconds: no access log."""


def serve(target: str | PostgresTarget, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, member: str | None = None,
          wide: Callable[[], bool] = lambda: True, group: str | None = None,
          paging_max: int = MetricsConfig.paging_max_findings) -> tuple[WSGIServer, Thread]:
    """Serve /metrics for the store, and /healthz and /readyz beside it (dashboards.probes), in a daemon thread.
    Port 0 picks a free port: read it from `server.server_port`. Stop with `server.shutdown(); server.server_close()`."""
    app = probes.with_probes(make_wsgi_app(registry(target, member, wide, group, paging_max)), target, member)
    server_class = type("Server", (_Server,), {"address_family": socket.getaddrinfo(host, port)[0][0]})
    server = make_server(host, port, app, server_class, handler_class=_Quiet)
    thread = Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread
