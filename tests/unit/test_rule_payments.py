"""F2 double_charge, F5 amount_mismatch, F6 invalid_callback_status."""

from decimal import Decimal

from devservices.samples import Shop, feed, order, payment, rules_of, shop_settings
from oncewatch.checks.engine import Engine
from oncewatch.checks.findings import finding_id


def paid(shop: Shop, at: float, trade_no: str, order_no: str, **kw):
    return shop.tx(at, payment(trade_no, order_no, "success", **kw))


def test_two_successful_trade_nos_for_one_order_is_f2():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, shop.tx(1, order("O1", "pending")), paid(shop, 2, "T1", "O1"), paid(shop, 3, "T2", "O1"))
    assert rules_of(found) == ["F2"]
    f = found[0]
    assert f.id == finding_id("F2", "O1") and f.keys["trade_nos"] == ["T1", "T2"]
    assert [e.values["trade_no"] for e in f.evidence] == ["T1", "T2"]
    # what finance needs: the amounts, and what was charged beyond one payment
    assert f.summary == "order O1 paid successfully 2 times: 10.00 + 10.00 = 20.00"
    assert (f.keys["charged"], f.keys["amount_involved"]) == (Decimal("20.00"), Decimal("10.00"))


def test_near_miss_two_trade_nos_where_only_one_succeeded():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, shop.tx(1, order("O1", "pending")),
                 shop.tx(2, payment("T1", "O1", "failed", callback="failed")), paid(shop, 3, "T2", "O1"))
    assert found == []


def test_a_trade_no_that_turns_successful_twice_is_counted_once():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, shop.tx(1, payment("T1", "O1", "processing")),
                 shop.tx(2, payment("T1", "O1", "success", was="processing")),
                 shop.tx(3, payment("T1", "O1", "success", callback="success", was="success")))
    assert found == []


def test_successful_amount_differs_from_the_order_is_f5():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, shop.tx(1, order("O1", "pending", amount="99.90")), paid(shop, 2, "T1", "O1", amount="9.99"))
    assert rules_of(found) == ["F5"]
    assert found[0].id == finding_id("F5", "T1") and "9.99" in found[0].summary and "99.90" in found[0].summary
    assert len(found[0].evidence) == 2 and found[0].keys["amount_involved"] == Decimal("89.91")


def test_f5_when_the_order_row_comes_after_the_payment():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, paid(shop, 2, "T1", "O1", amount="5.00"), shop.tx(3, order("O1", "pending", amount="6.00")))
    assert rules_of(found) == ["F5"]


def test_equal_amounts_with_another_scale_and_failed_payments_are_not_f5():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, shop.tx(1, order("O1", "pending", amount="10.0")), paid(shop, 2, "T1", "O1", amount="10.00"),
                 shop.tx(3, payment("T2", "O2", "failed", amount="1.00")), shop.tx(4, order("O2", "closed")))
    assert found == []


def test_callback_status_off_the_whitelist_that_moved_the_order_is_f6():
    shop, engine = Shop(), Engine(shop_settings())
    for i, callback in enumerate(["SUCCESS", "pending", None]):
        o, t = f"O{i}", f"T{i}"
        feed(engine, shop.tx(1, order(o, "pending")))
        tx = shop.tx(2, payment(t, o, "success", callback=callback), order(o, "paid", was="pending"))
        found = feed(engine, tx)
        assert rules_of(found) == ["F6"], callback
        assert found[0].id == finding_id("F6", t, tx.rows[0].txid)
        assert {e.coordinates for e in found[0].evidence} == {r.coordinates for r in tx.rows}


def test_whitelisted_callback_or_order_not_moved_in_that_transaction_is_not_f6():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, shop.tx(1, order("O1", "pending"), order("O2", "pending")),
                 shop.tx(2, payment("T1", "O1", "success", callback="success"), order("O1", "paid", was="pending")),
                 shop.tx(3, payment("T2", "O2", "failed", callback="TIMEOUT")),
                 shop.tx(4, order("O2", "closed", was="pending")))
    assert found == []
