"""The offsets collector against the dev broker, with a consumer group the test drives to known
commits and a clock it controls, plus the lag-seconds estimate on its own."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from oncewatch.collectors.kafka_offsets import KafkaOffsetsCollector, LagHistory, estimate_time
from oncewatch.core.records import OffsetsSnapshot
from tests.integration.kafka_fixtures import (BOOTSTRAP, create_topic, json_topic, jsonb, kafka_admin, kafka_config,
                                              produce, unique)

__all__ = ["kafka_admin"]


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def commit(group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit like an application consumer would, without joining (the group stays Empty)."""
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, group_id=group, enable_auto_commit=False)
    try:
        consumer.assign(list(offsets))
        consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
    finally:
        consumer.close(autocommit=False)


def test_lag_and_lag_seconds_of_a_group_at_known_commits(kafka_admin):
    topic = create_topic(kafka_admin, "lag", 3)
    group, nobody = unique("group"), unique("nobody")
    clock = Clock(1000.0)
    cfg = kafka_config([json_topic(topic), json_topic(unique("absent"))], consumer_groups=(group, nobody))
    collector = KafkaOffsetsCollector(cfg, clock=clock)
    record = jsonb({"type": "order.paid"})
    try:
        produce(topic, [(0, None, record)] * 10 + [(1, None, record)] * 10)
        first = collector.snapshot().to_dict()
        produce(topic, [(0, None, record)] * 10 + [(1, None, record)] * 10)
        clock.now = 1010.0
        collector.snapshot()
        commit(group, {TopicPartition(topic, 0): 15, TopicPartition(topic, 1): 20})
        clock.now = 1020.0
        snap = collector.snapshot()
    finally:
        collector.close()
    assert first["groups"][0]["partitions"][0]["committed"] is None  # nothing committed yet
    assert OffsetsSnapshot.from_dict(snap.to_dict()) == snap  # what the health row keeps reads back the same
    snap = snap.to_dict()
    assert snap["polled_at"] == 1020.0 and snap["error"] is None
    assert snap["partitions"] == [{"topic": topic, "partition": p, "earliest": 0, "end": e}
                                  for p, e in ((0, 20), (1, 20), (2, 0))]
    (g, n) = snap["groups"]
    assert (g["group"], g["state"]) == (group, "Empty")
    # End went 10 -> 20 between t=1000 and t=1010, so offset 15 was the end at t=1005: 15 s ago.
    assert g["partitions"] == [
        {"topic": topic, "partition": 0, "committed": 15, "lag": 5, "lag_seconds": 15.0},
        {"topic": topic, "partition": 1, "committed": 20, "lag": 0, "lag_seconds": 0.0},
        {"topic": topic, "partition": 2, "committed": None, "lag": None, "lag_seconds": None}]
    assert (n["group"], n["state"]) == (nobody, "Dead")
    assert [(p["partition"], p["committed"], p["lag"]) for p in n["partitions"]] == [(0, None, None), (1, None, None),
                                                                                   (2, None, None)]


def test_an_unreachable_broker_is_an_error_in_the_snapshot_not_an_exception():
    cfg = kafka_config([json_topic("owtest.none")], bootstrap_servers=("127.0.0.1:9",), request_timeout_seconds=1.0,
                       consumer_groups=("g",))
    collector = KafkaOffsetsCollector(cfg, clock=Clock(5.0))
    snap = collector.snapshot()
    assert (snap.polled_at, snap.partitions, snap.groups) == (5.0, (), ())
    assert snap.error.startswith("offsets: ")


@pytest.mark.parametrize("committed, expected", [
    (300, 0.0),     # at the end: no lag
    (250, 10.0),    # between 200@30 and 300@40: the end passed 250 at t=35
    (200, 15.0),    # the end sat at 200 until t=30, then moved on
    (150, 30.0),    # between 100@10 and 200@20: t=15
    (50, 42.5),     # older than the window: extrapolated along 100@10 .. 300@40 to t=2.5
])
def test_lag_seconds_interpolates_like_kafka_lag_exporter(committed, expected):
    history = LagHistory(limit=10)
    for offset, at in ((100, 10.0), (200, 20.0), (200, 25.0), (200, 30.0), (300, 40.0)):
        history.add(offset, at)
    assert history.points == [(100, 10.0), (200, 20.0), (200, 30.0), (300, 40.0)]  # flat stretch compressed
    assert history.lag_seconds(committed, now=45.0) == pytest.approx(expected)


def test_lag_history_window_order_and_reset():
    history = LagHistory(limit=3)
    for offset, at in ((1, 1.0), (2, 2.0), (2, 1.5), (3, 3.0), (4, 4.0)):
        history.add(offset, at)
    assert history.points == [(2, 2.0), (3, 3.0), (4, 4.0)]  # out-of-order point ignored, oldest dropped
    history.add(0, 5.0)
    assert history.points == [(0, 5.0)] and history.lag_seconds(0, 6.0) == 0.0
    assert estimate_time([(0, 5.0)], -1) is None and estimate_time([(5, 1.0), (5, 2.0)], 3) is None
