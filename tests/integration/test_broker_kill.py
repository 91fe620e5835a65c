"""A Kafka broker SIGKILLed under a live monitor is not evidence of lost events (issue 42, observation 1).

The shop sends at 10 orders/s with every fault on; a live monitor reads along; the broker is killed with
SIGKILL, stays down past the lost-event grace, and is started again while the shop goes on. A control
monitor reads the same traffic from the same starting store after it all. The live monitor must end with
the control's findings: no F7 for the events the broker had before it died (once raised at commit + grace
while the broker was away, then resolved on reconnect, with `resolved_at` before `first_seen`), none lost,
and every finding's history in time order.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from devservices import broker
from devservices.shop_monitor import findings, free_port, run_until_idle, shop_config, shop_settings
from oncewatch import shop

from .conftest import wait_for
from .recorded_run import RULES, assert_same, metric, start_monitor
from .shop_monitor import IDLE, prepared

DOWN_SECONDS = 2 * RULES["missing_event_grace_seconds"]  # the broker's absence, well past the grace


def reader_pid(log: Path, reader: str) -> int:
    """The process id of the monitor's newest reader process named `reader`, from its log."""
    pids = [line["pid"] for line in map(json.loads, log.read_text().splitlines())
            if line.get("event") == "reader_process_started" and line.get("reader") == reader]
    assert pids, f"no {reader} reader process in {log}"
    return pids[-1]


@pytest.mark.parametrize("reader_killed", [False, True], ids=["reader_kept", "reader_killed_meanwhile"])
def test_a_broker_killed_under_a_live_monitor_raises_no_finding_the_control_does_not(tmp_path, reader_killed):
    live_dir, control_dir = tmp_path / "live", tmp_path / "control"
    live_dir.mkdir()
    control_dir.mkdir()
    _, topic = prepared(live_dir)
    shutil.copy(live_dir / "store.db", control_dir / "store.db")
    port = free_port()
    live = shop_config(live_dir, topic=topic, rules=RULES, metrics_port=port)
    control = shop_config(control_dir, topic=topic, rules=RULES)
    monitor = start_monitor(live, tmp_path / "live.log")
    shop_run = threading.Thread(target=shop.run, args=(shop_settings(
        topic, seed=42, duration=24, rate=10, faults="all"),))
    try:
        wait_for("the live monitor's /metrics", lambda: metric(port, "oncewatch_collector_up") is not None)
        shop_run.start()
        time.sleep(6)
        killed = broker.kafka_kill()
        assert killed, "the dev broker was not running"
        if reader_killed:
            # the reader's process that saw the broker go is not the one that sees it come back
            time.sleep(1)
            os.kill(reader_pid(tmp_path / "live.log", "kafka_events"), signal.SIGKILL)
        time.sleep(DOWN_SECONDS)
        broker.kafka_up()
        shop_run.join()
        wait_for("the live monitor reading Kafka again",
                 lambda: metric(port, "oncewatch_collector_up", 'collector="kafka_events"') == 1)
    finally:
        broker.kafka_up()
        monitor.terminate()
        assert monitor.wait(60) == 0
        shop_run.join()
    run_until_idle(live, idle=IDLE)  # the verdicts still due when it was stopped
    run_until_idle(control, idle=IDLE)
    got = findings(live)
    assert_same(got, findings(control))
    disorder = [(f.id, f.first_seen, f.resolved_at) for f in got
                if f.resolved_at is not None and f.resolved_at < f.first_seen]
    assert not disorder, f"resolved before first seen: {disorder}"
