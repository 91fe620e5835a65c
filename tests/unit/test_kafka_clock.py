"""The Kafka clock of the absence rules while the stream is busy (`oncewatch.checks.clocks.kafka_watermark`)."""

from __future__ import annotations

import time

from kafka import TopicPartition
from kafka.errors import KafkaConnectionError

from oncewatch.checks.clocks import kafka_watermark
from oncewatch.collectors.kafka_events import KafkaEventCollector
from oncewatch.core.config import parse
from oncewatch.core.protocol import BrokerKnown, EndKnown
from oncewatch.core.records import PartitionStatus

KAFKA = parse({"mysql": {"host": "127.0.0.1", "user": "oncewatch", "tables": ["shop.orders"]},
               "kafka": {"bootstrap_servers": ["127.0.0.1:9092"],
                         "topics": [{"name": "t", "format": "json", "required": []}]},
               "store": {"path": ":memory:"}}).kafka


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


def test_while_the_broker_s_return_settles_nothing_vouches_not_even_a_partition_behind():
    """Producers append what they kept while the broker was away, each its own backlog stamped when it was sent: a
    partition's newest event, read from one producer's, says nothing of another's still to come."""
    parts = [part(0, 10, 105.0), part(1, 9, 105.0)]
    assert kafka_watermark(parts, {"t/0": 7, "t/1": 7}, {"t/0": 104_000, "t/1": 99_250}, 50.0, settling=True) == 50.0
    assert kafka_watermark(parts, {"t/0": 10, "t/1": 9}, {}, 50.0, settling=True) == 50.0


def test_a_fetch_that_comes_in_while_the_reader_takes_the_broker_for_away_settles_before_it_vouches():
    """The consumer reconnects on its own: after a broker's restart its fetches can bring records and highwaters
    before the reader's next refresh finds the broker back. Such a highwater vouches for nothing until the
    producers may have appended what they kept (the chaos soak's cdc-check monitor took one for a fresh end and
    raised F7 on 55 events on time, still in a producer's hands)."""
    tp = TopicPartition("t", 0)
    reader = KafkaEventCollector(KAFKA, {"t/0": 100}, {"t/0"})
    now = time.time()
    with reader._lock:
        reader._learn({tp: 130}, now - 60, now - 59.9)
    reader._connected()
    reader._disconnected(KafkaConnectionError("111 ECONNREFUSED"))
    with reader._lock:
        reader._learn({tp: 190}, now, now + 0.1, fetched=True)
    assert reader._s.ends == {tp: (190, now - 60)}  # the end taken in, vouching for no more than before
    assert reader._s.settle_until >= now + KAFKA.producer_delivery_seconds
    reader._connected()  # the refresh finds the broker back: the settle counts from then
    with reader._lock:
        later = reader._s.settle_until + 1
        reader._learn({tp: 250}, later, later + 0.1, fetched=True)
    assert reader._s.ends == {tp: (250, later)}


def test_a_reader_told_what_the_reader_before_it_learned_holds_an_end_gone_back_or_of_a_new_epoch():
    """A group's partitions change readers at every rebalance: a new reader of a broker restarted meanwhile must
    hold the stale end the broker reports, as the reader before it would have (the chaos soak's group raised 223
    false F7 when its new routers took such an end for a fresh one)."""

    gone_back, fresh = TopicPartition("t", 0), TopicPartition("t", 1)
    reader = KafkaEventCollector(KAFKA, {"t/0": 90, "t/1": 40}, {"t/0", "t/1"},
                                 BrokerKnown((EndKnown("t/0", 120, 3), EndKnown("t/1", 50, 3))))
    with reader._lock:
        reader._learn({gone_back: 100, fresh: 60}, 1000.0, 1000.1, {gone_back: 3, fresh: 3})
    # the end gone back says the broker restarted: no end vouches for now, the others' neither
    assert reader._s.ends == {gone_back: (100, 0.0), fresh: (60, 0.0)}
    with reader._lock:
        reader._learn({fresh: 70}, 1001.0, 1001.1, {fresh: 4})  # a new leader: its end is held too
    assert reader.status().held == ("t/0", "t/1")
    with reader._lock:
        # once the producers' delivery time after the outage is up, each vouches again, moved or not
        later = reader._s.settle_until + 1
        reader._learn({gone_back: 121, fresh: 70}, later, later + 0.1, {gone_back: 3, fresh: 4})
    assert reader._s.ends == {gone_back: (121, later), fresh: (70, later)} and not reader._s.held


def test_a_reader_told_the_broker_was_away_lets_no_end_vouch_until_the_settle_time_and_keeps_the_ends_held():
    """The reader before it saw the broker come back (or restart) and died while the producers might still send what
    they kept: this one, its process started again, learns ends that vouch for nothing before that settle time, and
    a held end stays held as long (test_broker_kill.py, the reader killed meanwhile)."""

    held, free = TopicPartition("t", 0), TopicPartition("t", 1)
    known = BrokerKnown((EndKnown("t/0", 40, 2, 40), EndKnown("t/1", 30, 2)), settle_until=2000.0)
    reader = KafkaEventCollector(KAFKA, {"t/0": 40, "t/1": 30}, {"t/0", "t/1"}, known)
    assert reader.known() == known and reader.status().held == ("t/0",)
    with reader._lock:
        reader._learn({held: 40, free: 35}, 1500.0, 1500.1, {held: 2, free: 2})
    assert reader._s.ends == {held: (40, 0.0), free: (35, 0.0)} and reader.status().held == ("t/0",)  # settling
    with reader._lock:
        reader._learn({held: 40, free: 35}, 2001.0, 2001.1, {held: 2, free: 2})
    assert reader._s.ends == {held: (40, 2001.0), free: (35, 2001.0)} and reader.status().held == ()  # settled


def test_an_end_asked_before_a_larger_one_came_in_is_an_older_answer_not_a_broker_gone_back():
    """Two threads ask the broker for the ends (`caught_up` each second, the poll's refresh of its partitions), and
    a request asked first can be answered last. A smaller end asked before the larger one's answer came in may be
    the older answer, not the broker reporting less (bench/load.py held the Kafka clock for the settle time on it
    with no broker restarted: "end went back from 30829 to 30826", two partitions at once). One asked after the
    larger end came in is the broker's end gone back."""
    tp = TopicPartition("t", 0)
    reader = KafkaEventCollector(KAFKA, {"t/0": 0}, {"t/0"})
    with reader._lock:
        reader._learn({tp: 30829}, 10.0, 10.3)  # caught_up's answer, asked at 10.0, in at 10.3
        reader._learn({tp: 30826}, 10.1, 10.4)  # the refresh's, asked later (10.1) but answered before
    assert reader._s.ends == {tp: (30829, 10.0)} and not reader._s.held and reader._s.settle_until == 0.0
    with reader._lock:
        reader._learn({tp: 30826}, 10.5, 10.6)  # asked after 30829 came in: the broker reports less than it did
    assert reader.status().held == ("t/0",) and reader._s.settle_until > 0.0


def test_a_fetch_s_highwater_below_an_end_the_broker_answered_is_older_not_a_broker_gone_back():
    """A fetch's highwater is taken in only once the poll reads its answer, and kafka-python does not say when the
    broker answered: it may have answered `caught_up` with a larger end meanwhile (bench/load.py held the Kafka
    clock for the settle time three times in 10 minutes on it, with no broker restarted: F7's detection p99 8.9 s).
    Only the broker's answers tell an end gone back. A fetch's larger end vouches from before the fetch was answered."""
    tp = TopicPartition("t", 0)
    reader = KafkaEventCollector(KAFKA, {"t/0": 0}, {"t/0"})
    with reader._lock:
        reader._learn({tp: 7272}, 10.0, 10.1)  # the broker's answer, asked at 10
        reader._learn({tp: 7269}, 10.2, 10.4, fetched=True)  # a fetch answered after 10.2, read at 10.4
    assert reader._s.ends == {tp: (7272, 10.0)} and not reader._s.held and reader._s.settle_until == 0.0
    with reader._lock:
        reader._learn({tp: 7280}, 10.6, 10.7, fetched=True)  # a later fetch's, larger: it vouches from 10.6
        reader._learn({tp: 7272}, 10.5, 10.8)  # the broker's answer asked before that fetch's end came in
        reader._learn({tp: 7280}, 10.55, 10.85, fetched=True)  # the same end, answered after 10.55: vouches no less
    assert reader._s.ends == {tp: (7280, 10.6)} and not reader._s.held
    with reader._lock:
        reader._learn({tp: 7269}, 10.9, 11.0)  # the broker's answer asked after: it reports less than it did
    assert reader.status().held == ("t/0",) and reader._s.settle_until > 0.0
