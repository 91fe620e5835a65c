"""Shape changes: a DDL that breaks a configured column blinds the rules that read it (no false
finding, the problem named by its config key); a later DDL that puts it right ends that; a TRUNCATE
of the orders table ends pending orders. Grace 30 s, stuck after 900 s (examples/shop.toml)."""

from __future__ import annotations

import dataclasses

from devservices.samples import Shop, feed, order, payment, rules_of, shipment, shop_settings
from oncewatch.checks import shape
from oncewatch.checks.engine import Engine
from oncewatch.core.records import SchemaChange, Transaction

T = 1000.0
ORDERS = {"order_no": "varchar", "status": "varchar", "amount": "decimal"}
PAYMENTS = {"trade_no": "varchar", "order_no": "varchar", "status": "varchar", "amount": "decimal",
            "callback_status": "varchar"}


def ddl(shop: Shop, at: float, table: str, columns: dict[str, str], kind: str = "alter") -> Transaction:
    tx = shop.tx(at)
    change = SchemaChange(table=table, kind=kind, statement="ALTER TABLE ...", columns=columns, txid=tx.position.gtid,
                          binlog_file="bin.000001", pos=tx.position.pos)
    return dataclasses.replace(tx, schema_changes=(change,))


def without(row_tx: Transaction, column: str, rename_to: str | None = None) -> Transaction:
    """The rows as the binlog gives them after the column was dropped (or renamed)."""
    def cut(image):
        if image is None:
            return None
        out = {k: v for k, v in image.items() if k != column}
        return out | ({rename_to: image[column]} if rename_to and column in image else {})
    return dataclasses.replace(row_tx, rows=tuple(dataclasses.replace(r, before=cut(r.before), after=cut(r.after))
                                                  for r in row_tx.rows))


def test_a_renamed_status_column_blinds_its_rules_instead_of_raising_false_f8() -> None:
    shop, engine = Shop(), Engine(shop_settings())
    renamed = {k if k != "status" else "state": v for k, v in ORDERS.items()}
    feed(engine, ddl(shop, T, "shop.orders", renamed))
    assert engine.blind_tables() == {"F3": {"shop.orders"}, "F4": {"shop.orders"},
                                     "F6": {"shop.orders", "shop.payments"},
                                     **{rule: {"shop.orders"} for rule in ("F7", "F8", "F9", "F10")}}
    (problem,) = [p for p in engine.shape() if p["column"] == "status" and p["config_key"].startswith("domain")]
    assert problem == {"table": "shop.orders", "column": "status", "config_key": "domain.orders.status_column",
                       "rules": ["F3", "F4", "F6"], "what": "shop.orders.status is gone (dropped or renamed)"}
    # The shop goes on: the order is paid under the new column name and announced.
    found = feed(engine, without(shop.tx(T + 1, order("O1", "paid", was="pending")), "status", "state"),
                 shop.event("order.paid", T + 1.1, order_no="O1"))
    engine.tick(now=T + 100, binlog_time=T + 100, kafka_time=T + 100)
    assert found + engine.drain() == []
    assert engine.stats()["suppressed_total"] == {"F8": 1}
    assert "F8" in [p["rules"] for p in engine.stats()["shape_problems"]][-1]


def test_near_miss_without_the_ddl_the_same_rows_give_f8() -> None:
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, without(shop.tx(T + 1, order("O1", "paid", was="pending")), "status", "state"),
         shop.event("order.paid", T + 1.1, order_no="O1"))
    engine.tick(now=T + 100, binlog_time=T + 100, kafka_time=T + 100)
    assert rules_of(engine.drain()) == ["F8"]


def test_a_renamed_status_column_leaves_f7_judging_the_other_tables() -> None:
    """Issue 42, observation 5: with the orders' status renamed, a shipment inserted whose event never comes is
    still an F7 (the shipments' announce entry is intact); only what the orders' entries would raise is held back."""
    shop, engine = Shop(), Engine(shop_settings())
    renamed = {k if k != "status" else "state": v for k, v in ORDERS.items()}
    feed(engine, ddl(shop, T, "shop.orders", renamed))
    found = feed(engine, shop.tx(T + 1, shipment("7", "T1")),
                 without(shop.tx(T + 1, order("O1", "paid", was="pending")), "status", "state"),
                 shop.event("order.paid", T + 1.1, order_no="O1"))
    engine.tick(now=T + 100, binlog_time=T + 100, kafka_time=T + 100)
    (f7,) = found + engine.drain()
    assert (f7.rule, f7.keys) == ("F7", {"event_type": "shipment.created", "key": "7", "table": "shop.shipments"})
    assert engine.stats()["suppressed_total"] == {"F8": 1}


def test_near_miss_a_problem_on_the_shipments_blinds_their_f7() -> None:
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, ddl(shop, T, "shop.shipments", {"trade_no": "varchar"}))  # shipment_id gone
    feed(engine, shop.tx(T + 1, shipment("7", "T1")))
    engine.tick(now=T + 100, binlog_time=T + 100, kafka_time=T + 100)
    assert engine.drain() == [] and engine.stats()["suppressed_total"] == {"F7": 1}


def test_a_dropped_or_retyped_amount_blinds_f5_and_putting_it_back_ends_that() -> None:
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, ddl(shop, T, "shop.payments", {**PAYMENTS, "amount": "varchar"}))
    assert [p["what"] for p in engine.shape()] == ["shop.payments.amount is now varchar, not a number"]
    feed(engine, ddl(shop, T + 1, "shop.payments", {k: v for k, v in PAYMENTS.items() if k != "amount"}))
    assert [(p["config_key"], p["rules"]) for p in engine.shape()] == [("domain.payments.amount_column", ["F5"])]
    mismatch = [shop.tx(T + 2, order("O1", "pending", amount="10.00")),
                shop.tx(T + 3, payment("T1", "O1", "success", amount="0.10"), order("O1", "paid", was="pending"))]
    assert feed(engine, *mismatch) == []
    feed(engine, ddl(shop, T + 4, "shop.payments", PAYMENTS))
    assert engine.shape() == [] and engine.blind_tables() == {}
    assert rules_of(feed(engine, shop.tx(T + 5, payment("T2", "O1", "success", amount="0.10")))) == ["F2", "F5"]


def test_a_table_that_is_gone_blinds_every_rule_reading_it() -> None:
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, ddl(shop, T, "shop.shipments", {}, kind="rename"))
    assert {p["config_key"] for p in engine.shape()} == {"domain.effects[0].trade_no_column", "announce[2].key_column"}
    assert "shop.shipments is gone (rename)" in {p["what"] for p in engine.shape()}


def test_a_truncated_orders_table_ends_pending_orders_without_f3() -> None:
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, shop.tx(T, order("O1", "pending")), shop.tx(T, order("O2", "pending")),
         shop.tx(T + 900, order("O3", "pending")))  # O3 not stuck yet at the truncate
    engine.tick(now=T + 901, binlog_time=T + 901, kafka_time=T + 901)
    (stuck,) = [f for f in engine.drain() if f.keys == {"order": "O1"}] or [None]
    assert stuck is not None and stuck.status == "open"
    ended = {f.keys["order"]: f for f in feed(engine, ddl(shop, T + 950, "shop.orders", ORDERS, kind="truncate"))}
    assert ended["O1"].status == "resolved" and "truncated" in ended["O1"].resolution and set(ended) == {"O1", "O2"}
    engine.tick(now=T + 5000, binlog_time=T + 5000, kafka_time=T + 5000)
    assert engine.drain() == [] and engine.shape() == []


def test_shape_problems_survive_a_restart() -> None:
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, ddl(shop, T, "shop.payments", {**PAYMENTS, "amount": "varchar"}))
    again = Engine(shop_settings())
    again.restore(engine.state())
    assert again.shape() == engine.shape() and again.findings.blind == {"F5": {"shop.orders", "shop.payments"}}


def test_every_configured_column_is_a_need_with_its_config_key() -> None:
    keys = {n.config_key for n in shape.needs(shop_settings())}
    assert {"domain.orders.key_column", "domain.orders.status_column", "domain.orders.amount_column",
            "domain.payments.trade_no_column", "domain.payments.amount_column", "domain.payments.callback_status_column",
            "domain.effects[1].trade_no_column", "announce[0].when_column", "announce[3].key_column"} <= keys
