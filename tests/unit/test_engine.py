"""The engine around the rules: state save/restore, drain, stats shape, the horizon."""

import dataclasses
import logging

import pytest

from devservices.samples import Shop, feed, order, payment, push, rules_of, shipment, shop_settings
from oncewatch.checks.engine import Engine, StateMismatchError, merge_delta
from oncewatch.checks.horizon import verdicts_lost
from oncewatch.core.exact_json import from_json, to_json

T = 1000.0


def restart(engine: Engine) -> Engine:
    again = Engine(engine.settings)
    again.restore(from_json(to_json(engine.state())))
    return again


def test_state_round_trips_through_json_and_the_run_goes_on_as_if_uninterrupted():
    shop = Shop()
    first = [shop.tx(T, order("O1", "pending", amount="12.50")),
             shop.tx(T + 1, payment("T1", "O1", "success", amount="12.50"),
                     order("O1", "paid", amount="12.50", was="pending")),
             shop.tx(T + 2, shipment("S1", "T1")), shop.event("order.paid", T + 60, order_no="O1")]
    second = [shop.tx(T + 3, shipment("S2", "T1")), shop.tx(T + 4, payment("T2", "O1", "success", amount="1.00")),
              shop.event("shipment.created", T + 2.1, entity_id="S1")]
    straight = Engine(shop_settings())
    expected = {f.id: f for f in feed(straight, *first) + feed(straight, *second)}

    engine = Engine(shop_settings())
    push(engine, *first)  # not drained: findings changed since the last drain travel with the state
    found = {f.id: f for f in feed(restart(engine), *second)}
    assert found == expected
    assert sorted(f.rule for f in found.values()) == ["F1", "F10", "F2", "F5", "F7"]


def test_deltas_carry_only_what_changed_and_add_up_to_the_state():
    shop, engine = Shop(), Engine(shop_settings())
    push(engine, shop.tx(T, shipment("S1", "T1")), shop.tx(T + 1, shipment("S2", "T2")))
    first = engine.state_delta()
    assert first["changes"]["effects"]["full"] and len(first["changes"]["effects"]["put"]) == 2
    push(engine, shop.event("shipment.created", T + 1.1, entity_id="S2"), shop.tx(T + 2, shipment("S3", "T1")))
    second = engine.state_delta()
    effects, waiting = second["changes"]["effects"], second["changes"]["waiting_changes.fresh"]
    assert not effects["full"] and [row[0] for row in effects["put"]] == ["shop.shipments\x1fT1"]
    assert waiting["gone"] == ["shop.events\x1fshipment.created\x1fS2"] and len(waiting["put"]) == 1
    assert [f["rule"] for f in second["changed"]] == ["F1"]  # not drained yet: travels with the state
    saved = merge_delta(merge_delta(None, first), second)
    key = lambda s: {space: sorted(rows) for space, rows in s["entries"].items()}  # noqa: E731
    assert key(from_json(to_json(saved))) == key(from_json(to_json(engine.state())))
    assert engine.state_delta()["changes"]["effects"] == {"full": False, "put": [], "gone": []}


def test_restore_refuses_state_from_another_shape():
    state = Engine(shop_settings()).state()
    other = dataclasses.replace(shop_settings(), announce=shop_settings().announce[:1])
    with pytest.raises(StateMismatchError, match="another"):
        Engine(other).restore(state)
    Engine(shop_settings(event_delay_seconds=2.0)).restore(state)  # thresholds may change


def test_drain_gives_each_change_once():
    shop, engine = Shop(), Engine(shop_settings())
    assert rules_of(feed(engine, shop.tx(T, shipment("S1", "T1"), shipment("S2", "T1")))) == ["F1"]
    assert engine.drain() == []
    assert feed(engine, shop.tx(T, shipment("S1", "T1"))) == []  # the same row again changes nothing


def test_stats_shape():
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, shop.tx(T, shipment("S1", "T1"), shipment("S2", "T1")), shop.tx(T, order("O1", "paid", was="pending")),
         shop.event("order.paid", T + 0.01, order_no="O1"))
    stats = engine.stats()
    assert set(stats) == {"backlog_by_table", "delay", "found_total", "horizon_dropped_total", "horizon_dropped",
                          "suppressed_total", "shape_problems", "truncated_total", "pipeline"}
    assert (stats["suppressed_total"], stats["shape_problems"], stats["truncated_total"]) == ({}, [], {})
    assert stats["backlog_by_table"] == {"shop.orders": 0, "shop.shipments": 2, "shop.points_grants": 0}
    assert list(stats["delay"]["gtid_commit_ts"]["buckets"])[-1] == "+Inf"
    assert stats["found_total"] == {f"F{i}": int(i == 1) for i in range(1, 17)}
    assert stats["horizon_dropped_total"] == 0
    assert stats["horizon_dropped"]["waiting_changes.fresh"] == {"age": 0, "count": 0}  # every space from the start


def test_state_past_the_horizon_falls_off_counted_and_logged(caplog):
    shop, engine = Shop(), Engine(shop_settings(horizon_seconds=100, stuck_pending_seconds=50))
    feed(engine, shop.tx(T, shipment("S1", "T1")))  # waits for its event; Kafka is stalled at T
    caplog.set_level(logging.WARNING, "oncewatch.checks.engine")
    engine.tick(now=T + 200, binlog_time=T + 200, kafka_time=T)
    stats = engine.stats()
    # the shipment row (F1 memory), the change waiting for its event, and the link of its key to its trade_no
    # (checks.verdicts)
    assert stats["horizon_dropped_total"] == 3
    assert stats["backlog_by_table"]["shop.shipments"] == 0
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "horizon_dropped"]
    assert record.levelname == "WARNING"  # a change that never got its verdict
    assert record.dropped == 3 and record.expired == {"effects": 1, "waiting_changes": 1, "announced_trades": 1}
    by_space = {space: n for space, n in stats["horizon_dropped"].items() if any(n.values())}
    assert by_space == {"effects": {"age": 1, "count": 0}, "waiting_changes.fresh": {"age": 1, "count": 0},
                        "announced_trades": {"age": 1, "count": 0}}
    engine.tick(now=T + 300, binlog_time=T + 300, kafka_time=T + 300)
    assert engine.drain() == []  # never judged: it fell off before Kafka was read that far


def test_the_horizon_log_comes_at_most_once_a_minute(caplog):
    shop, engine = Shop(), Engine(shop_settings(horizon_seconds=100, stuck_pending_seconds=50))
    caplog.set_level(logging.INFO, "oncewatch.checks.engine")
    for i in range(10):
        feed(engine, shop.tx(T + 10 * i, shipment(f"S{i}", f"T{i}")), shop.event("shipment.created", T + 10 * i,
                                                                               entity_id=f"S{i}"))
        engine.tick(now=T + 200 + 10 * i, binlog_time=T + 200 + 10 * i, kafka_time=T + 200 + 10 * i)
    records = [r for r in caplog.records if getattr(r, "event", None) == "horizon_dropped"]
    assert [r.levelname for r in records] == ["INFO", "INFO"]  # only memory for duplicate checks fell off
    assert sum(r.dropped for r in records) < engine.stats()["horizon_dropped_total"]  # the rest is in the next line


def test_a_reported_change_ageing_out_is_the_horizon_doing_its_job(caplog):
    """A change judged F7 waits as overdue for a late event; once it falls off the horizon nothing a rule
    needed is lost: the log line is info, and verdicts_lost (what pages) stays 0."""
    shop, engine = Shop(), Engine(shop_settings(horizon_seconds=100, missing_event_grace_seconds=5))
    feed(engine, shop.tx(T, shipment("S1", "T1")))
    engine.tick(now=T + 10, binlog_time=T + 10, kafka_time=T + 10)
    assert [f.rule for f in engine.drain()] == ["F7"]
    caplog.set_level(logging.INFO, "oncewatch.checks.engine")
    engine.tick(now=T + 200, binlog_time=T + 200, kafka_time=T + 200)
    dropped = engine.stats()["horizon_dropped"]
    assert dropped["waiting_changes.overdue"] == {"age": 1, "count": 0} and verdicts_lost(dropped) == 0
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "horizon_dropped"]
    assert record.levelname == "INFO"


def test_max_entries_bounds_each_kind(caplog):
    shop, engine = Shop(), Engine(shop_settings(horizon_max_entries=2))
    caplog.set_level(logging.INFO, "oncewatch.checks.engine")
    feed(engine, *(shop.tx(T + i, shipment(f"S{i}", f"T{i}")) for i in range(3)))
    engine.tick(now=T + 3, binlog_time=T + 3, kafka_time=T + 3)
    # one effect row, one waiting change, one link of a shipment's key to its trade_no (checks.verdicts)
    assert engine.stats()["horizon_dropped_total"] == 3
    dropped = engine.stats()["horizon_dropped"]
    assert dropped["effects"] == {"age": 0, "count": 1} and verdicts_lost(dropped) == 3
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "horizon_dropped"]
    assert record.levelname == "WARNING"  # pushed out over max_entries: a duplicate of S0's trade would be missed
    assert len(engine.state()["entries"]["effects"]) == 2
