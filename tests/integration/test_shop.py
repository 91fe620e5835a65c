"""The simulated shop on the real MariaDB and Kafka: each fault leaves exactly its rule's pattern.

Each test plays a small seeded run into its own schema and topic, then reads the tables and
the topic directly (not through oncewatch) and derives, per rule, the set of keys that show
the rule's pattern: two shipments for one trade_no (F1), a paid order without order.paid
(F7), an event whose shipment_id does not exist (F8), ... That set must equal the keys the
ground truth names: every fault shows its pattern, and clean orders show none.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pymysql
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from oncewatch.shop import GroundTruth, KafkaTarget, MySQLTarget, ShopSettings, run
from oncewatch.shop.faults import MODES, FaultMix, FaultSpecError
from oncewatch.shop.layout import Layout
from oncewatch.shop.plan import build
from oncewatch.shop.runner import _new_tag
from oncewatch.shop.settings import SettingsError

RULES = tuple(f"F{n}" for n in range(1, 11))
EVENT_RULES = ("F7", "F8", "F9", "F10")
PAYMENT_RULES = ("F1", "F5", "F6")
Key = str | tuple[str, str]


@dataclass(frozen=True)
class Target:
    mysql: MySQLTarget
    kafka: KafkaTarget


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    """A schema, a topic and two consumer groups of this module's own; removed afterwards."""
    suffix = uuid.uuid4().hex[:8]
    t = Target(MySQLTarget(database=f"owtest_shop_{suffix}"),
               KafkaTarget(topic=f"owtest.shop.{suffix}",
                           groups=(f"owtest-shop-{suffix}-shipping", f"owtest-shop-{suffix}-points")))
    server = pymysql.connect(host=t.mysql.host, port=t.mysql.port, user=t.mysql.user, password=t.mysql.password,
                             autocommit=True)
    with server.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{t.mysql.database}`")
    yield t
    with server.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{t.mysql.database}`")
    server.close()
    admin = KafkaAdminClient(bootstrap_servers=t.kafka.bootstrap_servers)
    if t.kafka.topic in admin.list_topics():
        admin.delete_topics([t.kafka.topic])
    admin.delete_groups(list(t.kafka.groups))
    admin.close()


def play(target: Target, **settings: Any) -> GroundTruth:
    truth = run(ShopSettings(mysql=target.mysql, kafka=target.kafka, reset=True, rate=100, **settings))
    assert truth.incidents == ()
    return truth


# ---------------------------------------------------------------- reading the outside world

def _rows(target: Target, sql: str) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(host=target.mysql.host, port=target.mysql.port, user=target.mysql.user,
                           password=target.mysql.password, database=target.mysql.database)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def _events(target: Target, truth: GroundTruth) -> list[tuple[int, dict[str, Any]]]:
    """(Kafka timestamp ms, payload) of every record the run produced."""
    k = target.kafka
    consumer = KafkaConsumer(bootstrap_servers=k.bootstrap_servers, enable_auto_commit=False)
    tps = [TopicPartition(k.topic, p) for p in range(k.partitions)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, truth.start["kafka_end_offsets"][str(tp.partition)])
    end = consumer.end_offsets(tps)
    out: list[tuple[int, dict[str, Any]]] = []
    while any(consumer.position(tp) < end[tp] for tp in tps):
        for records in consumer.poll(timeout_ms=500).values():
            out.extend((r.timestamp, json.loads(r.value)) for r in records)
    consumer.close()
    return out


def patterns(target: Target, truth: GroundTruth) -> dict[str, set[Key]]:
    """Per rule, the keys whose rows or events show that rule's pattern."""
    orders = {o: (status, amount) for o, status, amount in _rows(target, "SELECT order_no, status, amount FROM orders")}
    payments = _rows(target, "SELECT trade_no, order_no, amount, status, callback_status FROM payments")
    shipments = _rows(target, "SELECT shipment_id, trade_no FROM shipments")
    grants = _rows(target, "SELECT grant_id, trade_no FROM points_grants")
    refunded = {o for (o,) in _rows(target, "SELECT order_no FROM refunds")}
    events = _events(target, truth)
    success = [p for p in payments if p[3] == "success"]

    found: dict[str, set[Key]] = {rule: set() for rule in RULES}
    for effects in (shipments, grants):
        found["F1"] |= {t for t, n in Counter(t for _, t in effects).items() if n > 1}
    found["F2"] = {o for o, n in Counter(p[1] for p in success).items() if n > 1}
    found["F3"] = {o for o, (status, _) in orders.items() if status == "pending"}
    found["F4"] = {o for o in refunded if orders[o][0] == "paid"}
    found["F5"] = {t for t, o, amount, _, _ in success if amount != orders[o][1]}
    found["F6"] = {t for t, _, _, _, raw in success if raw not in ("success", "failed")}

    must = ({("shipment.created", str(i)) for i, _ in shipments} | {("points.granted", str(i)) for i, _ in grants}
            | {("order.paid", o) for o, (s, _) in orders.items() if s in ("paid", "shipped", "refunded")}
            | {("order.refunded", o) for o in refunded})
    announced = Counter((e["type"], e["entity_id"]) for _, e in events)
    found["F7"] = must - announced.keys()
    found["F8"] = announced.keys() - must
    sends = Counter(e["event_id"] for _, e in events)
    found["F9"] = {(e["type"], e["entity_id"]) for _, e in events if sends[e["event_id"]] > 1}
    found["F10"] = {(e["type"], e["entity_id"]) for ts, e in events if ts - e["occurred_at"] > 500}
    assert all(Decimal(e["amount"]) > 0 and e["order_no"] for _, e in events)
    return found


def expected(truth: GroundTruth) -> dict[str, set[Key]]:
    want: dict[str, set[Key]] = {rule: set() for rule in RULES}
    for f in truth.faults:
        if f.rule in EVENT_RULES:
            want[f.rule].add((f.keys["event_type"], f.keys["entity_id"]))
        elif f.rule in PAYMENT_RULES:
            want[f.rule].add(f.keys["trade_no"])
        elif f.rule in RULES:
            want[f.rule].add(f.keys["order_no"])
    # a clean send the busy machine itself made more than 500 ms late is slow too (shop.truth.late_sends)
    want["F10"] |= {(s.keys["event_type"], s.keys["entity_id"]) for s in truth.late_sends
                    if s.detail["delay_seconds"] > 0.5}
    return want


def group_lags(target: Target) -> dict[str, dict[int, int]]:
    k = target.kafka
    admin = KafkaAdminClient(bootstrap_servers=k.bootstrap_servers)
    consumer = KafkaConsumer(bootstrap_servers=k.bootstrap_servers)
    end = consumer.end_offsets([TopicPartition(k.topic, p) for p in range(k.partitions)])
    out = {}
    for group in k.groups:
        committed = {tp.partition: om.offset for tp, om in admin.list_group_offsets(group)[group].items()}
        # Every partition has a commit, stalled ones too: a monitor reads no lag where none was made.
        out[group] = {tp.partition: n - committed[tp.partition] for tp, n in end.items()}
    consumer.close()
    admin.close()
    return out


def assert_patterns_match(target: Target, truth: GroundTruth) -> None:
    found, want = patterns(target, truth), expected(truth)
    for rule in RULES:
        assert found[rule] == want[rule], (f"{rule}: pattern without a fault {sorted(found[rule] - want[rule])[:5]}, "
                                           f"fault without its pattern {sorted(want[rule] - found[rule])[:5]}")


def assert_every_mode_injected(truth: GroundTruth) -> None:
    assert truth.mix and set(truth.mix) <= {f.mode for f in truth.faults}


# ---------------------------------------------------------------- runs

@pytest.mark.integration
def test_after_commit_every_fault_shows_its_pattern_and_nothing_else(target: Target) -> None:
    truth = play(target, seed=11, orders=300, faults="all=0.05", style="after_commit")
    assert_every_mode_injected(truth)
    assert "send_then_rollback" not in truth.mix  # only a send inside the transaction can roll back
    assert_patterns_match(target, truth)

    shipping, points = target.kafka.groups
    lags = group_lags(target)
    assert all(n > 0 for n in lags[shipping].values())  # F11: the whole group stopped
    skewed = [p for p, n in lags[points].items() if n > 0]  # F12: one partition stopped
    assert skewed == [truth.seed % target.kafka.partitions]
    assert truth.consumers[points]["lag"][str(skewed[0])] == lags[points][skewed[0]]
    assert truth.fault_for("F11", {"group": shipping, "lag": 1}) is not None
    assert truth.fault_for("F12", {"group": points, "topic": target.kafka.topic}) is not None


@pytest.mark.integration
def test_in_transaction_send_faults_including_rollback(target: Target) -> None:
    truth = play(target, seed=12, orders=200, style="in_transaction",
                 faults="send_lost=0.08,send_then_rollback=0.08,send_retried=0.08,F1=0.03")
    assert_every_mode_injected(truth)
    assert_patterns_match(target, truth)
    # F8: the rolled-back shipment_id never became a row; the retry shipped under a new id.
    shipment_ids = {str(i) for (i,) in _rows(target, "SELECT shipment_id FROM shipments")}
    phantoms = [f for f in truth.faults if f.rule == "F8"]
    assert phantoms and all(f.keys["entity_id"] not in shipment_ids for f in phantoms)
    assert all(n == 0 for lags in group_lags(target).values() for n in lags.values())


@pytest.mark.integration
def test_outbox_send_faults(target: Target) -> None:
    truth = play(target, seed=13, orders=200, style="outbox", faults="send_retried=0.1,send_slow=0.1")
    assert_every_mode_injected(truth)
    assert_patterns_match(target, truth)
    assert _rows(target, "SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]


@pytest.mark.integration
def test_outbox_clean_run_has_no_pattern_and_no_lag(target: Target) -> None:
    truth = play(target, seed=14, orders=200, style="outbox", faults="none")
    assert truth.faults == ()
    # no pattern but the F10 of a send the busy machine itself made late, which the shop measured (late_sends)
    assert_patterns_match(target, truth)
    assert all(n == 0 for lags in group_lags(target).values() for n in lags.values())
    statuses = {s for (s,) in _rows(target, "SELECT DISTINCT status FROM orders")}
    assert statuses <= {"paid", "shipped", "refunded", "closed"} and "paid" in statuses


# ---------------------------------------------------------------- no servers

def test_a_seed_fixes_which_orders_get_which_faults() -> None:
    mix = FaultMix.parse("all", "in_transaction")
    first = [build(5, i, "t", mix) for i in range(300)]
    assert first == [build(5, i, "t", mix) for i in range(300)]
    assert [p.mode for p in first] != [build(6, i, "t", mix).mode for i in range(300)]
    # An order keeps its fault however many orders the run has.
    assert build(5, 42, "t", mix) == first[42]


def test_fault_specs() -> None:
    assert FaultMix.parse("none", "outbox").rates == ()
    assert dict(FaultMix.parse("all,send_slow=0.1", "outbox").rates)["send_slow"] == 0.1
    assert {n for n, _ in FaultMix.parse("F1=0.1", "outbox").rates} == {
        m.name for m in MODES if m.rule == "F1"}
    for bad in ("send_lost", "nope=0.1", "F2=2", "all=0.2"):
        with pytest.raises(FaultSpecError):
            FaultMix.parse(bad, "outbox")


def test_shapes_and_what_they_refuse() -> None:
    with pytest.raises(SettingsError, match="^style: the mall shape has no outbox table"):
        ShopSettings(shape="mall", style="outbox")
    with pytest.raises(SettingsError, match="^shape: must be one of shop, mall"):
        ShopSettings(shape="bazaar")
    # the mall's shards: every order to one of 2 x 4, all of them used, always the same one for an order
    mall = Layout("mall", "owmall")
    shards = {mall.of(f"O{i}")["orders"] for i in range(200)}
    assert shards == {f"`owmall_{s}`.`pay_order_{n}`" for s in (0, 1) for n in range(4)}
    assert mall.of("O7") == mall.of("O7") and mall.of("O7")["payments"].startswith(mall.of("O7")["orders"][:10])
    assert mall.status_of_order(mall.order_status("refunded")) == "refunded"


def test_two_shops_started_in_one_instant_get_tags_of_their_own() -> None:
    # The demo starts its two shops together; with a tag of the time alone (1/100 s) they once shared one.
    tags = [_new_tag() for _ in range(20)]  # well within one 1/100 s
    assert len(set(tags)) == 20 and all(len(t) == 10 and t.isalnum() for t in tags)
