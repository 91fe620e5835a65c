"""F3 stuck_pending (judged on the binlog clock, resolved when the order moves) and F4 illegal_transition."""

from devservices.samples import Shop, feed, order, rules_of, shop_settings
from oncewatch.checks.engine import Engine
from oncewatch.checks.findings import finding_id

T = 1000.0  # stuck_pending_seconds = 900 in examples/shop.toml


def test_pending_past_the_threshold_on_the_binlog_clock_is_f3_and_resolves_when_paid():
    shop, engine = Shop(), Engine(shop_settings())
    created = shop.tx(T, order("O1", "pending"))
    feed(engine, created)
    engine.tick(now=T + 901, binlog_time=T + 901, kafka_time=T + 901)
    (f,) = engine.drain()
    assert (f.rule, f.status, f.severity, f.id) == ("F3", "open", "warning", finding_id("F3", "O1"))
    assert f.first_seen == T + 900 and f.evidence[0].coordinates == created.rows[0].coordinates
    paid = shop.tx(T + 1000, order("O1", "paid", was="pending"))
    (f,) = feed(engine, paid)
    assert (f.status, f.resolved_at) == ("resolved", T + 1000)
    assert "paid" in f.resolution and paid.rows[0].coordinates in f.resolution
    assert [e.time for e in f.evidence] == [T, T + 1000]


def test_not_stuck_while_the_binlog_has_not_been_read_that_far():
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, shop.tx(T, order("O1", "pending")))
    engine.tick(now=T + 5000, binlog_time=T + 899, kafka_time=T + 5000)
    assert engine.drain() == []


def test_near_miss_paid_within_the_threshold():
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, shop.tx(T, order("O1", "pending")), shop.tx(T + 899, order("O1", "paid", was="pending")))
    engine.tick(now=T + 2000, binlog_time=T + 2000, kafka_time=T + 2000)
    assert "F3" not in rules_of(engine.drain())


def test_paid_after_the_threshold_before_the_timer_ran_is_recorded_resolved():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, shop.tx(T, order("O1", "pending")), shop.tx(T + 950, order("O1", "closed", was="pending")))
    (f,) = found
    assert (f.rule, f.status, f.first_seen, f.resolved_at) == ("F3", "resolved", T + 900, T + 950)
    assert "closed" in f.resolution


def test_a_snapshot_pending_order_is_watched_too():
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, shop.tx(T, order("O1", "pending"), snapshot=True))
    engine.tick(now=T + 901, binlog_time=T + 901, kafka_time=T + 901)
    assert rules_of(engine.drain()) == ["F3"]


def test_transition_outside_the_state_machine_is_f4():
    shop, engine = Shop(), Engine(shop_settings())
    tx = shop.tx(T, order("O1", "paid", was="refunded"))
    (f,) = feed(engine, tx)
    assert (f.rule, f.severity, f.keys) == ("F4", "critical", {"order": "O1", "from": "refunded", "to": "paid"})
    assert f.id == finding_id("F4", "O1", tx.rows[0].txid, 0)
    assert f.evidence[0].values["before.status"] == "refunded" and f.evidence[0].values["status"] == "paid"


def test_unknown_status_is_f4():
    shop, engine = Shop(), Engine(shop_settings())
    assert rules_of(feed(engine, shop.tx(T, order("O1", "lost", was="paid")))) == ["F4"]


def test_near_miss_transitions_the_state_machine_allows():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, shop.tx(T, order("O1", "pending")), shop.tx(T + 1, order("O1", "paid", was="pending")),
                 shop.tx(T + 2, order("O1", "shipped", was="paid")),
                 shop.tx(T + 3, order("O1", "refunded", was="shipped")),
                 shop.tx(T + 4, order("O1", "refunded", amount="0.00", was="refunded")))
    assert "F4" not in rules_of(found)


def test_snapshot_rows_are_not_transitions():
    shop, engine = Shop(), Engine(shop_settings())
    assert feed(engine, shop.tx(T, order("O1", "paid", was="refunded"), snapshot=True)) == []
