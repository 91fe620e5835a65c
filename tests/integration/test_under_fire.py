"""Under fire (issue 7): kill -9, server restarts, a schema change and garbage on the topic.

The session's recorded shop run (recorded_run.py) is read from the same starting store:
undisturbed (the baseline, which must match the ground truth exactly), killed with SIGKILL at
random moments, and with MariaDB and the Kafka broker restarted under it. Every disturbed run
must end with the baseline's findings.
"""

from __future__ import annotations

import os
import random
import signal
import time

from devservices import stack
from devservices.shop_monitor import findings, free_port, run_until_idle
from oncewatch.store import Store

from .recorded_run import assert_same, fresh_copy, metric, start_monitor, wait_for
from .shop_monitor import IDLE, score

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
