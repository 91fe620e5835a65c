"""A member paused past its session timeout and resumed (issue 44's review: "nothing tests fencing or a zombie
router"), on the real Kafka broker, Debezium and PostgreSQL: a group of two, one member SIGSTOPped until the
other has taken its work over, then SIGCONTed. A resumed judge commits nothing of the shard it lost (its epoch is
fenced in the store); a resumed router of the change source stores no position behind the one its successor
stored. A member pauses once, for its session timeout and a rebalance (some 12 s), in each test.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devservices import postgres
from devservices.group_runs import (Member, change_source_holder, group_config, members_of, shards_of,
                                    source_position_of, started)
from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import SHORT_RULES, new_topic, shop_settings
from oncewatch import shop
from oncewatch.monitor.group.membership import REJOIN_SECONDS, SESSION_TIMEOUT_MS

from .conftest import wait_for

SHARDS = 2
# How long a paused member's work may take to move: its session timeout and a rebalance; or, when kafka-python leaves
# the successor's consumer outside its group in that rebalance, the time after which it is made again and rejoins
# (membership.Rebalance), and a rebalance more. On a timeout the successor's log says which way it went.
TAKEOVER_SECONDS = SESSION_TIMEOUT_MS / 1000 + REJOIN_SECONDS + 20


@dataclass(frozen=True)
class Group:
    config: Path
    topic: str
    members: dict[str, Member]  # by label
    holder: str  # the label of the member reading the change source

    def other(self) -> Member:
        return next(m for label, m in self.members.items() if label != self.holder)


@pytest.fixture
def group(cdc_connector, tmp_path: Path) -> Iterator[Group]:
    """A group of two on a fresh topic and store, each member judging one shard; both stop with 0 at the end."""
    topic = new_topic()
    shop.run(shop_settings(topic, schema=CDC_SCHEMA, orders=0, reset=True))
    with postgres.new_schema() as store:
        config = group_config(tmp_path / "group", topic, store, SHARDS, SHORT_RULES)
        members = {"a": Member(config, "a"), "b": Member(config, "b")}
        try:
            wait_for("the group's first start", lambda: started(config), timeout=90)
            wait_for("each member judging a shard", lambda: each_judging_one(config, members), timeout=60)
            yield Group(config, topic, members, change_source_holder(config, members))
        finally:
            codes = {label: m.stop() for label, m in members.items()}
    assert codes == {"a": 0, "b": 0}, {label: m.tail() for label, m in members.items()}


def each_judging_one(config: Path, members: dict[str, Member]) -> bool:
    rows = members_of(config)
    return all(m.name in rows and len(rows[m.name].shards) == 1 for m in members.values())


def orders(group: Group, seed: int) -> None:
    shop.run(shop_settings(group.topic, schema=CDC_SCHEMA, seed=seed, orders=30, rate=100))


def paused(member: Member) -> None:
    os.kill(member.process.pid, signal.SIGSTOP)


def resumed(member: Member) -> None:
    os.kill(member.process.pid, signal.SIGCONT)


def logged(member: Member, name: str) -> list[dict[str, Any]]:
    """The member's log records of event `name`, in order."""
    lines = (json.loads(line) for line in member.log.read_text().splitlines() if line.startswith("{"))
    return [r for r in lines if r.get("event") == name]


def test_a_judge_paused_past_its_session_commits_nothing_of_the_shard_it_lost(group: Group):
    config, judge, successor = group.config, group.other(), group.members[group.holder]
    shard, = (int(s) for s in members_of(config)[judge.name].shards)
    before = shards_of(config)[shard]["offset"]
    paused(judge)
    try:
        orders(group, 3)
        wait_for("the shard taken over", lambda: shards_of(config)[shard]["owner"] == successor.name,
                 timeout=TAKEOVER_SECONDS, log=successor.log)
        wait_for("the shard committed by its new owner", lambda: shards_of(config)[shard]["offset"] > before,
                 timeout=20, log=successor.log)
        taken = shards_of(config)[shard]
        claimed = max(e["epoch"] for e in logged(successor, "shard_assigned") if e["shard"] == shard)
    finally:
        resumed_at = time.time()
        resumed(judge)
    # its commit under the epoch it had is refused (or it lets the shard go uncommitted, told it was dropped)
    wait_for("the resumed judge letting the shard go", lambda: [e for e in logged(judge, "shard_fenced")
             + logged(judge, "shard_lost") if e["shard"] == shard], timeout=20)
    time.sleep(2.0)  # commits of the resumed judge, if it made any, are in by now
    assert shards_of(config)[shard]["offset"] >= taken["offset"], (taken, shards_of(config)[shard])
    # a resumed member may be given the shard again (sticky): only by a new claim, from its successor's commit
    again = [e for e in logged(judge, "shard_assigned") if e["shard"] == shard and e["ts"] >= resumed_at]
    assert all(e["offset"] >= taken["offset"] and e["epoch"] > claimed for e in again), (claimed, again)


def offsets(position: dict[str, Any] | None) -> dict[str, int]:
    return dict((position or {}).get("positions") or {})


def test_a_change_router_paused_past_its_session_stores_no_position_behind_its_successor(group: Group):
    config, zombie, successor = group.config, group.members[group.holder], group.other()
    paused(zombie)
    try:
        before = offsets(source_position_of(config, "cdc"))
        orders(group, 4)
        wait_for("the successor reading the change source", lambda: members_of(config)[successor.name]
                 .routers.change_source, timeout=TAKEOVER_SECONDS, log=successor.log)
        wait_for("the successor storing a position past the pause's", lambda: any(
            offset > before.get(p, -1) for p, offset in offsets(source_position_of(config, "cdc")).items()),
            timeout=20, log=successor.log)
        newest = offsets(source_position_of(config, "cdc"))
    finally:
        resumed(zombie)
    behind = []
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:  # the resumed router's last marks, if it stored any
        now = offsets(source_position_of(config, "cdc"))
        behind += [(p, newest[p], now.get(p)) for p in newest if now.get(p, -1) < newest[p]]
        newest = {p: max(o, newest.get(p, -1)) for p, o in now.items()}
        time.sleep(0.05)
    assert behind == [], f"the resumed router stored positions behind its successor's: {behind[:5]}"
    wait_for("the resumed router letting the change source go",
             lambda: logged(zombie, "change_source_released"), timeout=20)
