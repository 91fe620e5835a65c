"""A shard's judge (oncewatch.monitor.group.judging.ShardJudge) and the messages it reads (wire), without servers.

What a router writes again after a restart or a move is applied once; clocks only move forward and the Kafka
clock waits for every partition of every announced topic; a judge restored from its checkpoint and state goes
on as if it had never stopped; every message comes off the wire as it went on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal

import msgspec
import pytest

from devservices.samples import Shop, order, payment
from oncewatch.checks.shards import Router, Shard
from oncewatch.core.exact_json import from_json, to_json
from oncewatch.core.records import BinlogPosition, CdcDelivery, Replay
from oncewatch.monitor.group.judging import FLOOR, ShardJudge
from oncewatch.monitor.group.wire import WIRE_VERSION, Event, Mark, Part, WireError, batch, decode, encode
from tests.unit.test_engine_properties import SETTINGS

TOPIC = "shop.events"  # examples/shop.toml's announced topic


def test_every_message_comes_off_the_wire_as_it_went_on():
    shop = Shop()
    tx = dataclasses.replace(shop.tx(5, payment("T1", "O1", "success"), order("O1", "paid", was="pending")),
                             cdc=CdcDelivery({"t/0": 3}, "0-1-1", 2, 2, "t/0@1", (Replay("t/0", 1, 2, 2, "a", "b"),),
                                             4.0))
    # every type a row's image may hold (collectors.values), exactly: msgpack would make most of them strings
    odd = {"money": Decimal("-12.3400"), "wide": Decimal("1234567890123456789012345678.123456789012"),
           "at": dt.datetime(2026, 1, 2, 3, 4, 5, 6), "utc": dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc),
           "day": dt.date(2026, 1, 2), "tm": dt.time(1, 2, 3, 4), "gap": dt.timedelta(days=-1, seconds=5),
           "st": {"a", "b"}, "fs": frozenset({1}), "raw": b"\x00\xff", "j": {"n": [Decimal("1.5"), None, True]}}
    row = dataclasses.replace(tx.rows[0], after={**tx.rows[0].after, **odd}, pk=(Decimal("7"), "x"))
    tx = dataclasses.replace(tx, rows=(row, *tx.rows[1:]), position=BinlogPosition("0-1-1", "b.1", 4, "0-1-2", 3))
    event = shop.event("order.paid", 5.2, order_no="O1")
    forwarded = dataclasses.replace(event, payload={"amount": Decimal("1.10")}, payload_json='{"amount":1.10}')
    messages = [Part(7, tx, 1.5, "cdc/0"), Event(f"{TOPIC}/0", 3, event), Event(f"{TOPIC}/0", 4, forwarded),
                Mark("cdc", 0, 10.5, 1)]
    back = decode(batch([encode(m) for m in messages]))
    assert back == messages
    assert back[0].tx.rows[0].after["money"].as_tuple() == Decimal("-12.3400").as_tuple()
    assert back[2].event.payload_json == '{"amount":1.10}'  # the text read, forwarded: the store keeps it as is
    assert len(decode(batch([encode(Mark("cdc", 0, 1.0))] * 40))) == 40  # a longer batch's array header


def test_a_record_of_another_wire_version_is_refused_naming_the_cause():
    packed = [msgspec.msgpack.encode(v) for v in ([1, []], [WIRE_VERSION, [[9, "cdc", 0]]], [WIRE_VERSION, [[2]]],
                                                   msgspec.msgpack.Ext(99, b"x"))]
    for record in (b'[{"kind": "part"}]', b'{"kind": "mark"}', b"[{", *packed):
        with pytest.raises(WireError, match="same oncewatch version"):
            decode(record)


def pending_o1() -> tuple[ShardJudge, Part]:
    """The judge of order O1's shard, and the part of O1's first transaction (pending) it is sent (after the router's
    first, which went to every shard with the watch's start)."""
    router, shop = Router(SETTINGS, 3), Shop()
    router.split(shop.tx(99, order("O0", "pending")))
    (shard, part), = router.split(shop.tx(100, order("O1", "pending"))).parts.items()
    return ShardJudge(SETTINGS, Shard(shard, 3)), Part(1, part, None, "cdc/0")


def test_a_message_written_again_is_applied_once_and_marks_never_go_back():
    judge, pending = pending_o1()
    judge.apply(pending, 0)
    judge.apply(Mark("cdc", 0, 200.0), 1)
    judge.apply(pending, 2)  # a router restarted from before it
    judge.apply(Mark("cdc", 0, 150.0), 3)  # and its marks from before the last one
    assert (judge.records, judge.repeated, judge.offset, judge.binlog_time()) == (1, 1, 4, 200.0)
    assert len(judge.engine.orders.pending) == 1


def test_the_kafka_clock_waits_for_every_partition_of_every_announced_topic():
    judge, _ = pending_o1()
    assert judge.kafka_time() == FLOOR
    judge.apply(Mark(f"{TOPIC}/0", 0, 50.0, 2), 0)
    assert judge.kafka_time() == FLOOR  # partition 1 has not spoken
    judge.apply(Mark(f"{TOPIC}/1", 0, 40.0, 2), 1)
    assert judge.kafka_time() == 40.0
    judge.apply(Mark(f"{TOPIC}/1", 0, 60.0, 0), 2)  # its router did not know the partitions: nothing vouched
    assert judge.kafka_time() == FLOOR


def test_a_judge_restored_from_its_checkpoint_goes_on_as_if_it_never_stopped():
    judge, pending = pending_o1()
    judge.apply(pending, 0)
    judge.apply(Mark("cdc", 0, 101.0), 1)
    judge.tick(101.0)
    saved = from_json(to_json(judge.checkpoint())), from_json(to_json(judge.engine.state()))
    again = ShardJudge(SETTINGS, judge.shard)
    again.restore(*saved)
    assert (again.offset, again.applied, again.records, again.binlog_time()) == (2, {"cdc/0": 1}, 1, 101.0)
    again.apply(pending, 0)  # read again from before the checkpoint: not applied twice
    assert again.repeated == 1 and again.records == 1
    for j in (judge, again):
        j.apply(Mark("cdc", 0, 100_000.0), 5)  # past stuck_pending_seconds: O1 is stuck, found by both
        j.tick(100_000.0)
    assert [f.id for f in judge.engine.drain()] == [f.id for f in again.engine.drain()] != []
