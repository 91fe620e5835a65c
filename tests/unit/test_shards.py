"""Shards judge as one engine: engines fed the router's split of a workload find what one engine finds.

The workload is test_engine_properties' scenarios (every fault of F1-F10: lost, late, duplicated, early and
phantom events; stuck, double-charged, mis-priced orders; bad callbacks, illegal transitions, duplicate
shipments), in any interleaving of the binlog and two Kafka partitions, with ticks and restarts anywhere (each
shard's state through JSON). The shards' findings together are one engine's, field by field (id, rule, status,
severity, times, keys, summary, evidence), and no finding comes from two shards.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devservices.samples import Shop, order, payment, shipment
from oncewatch.checks.engine import Engine, StateMismatchError
from oncewatch.checks.findings import to_dict
from oncewatch.checks.shards import Router, Shard, ShardingError, merge_stats, shard_of
from oncewatch.checks.settings import Settings
from oncewatch.core.config import parse
from oncewatch.core.exact_json import from_json, to_json
from oncewatch.core.records import CdcDelivery, Replay, SchemaChange, Transaction
from tests.unit.test_engine_properties import FAULTS, SETTINGS, Plan, build, clocks, runs, straight
from tests.unit import test_other_shapes as shapes


def run(binlog, partitions, end, order_of_streams, count: int | None, ticks=frozenset(), restarts=frozenset()):
    """What a store would hold of the findings; `count` None: one engine, no router. Also the rows each shard
    was sent."""
    router = Router(SETTINGS, count or 1)
    engines = [Engine(SETTINGS, Shard(i, count)) for i in range(count)] if count else [Engine(SETTINGS)]
    found, source, sent = {}, {}, [0] * len(engines)
    streams, read = [binlog, *partitions], [0, 0, 0]

    def collect():
        for i, engine in enumerate(engines):
            for f in engine.drain():
                assert source.setdefault(f.id, i) == i, f"{f.id} ({f.rule}) came from shards {source[f.id]} and {i}"
                found[f.id] = f

    for step, stream in enumerate(order_of_streams):
        item = streams[stream][read[stream]]
        read[stream] += 1
        if count is None and stream == 0:
            engines[0].on_transaction(item)
        elif count is None:
            engines[0].on_events([item])
        elif stream == 0:
            for s, part in routed(router, engines, item):
                sent[s] += len(part.rows)
        elif (s := router.shard_of_event(item)) is not None:
            engines[s].on_events([item])
        if step in ticks:
            binlog_time, kafka_time = clocks(binlog, partitions, end, read)
            for engine in engines:
                engine.tick(now=max(binlog_time, kafka_time), binlog_time=binlog_time, kafka_time=kafka_time)
        if step in restarts:
            engines = [restored(engine) for engine in engines]
        collect()
    for engine in engines:
        engine.tick(now=end, binlog_time=end, kafka_time=end)
    collect()
    return {fid: to_dict(f) for fid, f in found.items()}, sent


def routed(router: Router, shards: list[Engine], tx: Transaction) -> list[tuple[int, Transaction]]:
    """`tx` split by the router, each part fed to its shard as a judge does (the watch start first); the parts."""
    split = router.split(tx)
    for s, part in split.parts.items():
        if split.watch_start is not None:
            shards[s].start_watch(split.watch_start)
        shards[s].on_transaction(part)
    return list(split.parts.items())


def restored(engine: Engine) -> Engine:
    fresh = Engine(SETTINGS, engine.shard)
    fresh.restore(from_json(to_json(engine.state())))
    return fresh


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.integers(2, 5))
def test_shards_find_what_one_engine_finds_in_any_interleaving(case, count):
    chosen, order_of_streams, ticks, restarts, _ = case
    binlog, partitions, end = build(chosen)
    reference, _ = run(binlog, partitions, end, straight(binlog, partitions), None)
    found, _ = run(binlog, partitions, end, order_of_streams, count, ticks, restarts)
    assert found == reference


def test_every_outcome_of_f1_to_f10_comes_out_of_three_shards_the_same():
    """The property is only as good as its scenarios: every fault once, spread over the shards."""
    plans = [Plan(frozenset([f]), pay_after=950 if f in ("late", "very_early") else 3) for f in FAULTS] * 3
    binlog, partitions, end = build(plans)
    reference, _ = run(binlog, partitions, end, straight(binlog, partitions), None)
    found, sent = run(binlog, partitions, end, straight(binlog, partitions), 3)
    assert found == reference
    assert {f"{f['rule']}:{f['status']}" for f in found.values()} >= {
        "F1:open", "F2:open", "F3:open", "F3:resolved", "F4:open", "F5:open", "F6:open", "F7:open", "F7:resolved",
        "F8:open", "F8:resolved", "F9:open", "F10:open"}
    assert all(sent), f"a shard was sent nothing: {sent}"


def test_the_rows_spread_evenly_over_the_shards():
    """Work per shard within 15 % of 1/N (the hash of the keys' text, over a few thousand orders)."""
    shop, router = Shop(), Router(SETTINGS, 3)
    sent = [0, 0, 0]
    for i in range(3000):
        o, t = f"O{i}", f"T{i}"
        for tx in (shop.tx(i, order(o, "pending")),
                   shop.tx(i + 1, payment(t, o, "success"), order(o, "paid", was="pending")),
                   shop.tx(i + 2, shipment(f"S{i}", t))):
            for s, part in router.split(tx).parts.items():
                sent[s] += len(part.rows)
    share = [n / sum(sent) for n in sent]
    assert all(abs(x - 1 / 3) <= 0.15 / 3 for x in share), share


def test_a_row_goes_to_the_shard_of_each_of_its_keys():
    """A payment row to its order's shard (F2, F5); a shipment to its trade_no's (F1) and to its shipment id's
    (the shipment.created it announces, F7-F10)."""
    shop, count = Shop(), 4
    i = next(i for i in range(100) if len({shard_of(k, count) for k in (f"O{i}", f"T{i}", f"S{i}")}) == 3)
    router = Router(SETTINGS, count)
    assert len(router.split(shop.tx(0, order("O-first", "pending"))).parts) == count  # the watch starts everywhere
    pay, ship = router.split(shop.tx(1, payment(f"T{i}", f"O{i}", "success"))), router.split(
        shop.tx(2, shipment(f"S{i}", f"T{i}")))
    assert sorted(pay.parts) == [shard_of(f"O{i}", count)]
    assert sorted(ship.parts) == sorted({shard_of(f"T{i}", count), shard_of(f"S{i}", count)})


def test_the_snapshot_s_last_part_starts_every_shard_s_watch_and_its_rows_explain_their_events():
    """Issue 42, observation 6, sharded: the shards judge the orphans read before any announced change, and the
    events of the changes the snapshot shows, as one engine does."""
    shop, count = Shop(), 3
    first = dataclasses.replace(shop.tx(100, shipment("S1", "T1"), snapshot=True), snapshot=True, complete=False)
    last = dataclasses.replace(shop.tx(100, order("O1", "paid"), snapshot=True), snapshot=True)
    events = [shop.event("shipment.created", 101, entity_id="S1"), shop.event("order.paid", 102, order_no="O1"),
              shop.event("order.paid", 103, order_no="O-GHOST"), shop.event("shipment.created", 104, entity_id="S9")]
    one, router = Engine(SETTINGS), Router(SETTINGS, count)
    shards = [Engine(SETTINGS, Shard(i, count)) for i in range(count)]
    for tx in (first, last):
        one.on_transaction(tx)
        routed(router, shards, tx)
    assert router.watch_start == 100 and all(s.announcements.marks["watch_start"] == 100 for s in shards)
    one.on_events(events)
    for event in events:
        shards[router.shard_of_event(event)].on_events([event])
    for engine in (one, *shards):
        engine.tick(now=200, binlog_time=200, kafka_time=200)
    expected = {f.id: to_dict(f) for f in one.drain()}
    assert {(f["rule"], f["keys"]["key"]) for f in expected.values()} == {("F8", "O-GHOST"), ("F8", "S9")}
    assert {f.id: to_dict(f) for engine in shards for f in engine.drain()} == expected


def test_ddl_goes_to_every_shard_and_the_cdc_delivery_to_the_leader_alone():
    """F15 and F16 are the leader's, timed as one engine times them (the newest commit delivered so far)."""
    shop, count = Shop(), 3
    txs = [dataclasses.replace(shop.tx(100 + i, order(f"O{i}", "pending")), cdc=CdcDelivery({"t/0": i}, f"0-1-{i}",
                                                                                        expected=1, records=1))
           for i in range(6)]
    incomplete = dataclasses.replace(txs[2], cdc=dataclasses.replace(txs[2].cdc, expected=3))
    notice = dataclasses.replace(shop.tx(0), commit_time=0.0, cdc=CdcDelivery(
        {"t/0": 6}, replays=(Replay("t/0", 1, 3, 3, "0-1-1", "0-1-3"),)))
    workload = [*txs[:2], incomplete, *txs[3:], notice]
    one = Engine(SETTINGS)
    router, shards = Router(SETTINGS, count), [Engine(SETTINGS, Shard(i, count)) for i in range(count)]
    for tx in workload:
        one.on_transaction(tx)
        for s, part in router.split(tx).parts.items():
            assert part.cdc is None or s == 0
            shards[s].on_transaction(part)
    for engine in (one, *shards):
        engine.tick(now=200, binlog_time=200, kafka_time=200)
    expected = {f.id: to_dict(f) for f in one.drain() if f.rule in ("F15", "F16")}
    got = [{f.id: to_dict(f) for f in engine.drain() if f.rule in ("F15", "F16")} for engine in shards]
    assert got[0] == expected and not got[1] and not got[2]
    assert {f["rule"] for f in expected.values()} == {"F15", "F16"}
    ddl = SchemaChange("shop.orders", "truncate", "TRUNCATE shop.orders", {}, "0-1-9", "bin.000001", 4)
    parts = router.split(dataclasses.replace(shop.tx(300), schema_changes=(ddl,))).parts
    assert sorted(parts) == [0, 1, 2] and all(p.schema_changes == (ddl,) for p in parts.values())


def test_cdc_check_mode_is_refused_naming_its_key():
    with pytest.raises(ShardingError, match="cdc.mode"):
        Engine(dataclasses.replace(SETTINGS, cdc_check=True), Shard(1, 2))


def mall_orders(shop: shapes.Mall, orders: int) -> list[Transaction]:
    """Orders of every kind of callback: a bad status that moves the order (F6), a success of another amount
    (F5), a clean one, one whose callback comes before its payment (F5 when the payment comes), one with two
    callbacks, and one whose callback, order and payment share a transaction; their shards and schemas spread."""
    txs = []
    for i in range(orders):
        schema, no, trade = f"mall_{i % 2}", f"O{i}", f"T{i}"
        orders_table, payments_table = f"{schema}.pay_order_{i % 4}", f"{schema}.pay_payment_{i % 4}"
        kind, at = i % 6, float(i * 10)
        status, amount = {0: ("SUCCESS", "19.99"), 1: ("TRADE_SUCCESS", "18.99")}.get(kind, ("TRADE_SUCCESS", "19.99"))
        created = shop.tx(at + 1, shapes.order(orders_table, no, "WAIT_PAY"))
        if kind == 3:  # the callback first, its payment later
            txs += [created, shop.tx(at + 2, shapes.callback(schema, i, trade, "TRADE_SUCCESS", "5.00")),
                    shop.tx(at + 3, shapes.payment(payments_table, trade, no, "WAIT"))]
            continue
        waiting = shop.tx(at + 2, shapes.payment(payments_table, trade, no, "WAIT"))
        paid = (shapes.payment(payments_table, trade, no, "SUCCESS", 1999, was="WAIT"),
                shapes.order(orders_table, no, "PAID", was="WAIT_PAY"))
        if kind == 4:
            txs += [created, waiting, shop.tx(at + 3, shapes.callback(schema, 1000 + i, trade, "WAIT_BUYER_PAY"),
                                              shapes.callback(schema, i, trade, "SUCCESS", "1.00"), *paid)]
        elif kind == 5:
            txs += [shop.tx(at + 3, shapes.order(orders_table, no, "WAIT_PAY"),
                            shapes.payment(payments_table, trade, no, "WAIT"),
                            shapes.callback(schema, i, trade, "SUCCESS", "19.99"))]
        else:
            txs += [created, waiting, shop.tx(at + 3, shapes.callback(schema, i, trade, status, amount), *paid)]
    return txs


@pytest.mark.parametrize("count", [2, 3, 5])
def test_shards_judge_a_callback_log_as_one_engine_does(count):
    """Issue 44: a group refused [domain.callbacks] ('a callback log is judged through the payment of its
    trade_no, which may sit on another shard'). Each callback row now goes to the shard of its payment's order
    with its transaction, or to every shard when its payment was not read yet, and the shards' F5 and F6 are one
    engine's, field by field, each from one shard."""
    settings = Settings.from_config(parse(shapes.mall()))
    one, shards = Engine(settings), [Engine(settings, Shard(i, count)) for i in range(count)]
    router, shop = Router(settings, count), shapes.Mall(parse(shapes.mall()))
    expected, found = {}, {}
    for tx in mall_orders(shop, 36):
        one.on_transaction(tx)
        for s, part in router.split(tx).parts.items():
            shards[s].on_transaction(part)
            for f in shards[s].drain():
                assert f.id not in found, f"{f.id} ({f.rule}) came from two shards"
                found[f.id] = to_dict(f)
    expected = {f.id: to_dict(f) for f in one.drain()}
    assert found == expected
    assert sorted({f["rule"] for f in found.values()}) == ["F5", "F6"]
    assert len([f for f in found.values() if f["rule"] == "F5"]) == 12  # kinds 1 and 3, 6 orders each


def test_f6_is_judged_by_the_orders_shard_alone_whatever_rows_another_shard_was_sent():
    """Another space's key (an announcement keyed by another column) may send an order's rows to a shard not its
    own: that shard does not judge the order's callback."""
    shop, count = Shop(), 3
    tx = shop.tx(5, payment("T1", "O1", "success", callback="SUCCESS"), order("O1", "paid", was="pending"))
    found = {}
    for i in range(count):
        engine = Engine(SETTINGS, Shard(i, count))
        engine.on_transaction(tx)
        found[i] = [f.rule for f in engine.drain()]
    assert found == {i: ["F6"] if i == shard_of("O1", count) else [] for i in range(count)}


def test_f11_is_the_leaders_judging_the_backlog_of_every_shard():
    rules = dataclasses.replace(SETTINGS.rules, offset_drift_threshold=4)
    config = dataclasses.replace(SETTINGS, rules=rules)
    binlog, _, _ = build([Plan(frozenset({"lost"}), start=i) for i in range(12)])
    at = max(tx.commit_time for tx in binlog) + 1  # every change still within its grace: in the backlog
    one, count = Engine(config), 3
    router, shards = Router(config, count), [Engine(config, Shard(i, count)) for i in range(count)]
    for tx in binlog:
        one.on_transaction(tx)
        routed(router, shards, tx)
    one.tick(now=at, binlog_time=at, kafka_time=at)
    for engine in shards[1:]:
        engine.tick(now=at, binlog_time=at, kafka_time=at)
    elsewhere: dict[str, int] = {}
    for engine in shards[1:]:
        for table, n in engine.stats()["backlog_by_table"].items():
            elsewhere[table] = elsewhere.get(table, 0) + n
    shards[0].tick(now=at, binlog_time=at, kafka_time=at, backlog_elsewhere=elsewhere)
    expected = {f.id: to_dict(f) for f in one.drain() if f.rule == "F11"}
    assert expected and {f.id: to_dict(f) for f in shards[0].drain() if f.rule == "F11"} == expected
    assert not [f for engine in shards[1:] for f in engine.drain() if f.rule == "F11"]
    assert all(engine.stats()["backlog_by_table"] != one.stats()["backlog_by_table"] for engine in shards)


def test_a_shard_refuses_another_shards_state():
    with pytest.raises(StateMismatchError, match="shard 1 of 3"):
        Engine(SETTINGS, Shard(2, 3)).restore(Engine(SETTINGS, Shard(1, 3)).state())


def test_the_shards_stats_add_up_to_one_engines():
    plans = [Plan(frozenset([f]), pay_after=950 if f in ("late", "very_early") else 3) for f in FAULTS]
    binlog, partitions, end = build(plans)
    one, router = Engine(SETTINGS), Router(SETTINGS, 3)
    shards = [Engine(SETTINGS, Shard(i, 3)) for i in range(3)]
    for tx in binlog:
        one.on_transaction(tx)
        routed(router, shards, tx)
    for event in (e for p in partitions for e in p):
        one.on_events([event])
        shards[router.shard_of_event(event)].on_events([event])
    for engine in (one, *shards):
        engine.tick(now=end, binlog_time=end, kafka_time=end)
    merged = merge_stats(engine.stats() for engine in shards)
    assert merged["found_total"] == one.stats()["found_total"] and sum(merged["found_total"].values()) > 10
    assert merged["delay"] == one.stats()["delay"] and merged["backlog_by_table"] == one.stats()["backlog_by_table"]
