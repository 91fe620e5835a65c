"""The Kafka clock of the absence rules while the stream is busy (`oncewatch.checks.clocks.kafka_watermark`)."""

from __future__ import annotations

from oncewatch.checks.clocks import kafka_watermark
from oncewatch.core.records import PartitionStatus


def part(partition: int, end: int, end_at: float) -> PartitionStatus:
    return PartitionStatus("t", partition, position=end, end=end, end_at=end_at)


def test_partitions_applied_to_their_ends_vouch_for_when_the_ends_were_learned():
    parts = [part(0, 10, 105.0), part(1, 7, 103.5)]
    assert kafka_watermark(parts, {"t/0": 10, "t/1": 7}, {"t/0": 90_000, "t/1": 80_000}, 50.0) == 103.5


def test_a_partition_behind_vouches_only_up_to_its_newest_applied_event():
    parts = [part(0, 10, 105.0), part(1, 9, 105.0)]
    assert kafka_watermark(parts, {"t/0": 10, "t/1": 7}, {"t/0": 104_000, "t/1": 99_250}, 50.0) == 99.25


def test_a_partition_behind_with_nothing_applied_holds_the_clock():
    parts = [part(0, 10, 105.0), part(1, 9, 105.0)]
    assert kafka_watermark(parts, {"t/0": 10}, {"t/0": 104_000}, 50.0) == 50.0


def test_an_empty_partition_has_nothing_to_wait_for():
    assert kafka_watermark([part(0, 0, 105.0)], {}, {}, 50.0) == 105.0


def test_no_partitions_assigned_yet_holds_the_clock():
    assert kafka_watermark([], {}, {}, 50.0) == 50.0
