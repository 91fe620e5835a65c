"""The health rows' codec (store.codec): every typed health value the monitor writes comes back equal, a row of no
known kind is refused by name, and the store hands the rows out typed, leaving out one an older version wrote."""

from __future__ import annotations

import pytest

from oncewatch.core.protocol import (BinlogStatus, BootstrapStatus, BrokerKnown, CdcCounts, CdcStatus, ComponentHealth,
                                     EndKnown, Gap, GroupMemberHealth, HealthRow, KafkaEventsStatus, MonitorHealth,
                                     ReaderHealth, RoutersHealth, ShardHealth, Slo)
from oncewatch.core.records import (BinlogPosition, GroupOffsets, GroupPartition, OffsetsSnapshot, PartitionRange,
                                    PartitionStatus)
from oncewatch.store import Store
from oncewatch.store.codec import HealthRowError, health_from_json, health_json

READER = ReaderHealth(running=False, failures=2, last_failure="RuntimeError: boom", alive_at=12.5, restart_at=14.0)

VALUES = [
    ComponentHealth(BinlogStatus(connected=True, seconds_behind=0.5, last_position=BinlogPosition(
        "0-1-9", "bin.000002", 420, within_gtid="0-1-10", within_rows=2000), rows_read=7, events_read=30), READER),
    ComponentHealth(BootstrapStatus(bootstrap_rows=5000, bootstrap_table="shop.orders", rows_read=5000)),
    ComponentHealth(CdcStatus(connected=True, last_position=BinlogPosition("0-1-3"), source="debezium",
                              topics=("cdc.transaction", "cdc.owcdc.orders"), cdc=CdcCounts(1, 2, 3, 4, 5),
                              heartbeat_topic="__debezium-heartbeat.cdc", heartbeats_read=9, caught_up=True)),
    ComponentHealth(KafkaEventsStatus(connected=True, state="reading", reconnects=1, records_read=3, events_read=2,
                                      partitions=(PartitionStatus("events", 0, 5, 7, 1.5),),
                                      gaps=(Gap("events", 0, 1, 4, "deleted", 2.0),),
                                      known=BrokerKnown((EndKnown("events/0", 7, 2, 6), EndKnown("events/1", 3, 2)),
                                                        3.0)), READER),
    ComponentHealth(OffsetsSnapshot(1.0, "offsets: KafkaTimeoutError", (PartitionRange("events", 0, 0, 7),), (
        GroupOffsets("points", "Stable", (GroupPartition("events", 0, 5, 2, 0.25),
                                          GroupPartition("events", 1, None, None, None))),))),
    MonitorHealth(started_at=1.0, pid=42, binlog_time=2.0, kafka_time=3.0, caught_up=False, verdict="degraded",
                  reasons=("binlog read 12.0 s behind",), lag_seconds={"binlog": 12.0, "kafka": 0.0},
                  blind_rules=("F12",), blind_tables={"F5": ("shop.payments",)}, rule_tables={"F1": ("shop.points",)},
                  shape_problems=({"table": "shop.payments", "config_key": "k", "what": "dropped", "rules": ["F5"]},),
                  probe_error="OperationalError: gone", store_outages=1, store_outage_seconds=2.5,
                  thresholds={"F3": {"stuck_pending_seconds": 6.0}}, slo=Slo(0.999, 60.0)),
    GroupMemberHealth(at=5.0, member="m1", shards={"0": ShardHealth(9, 1, 40, 2.0, 3.0), "2": ShardHealth()},
                      routers=RoutersHealth(("events/0", "x.lease/0"), True, 8, 3),
                      fenced=1, applied=90, rejoins=2, store_outages=1, store_outage_seconds=0.5, kafka_outages=1,
                      kafka_outage_seconds=3.0),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(getattr(v, "status", v)).__name__)
def test_health_round_trip(value):
    assert health_from_json(health_json(value)) == value


def test_a_row_of_no_known_kind_is_refused():
    with pytest.raises(HealthRowError, match="no known kind"):
        health_from_json('{"connected": true, "reader": {"running": true}}')
    with pytest.raises(HealthRowError, match="binlog health row that does not decode"):
        health_from_json('{"kind": "binlog", "status": {"connected": "yes"}, "reader": {}}')


def test_the_store_hands_out_typed_rows_and_leaves_out_one_an_older_version_wrote(store_target) -> None:
    store = Store(store_target)
    try:
        for name, value in zip(("binlog", "monitor", "group/m1"), (VALUES[0], VALUES[5], VALUES[6])):
            store.set_health(name, value)
        with store.batch() as tx:  # the flat row of a monitor before the rows had kinds
            tx.conn.execute("INSERT INTO health (component, value, updated_at) VALUES (?, ?, ?)",
                            ("kafka_events", '{"connected": true, "reader": {"running": true}}', 1.0))
        rows = store.health()
    finally:
        store.close()
    assert {name: row.health for name, row in rows.items()} == {"binlog": VALUES[0], "monitor": VALUES[5],
                                                                "group/m1": VALUES[6]}
    assert all(isinstance(row, HealthRow) and row.updated_at > 0 for row in rows.values())
