"""The verdict per trade (issue 45, checks.verdicts): pending from the payment's commit, verified once the graces
have run with every effect there and nothing found, violated by the first finding that touches the trade, its
order or a change announced for it, and moved from verified to violated by a later one."""

from __future__ import annotations

from decimal import Decimal

from devservices.samples import Shop, grant, order, payment, push, shipment, shop_settings
from oncewatch.checks.engine import Engine
from oncewatch.core.exact_json import from_json, to_json
from oncewatch.core.records import VERDICT_PENDING, VERDICT_VERIFIED, VERDICT_VIOLATED, Transaction

GRACE = 30.0  # examples/shop.toml's missing_event_grace_seconds


def paid(shop: Shop, at: float, trade_no: str = "T1", order_no: str = "O1", *, amount: str = "10.00",
         ship: str | None = "S1", points: str | None = "G1") -> Transaction:
    rows = [order(order_no, "paid", was="pending"), payment(trade_no, order_no, "success", amount=amount)]
    rows += [shipment(ship, trade_no)] if ship else []
    rows += [grant(points, trade_no)] if points else []
    return shop.tx(at, *rows)


def announced(shop: Shop, at: float, order_no: str = "O1", ship: str | None = "S1", points: str | None = "G1"):
    events = [shop.event("order.paid", at, order_no=order_no)]
    events += [shop.event("shipment.created", at, entity_id=ship)] if ship else []
    events += [shop.event("points.granted", at, entity_id=points)] if points else []
    return events


def verdicts(engine: Engine) -> dict[str, tuple]:
    return {v.trade_no: (v.verdict, v.rule, v.reached_at) for v in engine.drain_verdicts()}


def tick(engine: Engine, at: float) -> None:
    engine.tick(at, at, at)


def test_a_clean_trade_is_pending_then_verified_once_the_graces_have_run():
    shop, engine = Shop(), Engine(shop_settings())
    push(engine, paid(shop, 100.0), *announced(shop, 100.2))
    got = engine.drain_verdicts()
    assert [(v.trade_no, v.order_id, v.amount, v.verdict, v.committed_at, v.reached_at) for v in got] == [
        ("T1", "O1", Decimal("10.00"), VERDICT_PENDING, 100.0, None)]
    tick(engine, 100.0 + GRACE)  # not past the deadline yet
    assert verdicts(engine) == {}
    assert engine.undecided()[0] >= 1
    engine.tick(200.0, 200.0, 131.0)  # the Kafka clock decides too
    assert verdicts(engine) == {"T1": (VERDICT_VERIFIED, None, 131.0)}
    tick(engine, 300.0)
    assert verdicts(engine) == {}  # judged once


def test_a_second_effect_row_within_the_grace_violates_the_trade_by_f1():
    shop, engine = Shop(), Engine(shop_settings())
    push(engine, paid(shop, 100.0), *announced(shop, 100.2), shop.tx(105.0, shipment("S2", "T1")))
    assert verdicts(engine)["T1"] == (VERDICT_VIOLATED, "F1", 105.0)
    tick(engine, 200.0)
    assert verdicts(engine) == {}


def test_a_missing_event_of_its_order_or_of_its_shipment_violates_the_trade_by_f7():
    shop, engine = Shop(), Engine(shop_settings())
    events = announced(shop, 100.2, ship=None) + announced(shop, 100.2, order_no="O2", ship="S2", points="G2")[1:]
    push(engine, paid(shop, 100.0), paid(shop, 100.0, "T2", "O2", ship="S2", points="G2"), *events)
    engine.drain_verdicts()
    tick(engine, 200.0)
    # T1's shipment S1 was never announced; O2's paid change was not
    assert verdicts(engine) == {"T1": (VERDICT_VIOLATED, "F7", 130.0), "T2": (VERDICT_VIOLATED, "F7", 130.0)}


def test_a_double_charge_violates_both_trades_of_the_order():
    shop, engine = Shop(), Engine(shop_settings())
    push(engine, paid(shop, 100.0), *announced(shop, 100.2),
         shop.tx(101.0, payment("T2", "O1", "success"), shipment("S2", "T2"), grant("G2", "T2")))
    got = verdicts(engine)
    assert got == {"T1": (VERDICT_VIOLATED, "F2", 101.0), "T2": (VERDICT_VIOLATED, "F2", 101.0)}


def test_a_finding_before_the_trade_opens_violates_it_at_its_commit():
    shop, engine = Shop(), Engine(shop_settings())
    push(engine, shop.tx(90.0, order("O1", "pending", amount="10.00")), paid(shop, 100.0, amount="9.00"))
    assert verdicts(engine) == {"T1": (VERDICT_VIOLATED, "F5", 100.0)}


def test_a_later_finding_moves_a_verified_trade_to_violated_and_a_benign_replay_does_not():
    shop, engine = Shop(), Engine(shop_settings())
    push(engine, paid(shop, 100.0), *announced(shop, 100.2))
    tick(engine, 200.0)
    assert verdicts(engine)["T1"][0] == VERDICT_VERIFIED
    push(engine, shop.event("order.paid", 210.0, order_no="O1"))  # the same event again: at-least-once
    tick(engine, 300.0)
    assert verdicts(engine) == {}
    push(engine, shop.tx(400.0, grant("G9", "T1")))
    assert verdicts(engine) == {"T1": (VERDICT_VIOLATED, "F1", 400.0)}


def test_a_trade_short_of_an_effect_waits_for_its_row_then_the_grace_after_it():
    shop, engine = Shop(), Engine(shop_settings())
    push(engine, paid(shop, 100.0, points=None), *announced(shop, 100.2, points=None))
    engine.drain_verdicts()
    tick(engine, 200.0)
    assert verdicts(engine) == {}
    assert engine.undecided() == (0, None)  # nothing is due until the row comes
    push(engine, shop.tx(250.0, grant("G1", "T1")), shop.event("points.granted", 250.1, entity_id="G1"))
    tick(engine, 270.0)
    assert verdicts(engine) == {}
    tick(engine, 290.0)
    assert verdicts(engine) == {"T1": (VERDICT_VERIFIED, None, 290.0)}


def test_a_payment_of_the_snapshot_opens_no_trade():
    shop, engine = Shop(), Engine(shop_settings())
    push(engine, shop.tx(50.0, payment("T0", "O0", "success"), snapshot=True))
    tick(engine, 200.0)
    assert verdicts(engine) == {}


def test_a_restart_from_the_saved_state_neither_loses_nor_repeats_a_verdict():
    def story(engine: Engine, shop: Shop, cut: int | None) -> list[tuple]:
        steps = [lambda: push(engine, paid(shop, 100.0), *announced(shop, 100.2)),
                 lambda: push(engine, paid(shop, 101.0, "T2", "O2", ship="S2", points="G2"),
                              *announced(shop, 101.1, "O2", "S2", "G2")),
                 lambda: tick(engine, 131.5),
                 lambda: push(engine, shop.tx(140.0, shipment("S3", "T1"))),
                 lambda: tick(engine, 300.0)]
        out = []
        for i, step in enumerate(steps):
            step()
            if i == cut:  # a kill -9 after the state was saved, before the verdicts were drained
                saved = from_json(to_json(engine.state()))
                engine = Engine(shop_settings())
                engine.restore(saved)
            if i != cut:
                out += [(v.trade_no, v.verdict, v.rule, v.reached_at) for v in engine.drain_verdicts()]
        return out

    undisturbed = story(Engine(shop_settings()), Shop(), None)
    assert undisturbed[-3:] == [("T1", VERDICT_VERIFIED, None, 131.5), ("T2", VERDICT_VERIFIED, None, 131.5),
                                ("T1", VERDICT_VIOLATED, "F1", 140.0)]
    for cut in range(5):
        assert sorted(story(Engine(shop_settings()), Shop(), cut)) == sorted(undisturbed), cut
