"""Several instances judge as one (issue 18): a CDC workload with every fault mode, read by one instance of a
group and by three of another, one of those SIGKILLed mid-run and a fourth added mid-run, on the real MariaDB,
Debezium, Kafka and PostgreSQL. Both groups' findings are the same (ids, rules, status, severity, times, keys,
summaries and evidence; the readings F11 and F12, whose evidence is the latest reading, by id, rule and status),
no finding twice, and every injected fault is found and nothing else.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from pathlib import Path

import pytest
import tomli_w

from devservices import postgres
from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import ROOT, findings, new_topic, shop_config, shop_settings
from oncewatch import shop
from oncewatch.core.config import PostgresTarget, load
from oncewatch.store import Store, StoreError
from oncewatch.store.group import shard_checkpoints, source_position

from .conftest import wait_for
from .shop_monitor import score
from .test_scoring import SCORING_RULES

SHARDS = 6
ORDERS = 400
READINGS = ("F11", "F12")  # their evidence is the latest reading: when it was taken differs from run to run


def group_config(folder: Path, topic: str, store: PostgresTarget) -> Path:
    folder.mkdir()
    path = shop_config(folder, topic=topic, rules=SCORING_RULES, cdc=True, postgres=store)
    data = tomllib.loads(path.read_text())
    data["cdc"]["capture_seconds"] = 5.0  # read live, while the shop runs: its default
    data["group"] = {"name": f"owtest-{uuid.uuid4().hex[:8]}", "shards": SHARDS, "commit_seconds": 0.3,
                     "mark_seconds": 0.2}
    path.write_text(tomli_w.dumps(data))
    return path


class Instance:
    def __init__(self, config: Path, name: str):
        self.log = config.parent / f"{name}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)],
                                            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


def store_of(config: Path) -> Store:
    return Store(load(config).store.target, readonly=True)


def started(config: Path) -> bool:
    """The group's change source has stored its first position (a first start reads from the topics' ends)."""
    try:
        store = store_of(config)
    except StoreError:  # not made yet
        return False
    try:
        return source_position(store, "cdc") is not None
    finally:
        store.close()


def clocks(config: Path) -> dict[int, tuple[float, float]]:
    """Per shard committed at least once, its (binlog clock, Kafka clock)."""
    store = store_of(config)
    try:
        return {shard: (c["binlog_time"], c["kafka_time"]) for shard, c in shard_checkpoints(store).items()}
    finally:
        store.close()


def wait_judged_past(config: Path, until: float, timeout: float = 180) -> None:
    """Every shard has committed with both its clocks past `until`: every verdict due by then is given."""
    deadline = time.monotonic() + timeout
    while len(now := clocks(config)) < SHARDS or min(min(c) for c in now.values()) < until:
        if time.monotonic() > deadline:
            pytest.fail(f"the shards' clocks did not pass {until:.3f} in {timeout:.0f} s: {now}")
        time.sleep(0.5)


def change_source_holder(config: Path, instances: dict[str, Instance]) -> str:
    """The name of the instance of `config`'s group that reads the change source now (its health row says)."""
    by_pid = {f"{socket.gethostname()}-{i.process.pid}": name for name, i in instances.items()}
    store = store_of(config)
    try:
        rows = store.health()
    finally:
        store.close()
    holders = [by_pid[r["member"]] for key, r in rows.items() if key.startswith("group/") and
               r["routers"]["change_source"] and r["member"] in by_pid]
    assert len(holders) == 1, rows
    return holders[0]


def compared(found) -> dict[str, tuple]:
    return {f.id: (f.rule, f.status) if f.rule in READINGS else
            (f.rule, f.status, f.severity, f.first_seen, f.resolved_at, f.keys, f.summary, f.evidence) for f in found}


def test_three_instances_one_killed_one_added_find_what_one_instance_finds(cdc_connector, tmp_path):
    topic = new_topic()
    shop.run(shop_settings(topic, schema=CDC_SCHEMA, orders=0, reset=True))
    with postgres.new_schema() as one_store, postgres.new_schema() as three_store:
        one, three = group_config(tmp_path / "one", topic, one_store), group_config(tmp_path / "three", topic,
                                                                                   three_store)
        instances = {"one": Instance(one, "one"), **{f"three-{i}": Instance(three, f"three-{i}") for i in range(3)}}
        try:
            for config in (one, three):
                wait_for("the group's first start", lambda: started(config), timeout=120)
            shop_done: list[shop.GroundTruth] = []
            run = threading.Thread(target=lambda: shop_done.append(shop.run(shop_settings(
                topic, schema=CDC_SCHEMA, seed=21, orders=ORDERS, rate=100, faults="all"))))
            run.start()
            time.sleep(2.0)
            # mid-run, the one reading the change source: it and its shards go to the others after the session timeout
            holder = change_source_holder(three, instances)
            instances[holder].kill()
            time.sleep(1.5)
            instances["three-3"] = Instance(three, "three-3")  # mid-run: the group rebalances to take it in
            run.join()
            truth, = shop_done
            assert not truth.incidents, truth.incidents
            until = time.time() + max(SCORING_RULES["stuck_pending_seconds"],
                                      SCORING_RULES["missing_event_grace_seconds"]) + 2
            for config in (one, three):
                wait_judged_past(config, until)
            time.sleep(6.0)  # the offsets' readings (F11, F12) of the stalled group held and committed
            found = {"one": findings(one), "three": findings(three)}
        finally:
            codes = {name: i.stop() for name, i in instances.items() if i.process.returncode is None}
        for name, code in codes.items():
            assert code == 0, (name, instances[name].tail())
        one_found, three_found = compared(found["one"]), compared(found["three"])
        assert three_found == one_found, {
            "only with three": [three_found[i] for i in sorted(three_found.keys() - one_found.keys())][:5],
            "only with one": [one_found[i] for i in sorted(one_found.keys() - three_found.keys())][:5],
            "differ": [(one_found[i], three_found[i]) for i in sorted(one_found.keys() & three_found.keys())
                       if one_found[i] != three_found[i]][:5]}
        result = score(truth, found["three"])
        print(f"\n{result.table()}")
        assert result.found == result.injected and len(result.injected) == 14, result.table()
        assert result.unexplained == [], [(f.rule, f.keys, f.summary) for f in result.unexplained[:10]]
