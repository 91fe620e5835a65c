"""A live monitor judges lost events while the shop keeps sending, not only once traffic stops.

Under steady traffic the Kafka stream is never read to its end at the instant the monitor asks,
so the clock F7 is judged on has to advance from what each partition has vouched for (see
`oncewatch.checks.clocks.kafka_watermark`). A 10-minute load run once found it standing still: lost
events were reported only after the shop went quiet.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from devservices.shop_monitor import SHORT_RULES, shop_settings
from oncewatch import shop
from oncewatch.store import Store

from .shop_monitor import prepared

TRAFFIC_SECONDS = 15  # some 13 lost sends at 3% of 30 orders/s, each judged while traffic goes on
# From the moment an F7 became decidable (commit + grace) to the moment it is in the store: the
# monitor's batching, the Kafka clock's polls and this test's own 0.5 s polling.
MAX_DETECTION_SECONDS = 10.0


def test_lost_events_are_found_while_traffic_goes_on(tmp_path):
    config, topic = prepared(tmp_path)
    monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)],
                               stdout=subprocess.DEVNULL, stderr=open(tmp_path / "monitor.log", "wb"))
    shop_run = threading.Thread(target=shop.run, args=(shop_settings(
        topic, seed=11, duration=TRAFFIC_SECONDS, rate=30, faults="send_lost=0.03"),))
    seen_at: dict[str, float] = {}
    try:
        time.sleep(2)
        shop_run.start()
        store = Store(str(tmp_path / "store.db"), readonly=True)
        while shop_run.is_alive():
            time.sleep(0.5)
            now = time.time()
            for f in store.findings(rule="F7"):
                seen_at.setdefault(f.id, now)
        found = {f.id: f for f in store.findings(rule="F7")}
        store.close()
    finally:
        monitor.terminate()
        monitor.wait(60)
        shop_run.join()
    assert seen_at, (f"no lost event was reported during {TRAFFIC_SECONDS} s of traffic with 3% of sends "
                     f"lost ({len(found)} F7 in the store at the end)")
    grace = SHORT_RULES["missing_event_grace_seconds"]
    late = {fid: round(at - (max(e.time for e in found[fid].evidence) + grace), 1) for fid, at in seen_at.items()}
    assert max(late.values()) <= MAX_DETECTION_SECONDS, f"seconds from decidable to reported: {late}"
