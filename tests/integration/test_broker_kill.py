"""A Kafka broker SIGKILLed under a live monitor is not evidence of lost events (issue 42, observation 1).

The shop sends at 10 orders/s with every fault on; two live monitors read along; the broker is killed with
SIGKILL, stays down past the lost-event grace, and is started again while the shop goes on. One live monitor
keeps its Kafka reader throughout; the other's reader process is SIGKILLed a second after the broker, so the
reader that sees the broker come back is not the one that saw it go (the monitor starts a new one, as it does
for any failed reader). A control monitor reads the same traffic from the same starting store after it all.
Each live monitor must end with the control's findings: no F7 for the events the broker had before it died
(once raised at commit + grace while the broker was away, then resolved on reconnect, with `resolved_at` before
`first_seen`), none lost, and every finding's history in time order. The two live monitors share one shop run
and one broker outage, which halves the test's minutes in the lane that restarts servers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

from devservices import broker
from devservices.shop_monitor import findings, free_ports, run_until_idle, shop_config, shop_settings
from oncewatch import shop

from .conftest import wait_for
from .recorded_run import RULES, assert_same, metric, start_monitor
from .shop_monitor import IDLE, prepared

DOWN_SECONDS = 2 * RULES["missing_event_grace_seconds"]  # the broker's absence, well past the grace
KEPT, KILLED = "reader_kept", "reader_killed_meanwhile"


def reader_pid(log: Path, reader: str) -> int:
    """The process id of the monitor's newest reader process named `reader`, from its log."""
    pids = [line["pid"] for line in map(json.loads, log.read_text().splitlines())
            if line.get("event") == "reader_process_started" and line.get("reader") == reader]
    assert pids, f"no {reader} reader process in {log}"
    return pids[-1]


def test_a_broker_killed_under_live_monitors_raises_no_finding_the_control_does_not(tmp_path):
    dirs = {name: tmp_path / name for name in (KEPT, KILLED, "control")}
    for folder in dirs.values():
        folder.mkdir()
    _, topic = prepared(dirs[KEPT])
    for name in (KILLED, "control"):
        shutil.copy(dirs[KEPT] / "store.db", dirs[name] / "store.db")
    ports = dict(zip((KEPT, KILLED), free_ports(2)))
    configs = {name: shop_config(dirs[name], topic=topic, rules=RULES, metrics_port=ports.get(name, 0))
               for name in dirs}
    logs = {name: tmp_path / f"{name}.log" for name in ports}
    monitors = {name: start_monitor(configs[name], logs[name]) for name in ports}
    shop_run = threading.Thread(target=shop.run, args=(shop_settings(
        topic, seed=42, duration=24, rate=10, faults="all"),))
    try:
        for name, port in ports.items():
            wait_for(f"the {name} monitor's /metrics", lambda p=port: metric(p, "oncewatch_collector_up") is not None)
        shop_run.start()
        time.sleep(6)
        killed = broker.kafka_kill()
        assert killed, "the dev broker was not running"
        time.sleep(1)
        os.kill(reader_pid(logs[KILLED], "kafka_events"), signal.SIGKILL)
        time.sleep(DOWN_SECONDS)
        broker.kafka_up()
        shop_run.join()
        for name, port in ports.items():
            wait_for(f"the {name} monitor reading Kafka again",
                     lambda p=port: metric(p, "oncewatch_collector_up", 'collector="kafka_events"') == 1)
    finally:
        broker.kafka_up()
        for monitor in monitors.values():
            monitor.terminate()
        for name, monitor in monitors.items():
            assert monitor.wait(60) == 0, f"the {name} monitor did not stop cleanly: {logs[name]}"
        if shop_run.is_alive():
            shop_run.join()
    for config in configs.values():
        run_until_idle(config, idle=IDLE)  # the live monitors' verdicts still due when they were stopped
    control = findings(configs["control"])
    wrong = {}
    for name in ports:
        got = findings(configs[name])
        try:
            assert_same(got, control)
        except AssertionError as differs:
            wrong[name] = f"findings not the control's: {differs}"
        disorder = [(f.id, f.first_seen, f.resolved_at) for f in got
                    if f.resolved_at is not None and f.resolved_at < f.first_seen]
        if disorder:
            wrong[f"{name} order"] = f"resolved before first seen: {disorder}"
    assert not wrong, wrong
