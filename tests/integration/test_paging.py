"""The paging path end to end on real parts: a shop fault, its finding, the alert through Debian's
Prometheus and Alertmanager (devservices.paging) to a webhook receiver here; `oncewatch ack` ends the
alert at the receiver; a stuck order that is then paid resolves by itself; a closed finding whose
fact is seen again reopens with the same id, and pages again.

The monitor runs as `oncewatch run` with /metrics on a port of its own, listed for Prometheus in
a file-discovery target file for the length of the test.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devservices import base, paging
from devservices.receiver import Receiver
from devservices.shop_monitor import ROOT, SCHEMA, findings, free_port, oncewatch, shop_config, shop_settings
from oncewatch import shop
from oncewatch.store import Store, reviews

from .conftest import admin_connection, wait_for
from .shop_monitor import prepared


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """Alertmanager's webhook for the tests' monitors (devservices.paging routes them to WEBHOOK_PORT)."""
    r = Receiver(paging.WEBHOOK_PORT)
    yield r
    r.close()


@pytest.fixture
def monitored(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """(config, topic, instance) of a fresh shop watched by a running monitor that Prometheus scrapes."""
    _, topic = prepared(tmp_path)
    port = free_port()
    config = shop_config(tmp_path, metrics_port=port, topic=topic)
    instance = f"{base.HOST}:{port}"
    target = paging.TARGETS / f"test-{uuid.uuid4().hex[:8]}.json"
    target.write_text(json.dumps([{"targets": [instance]}]))
    with open(tmp_path / "monitor.log", "ab") as log:
        monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)], cwd=ROOT,
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        yield config, topic, instance
    finally:
        target.unlink()
        monitor.terminate()
        assert monitor.wait(30) == 0


def prometheus_value(query: str) -> float | None:
    """The single value Prometheus gives for an instant query, or None."""
    url = f"http://{base.HOST}:{paging.PROMETHEUS_PORT}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as resp:
        result = json.load(resp)["data"]["result"]
    return float(result[0]["value"][1]) if len(result) == 1 else None


def the(config: Path, rule: str) -> Any:
    found = [f for f in findings(config) if f.rule == rule]
    return found[0] if len(found) == 1 else None


def test_a_finding_pages_an_ack_ends_the_page_and_a_fact_seen_again_reopens_it(receiver, monitored):
    config, topic, instance = monitored
    truth = shop.run(shop_settings(topic, seed=11, orders=6, rate=10,
                                   faults="retry_no_idempotency*1,callback_lost*1"))
    duplicated = next(f for f in truth.faults if f.mode == "retry_no_idempotency").keys["trade_no"]
    stuck = next(f for f in truth.faults if f.mode == "callback_lost").keys["order_no"]

    wait_for("F1 firing at the receiver", lambda: receiver.saw(
        "firing", "OncewatchDuplicateEffect", rule="F1", instance=instance, job="oncewatch"))
    f1 = the(config, "F1")
    assert f1.keys["trade_no"] == duplicated and f1.status == "open"
    page = next(a.annotations for a in receiver.alerts if a.name == "OncewatchDuplicateEffect")
    assert set(page) == {"summary", "description", "runbook_url"}
    assert page["runbook_url"].endswith("README.md#f1-duplicate_effect") and "idempotent" in page["description"]
    # What Prometheus itself scraped: a monitor that has read the shop's traffic, healthy and caught up.
    wait_for("a healthy, caught-up verdict in Prometheus", lambda: prometheus_value(
        f'oncewatch_monitor_verdict{{verdict="healthy", instance="{instance}"}}') == 1
        and prometheus_value(f'oncewatch_monitor_caught_up{{instance="{instance}"}}') == 1, timeout=30)

    oncewatch("ack", "--config", str(config), f1.id, "--note", "stopping the second shipment", "--by", "sre")
    wait_for("F1 resolved at the receiver after the ack",
             lambda: receiver.saw("resolved", "OncewatchDuplicateEffect", rule="F1", instance=instance))
    assert the(config, "F1").status == "acknowledged"

    wait_for("F3 for the order whose callback was lost", lambda: (f := the(config, "F3")) is not None
             and f.keys.get("order") == stuck and f.status == "open")
    conn = admin_connection(SCHEMA)
    with conn.cursor() as c:
        c.execute("UPDATE orders SET status = 'paid', updated_at = NOW(3) WHERE order_no = %s", (stuck,))
    wait_for("F3 resolved by itself once the order is paid", lambda: the(config, "F3").status == "resolved")

    oncewatch("close", "--config", str(config), f1.id, "--reason", "fixed", "--note", "refunded", "--by", "sre")
    assert the(config, "F1").status == "closed"
    fired_before = sum(1 for a in receiver.alerts if a.status == "firing" and a.name == "OncewatchDuplicateEffect")
    with conn.cursor() as c:  # the same payment ships once more: the same fact, seen again
        c.execute("INSERT INTO shipments (trade_no, order_no, pickup_code, created_at) "
                  "SELECT trade_no, order_no, 'AGAIN1', NOW(3) FROM shipments WHERE trade_no = %s LIMIT 1",
                  (duplicated,))
    conn.close()
    wait_for("F1 reopened", lambda: the(config, "F1").status == "open")
    reopened = the(config, "F1")
    assert reopened.id == f1.id and len(reopened.evidence) > len(f1.evidence)
    store = Store(str(config.parent / "store.db"), readonly=True)
    try:
        trail = [(h.status, h.by) for h in reviews.history(store, [f1.id])[f1.id]]
    finally:
        store.close()
    assert trail == [("acknowledged", "sre"), ("closed", "sre"), ("open", "oncewatch")]
    report = config.parent / "report.json"
    oncewatch("export", "--config", str(config), "--format", "json", "--out", str(report))
    exported = {f["id"]: f["history"] for f in json.loads(report.read_text())["findings"]}
    assert [(h["status"], h["by"], h["reason"]) for h in exported[f1.id]] == [
        ("acknowledged", "sre", None), ("closed", "sre", "fixed"), ("open", "oncewatch", None)]
    assert [(h["status"], h["by"]) for h in exported[the(config, "F3").id]] == [("resolved", "oncewatch")]
    wait_for("F1 firing again at the receiver", lambda: sum(
        1 for a in receiver.alerts if a.status == "firing" and a.name == "OncewatchDuplicateEffect") > fired_before)


# ---------------------------------------------------------------- a page per finding (issue 43)

def prometheus_api(path: str, **params: str) -> Any:
    url = f"http://{base.HOST}:{paging.PROMETHEUS_PORT}/api/v1/{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)["data"]


def unix(timestamp: str) -> float:
    """An RFC 3339 time of Prometheus or Alertmanager (nanoseconds, Z) as unix time."""
    return dt.datetime.fromisoformat(timestamp).timestamp()


def evaluation_interval() -> float:
    """The seconds between two evaluations of the shipped rules by the stack's Prometheus."""
    return max(g["interval"] for g in prometheus_api("rules")["groups"])


def evaluated_after(moment: float) -> bool:
    """Every rule group of the stack's Prometheus has been evaluated since `moment` (unix time)."""
    return all(unix(g["lastEvaluation"]) > moment for g in prometheus_api("rules")["groups"])


def acknowledged_at(config: Path, fid: str) -> float:
    store = Store(str(config.parent / "store.db"), readonly=True)
    try:
        return next(h.at for h in reviews.history(store, [fid])[fid] if h.status == "acknowledged")
    finally:
        store.close()


def test_a_fresh_deployment_with_nothing_quarantined_fires_nothing(receiver, monitored):
    config, topic, instance = monitored
    shop.run(shop_settings(topic, seed=5, orders=6, rate=10))  # no fault: nothing to page about
    wait_for("the monitor caught up, in Prometheus", lambda: prometheus_value(
        f'oncewatch_monitor_caught_up{{instance="{instance}"}}') == 1, timeout=60)
    assert prometheus_value(f'sum(oncewatch_kafka_quarantined_records_total{{instance="{instance}"}})') == 0
    caught_up = time.time()
    wait_for("every rule evaluated on what the caught-up monitor serves", lambda: evaluated_after(caught_up + 1))
    active = [(a["labels"]["alertname"], a["state"], a["value"]) for a in prometheus_api("alerts")["alerts"]
              if a["labels"].get("instance") == instance]
    assert active == []
    assert [a.labels for a in receiver.alerts if a.labels.get("instance") == instance] == []
    assert findings(config) == []


def test_a_page_follows_each_finding(receiver, monitored):
    """Two payments shipped twice: one F1 notification lists both, and the exactly-once SLO's fast burn pages;
    acknowledging one ends its page alone, within two evaluations; a third duplicate while the rule still fires is
    notified anew, beside the one still open."""
    config, topic, instance = monitored
    # the verdicts' counters scraped before the faults: rate() counts no increase into a series' first sample
    wait_for("Prometheus scraping the monitor", lambda: prometheus_value(
        f'oncewatch_amount_violated_total{{instance="{instance}"}}') == 0)
    shop.run(shop_settings(topic, seed=17, orders=8, rate=10, faults="retry_no_idempotency*2"))
    wait_for("two open F1 findings", lambda: len([f for f in findings(config)
                                                  if f.rule == "F1" and f.status == "open"]) == 2)
    first, second = sorted((f for f in findings(config) if f.rule == "F1"), key=lambda f: f.id)
    wait_for("F1 firing at the receiver", lambda: receiver.saw(
        "firing", "OncewatchDuplicateEffect", rule="F1", instance=instance))
    # two of the eight payments violated: the exactly-once budget (99.9% of the money) burns fast, and pages (issue 45)
    wait_for("the exactly-once budget's fast burn at the receiver", lambda: receiver.saw(
        "firing", "OncewatchExactlyOnceFastBurn", instance=instance, severity="critical"), timeout=30)
    burn = prometheus_value(f'oncewatch:exactly_once_errors:ratio_rate1h{{instance="{instance}"}}')
    assert burn is not None and burn > 14.4 * (1 - 0.999), burn

    oncewatch("ack", "--config", str(config), first.id, "--note", "refunding", "--by", "sre")
    acked = acknowledged_at(config, first.id)
    wait_for("a resolved F1 notification after one of the two findings was acknowledged", lambda: receiver.saw(
        "resolved", "OncewatchDuplicateEffect", rule="F1", instance=instance), timeout=30)
    resolved = [a for a in receiver.alerts if a.status == "resolved" and a.name == "OncewatchDuplicateEffect"]
    assert {a.labels.get("finding") for a in resolved} == {first.id}
    assert {a.labels.get("entity") for a in resolved} == {first.keys["trade_no"]}
    interval = evaluation_interval()
    took = unix(resolved[0].ends_at) - acked
    print(f"\nF1 page of {first.id} ended {took:.2f} s after its acknowledgement (evaluation interval {interval} s)")
    assert took <= 2 * interval
    # Alertmanager groups a rule's findings: the notification that ended the first page still lists the second.
    ending = next(n for n in receiver.notifications
                  if any(a.status == "resolved" and a.name == "OncewatchDuplicateEffect" for a in n.alerts))
    assert ending.status == "firing"
    assert {(a.status, a.labels["finding"]) for a in ending.alerts} == {("resolved", first.id), ("firing", second.id)}

    conn = admin_connection(SCHEMA)
    with conn.cursor() as c:  # a payment that shipped once ships again: a new F1 while the rule already fires
        c.execute("INSERT INTO shipments (trade_no, order_no, pickup_code, created_at) "
                  "SELECT trade_no, order_no, 'AGAIN2', NOW(3) FROM shipments WHERE trade_no NOT IN (%s, %s) LIMIT 1",
                  (first.keys["trade_no"], second.keys["trade_no"]))
    conn.close()
    wait_for("a third F1 finding", lambda: len([f for f in findings(config) if f.rule == "F1"]) == 3)
    third = next(f for f in findings(config) if f.rule == "F1" and f.id not in (first.id, second.id))
    wait_for("the third F1 finding notified", lambda: receiver.saw(
        "firing", "OncewatchDuplicateEffect", finding=third.id, instance=instance), timeout=30)
    latest = next(n for n in reversed(receiver.notifications)
                  if any(a.labels.get("finding") == third.id for a in n.alerts))
    firing = {a.labels["finding"] for a in latest.alerts if a.status == "firing"}
    assert firing == {second.id, third.id}
    assert not receiver.saw("resolved", "OncewatchDuplicateEffect", finding=second.id)
