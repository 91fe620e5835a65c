"""A member joining a running group (issue 44's review of the group), on the real Kafka broker, Debezium and
PostgreSQL: the judges rebalance incrementally, so the member already there lets go of the shards the newcomer
gets and keeps the others as they are, instead of letting go of every shard and loading half of them again from
the store; and the owner of shard 0 deletes from the internal topic the records every shard has committed past.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from kafka import KafkaConsumer, TopicPartition

from devservices import base, postgres
from devservices.group_runs import Member, group_config, members_of, shards_of, started
from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import SHORT_RULES, new_topic, shop_settings
from oncewatch import shop

from .conftest import wait_for

SHARDS = 4


def events(member: Member, name: str) -> list[dict[str, Any]]:
    """The member's log records of event `name`, in order."""
    lines = (json.loads(line) for line in member.log.read_text().splitlines() if line.startswith("{"))
    return [r for r in lines if r.get("event") == name]


def owned(config: Path, member: Member) -> set[str]:
    row = members_of(config).get(member.name)
    return set(row.shards) if row is not None else set()


def first_offsets(group: str) -> dict[int, int]:
    """Each partition of the group's records topic: its first offset still kept."""
    consumer = KafkaConsumer(bootstrap_servers=f"{base.HOST}:{base.KAFKA_PORT}")
    try:
        tps = [TopicPartition(f"oncewatch.{group}.records", s) for s in range(SHARDS)]
        return {tp.partition: offset for tp, offset in consumer.beginning_offsets(tps, timeout_ms=10_000).items()}
    finally:
        consumer.close()


def test_a_member_that_joins_moves_only_the_shards_it_gets_and_what_all_committed_past_is_purged(
        cdc_connector, tmp_path):
    """Before (the eager Range assignor): the first member revoked all 4 shards when the second joined and took
    2 of them again, each claimed and loaded anew from the store; and the records topic kept every record."""
    topic = new_topic()
    shop.run(shop_settings(topic, schema=CDC_SCHEMA, orders=0, reset=True))
    with postgres.new_schema() as store:
        config = group_config(tmp_path / "group", topic, store, SHARDS, SHORT_RULES)
        data = tomllib.loads(config.read_text())
        data["group"]["purge_seconds"] = 1.0
        config.write_text(tomli_w.dumps(data))
        first = Member(config, "first")
        second = None
        try:
            wait_for("the group's first start", lambda: started(config), timeout=90)
            wait_for("the first member judging every shard", lambda: len(owned(config, first)) == SHARDS, timeout=60)
            shop.run(shop_settings(topic, schema=CDC_SCHEMA, seed=5, orders=40, rate=200))
            taken_alone = len(events(first, "shard_assigned"))
            second = Member(config, "second")
            wait_for("both members judging shards", lambda: owned(config, first) and owned(config, second)
                     and len(owned(config, first) | owned(config, second)) == SHARDS, timeout=60)
            moved = owned(config, second)
            assert events(first, "shard_assigned")[taken_alone:] == [], "the first member took shards again"
            assert {str(r["shard"]) for r in events(first, "shard_revoked")} == moved
            wait_for("records purged from the internal topic",
                     lambda: any(offset > 0 for offset in first_offsets(data["group"]["name"]).values()), timeout=30)
            kept = first_offsets(data["group"]["name"])
            committed = {s: c["offset"] for s, c in shards_of(config).items()}
        finally:
            for m in (first, second):
                if m is not None:
                    assert m.stop() == 0, m.tail()
        # never past what a shard has committed: its next owner reads on from there
        assert all(kept[s] <= committed[s] for s in range(SHARDS)), (kept, committed)
