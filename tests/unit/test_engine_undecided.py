"""What `--until-idle` waits for: facts read whose verdict is still to come (Engine.undecided)."""

from devservices.samples import Shop, feed, order, push, rules_of, shop_settings
from oncewatch.checks.engine import Engine

from .test_rule_offsets import snapshot

T = 1000.0  # examples/shop.toml: stuck_pending_seconds 900, missing/orphan event grace 30


def test_a_pending_order_and_an_unannounced_change_wait_until_their_verdicts_are_given():
    shop, engine = Shop(), Engine(shop_settings())
    assert engine.undecided() == (0, None)
    push(engine, shop.tx(T, order("O1", "pending")), shop.tx(T, order("O2", "pending")))
    assert engine.undecided() == (2, T + 900)
    push(engine, shop.tx(T + 10, order("O1", "paid", was="pending")))  # paid: now its event is awaited
    assert engine.undecided() == (2, T + 40)
    engine.tick(now=T + 41, binlog_time=T + 41, kafka_time=T + 41)
    assert rules_of(engine.drain()) == ["F7"] and engine.undecided() == (1, T + 900)
    engine.tick(now=T + 901, binlog_time=T + 901, kafka_time=T + 901)
    assert rules_of(engine.drain()) == ["F3"] and engine.undecided() == (0, None)


def test_an_event_waits_for_its_change_and_a_matched_pair_waits_for_nothing():
    shop, engine = Shop(), Engine(shop_settings())
    push(engine, shop.event("order.paid", T, order_no="O2", amount="10.00", status="paid"))
    assert engine.undecided() == (1, T + 30)
    found = feed(engine, shop.tx(T, order("O2", "paid", was="pending")))
    assert found == [] and engine.undecided() == (0, None)


def test_a_skew_seen_waits_until_it_has_held():
    engine = Engine(shop_settings(partition_skew_threshold=3.0, partition_skew_seconds=60))
    engine.on_offsets(snapshot(10, [0, 0, 20, None]))
    assert engine.drain() == [] and engine.undecided() == (1, 70)
    engine.on_offsets(snapshot(70, [0, 0, 20, None]))
    assert rules_of(engine.drain()) == ["F12"] and engine.undecided() == (0, None)


def test_with_a_change_clock_that_only_commits_move_what_waits_on_it_is_not_waited_for():
    """Seen: a Canal source monitor (no heartbeats) run --until-idle never ended once its last trades waited for
    their verdicts on the change clock (300 s, test_canal_replay); an event awaited on the Kafka clock still is."""
    shop, engine = Shop(), Engine(shop_settings())
    push(engine, shop.tx(T, order("O1", "pending")))
    assert engine.undecided() == (1, T + 900)
    assert engine.undecided(change_clock_moves=False) == (0, None)
    push(engine, shop.event("order.paid", T, order_no="O2", amount="10.00", status="paid"))
    assert engine.undecided(change_clock_moves=False) == (1, T + 30)
