"""Issue 4's end-to-end line: exactly one instance of each of F1-F9 among clean traffic.

The shop (in-transaction style, so a send can precede a rollback) places one fault of each
rule F1-F9 on seeded orders among clean ones. `oncewatch run --until-idle` must report exactly
those nine findings, each with evidence pointing at the faulty order's own binlog rows and
Kafka records; `findings --format json` and the three export formats must agree; and a
running monitor's /metrics must show them with the right names, types and labels.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
import urllib.request

import openpyxl
import pytest

from devservices.shop_monitor import ROOT, findings, free_port, oncewatch, run_until_idle, shop_settings
from oncewatch import shop
from oncewatch.core.config import load
from oncewatch.dashboards import incidents, views
from oncewatch.shop.settings import STYLE_IN_TRANSACTION
from oncewatch.store import Store

from .shop_monitor import IDLE, prepared

ONE_OF_EACH = {"retry_no_idempotency": "F1", "second_channel_success": "F2", "callback_lost": "F3",
               "refunded_then_paid": "F4", "amount_mismatch": "F5", "status_not_whitelisted": "F6",
               "send_lost": "F7", "send_then_rollback": "F8", "send_retried": "F9"}


@pytest.fixture(scope="module")
def nine(tmp_path_factory):
    base = tmp_path_factory.mktemp("nine")
    config, topic = prepared(base)
    truth = shop.run(shop_settings(topic, seed=4, orders=300, rate=60, style=STYLE_IN_TRANSACTION,
                                   faults=",".join(f"{mode}*1" for mode in ONE_OF_EACH)))
    assert sorted(f.mode for f in truth.faults) == sorted(ONE_OF_EACH)
    run_until_idle(config, idle=IDLE)
    return truth, config, base


def test_exactly_the_nine_findings(nine):
    truth, config, _ = nine
    found = findings(config)
    assert sorted(f.rule for f in found) == [f"F{i}" for i in range(1, 10)], [(f.rule, f.keys) for f in found]
    for fault in truth.faults:
        matching = [f for f in found if fault.matches(f.rule, f.keys)]
        assert [f.rule for f in matching] == [ONE_OF_EACH[fault.mode]], (fault.mode, fault.keys)


def test_the_stopped_monitor_says_so(nine):
    """After `run --until-idle` the monitor's last health row says it stopped: every rule blind, not
    "failing" because its readers are down."""
    _, _, base = nine
    store = Store(str(base / "store.db"), readonly=True)
    try:
        monitor = store.health()["monitor"].health
    finally:
        store.close()
    assert (monitor.verdict, monitor.caught_up) == ("stopped", False)
    assert monitor.reasons[0] == "stopped: nothing is read until `oncewatch run` starts again"
    assert not [r for r in monitor.reasons if "reader down" in r]  # stopped on purpose
    assert sorted(monitor.blind_rules, key=lambda r: int(r[1:])) == [f"F{i}" for i in range(1, 17)]


def test_evidence_points_at_the_faulty_orders_records(nine):
    truth, config, base = nine
    store = Store(str(base / "store.db"), readonly=True)
    rows = {r.coordinates: r for r in store.row_changes()}
    events = {e.coordinates: e for e in store.events()}
    for finding in findings(config):
        fault = next(f for f in truth.faults if f.matches(finding.rule, finding.keys))
        order_no = fault.keys["order_no"]
        assert finding.evidence, finding
        for item in finding.evidence:
            if item.kind == "row_change":
                row = rows[item.coordinates]  # a real binlog row at those coordinates
                assert order_no in json.dumps(row.row, default=str), (finding.rule, item)
            elif item.kind == "event":
                event = events[item.coordinates]  # a real record at topic/partition@offset
                assert event.keys.get("order_key") == order_no, (finding.rule, item)
                assert item.time == event.timestamp_ms / 1000
            else:
                pytest.fail(f"unexpected evidence kind {item.kind} on {finding.rule}")


def test_exports_agree_with_findings_json(nine, tmp_path):
    _, config, _ = nine
    listed = json.loads(oncewatch("findings", "--config", str(config), "--format", "json").stdout)
    ids = sorted(f["id"] for f in listed)
    evidence = sorted((f["id"], e["coordinates"]) for f in listed for e in f["evidence"])
    for fmt in ("csv", "json", "xlsx"):
        oncewatch("export", "--config", str(config), "--format", fmt, "--out", str(tmp_path / f"r.{fmt}"))
    as_json = json.loads((tmp_path / "r.json").read_text())
    assert sorted(f["id"] for f in as_json["findings"]) == ids
    assert sorted((f["id"], e["coordinates"]) for f in as_json["findings"] for e in f["evidence"]) == evidence
    data = [line for line in (tmp_path / "r.csv").read_text().splitlines() if not line.startswith("#")]
    rows = list(csv.DictReader(io.StringIO("\n".join(data))))
    assert sorted((r["finding_id"], r["coordinates"]) for r in rows) == evidence
    book = openpyxl.load_workbook(tmp_path / "r.xlsx", read_only=True)
    sheet = book["Evidence"].iter_rows(values_only=True)
    header = next(sheet)
    xrows = [dict(zip(header, r)) for r in sheet]
    assert sorted((r["finding_id"], r["coordinates"]) for r in xrows) == evidence
    assert as_json["header"]["binlog_position"]["gtid"]
    assert as_json["header"]["kafka_positions"]


def test_each_faults_finding_is_an_incident_of_its_order(nine):
    """The Incidents page's grouping on a real run: every finding lands in the incident of the
    faulty order it is about, joined to it through the stored rows where its keys name only a
    trade_no (F1: the payment row) or an announced shipment (F7-F9: the shipment's row, then the payment's)."""
    truth, config, base = nine
    cfg = load(config)
    store = Store(str(base / "store.db"), readonly=True)
    try:
        grouped = {(i.kind, i.value): sorted(f.rule for f in i.findings)
                   for i in views.incidents_of(store, store.findings(), incidents.Fields.of(cfg))}
    finally:
        store.close()
    expected = {("order", fault.keys["order_no"]): [ONE_OF_EACH[fault.mode]] for fault in truth.faults}
    assert grouped == expected


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def test_metrics_of_a_running_monitor(nine):
    _, config, base = nine
    port = free_port()
    text = config.read_text().replace("port = 0", f"port = {port}")
    live = base / "live.toml"
    live.write_text(text)
    launched = time.time() - 1
    monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(live)], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        body = ""
        while time.monotonic() < deadline:
            try:
                body = scrape(port)
                started = [float(line.split()[1]) for line in body.splitlines()
                           if line.startswith("oncewatch_monitor_start_time_seconds ")]
                if started and started[0] >= launched and 'collector="kafka_events"} 1.0' in body \
                        and 'collector="binlog"} 1.0' in body:
                    break  # health written by this process, not left by the run before
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"no fresh health on /metrics within 60 s:\n{body[-2000:]}")
        types = {line.split()[2]: line.split()[3] for line in body.splitlines() if line.startswith("# TYPE")}
        assert types["oncewatch_findings_found_total"] == "counter"
        assert types["oncewatch_findings_open"] == "gauge"
        assert types["oncewatch_event_delay_seconds"] == "histogram"
        assert types["oncewatch_collector_up"] == "gauge"
        for rule in [f"F{i}" for i in range(1, 10)]:
            assert f'oncewatch_findings_found_total{{rule="{rule}"}} 1.0' in body, rule
        for rule in ("F10", "F11", "F12"):
            assert f'oncewatch_findings_found_total{{rule="{rule}"}} 0.0' in body, rule
        assert "trade_no" not in body and "Oo" not in body  # no entity ids in labels
        # A person acknowledges the F1 finding beside the running monitor: the page's series moves from
        # status="open" to "acknowledged" and stays there while the monitor writes on.
        f1, = [f for f in findings(config) if f.rule == "F1"]
        oncewatch("ack", "--config", str(live), f1.id, "--note", "refunding", "--by", "sre")
        acked = 'oncewatch_findings_by_status{rule="F1",severity="critical",status="acknowledged"} 1.0'
        deadline = time.monotonic() + 10
        while acked not in (body := scrape(port)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert acked in body and 'rule="F1",severity="critical",status="open"' not in body
        time.sleep(3)
        assert acked in scrape(port)
    finally:
        monitor.terminate()
        assert monitor.wait(30) == 0
