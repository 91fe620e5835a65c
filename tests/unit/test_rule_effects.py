"""F1 duplicate_effect: more than one effect row per trade_no in an effect table; one finding per trade_no."""

import dataclasses


from devservices.samples import Shop, feed, grant, order, payment, rules_of, shipment, shop_settings
from oncewatch.checks.engine import Engine
from oncewatch.checks.findings import finding_id


def test_two_shipments_for_one_trade_no_is_one_f1_with_both_rows():
    shop, engine = Shop(), Engine(shop_settings())
    first, second = shop.tx(10, shipment("S1", "T1")), shop.tx(11, shipment("S2", "T1"))
    found = feed(engine, first, second)
    assert rules_of(found) == ["F1"]
    f = found[0]
    assert f.id == finding_id("F1", "T1")
    assert f.severity == "critical" and f.keys == {"tables": ["shop.shipments"], "trade_no": "T1"}
    assert [e.coordinates for e in f.evidence] == [first.rows[0].coordinates, second.rows[0].coordinates]
    assert [e.time for e in f.evidence] == [10, 11] and f.first_seen == 11
    assert f.evidence[0].kind == "row_change" and f.evidence[0].values["trade_no"] == "T1"
    assert [e.values["row_id"] for e in f.evidence] == ["S1", "S2"]  # which rows to take back


def test_a_third_row_updates_the_same_finding():
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, shop.tx(10, shipment("S1", "T1"), shipment("S2", "T1")))
    again = feed(engine, shop.tx(12, shipment("S3", "T1")))
    assert len(again) == 1 and len(again[0].evidence) == 3 and again[0].last_seen == 12
    assert engine.stats()["found_total"]["F1"] == 1


def test_near_miss_one_shipment_per_trade_no_for_two_trade_nos_of_one_order():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, shop.tx(10, order("O1", "pending")),
                 shop.tx(11, payment("T1", "O1", "failed", callback="failed")),
                 shop.tx(12, payment("T2", "O1", "success"), order("O1", "paid", was="pending")),
                 shop.tx(13, shipment("S1", "T1")), shop.tx(14, shipment("S2", "T2")))
    assert "F1" not in rules_of(found)


def test_a_payment_handled_twice_is_one_finding_naming_both_tables():
    shop, engine = Shop(), Engine(shop_settings())
    first = shop.tx(10, shipment("S1", "T1"), grant("G1", "T1"))
    second = shop.tx(11, shipment("S2", "T1"), grant("G2", "T1"))
    found = feed(engine, first, second)
    assert rules_of(found) == ["F1"]
    assert found[0].keys == {"tables": ["shop.points_grants", "shop.shipments"], "trade_no": "T1"}
    assert sorted(e.coordinates for e in found[0].evidence) == sorted(r.coordinates for r in first.rows + second.rows)


def test_one_row_in_each_of_two_effect_tables_is_not_a_duplicate():
    shop, engine = Shop(), Engine(shop_settings())
    assert "F1" not in rules_of(feed(engine, shop.tx(10, shipment("S1", "T1"), grant("G1", "T1"))))


def test_an_update_of_the_same_shipment_is_not_a_second_one():
    shop, engine = Shop(), Engine(shop_settings())
    tx = shop.tx(10, shipment("S1", "T1"))
    row = tx.rows[0]
    update = shop.tx(11, ("shipments", "update", row.after, {**row.after, "carrier": "x"}))
    assert "F1" not in rules_of(feed(engine, tx, update))


def test_a_snapshot_row_counts_as_an_existing_effect():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, shop.tx(1, shipment("S1", "T1"), snapshot=True), shop.tx(10, shipment("S2", "T1")))
    assert rules_of(found) == ["F1"]


def without_pk(tx):
    """The same transaction from a table without a primary key: the binlog gives no key columns."""
    return dataclasses.replace(tx, rows=tuple(dataclasses.replace(r, pk=()) for r in tx.rows))


def test_an_effect_table_without_a_primary_key_still_shows_duplicates():
    shop, engine = Shop(), Engine(shop_settings())
    found = feed(engine, without_pk(shop.tx(10, shipment("S1", "T1"))), without_pk(shop.tx(11, shipment("S2", "T1"))))
    assert rules_of(found) == ["F1"] and len(found[0].evidence) == 2


def test_near_miss_an_update_in_a_table_without_a_primary_key_is_no_new_effect():
    shop, engine = Shop(), Engine(shop_settings())
    first = without_pk(shop.tx(10, shipment("S1", "T1")))
    updated = without_pk(shop.tx(11, shipment("S1", "T1")))
    updated = dataclasses.replace(updated, rows=tuple(dataclasses.replace(r, op="update", before=r.after)
                                                      for r in updated.rows))
    assert feed(engine, first, updated) == []


def test_a_trade_no_in_a_varbinary_column_is_the_text_it_holds():
    shop, engine = Shop(), Engine(shop_settings())
    binary = shop.tx(10, shipment("S1", "T1"))
    binary = dataclasses.replace(binary, rows=tuple(dataclasses.replace(r, after={**r.after, "trade_no": b"T1"})
                                                    for r in binary.rows))
    found = feed(engine, binary, shop.tx(11, shipment("S2", "T1")))
    assert rules_of(found) == ["F1"] and found[0].keys["trade_no"] == "T1"
