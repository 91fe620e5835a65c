"""The monitor's verdict on itself: healthy, degraded, failing or stopped, with its reasons; caught up or not."""

from __future__ import annotations

from oncewatch.core.records import GroupOffsets, GroupPartition, OffsetsSnapshot
from oncewatch.monitor.verdict import judge

NOW = 10_000.0


def reader(running: bool = True, alive_at: float | None = NOW - 1, failure: str | None = None) -> dict:
    return {"running": running, "alive_at": alive_at, "last_failure": failure, "failures": 0}


def rows(**changes: dict) -> dict[str, dict]:
    base = {"binlog": {"connected": True, "reader": reader()},
            "kafka_events": {"connected": True, "reader": reader()},
            "kafka_offsets": {"error": None, "reader": reader()}}
    return {**base, **changes}


def offsets(*lags: int | None) -> OffsetsSnapshot:
    return OffsetsSnapshot(NOW, None, (), (GroupOffsets("shipping-service", "Stable", tuple(
        GroupPartition("t", i, None if lag is None else 100, lag, None) for i, lag in enumerate(lags))),))


def verdict(components: dict, lags: dict | None = None, snapshot: OffsetsSnapshot | None = None):
    return judge(NOW, components, lags if lags is not None else {"binlog": 0.3, "kafka": 0.8}, snapshot,
                 caught_up_seconds=5.0, drift_threshold=5000)


def test_everything_read_within_the_lag_is_healthy_and_caught_up() -> None:
    v = verdict(rows(), snapshot=offsets(10, 20))
    assert (v.verdict, v.reasons, v.caught_up) == ("healthy", (), True)


def test_a_stream_behind_or_a_group_far_behind_is_degraded_not_failing() -> None:
    v = verdict(rows(), {"binlog": 0.2, "kafka": 12.0})
    assert v.verdict == "degraded" and not v.caught_up
    assert v.reasons == ("kafka read 12.0 s behind (caught up means within 5 s)",)
    stalled = verdict(rows(), snapshot=offsets(4000, 3000, None))
    assert stalled.verdict == "degraded" and stalled.caught_up  # the shop's group, not the monitor, is behind
    assert stalled.reasons == ("consumer group shipping-service is 7000 records behind (threshold 5000)",)
    polled = verdict(rows(kafka_offsets={"error": "offsets: KafkaTimeoutError", "reader": reader()}))
    assert polled.verdict == "degraded" and polled.reasons == ("offsets poll failed: offsets: KafkaTimeoutError",)


def test_a_reader_down_silent_or_disconnected_is_failing_and_never_caught_up() -> None:
    down = verdict(rows(kafka_events={"connected": True, "reader": reader(False, failure="ValueError: x")}))
    assert down.verdict == "failing" and not down.caught_up
    assert down.reasons == ("kafka_events reader down (ValueError: x)",)
    silent = verdict(rows(binlog={"connected": True, "reader": reader(alive_at=NOW - 90)}))
    assert silent.reasons == ("binlog reader silent for 90 s",) and silent.verdict == "failing"
    lost = verdict(rows(binlog={"connected": False, "last_error": "OperationalError: 2013", "reader": reader()}),
                   {"binlog": 30.0, "kafka": 0.0})
    assert lost.verdict == "failing"
    assert lost.reasons == ("binlog disconnected (OperationalError: 2013)",
                            "binlog read 30.0 s behind (caught up means within 5 s)")


def test_rules_that_read_a_stream_the_monitor_cannot_see_are_blind() -> None:
    assert verdict(rows()).blind == ()
    kafka_down = verdict(rows(kafka_events={"connected": False, "reader": reader()}))
    assert kafka_down.blind == ("F7", "F8", "F9", "F10", "F11")
    binlog_dead = verdict(rows(binlog={"connected": True, "reader": reader(False)}))
    assert set(binlog_dead.blind) == {f"F{i}" for i in range(1, 17)} - {"F12"}
    no_offsets = verdict(rows(kafka_offsets={"error": "offsets: timeout", "reader": reader()}))
    assert no_offsets.blind == ("F11", "F12") and no_offsets.verdict == "degraded"


def test_a_first_bootstrap_under_way_is_degraded_and_says_how_far_it_is() -> None:
    v = verdict(rows(binlog={"connected": True, "bootstrapping": True, "bootstrap_rows": 125000,
                             "bootstrap_table": "shop.payments", "reader": reader()}))
    assert v.verdict == "degraded" and v.blind == () and not v.caught_up
    assert v.reasons == ("bootstrapping: 125000 rows of the watched tables read, now shop.payments; "
                         "the binlog tail starts after it",)


def test_a_monitor_that_stops_says_so_and_keeps_what_else_was_wrong() -> None:
    """Its readers stopped on purpose: no "reader down" reason, every rule blind, a shape problem still said."""
    stopped = {name: {**row, "reader": reader(False)} for name, row in rows().items()}
    shape = [{"table": "owtest.orders", "config_key": "domain.orders.status_column",
              "what": "owtest.orders.status is gone", "rules": ["F3"]}]
    v = judge(NOW, stopped, {"binlog": 0.3, "kafka": 0.8}, None, caught_up_seconds=5.0, drift_threshold=5000,
              shape=shape, stopped=True)
    assert (v.verdict, v.caught_up) == ("stopped", False)
    assert v.reasons == ("stopped: nothing is read until `oncewatch run` starts again",
                         "domain.orders.status_column: owtest.orders.status is gone (F3 cannot judge)")
    assert sorted(v.blind, key=lambda r: int(r[1:])) == [f"F{i}" for i in range(1, 17)]
    assert v.blind_tables == {"F3": ("owtest.orders",)}


def test_a_shape_problem_blinds_its_rules_for_its_table_only() -> None:
    """Issue 42, observation 5: the orders' status renamed blinds F7-F10 for the orders, not for the shipments
    (their findings name their table); F6 judges an order's callbacks across tables and is blind for all it reads."""
    shape = [{"table": "owtest.orders", "config_key": "domain.orders.status_column", "what": "gone",
              "rules": ["F3", "F4", "F6"]},
             {"table": "owtest.orders", "config_key": "announce[0].when_column", "what": "gone",
              "rules": ["F7", "F8", "F9", "F10"]}]
    reads = {"F3": ["owtest.orders"], "F4": ["owtest.orders"], "F6": ["owtest.orders", "owtest.payments"],
             **{rule: ["owtest.orders", "owtest.shipments"] for rule in ("F7", "F8", "F9", "F10")}}
    v = judge(NOW, rows(), {"binlog": 0.3, "kafka": 0.8}, None, caught_up_seconds=5.0, drift_threshold=5000,
              shape=shape, reads=reads)
    assert v.verdict == "degraded" and v.blind == ()
    assert v.blind_tables == {"F3": ("owtest.orders",), "F4": ("owtest.orders",),
                              "F6": ("owtest.orders", "owtest.payments"),
                              **{rule: ("owtest.orders",) for rule in ("F7", "F8", "F9", "F10")}}
