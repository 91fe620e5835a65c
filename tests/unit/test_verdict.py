"""The monitor's verdict on itself: healthy, degraded, failing or stopped, with its reasons; caught up or not."""

from __future__ import annotations

from oncewatch.core.protocol import BinlogStatus, BootstrapStatus, ComponentHealth, KafkaEventsStatus, ReaderHealth
from oncewatch.core.records import GroupOffsets, GroupPartition, OffsetsSnapshot
from oncewatch.dashboards import views
from oncewatch.monitor.verdict import judge

NOW = 10_000.0


def reader(running: bool = True, alive_at: float | None = NOW - 1, failure: str | None = None) -> ReaderHealth:
    return ReaderHealth(running=running, alive_at=alive_at, last_failure=failure)


def rows(**changes: ComponentHealth) -> dict[str, ComponentHealth]:
    base = {"binlog": ComponentHealth(BinlogStatus(connected=True), reader()),
            "kafka_events": ComponentHealth(KafkaEventsStatus(connected=True), reader()),
            "kafka_offsets": ComponentHealth(OffsetsSnapshot(NOW, None), reader())}
    return {**base, **changes}


def offsets(*lags: int | None) -> OffsetsSnapshot:
    return OffsetsSnapshot(NOW, None, (), (GroupOffsets("shipping-service", "Stable", tuple(
        GroupPartition("t", i, None if lag is None else 100, lag, None) for i, lag in enumerate(lags))),))


def verdict(components: dict, lags: dict | None = None):
    return judge(NOW, components, lags if lags is not None else {"binlog": 0.3, "kafka": 0.8}, caught_up_seconds=5.0)


def test_everything_read_within_the_lag_is_healthy_and_caught_up() -> None:
    v = verdict(rows())
    assert (v.verdict, v.reasons, v.caught_up) == ("healthy", (), True)


def test_a_stream_behind_or_an_offsets_poll_failed_is_degraded_not_failing() -> None:
    v = verdict(rows(), {"binlog": 0.2, "kafka": 12.0})
    assert v.verdict == "degraded" and not v.caught_up
    assert v.reasons == ("kafka read 12.0 s behind (caught up means within 5 s)",)
    polled = verdict(rows(kafka_offsets=ComponentHealth(OffsetsSnapshot(NOW, "offsets: KafkaTimeoutError"), reader())))
    assert polled.verdict == "degraded" and polled.reasons == ("offsets poll failed: offsets: KafkaTimeoutError",)


def test_a_reader_down_silent_or_disconnected_is_failing_and_never_caught_up() -> None:
    down = verdict(rows(kafka_events=ComponentHealth(KafkaEventsStatus(connected=True),
                                                     reader(False, failure="ValueError: x"))))
    assert down.verdict == "failing" and not down.caught_up
    assert down.reasons == ("kafka_events reader down (ValueError: x)",)
    silent = verdict(rows(binlog=ComponentHealth(BinlogStatus(connected=True), reader(alive_at=NOW - 90))))
    assert silent.reasons == ("binlog reader silent for 90 s",) and silent.verdict == "failing"
    lost = verdict(rows(binlog=ComponentHealth(BinlogStatus(connected=False, last_error="OperationalError: 2013"),
                                               reader())), {"binlog": 30.0, "kafka": 0.0})
    assert lost.verdict == "failing"
    assert lost.reasons == ("binlog disconnected (OperationalError: 2013)",
                            "binlog read 30.0 s behind (caught up means within 5 s)")


def test_rules_that_read_a_stream_the_monitor_cannot_see_are_blind() -> None:
    assert verdict(rows()).blind == ()
    kafka_down = verdict(rows(kafka_events=ComponentHealth(KafkaEventsStatus(connected=False), reader())))
    assert kafka_down.blind == ("F7", "F8", "F9", "F10", "F11")
    binlog_dead = verdict(rows(binlog=ComponentHealth(BinlogStatus(connected=True), reader(False))))
    assert set(binlog_dead.blind) == {f"F{i}" for i in range(1, 17)} - {"F12"}
    no_offsets = verdict(rows(kafka_offsets=ComponentHealth(OffsetsSnapshot(NOW, "offsets: timeout"), reader())))
    assert no_offsets.blind == ("F11", "F12") and no_offsets.verdict == "degraded"


def test_a_first_bootstrap_under_way_is_degraded_and_says_how_far_it_is() -> None:
    v = verdict(rows(binlog=ComponentHealth(BootstrapStatus(bootstrap_rows=125000, bootstrap_table="shop.payments"),
                                            reader())))
    assert v.verdict == "degraded" and v.blind == () and not v.caught_up
    assert v.reasons == ("bootstrapping: 125000 rows of the watched tables read, now shop.payments; "
                         "the binlog tail starts after it",)


def test_a_monitor_that_stops_says_so_and_keeps_what_else_was_wrong() -> None:
    """Its readers stopped on purpose: no "reader down" reason, every rule blind, a shape problem still said."""
    stopped = {name: ComponentHealth(row.status, reader(False)) for name, row in rows().items()}
    shape = [{"table": "owtest.orders", "config_key": "domain.orders.status_column",
              "what": "owtest.orders.status is gone", "rules": ["F3"]}]
    v = judge(NOW, stopped, {"binlog": 0.3, "kafka": 0.8}, caught_up_seconds=5.0, shape=shape, stopped=True)
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
    v = judge(NOW, rows(), {"binlog": 0.3, "kafka": 0.8}, caught_up_seconds=5.0, shape=shape, reads=reads)
    assert v.verdict == "degraded" and v.blind == ()
    assert v.blind_tables == {"F3": ("owtest.orders",), "F4": ("owtest.orders",),
                              "F6": ("owtest.orders", "owtest.payments"),
                              **{rule: ("owtest.orders",) for rule in ("F7", "F8", "F9", "F10")}}


# ---------------------------------------------------------------- the shop's state (issue 43)

COUNTS = [("F1", "critical", "open", 331), ("F1", "critical", "acknowledged", 19), ("F2", "critical", "resolved", 7),
          ("F3", "warning", "open", 4), ("F3", "warning", "closed", 2), ("F9", "info", "open", 1)]


def test_a_group_far_behind_is_the_shops_state_not_the_monitors() -> None:
    """Seen 4: "Monitor degraded: consumer group shipping-service is 7352 records behind". The monitor read its
    streams; the shop's consumer was behind: the shop's state says so (judge takes no offsets; the monitor staying
    healthy through a stall is tests/integration/test_verdict_live.py)."""
    stalled = offsets(4000, 3352, None)
    state = views.shop_state(COUNTS, stalled, 5000)
    assert state.behind == (("shipping-service", 7352),)
    assert state.reasons == ("331 open critical findings", "4 open warning findings",
                             "1 open info finding (19 more acknowledged)",
                             "consumer group shipping-service is 7,352 records behind (F11's threshold 5,000)")
    assert state.verdict == "critical"


def test_the_shops_state_counts_open_findings_not_acknowledged_closed_or_resolved_ones() -> None:
    """Seen 4: the tile "Open critical findings 350" counted the 19 acknowledged too."""
    assert views.open_critical(COUNTS) == 331
    assert views.shop_state(COUNTS, offsets(10), 5000).open == {"critical": 331, "warning": 4, "info": 1}


def test_the_shop_is_clean_warned_or_critical_and_its_groups_unknown_until_polled() -> None:
    quiet = [("F3", "warning", "closed", 2), ("F1", "critical", "acknowledged", 1)]
    clean = views.shop_state(quiet, offsets(10), 5000)
    assert (clean.verdict, clean.reasons) == ("clean", ())
    assert views.shop_state(quiet, offsets(6000), 5000).verdict == "warning"  # a group behind, nothing open
    assert views.shop_state([("F3", "warning", "open", 1)], offsets(10), 5000).verdict == "warning"
    unpolled = views.shop_state(quiet, OffsetsSnapshot(polled_at=0.0, error=None), 5000)
    assert unpolled.behind is None and unpolled.verdict == "clean"
