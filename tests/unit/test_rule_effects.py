"""F1 duplicate_effect: more than one effect row per trade_no in an effect table; one finding per trade_no.

F1 counts the rows that exist: deletes and TRUNCATEs take rows away, and end a finding they leave no duplicate
in (issue 42, observation 4)."""

import dataclasses
import logging

from devservices.samples import Shop, deleted, feed, grant, order, payment, rules_of, shipment, shop_settings
from oncewatch.checks.engine import Engine
from oncewatch.checks.findings import finding_id
from oncewatch.checks.shards import Router, Shard, merge_stats
from oncewatch.core.exact_json import from_json, to_json


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


# ---------------------------------------------------------------- deletes and truncates

def restarted(engine: Engine) -> Engine:
    """A new engine from `engine`'s state, through JSON as the store keeps it."""
    again = Engine(engine.settings, engine.shard)
    again.restore(from_json(to_json(engine.state())))
    return again


def test_a_row_truncated_away_and_written_again_is_one_row_and_the_truncate_is_counted_and_logged(caplog):
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, shop.tx(10, shipment("S1", "T1")))
    engine = restarted(engine)
    with caplog.at_level(logging.WARNING, logger="oncewatch.checks.engine"):
        found = feed(engine, shop.truncate(11, "shop.shipments"), shop.tx(12, shipment("S2", "T1")))
    assert found == [] and engine.shape() == []  # a TRUNCATE changes no column
    assert engine.stats()["truncated_total"] == {"shop.shipments": 1}
    (line,) = [r for r in caplog.records if getattr(r, "event", None) == "table_truncated"]
    assert (line.table, line.gtid) == ("shop.shipments", "0-1-2")
    # counted across a restart too, and the rows of before it stay gone
    engine = restarted(engine)
    assert feed(engine, shop.tx(13, shipment("S3", "T2"))) == [] and engine.stats()["truncated_total"] == {
        "shop.shipments": 1}
    assert rules_of(feed(engine, shop.tx(14, shipment("S4", "T1")))) == ["F1"]


def test_an_open_f1_ends_with_the_truncate_of_its_table_and_opens_again_on_a_new_duplicate():
    shop, engine = Shop(), Engine(shop_settings())
    (f1,) = feed(engine, shop.tx(10, shipment("S1", "T1")), shop.tx(11, shipment("S2", "T1")))
    engine = restarted(engine)
    truncate = shop.truncate(20, "shop.shipments")
    (ended,) = feed(engine, truncate, shop.tx(21, shipment("S3", "T1")))
    assert ended.id == f1.id and ended.status == "resolved" and ended.resolved_at == 20
    assert ended.resolution == f"shop.shipments truncated at bin.000001:{truncate.position.pos}"
    assert ended.evidence == f1.evidence and ended.summary == f1.summary  # what was duplicated stays to be seen
    (again,) = feed(engine, shop.tx(22, shipment("S4", "T1")))
    assert again.id == f1.id and again.status == "open" and again.summary == "trade_no T1: 2 rows in shop.shipments"
    assert [e.values["row_id"] for e in again.evidence] == ["S1", "S2", "S3", "S4"]


def test_a_truncate_of_another_effect_table_leaves_the_duplicate_standing():
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, shop.tx(10, shipment("S1", "T1"), grant("G1", "T1")), shop.tx(11, shipment("S2", "T1"),
                                                                            grant("G2", "T1")))
    (f1,) = feed(engine, shop.truncate(20, "shop.points_grants"))
    assert f1.status == "open" and f1.keys["tables"] == ["shop.shipments"]
    assert f1.summary == "trade_no T1: 2 rows in shop.shipments"
    (f1,) = feed(engine, shop.truncate(21, "shop.shipments"))
    assert f1.status == "resolved" and f1.resolution.startswith("shop.shipments truncated at ")


def test_insert_delete_insert_of_one_trade_no_is_one_row():
    shop, engine = Shop(), Engine(shop_settings())
    first = shipment("S1", "T1")
    feed(engine, shop.tx(10, first), shop.tx(11, deleted(first)))
    engine = restarted(engine)
    assert feed(engine, shop.tx(12, shipment("S2", "T1"))) == []


def test_a_duplicate_deleted_down_to_one_row_is_resolved_with_the_delete_in_its_evidence():
    shop, engine = Shop(), Engine(shop_settings())
    second = shipment("S2", "T1")
    (f1,) = feed(engine, shop.tx(10, shipment("S1", "T1")), shop.tx(11, second))
    engine = restarted(engine)
    delete = shop.tx(12, deleted(second))
    (ended,) = feed(engine, delete)
    assert ended.id == f1.id and (ended.status, ended.resolved_at) == ("resolved", 12)
    assert ended.resolution == f"shop.shipments row deleted at {delete.rows[0].coordinates}"
    assert [(e.values["op"], e.values["row_id"], e.time) for e in ended.evidence] == [
        ("insert", "S1", 10), ("insert", "S2", 11), ("delete", "S2", 12)]
    assert feed(engine, shop.tx(13, shipment("S3", "T2"))) == []


def test_a_third_row_deleted_leaves_the_finding_open_with_the_delete_and_the_rows_that_are_left():
    shop, engine = Shop(), Engine(shop_settings())
    third = shipment("S3", "T1")
    feed(engine, shop.tx(10, shipment("S1", "T1"), shipment("S2", "T1"), third))
    (f1,) = feed(engine, shop.tx(12, deleted(third)))
    assert f1.status == "open" and f1.summary == "trade_no T1: 2 rows in shop.shipments" and f1.last_seen == 12
    assert [(e.values["op"], e.values["row_id"]) for e in f1.evidence][-1] == ("delete", "S3")


def test_a_delete_in_another_table_is_no_evidence_of_the_duplicate():
    shop, engine = Shop(), Engine(shop_settings())
    one = grant("G1", "T1")
    feed(engine, shop.tx(10, shipment("S1", "T1"), one), shop.tx(11, shipment("S2", "T1")))
    assert feed(engine, shop.tx(12, deleted(one))) == []


def test_a_resolution_is_never_before_the_rows_it_ends():
    """A delete timed by the binlog header (whole seconds) may read earlier than the row column's time of the
    insert before it: the finding resolves at the newest of its evidence, its history in time order."""
    shop, engine = Shop(), Engine(shop_settings())
    second = shipment("S2", "T1")
    feed(engine, shop.tx(10.2, shipment("S1", "T1")), shop.tx(10.7, second))
    (ended,) = feed(engine, shop.tx(10.0, deleted(second)))
    assert ended.status == "resolved" and ended.resolved_at == 10.7 >= ended.first_seen


def test_a_delete_of_a_row_never_seen_or_without_its_key_changes_nothing():
    shop, engine = Shop(), Engine(shop_settings())
    feed(engine, shop.tx(10, shipment("S1", "T1")), shop.tx(11, shipment("S2", "T1")))
    assert feed(engine, shop.tx(12, deleted(shipment("S0", "T1"))), shop.tx(13, deleted(shipment("S9", None)))) == []


def test_a_delete_in_a_table_without_a_primary_key_takes_one_row_of_its_trade_no_away():
    shop, engine = Shop(), Engine(shop_settings())
    one = shipment("S1", "T1")
    (f1,) = feed(engine, without_pk(shop.tx(10, one)), without_pk(shop.tx(11, one)))
    (ended,) = feed(engine, without_pk(shop.tx(12, deleted(one))))
    assert ended.id == f1.id and ended.status == "resolved"
    assert feed(engine, without_pk(shop.tx(13, deleted(one))), without_pk(shop.tx(14, one))) == []


def test_sharded_engines_end_their_own_duplicates_on_a_truncate_and_count_it_once():
    """The truncate reaches every shard; each ends the F1s of its trade_nos, the leader alone counts it."""
    settings = shop_settings()
    router, count = Router(settings, 3), 3
    shards = [Engine(settings, Shard(i, count)) for i in range(count)]
    shop = Shop()
    txs = [shop.tx(10, *[shipment(f"S{i}", f"T{i}") for i in range(12)]),
           shop.tx(11, *[shipment(f"S{i}b", f"T{i}") for i in range(12)]),
           shop.tx(12, deleted(shipment("S0b", "T0"))), shop.truncate(20, "shop.shipments"),
           shop.tx(21, *[shipment(f"S{i}c", f"T{i}") for i in range(12)])]
    found = {}
    for tx in txs:
        for s, part in router.split(tx).parts.items():
            shards[s].on_transaction(part)
        for engine in shards:
            found.update((f.id, f) for f in engine.drain())
    assert sorted(f.keys["trade_no"] for f in found.values()) == sorted(f"T{i}" for i in range(12))
    assert {f.status for f in found.values()} == {"resolved"}
    assert found[finding_id("F1", "T0")].resolution.startswith("shop.shipments row deleted at ")
    assert sum(f.resolution.startswith("shop.shipments truncated") for f in found.values()) == 11
    assert merge_stats(e.stats() for e in shards)["truncated_total"] == {"shop.shipments": 1}
