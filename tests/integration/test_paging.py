"""The paging path end to end on real parts: a shop fault, its finding, the alert through Debian's
Prometheus and Alertmanager (devservices.paging) to a webhook receiver here; `oncewatch ack` ends the
alert at the receiver; a stuck order that is then paid resolves by itself; a closed finding whose
fact is seen again reopens with the same id, and pages again.

The monitor runs as `oncewatch run` with /metrics on a port of its own, listed for Prometheus in
a file-discovery target file for the length of the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from devservices import paging, stack
from devservices.shop_monitor import ROOT, SCHEMA, findings, free_port, oncewatch, shop_config, shop_settings
from oncewatch import shop
from oncewatch.store import Store, reviews

from .conftest import admin_connection, wait_for
from .shop_monitor import prepared


class Receiver:
    """Alertmanager's webhook: every alert it posts, in order, as (status, alertname, labels), and
    the annotations each alertname last came with."""

    def __init__(self) -> None:
        self.alerts: list[tuple[str, str, dict[str, str]]] = []
        self.annotations: dict[str, dict[str, str]] = {}
        received, annotations = self.alerts, self.annotations

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                received.extend((a["status"], a["labels"]["alertname"], a["labels"]) for a in body["alerts"])
                annotations.update((a["labels"]["alertname"], a["annotations"]) for a in body["alerts"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((stack.HOST, paging.WEBHOOK_PORT), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def saw(self, status: str, alertname: str, **labels: str) -> bool:
        return any(s == status and name == alertname and all(got.get(k) == v for k, v in labels.items())
                   for s, name, got in self.alerts)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture
def monitored(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """(config, topic, instance) of a fresh shop watched by a running monitor that Prometheus scrapes."""
    _, topic = prepared(tmp_path)
    port = free_port()
    config = shop_config(tmp_path, metrics_port=port, topic=topic)
    instance = f"{stack.HOST}:{port}"
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
    url = f"http://{stack.HOST}:{paging.PROMETHEUS_PORT}/api/v1/query?" + urllib.parse.urlencode({"query": query})
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
    page = receiver.annotations["OncewatchDuplicateEffect"]
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
    fired_before = sum(1 for s, name, _ in receiver.alerts if s == "firing" and name == "OncewatchDuplicateEffect")
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
        1 for s, name, _ in receiver.alerts if s == "firing" and name == "OncewatchDuplicateEffect") > fired_before)
