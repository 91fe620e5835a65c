"""The two verdicts over a steady shop run: the monitor healthy and caught up throughout, while a downstream
consumer group stalls and the shop's state (the dashboard's) says so; the stall of the whole group is F11, not F12.
Issue 43: the monitor's verdict once turned degraded for the shop's stalled consumer.

The shop sells at a steady rate for 20 s with its shipping-service group stalling on every
partition early in the run; a monitor watches it with a low drift threshold (and F12's hold as
long as the run, where the other shop tests shorten it: a stall's first seconds look uneven too),
and the test samples its /metrics and its health row every half second.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from devservices.shop_monitor import ROOT, SHORT_RULES, findings, free_port, shop_config, shop_settings
from oncewatch import shop
from oncewatch.dashboards import views
from oncewatch.store import open_reader

from .conftest import wait_for
from .shop_monitor import prepared

DRIFT = 100  # records: a stalled group passes it within seconds at this rate
SELLING_SECONDS = 20


def sample(port: int, store_path: str) -> tuple[str | None, float | None, list[str], tuple[str, ...]]:
    """(verdict, caught_up, reasons) as /metrics and the health row say them now, and the shop's state's reasons."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    verdict = next((line.split('"')[1] for line in lines
                    if line.startswith("oncewatch_monitor_verdict{") and line.endswith(" 1.0")), None)
    caught_up = next((float(line.split()[1]) for line in lines if line.startswith("oncewatch_monitor_caught_up ")), None)
    store = open_reader(store_path)
    try:
        comps = views.components(store)
        shop = views.shop_state(store.finding_counts(), views.offsets_of(comps), DRIFT)
    finally:
        store.close()
    monitor = views.monitor_of(comps)
    return verdict, caught_up, list(monitor.reasons) if monitor else [], shop.reasons


def healthy(port: int, store_path: str) -> bool:
    """The monitor says it is healthy and caught up (False while its /metrics does not answer yet)."""
    try:
        return sample(port, store_path)[:2] == ("healthy", 1.0)
    except OSError:
        return False


def test_the_monitor_stays_healthy_while_the_shops_group_stalls_and_the_shop_says_so_and_no_f12(
        tmp_path: Path) -> None:
    _, topic = prepared(tmp_path)
    port = free_port()
    config = shop_config(tmp_path, metrics_port=port, topic=topic,
                         rules={**SHORT_RULES, "offset_drift_threshold": DRIFT,
                                "partition_skew_seconds": SELLING_SECONDS})
    store_path = str(tmp_path / "store.db")
    with open(tmp_path / "monitor.log", "ab") as log:
        monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)], cwd=ROOT,
                                   stdout=log, stderr=subprocess.STDOUT)
    samples: list[tuple[str | None, float | None, list[str], tuple[str, ...]]] = []
    try:
        selling = threading.Thread(target=shop.run, args=(shop_settings(
            topic, seed=5, duration=SELLING_SECONDS, rate=10, faults="consumer_stall"),))
        # its readers connected and caught up before the shop sells: a monitor still starting says `failing` (its readers
        # connecting), and on a loaded fresh clone it still was after the fixed 3 s this waited
        wait_for("the monitor healthy and caught up", lambda: healthy(port, store_path), timeout=60,
                 log=tmp_path / "monitor.log")
        selling.start()
        while selling.is_alive():
            try:
                samples.append(sample(port, store_path))
            except OSError:
                pass
            time.sleep(0.5)
    finally:
        monitor.terminate()
        assert monitor.wait(30) == 0
    # the shop's consumer behind is never the monitor's reason; while the shop's state says it, the monitor is healthy
    assert not [s for s in samples if any("consumer group" in r for r in s[2])]
    stalled = [s for s in samples if any(r.startswith("consumer group shipping-service is") for r in s[3])]
    assert stalled, sorted({r for s in samples for r in s[3]})
    assert any(verdict == "healthy" and caught_up == 1 and not reasons for verdict, caught_up, reasons, _ in stalled)
    assert samples.index(stalled[0]) > 0  # the stall came after the first samples
    assert not [s for s in samples if s[0] == "failing"]
    found = findings(config)
    assert any(f.rule == "F11" and f.keys.get("group") == "shipping-service" for f in found)
    assert not [f for f in found if f.rule == "F12"], [f.keys for f in found if f.rule == "F12"]
