"""Under fire (issue 7): kill -9, server restarts, a schema change and garbage on the topic.

One seeded shop run with every fault on is recorded once, with a column added to a watched
table and a burst of malformed records in the middle of it. The monitor then reads the same
binlog and topic several times from the same starting store: undisturbed (the baseline, which
must match the ground truth exactly), killed with SIGKILL at random moments, and with MariaDB
and the Kafka broker restarted under it. Every disturbed run must end with the baseline's
findings: same ids, rules, statuses and evidence; none doubled, none lost.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from kafka import KafkaProducer

from oncewatch import shop
from devservices import stack
from devservices.shop_monitor import ROOT, SCHEMA, findings, free_port, run_until_idle, shop_config, shop_settings
from oncewatch.store import Store

from .conftest import admin_connection
from .shop_monitor import IDLE, prepared, score

MALFORMED = [
    (b"k1", b"\xff\xfe not utf-8 \xc3\x28"),
    (b"k2", b"{this is not json"),
    (b"k3", json.dumps({"order_no": "X1", "amount": "1.00"}).encode()),  # no event type
    (b"k4", b'{"type": "order.paid", "order_no": "' + b"x" * (1024 * 1024) + b'"}'),  # 1 MiB
    (b"k5", json.dumps({"type": ["order.paid"], "order_no": {"a": 1}}).encode()),  # wrong types
]


def produce_garbage(topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=f"{stack.HOST}:{stack.KAFKA_PORT}", max_request_size=4 * 1024 * 1024)
    for key, value in MALFORMED:
        producer.send(topic, key=key, value=value).get(timeout=30)
    producer.close()


def alter_orders() -> None:
    conn = admin_connection(SCHEMA)
    with conn.cursor() as c:
        c.execute("ALTER TABLE orders ADD COLUMN risk_note VARCHAR(32) NULL")
    conn.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(truth, starting store, baseline findings) of one recorded run."""
    base = tmp_path_factory.mktemp("under_fire")
    _, topic = prepared(base)
    start_store = base / "start.db"
    Store(str(base / "store.db")).conn.execute(f"VACUUM INTO '{start_store}'")

    result: dict[str, object] = {}

    def play() -> None:
        result["truth"] = shop.run(shop_settings(topic, seed=21, orders=800, rate=60, faults="all"))

    runner = threading.Thread(target=play)
    runner.start()
    time.sleep(5)
    alter_orders()
    produce_garbage(topic)
    runner.join()
    truth = result["truth"]
    start = (start_store, topic)
    baseline = fresh_copy(start, base / "baseline")
    run_until_idle(baseline, idle=IDLE)
    return truth, start, findings(baseline), base


def fresh_copy(start: tuple[Path, str], folder: Path, metrics_port: int = 0) -> Path:
    """A config and a copy of the store as they were before the recorded run."""
    start_store, topic = start
    folder.mkdir()
    shutil.copy(start_store, folder / "store.db")
    return shop_config(folder, metrics_port=metrics_port, topic=topic)


def comparable(found) -> dict[str, tuple]:
    assert len({f.id for f in found}) == len(found), "a finding id appears twice"
    return {f.id: (f.rule, f.status, f.severity, tuple(sorted(e.coordinates for e in f.evidence))) for f in found}


def start_monitor(config: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def test_baseline_matches_the_ground_truth_and_quarantines_the_garbage(recorded):
    truth, _, baseline, base = recorded
    result = score(truth, baseline)
    print("\n" + result.table())
    assert result.found == result.injected and result.unexplained == []
    store = Store(str(base / "baseline" / "store.db"), readonly=True)
    reasons = sorted(q.reason for q in store.quarantined())
    assert reasons == sorted(["not_utf8", "not_json", "missing_path", "too_large", "wrong_type"])
    # rows written after the ALTER carry the new column
    assert any("risk_note" in (r.after or {}) for r in store.row_changes("table_name = 'orders'"))


def test_sigkill_at_random_moments(recorded, tmp_path):
    _, start, baseline, _ = recorded
    config = fresh_copy(start, tmp_path / "killed")
    rng = random.Random(5)
    kills = 0
    while kills < 10:
        monitor = start_monitor(config, tmp_path / "monitor.log")
        time.sleep(rng.uniform(0.5, 3.0))
        os.kill(monitor.pid, signal.SIGKILL)
        monitor.wait()
        kills += 1
    run_until_idle(config, idle=IDLE)
    assert_same(findings(config), baseline)


def assert_same(found, baseline) -> None:
    got, want = comparable(found), comparable(baseline)
    diff = {k: (got.get(k), want.get(k)) for k in got.keys() | want.keys() if got.get(k) != want.get(k)}
    assert not diff, diff


def metric(port: int, name: str, labels: str = "") -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + (("{" + labels) if labels else "")) and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(what: str, cond, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def test_mariadb_and_kafka_restarted_mid_run(recorded, tmp_path):
    _, start, baseline, _ = recorded
    port = free_port()
    config = fresh_copy(start, tmp_path / "restarts", metrics_port=port)
    monitor = start_monitor(config, tmp_path / "monitor.log")
    try:
        wait_for("the monitor's /metrics", lambda: metric(port, "oncewatch_collector_up") is not None)
        stack.mariadb_down()
        wait_for("binlog down on /metrics", lambda: metric(port, "oncewatch_collector_up", 'collector="binlog"') == 0)
        stack.mariadb_up()
        wait_for("binlog up again", lambda: metric(port, "oncewatch_collector_up", 'collector="binlog"') == 1)
        stack.kafka_down()
        wait_for("kafka down on /metrics",
                 lambda: metric(port, "oncewatch_collector_up", 'collector="kafka_events"') == 0)
        stack.kafka_up()
        wait_for("kafka up again", lambda: metric(port, "oncewatch_collector_up", 'collector="kafka_events"') == 1)
    finally:
        monitor.terminate()
        assert monitor.wait(30) == 0
    run_until_idle(config, idle=IDLE)
    assert_same(findings(config), baseline)
