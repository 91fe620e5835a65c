"""A small store with known figures: what the page, metrics and browser tests check against.

One paid order O501 whose trade_no T1001 created two shipments (an open F1), an order O502
paid with no event (an open F7), replayed and conflicting events (F9), and resolved findings,
plus the health rows, engine stats and series a running monitor writes. Key figures:

- binlog up, 2.5 s behind, at mysql-bin.000003:123456 (GTID 0-1-4711), 1 reconnect, 1,200 rows;
- kafka_events up (its reader restarted once), 900 records read, 4 unread, quarantined
  shop.events|not_json 3 and |too_large 1;
- group shipping-service lags 10 and 22 (stddev 6.0) with partition 2 never committed;
- the monitor degraded: Kafka applied 7 s behind (binlog 2.5 s), and payments.callback_status
  dropped, so F6 cannot judge;
- backlog shop.orders 7 + shop.shipments 2 = 9; p99 event delay 0.475 s;
- 7 findings, 5 open, 3 of them critical (F1, F7, F9 conflicting).
"""

from __future__ import annotations

import time
from decimal import Decimal

from devservices.samples import shop_settings
from oncewatch.checks import shape
from oncewatch.core.config import PostgresTarget
from oncewatch.core.protocol import (BinlogStatus, ComponentHealth, GroupMemberHealth, KafkaEventsStatus, MonitorHealth,
                                     ReaderHealth, RoutersHealth, ShardHealth, Slo)
from oncewatch.core.records import (CLOCK_GTID_COMMIT_TS, CLOCK_ROW_COLUMN, OP_INSERT, OP_UPDATE, VERDICT_PENDING,
                                    VERDICT_VERIFIED, VERDICT_VIOLATED, BinlogPosition, EmittedEvent, Evidence,
                                    Finding, GroupOffsets, GroupPartition, OffsetsSnapshot, PartitionRange,
                                    PartitionStatus, QuarantinedRecord, RowChange, TradeVerdict)
from oncewatch.store import Store, verdicts

TOPIC = "shop.events"
GROUP = "shipping-service"


def _row(table: str, op: str, pk: str, before: dict | None, after: dict | None, gtid: int, index: int,
         at: float) -> RowChange:
    return RowChange(schema="shop", table=table, op=op, pk=(pk,), before=before, after=after, txid=f"0-1-{gtid}",
                     row_index=index, binlog_file="mysql-bin.000003", end_pos=100_000 + gtid, commit_time=at,
                     commit_clock=CLOCK_GTID_COMMIT_TS)


def _event(partition: int, offset: int, at: float, payload: dict) -> EmittedEvent:
    keys = {k: payload[p] for k, p in (("event_type", "type"), ("order_key", "order_no"), ("trade_no", "trade_no"),
                                       ("effect_id", "entity_id")) if p in payload}
    return EmittedEvent(topic=TOPIC, partition=partition, offset=offset, timestamp_ms=int(at * 1000),
                        timestamp_type="CreateTime", key=payload.get("order_no"), headers=(), payload=payload,
                        format="json", keys=keys)


def _evidence_of(item: RowChange | EmittedEvent) -> Evidence:
    if isinstance(item, RowChange):
        return Evidence("row_change", item.coordinates, item.commit_time, {"table": item.qualified_table, **item.row})
    return Evidence("event", item.coordinates, item.timestamp_ms / 1000, dict(item.payload))


def _announced(order: str) -> dict:
    """Keys the announcement rules (F7-F10) give a finding about an order's order.paid event."""
    return {"event_type": "order.paid", "key": order, "table": "shop.orders"}


def _finding(fid: str, rule: str, name: str, severity: str, keys: dict, summary: str, at: float,
             evidence: list[RowChange | EmittedEvent], resolution: str | None = None) -> Finding:
    return Finding(id=fid, rule=rule, name=name, severity=severity, keys=keys, summary=summary, first_seen=at,
                   last_seen=at + 30, evidence=tuple(_evidence_of(e) for e in evidence),
                   status="resolved" if resolution else "open", resolved_at=at + 60 if resolution else None,
                   resolution=resolution)


def reader(alive_at: float, failures: int = 0, cpu_seconds: float | None = None) -> ReaderHealth:
    """A reader's part of a collector's health row: running, restarted `failures` times, `cpu_seconds` used in a
    process of its own (None: a reader in a thread of the monitor's process)."""
    return ReaderHealth(running=True, failures=failures, last_failure="ValueError: injected" if failures else None,
                        alive_at=alive_at, cpu_seconds=cpu_seconds)


def write_health(store: Store, now: float) -> None:
    """The four health rows of a monitor that is up, as in the module docstring."""
    store.set_health("binlog", ComponentHealth(BinlogStatus(
        connected=True, seconds_behind=2.5, last_position=BinlogPosition("0-1-4711", "mysql-bin.000003", 123456),
        last_event_time=now - 2.5, reconnects=1, rows_read=1200, transactions_read=400),
        reader(now - 0.5, cpu_seconds=41.5)))
    store.set_health("kafka_events", ComponentHealth(KafkaEventsStatus(
        connected=True, state="reading", reconnects=2, records_read=900,
        partitions=(PartitionStatus(TOPIC, 0, 300, 300, now - 1), PartitionStatus(TOPIC, 1, 300, 302, now - 1),
                    PartitionStatus(TOPIC, 2, 298, 300, now - 1))), reader(now - 0.2, failures=1, cpu_seconds=12.25)))
    ends = (300, 302, 300)
    store.set_health("kafka_offsets", ComponentHealth(OffsetsSnapshot(
        polled_at=now - 1, error=None,
        partitions=tuple(PartitionRange(TOPIC, p, 0, e) for p, e in enumerate(ends)),
        groups=(GroupOffsets(GROUP, "Stable", (GroupPartition(TOPIC, 0, 290, 10, 1.5),
                                               GroupPartition(TOPIC, 1, 280, 22, 3.0),
                                               GroupPartition(TOPIC, 2, None, None, None))),
                GroupOffsets("points-service", "Empty", tuple(GroupPartition(TOPIC, p, e, 0, 0.0)
                                                              for p, e in enumerate(ends))))), reader(now - 1)))
    store.set_health("monitor", MonitorHealth(
        started_at=now - 3600, pid=4242, cpu_seconds=96.0, forkserver_cpu_seconds=1.25, store_writer_cpu_seconds=30.5,
        binlog_time=now - 2.5,
        kafka_time=now - 7.0, caught_up=False,
        verdict="degraded", reasons=("kafka read 7.0 s behind (caught up means within 5 s)",
                                     "domain.payments.callback_status_column: shop.payments.callback_status "
                                     "is gone (dropped or renamed) (F6 cannot judge)"),
        lag_seconds={"binlog": 2.5, "kafka": 7.0}, blind_tables={"F6": ("shop.orders", "shop.payments")},
        rule_tables={rule: tuple(tables) for rule, tables in shape.reads(shape.needs(shop_settings())).items()},
        shape_problems=(SHAPE_PROBLEM,),
        thresholds={"F10": {"event_delay_seconds": 0.5}, "F11": {"offset_drift_threshold": 5000.0},
                    "F12": {"partition_skew_threshold": 3.0, "partition_skew_relative": 0.5},
                    "F13": {"cdc_position_gap_threshold": 5000.0}},
        slo=Slo(0.999, 60.0)))


# A column the config names was dropped: F6 cannot judge (checks.shape).
SHAPE_PROBLEM = {"table": "shop.payments", "column": "callback_status",
                 "config_key": "domain.payments.callback_status_column", "rules": ["F6"],
                 "what": "shop.payments.callback_status is gone (dropped or renamed)"}
ENGINE_STATS = {
    "backlog_by_table": {"shop.orders": 7, "shop.shipments": 2},
    "delay": {
        CLOCK_GTID_COMMIT_TS: {"buckets": {"0.005": 5, "0.01": 12, "0.025": 30, "0.05": 52, "0.1": 70, "0.25": 90,
                                           "0.5": 100, "1.0": 100, "2.5": 100, "+Inf": 100},
                               "sum": 9.8, "count": 100},
        CLOCK_ROW_COLUMN: {"buckets": {"0.005": 0, "0.01": 0, "0.025": 1, "0.05": 2, "0.1": 5, "0.25": 10,
                                       "0.5": 15, "1.0": 18, "2.5": 20, "+Inf": 20},
                           "sum": 8.5, "count": 20}},
    "found_total": {"F1": 1, "F2": 1, "F7": 2, "F9": 3},
    "horizon_dropped_total": 3,
    "horizon_dropped": {"effects": {"age": 3, "count": 0}, "waiting_changes.fresh": {"age": 0, "count": 0}},
    "suppressed_total": {},
    "shape_problems": [SHAPE_PROBLEM],
    "truncated_total": {"shop.shipments": 1},
    # [cdc] mode = "check": the CDC topics two transactions behind the binlog (checks.pipeline)
    "pipeline": {"against_binlog": True, "lag_transactions": 2, "lag_rows": 5, "lag_seconds": 1.5,
                 "position_gap": 1800, "before_start": 0, "replayed_records": 0},
}


def trade_verdicts(t0: float) -> list[TradeVerdict]:
    """The scenario's verdicts per trade: T1001 violated by its duplicated shipment, four verified (one of them
    later than the objective's 60 s), one pending: 99.00 of 1098.50 violated."""
    def verdict(trade_no: str, amount: str, state: str, at: float, reached: float | None,
                rule: str | None = None) -> TradeVerdict:
        return TradeVerdict(trade_no, f"O{trade_no[1:]}", Decimal(amount), state, rule, t0 + at,
                            None if reached is None else t0 + reached)
    return [verdict("T1001", "99.00", VERDICT_VIOLATED, 5, 9, "F1"),
            verdict("T1002", "500.00", VERDICT_VERIFIED, 10, 40), verdict("T1003", "250.00", VERDICT_VERIFIED, 12, 42),
            verdict("T1004", "199.50", VERDICT_VERIFIED, 15, 45), verdict("T1005", "50.00", VERDICT_VERIFIED, 20, 200),
            verdict("T1006", "30.00", VERDICT_PENDING, 550, None)]


def seed(path: str | PostgresTarget, now: float | None = None) -> Store:
    """Write the scenario into a new store at `path` (or in a PostgreSQL database); returns the (writable) store."""
    now = time.time() if now is None else now
    t0 = now - 600
    store = Store(path)
    paid = {"order_no": "O501", "status": "paid", "amount": Decimal("99.00")}
    rows = [
        _row("orders", OP_INSERT, "O501", None, {**paid, "status": "pending"}, 4701, 0, t0),
        _row("payments", OP_INSERT, "T1001", None,
             {"trade_no": "T1001", "order_no": "O501", "status": "success", "amount": Decimal("99.00")},
             4702, 0, t0 + 5),
        _row("orders", OP_UPDATE, "O501", {**paid, "status": "pending"}, paid, 4702, 1, t0 + 5),
        _row("shipments", OP_INSERT, "S1", None, {"shipment_id": "S1", "trade_no": "T1001"}, 4703, 0, t0 + 6),
        _row("shipments", OP_INSERT, "S2", None, {"shipment_id": "S2", "trade_no": "T1001"}, 4704, 0, t0 + 9),
        _row("orders", OP_UPDATE, "O502", {"order_no": "O502", "status": "pending"},
             {"order_no": "O502", "status": "paid"}, 4705, 0, t0 + 20),
    ]
    row_entities = [(0, "order_key:O501"), (1, "order_key:O501"), (1, "trade_no:T1001"), (2, "order_key:O501"),
                    (3, "trade_no:T1001"), (4, "trade_no:T1001"), (5, "order_key:O502")]
    events = [
        _event(0, 100, t0 + 5.2, {"type": "order.paid", "order_no": "O501", "trade_no": "T1001"}),
        _event(1, 200, t0 + 6.1, {"type": "shipment.created", "entity_id": "S1", "trade_no": "T1001"}),
        _event(1, 201, t0 + 9.3, {"type": "shipment.created", "entity_id": "S2", "trade_no": "T1001"}),
        _event(2, 50, t0 + 40, {"type": "order.paid", "order_no": "O507", "amount": "10.00"}),
        _event(2, 51, t0 + 41, {"type": "order.paid", "order_no": "O507", "amount": "12.00"}),
    ]
    event_entities = [(0, "order_key:O501"), (0, "trade_no:T1001"), (1, "trade_no:T1001"), (2, "trade_no:T1001"),
                      (3, "order_key:O507"), (4, "order_key:O507")]
    findings = [
        _finding("f1-t1001", "F1", "duplicate_effect", "critical", {"table": "shop.shipments", "trade_no": "T1001"},
                 "2 shop.shipments rows for trade_no T1001 (S1, S2)", t0 + 9, [rows[3], rows[4]]),
        _finding("f7-o502", "F7", "missing_event", "critical", _announced("O502"),
                 "orders O502 became paid, no order.paid event on shop.events after 30 s", t0 + 50, [rows[5]]),
        _finding("f7-o504", "F7", "missing_event", "critical", _announced("O504"),
                 "orders O504 became paid, no order.paid event on shop.events after 30 s", t0 + 60, [],
                 resolution="event arrived late (F10)"),
        _finding("f2-o505", "F2", "double_charge", "critical",
                 {"order": "O505", "trade_nos": ["T2005", "T2006"]},
                 "2 successful trade_nos for order O505", t0 + 70, [], resolution="refunded T2006"),
        _finding("f9-o503", "F9", "duplicate_event", "info", _announced("O503"),
                 "order.paid for O503 announced twice, same payload", t0 + 80, []),
        _finding("f9-o506", "F9", "duplicate_event", "info", _announced("O506"),
                 "order.paid for O506 announced twice, same payload", t0 + 90, []),
        _finding("f9-o507", "F9", "duplicate_event", "critical", _announced("O507"),
                 "order.paid for O507 announced twice with different amounts", t0 + 100, [events[3], events[4]]),
    ]
    with store.batch() as tx:
        tx.add_row_changes(rows, row_entities)
        tx.add_events(events, event_entities)
        tx.add_quarantined([QuarantinedRecord(TOPIC, 0, 7 + i, int(t0 * 1000), "not_json", "Expecting value", 5,
                                              "oops!") for i in range(3)]
                           + [QuarantinedRecord(TOPIC, 1, 9, int(t0 * 1000), "too_large", "2000000 bytes", 2_000_000,
                                                "{\"type\": \"order.paid\", ...")])
        tx.upsert_findings(findings)
        verdicts.save(tx, trade_verdicts(t0), 60.0)
        tx.set_state("engine_stats", ENGINE_STATS)
        ramp = range(21)
        tx.add_series([("backlog", {"table": "shop.orders"}, t0 + 30 * i, float(min(i, 7))) for i in ramp]
                      + [("backlog", {"table": "shop.shipments"}, t0 + 30 * i, float(i % 3)) for i in ramp]
                      + [("delay_p99", {}, t0 + 30 * i, 0.2 + 0.275 * i / 20) for i in ramp]
                      + [("group_lag", {"group": GROUP, "topic": TOPIC}, t0 + 30 * i, float(12 + i)) for i in ramp]
                      + [("lag_stddev", {"group": GROUP, "topic": TOPIC}, t0 + 30 * i, i * 0.3) for i in ramp]
                      + [("lag_mean", {"group": GROUP, "topic": TOPIC}, t0 + 30 * i, (12 + i) / 2) for i in ramp]
                      + [("cdc_position_gap", {"unit": "bytes"}, t0 + 30 * i, 90.0 * i) for i in ramp])
    write_health(store, now)
    return store


def seed_group(store: Store, now: float | None = None) -> None:
    """A group of two instances on the store ([group], oncewatch.monitor.group): "east" judges shards 0 and 1 and
    reads the change source and event partitions 0-1; "west" judged shard 2 until it was killed 120 s ago (its
    health row stays, its shard was last committed then, 40 messages behind). Shards applied 500, 400, 300."""
    from oncewatch.checks.shards import Shard
    from oncewatch.monitor.group.judging import ShardJudge
    from oncewatch.store.group import claim, save_shard

    now = time.time() if now is None else now
    settings = shop_settings()
    for shard, owner, records in ((0, "east", 500), (1, "east", 400), (2, "west", 300)):
        judge = ShardJudge(settings, Shard(shard, 3))
        judge.records, judge.offset, judge.end = records, records + 10, records + 10 + 40 * (owner == "west")
        judge.marks = {"cdc": [now - 1.0, 1]}
        epoch = claim(store, shard, owner)
        with store.batch() as tx:
            save_shard(tx, shard, epoch, judge.checkpoint(), judge.engine.state_delta(), [], [])

    store.set_health("group/east", GroupMemberHealth(
        at=now - 0.5, member="east", applied=900, store_outages=1, store_outage_seconds=4.5,
        shards={"0": ShardHealth(), "1": ShardHealth()},
        routers=RoutersHealth(("shop.events/0", "shop.events/1", "oncewatch.g.lease/0"), True, 1300, 700)))
    store.set_health("group/west", GroupMemberHealth(
        at=now - 120, member="west", fenced=1, applied=300, rejoins=2, shards={"2": ShardHealth()},
        routers=RoutersHealth(("shop.events/2",), False, 200, 0)))
    with store.batch() as tx:  # west's last commit and health, before it was killed
        tx.conn.execute("UPDATE checkpoints SET updated_at = ? WHERE name = 'group/shard/2'", (now - 120,))
        tx.conn.execute("UPDATE health SET updated_at = ? WHERE component = 'group/west'", (now - 120,))
