"""F11 offset_drift (announce backlog, consumer-group lag) and F12 partition_skew."""

from devservices.samples import Shop, feed, order, shop_settings
from oncewatch.checks.engine import Engine
from oncewatch.checks.findings import finding_id
from oncewatch.core.records import OffsetsSnapshot


def snapshot(at: float, lags: list[int | None], group: str = "shipping-service",
             topic: str = "shop.events") -> OffsetsSnapshot:
    return OffsetsSnapshot.from_dict({"polled_at": at,
            "partitions": [{"topic": topic, "partition": i, "earliest": 0, "end": 1000} for i in range(len(lags))],
            "groups": [{"group": group, "state": "Stable", "partitions": [
                {"topic": topic, "partition": i, "committed": None if lag is None else 1000 - lag, "lag": lag,
                 "lag_seconds": None if lag is None else lag / 10} for i, lag in enumerate(lags)]}]})


def test_group_lag_above_the_threshold_is_f11_and_resolves_when_it_drops():
    engine = Engine(shop_settings(offset_drift_threshold=100, partition_skew_threshold=1000.0))
    engine.on_offsets(snapshot(10, [60, 50]))
    (f,) = engine.drain()
    assert (f.rule, f.status, f.id) == ("F11", "open", finding_id("F11", "lag", "shipping-service"))
    assert f.keys["lag"] == 110
    assert [(e.kind, e.coordinates, e.values["lag"], e.values["end"]) for e in f.evidence] == [
        ("offsets", "shipping-service:shop.events/0", 60, 1000),
        ("offsets", "shipping-service:shop.events/1", 50, 1000)]
    engine.on_offsets(snapshot(15, [90, 50]))
    (f,) = engine.drain()
    assert f.keys["lag"] == 140 and f.last_seen == 15 and len(f.evidence) == 2
    engine.on_offsets(snapshot(20, [5, 5]))
    (f,) = engine.drain()
    assert (f.status, f.resolved_at, f.resolution) == ("resolved", 20, "lag down to 10")


def test_partitions_without_a_commit_are_left_out_not_read_as_zero():
    engine = Engine(shop_settings(offset_drift_threshold=100, partition_skew_threshold=3.0))
    engine.on_offsets(snapshot(10, [None, 7]))
    assert engine.drain() == []


def test_announce_backlog_above_the_threshold_is_f11():
    shop, engine = Shop(), Engine(shop_settings(offset_drift_threshold=1))
    feed(engine, shop.tx(10, order("O1", "paid", was="pending"), order("O2", "paid", was="pending")))
    engine.tick(now=11, binlog_time=11, kafka_time=11)
    (f,) = engine.drain()
    assert (f.rule, f.id, f.keys) == ("F11", finding_id("F11", "backlog", "shop.orders"),
                                      {"table": "shop.orders", "backlog": 2})
    feed(engine, shop.event("order.paid", 10.1, order_no="O1"))
    engine.tick(now=12, binlog_time=12, kafka_time=12)
    (f,) = [f for f in engine.drain() if f.rule == "F11"]
    assert f.status == "resolved"


def test_the_backlog_counts_only_changes_kafka_has_been_read_past():
    """Kafka read only up to 9 s: the changes committed at 10 s may have their events there, unread. Counting
    them would report the monitor's own lag as the shop's backlog."""
    shop, engine = Shop(), Engine(shop_settings(offset_drift_threshold=1))
    feed(engine, shop.tx(10, order("O1", "paid", was="pending"), order("O2", "paid", was="pending")))
    engine.tick(now=11, binlog_time=11, kafka_time=9)
    assert engine.drain() == [] and engine.stats()["backlog_by_table"]["shop.orders"] == 0
    engine.tick(now=12, binlog_time=12, kafka_time=10.5)
    (f,) = engine.drain()
    assert (f.rule, f.keys) == ("F11", {"table": "shop.orders", "backlog": 2})
    assert engine.stats()["backlog_by_table"]["shop.orders"] == 2


def test_uneven_lag_across_partitions_is_f12():
    engine = Engine(shop_settings(partition_skew_threshold=3.0, partition_skew_seconds=0))
    engine.on_offsets(snapshot(10, [0, 0, 20, None]))
    (f,) = engine.drain()
    assert (f.rule, f.id, f.keys["stddev"]) == ("F12", finding_id("F12", "shipping-service", "shop.events"), 9.428)
    assert len(f.evidence) == 4
    engine.on_offsets(snapshot(20, [4, 5, 6, None]))
    (f,) = engine.drain()
    assert f.status == "resolved"


def test_near_miss_even_lag_or_a_single_partition():
    engine = Engine(shop_settings(partition_skew_threshold=3.0))
    engine.on_offsets(snapshot(10, [100, 102, 101]))
    engine.on_offsets(snapshot(11, [500], group="other"))
    assert engine.drain() == []


def test_a_uniform_stall_of_the_whole_group_is_f11_not_f12():
    # Every partition stopped at once: the lags differ by hundreds of records (the partitions receive
    # unevenly) but by a tenth of their mean. That is a stall (F11), not a skewed group.
    engine = Engine(shop_settings(partition_skew_threshold=3.0, partition_skew_relative=0.5,
                                  offset_drift_threshold=5000))
    engine.on_offsets(snapshot(10, [2100, 1900, 2300]))
    assert [(f.rule, f.keys["lag"]) for f in engine.drain()] == [("F11", 6300)]
    # One partition stuck while the others keep up is skew, once it has lasted partition_skew_seconds
    # (60 s by default): a stall's first readings, a few records each, look uneven too.
    engine.on_offsets(snapshot(20, [0, 0, 400]))
    assert {f.rule: f.status for f in engine.drain()} == {"F11": "resolved"}
    engine.on_offsets(snapshot(50, [0, 0, 900]))
    engine.on_offsets(snapshot(60, [100, 102, 101]))  # even again in between: the hold starts over
    engine.on_offsets(snapshot(70, [0, 0, 400]))
    assert engine.drain() == []
    engine.on_offsets(snapshot(130, [0, 1, 700]))
    assert [(f.rule, f.status) for f in engine.drain()] == [("F12", "open")]


def test_an_open_skew_stays_open_across_a_restart_while_it_holds_again():
    """Seen in the short chaos soak: a group member SIGKILLed took its skew readings anew, and its first reading,
    still skewed but not yet held in the new process, resolved the group's open F12 ("stddev down to 9.43")."""
    settings = shop_settings(partition_skew_threshold=3.0, partition_skew_seconds=30)
    engine = Engine(settings)
    engine.on_offsets(snapshot(10, [0, 0, 20, None]))
    engine.on_offsets(snapshot(40, [0, 0, 20, None]))
    assert [(f.rule, f.status) for f in engine.drain()] == [("F12", "open")]
    again = Engine(settings)
    again.restore(engine.state())
    again.on_offsets(snapshot(50, [0, 0, 20, None]))
    assert again.drain() == []  # neither resolved nor raised again until it has held once more
    again.on_offsets(snapshot(60, [4, 5, 6, None]))
    assert [(f.rule, f.status) for f in again.drain()] == [("F12", "resolved")]


def test_a_skew_s_hold_is_watched_by_readings_and_starts_again_after_a_failed_one():
    """Seen on the real broker (test_broker_kill.py): a skew read before the broker was killed and again as it came
    back, its consumers catching up, raised F12 at the first reading after it, its hold counted over 20 s of
    readings that failed."""
    engine = Engine(shop_settings(partition_skew_threshold=3.0, partition_skew_seconds=10, lag_settle_seconds=0))
    engine.on_offsets(snapshot(10, [0, 0, 20]))
    engine.on_offsets(OffsetsSnapshot(polled_at=15, error="offsets: KafkaConnectionError: 111 ECONNREFUSED"))
    engine.on_offsets(snapshot(30, [0, 0, 20]))
    assert engine.drain() == []  # held since 30, not since 10
    engine.on_offsets(OffsetsSnapshot.from_dict({"polled_at": 35, "error": "group shipping-service: timed out",
        "partitions": [], "groups": [{"group": "shipping-service", "state": None, "partitions": []}]}))
    engine.on_offsets(snapshot(41, [0, 0, 20]))
    assert engine.drain() == []  # the group's own reading failed at 35: held since 41
    engine.on_offsets(snapshot(51, [0, 0, 20]))
    assert [(f.rule, f.status, f.first_seen) for f in engine.drain()] == [("F12", "open", 51)]


def test_a_group_read_again_after_a_failed_reading_settles_before_its_lag_is_judged():
    """Consumers catching up after a broker's restart are maintenance (seen: test_broker_kill.py on a slow machine,
    shipping-service's lag uneven for 5 s after the broker came back, raised F12 past the test's 2 s hold). For
    `lag_settle_seconds` after a failed reading the group's lag raises neither F11 nor F12; what is open stays open
    and resolves if the reading drops back; a skew's hold starts when the settle ends; the wait is undecided."""
    engine = Engine(shop_settings(offset_drift_threshold=5000, partition_skew_threshold=3.0,
                                  partition_skew_seconds=10, lag_settle_seconds=30))
    engine.on_offsets(snapshot(10, [0, 0, 0]))
    engine.on_offsets(OffsetsSnapshot(polled_at=15, error="offsets: KafkaConnectionError: 111 ECONNREFUSED"))
    engine.on_offsets(snapshot(20, [3000, 3000, 3000]))  # read again: settles until 50
    engine.on_offsets(snapshot(30, [0, 0, 400]))
    assert engine.drain() == []
    assert engine.offsets.undecided() == (1, 60)  # the skew's hold starts at 50
    engine.on_offsets(snapshot(49, [2000, 2000, 2000]))
    assert engine.drain() == [] and engine.offsets.undecided() == (1, 50)  # the lag waits; even, no skew to hold
    engine.on_offsets(snapshot(50, [2000, 2000, 2000]))  # settled: a lag still over the threshold is F11
    assert [(f.rule, f.status, f.first_seen) for f in engine.drain()] == [("F11", "open", 50)]
    engine.on_offsets(snapshot(55, [0, 0, 400]))
    engine.on_offsets(snapshot(64, [0, 0, 400]))
    assert [(f.rule, f.status) for f in engine.drain()] == [("F11", "resolved")]  # skewed since 55, not 30
    engine.on_offsets(snapshot(65, [0, 0, 400]))
    assert [(f.rule, f.status, f.first_seen) for f in engine.drain()] == [("F12", "open", 65)]
    # A failure while both are open: they stay open through the settle, neither raised again nor resolved by a
    # reading over the thresholds; a reading back under them resolves.
    engine.on_offsets(snapshot(70, [9000, 0, 0]))
    assert [(f.rule, f.status) for f in engine.drain()] == [("F11", "open"), ("F12", "open")]
    engine.on_offsets(OffsetsSnapshot(polled_at=75, error="offsets: KafkaConnectionError: 111 ECONNREFUSED"))
    engine.on_offsets(snapshot(80, [9000, 0, 0]))
    assert engine.drain() == []
    engine.on_offsets(snapshot(85, [1, 1, 1]))
    assert sorted((f.rule, f.status) for f in engine.drain()) == [("F11", "resolved"), ("F12", "resolved")]


def test_a_process_s_first_reading_is_judged_at_once_even_after_a_failed_one_elsewhere():
    """A monitor started during a stall pages it: only a group read again after a reading of it failed settles, or
    after a reading that failed whole (a monitor started while the broker is away)."""
    engine = Engine(shop_settings(offset_drift_threshold=5000, lag_settle_seconds=30))
    engine.on_offsets(snapshot(10, [3000, 3000, 3000]))
    assert [(f.rule, f.status) for f in engine.drain()] == [("F11", "open")]
    engine.on_offsets(snapshot(11, [3000, 3000, 3000], group="other"))  # other's first reading, shipping's failed
    assert [(f.rule, f.keys["group"]) for f in engine.drain()] == [("F11", "other")]
    away = Engine(shop_settings(offset_drift_threshold=5000, lag_settle_seconds=30))
    away.on_offsets(OffsetsSnapshot(polled_at=10, error="offsets: KafkaConnectionError: 111 ECONNREFUSED"))
    away.on_offsets(snapshot(20, [3000, 3000, 3000]))
    assert away.drain() == [] and away.offsets.undecided() == (1, 50)
