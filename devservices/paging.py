"""The paging path for development and tests: Debian's Prometheus server and Alertmanager on loopback.

Both come from Debian's packages (`prometheus`, which also brings promtool, and
`prometheus-alertmanager`), installed by the stack script with their system services kept
from starting; these run as plain processes with configs and data under .devstack/. Prometheus scrapes every 1 s the targets that tests list in
`.devstack/prometheus/targets/*.json` (file service discovery, picked up as the files change),
evaluates the shipped alert rules (a copy of dashboards/alerts.yml made at each start) every 1 s and sends
alerts to the Alertmanager, which groups them by alertname, rule and instance (a rule's findings in one
notification) for 1 s and posts them, firing and resolved, to a webhook on loopback: the demo's
(`make demo` lists its /metrics in `targets/demo/`, scraped as job `oncewatch-demo`) to DEMO_WEBHOOK_PORT,
where the demo's receiver listens (devservices.receiver), every other to WEBHOOK_PORT, where the test that
wants them listens.

Ports follow the Kafka port, so a second stack beside the first moves them too:
Prometheus KAFKA_PORT - 2, Alertmanager KAFKA_PORT + 3, the webhook KAFKA_PORT + 4, the demo's KAFKA_PORT + 5.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

from devservices.base import HOST, KAFKA_PORT, ROOT, STATE, Service, already_up, log, shown, spawn, stop, wait_until

PROMETHEUS_PORT = KAFKA_PORT - 2
ALERTMANAGER_PORT = KAFKA_PORT + 3
WEBHOOK_PORT = KAFKA_PORT + 4
DEMO_WEBHOOK_PORT = KAFKA_PORT + 5
DEMO_JOB = "oncewatch-demo"
INTERVAL = "1s"  # scrape, evaluation and Alertmanager's grouping: a page within seconds of its finding
BIN = Path("/usr/bin")
PROMETHEUS_DIR = STATE / "prometheus"
ALERTMANAGER_DIR = STATE / "alertmanager"
TARGETS = PROMETHEUS_DIR / "targets"
DEMO_TARGETS = TARGETS / "demo"
PROMETHEUS = Service("prometheus", PROMETHEUS_DIR / "prometheus.pid", PROMETHEUS_DIR / "prometheus.log",
                     str(PROMETHEUS_DIR / "prometheus.yml"))
ALERTMANAGER = Service("alertmanager", ALERTMANAGER_DIR / "alertmanager.pid", ALERTMANAGER_DIR / "alertmanager.log",
                       str(ALERTMANAGER_DIR / "alertmanager.yml"))


def _ready(port: int) -> bool:
    with urllib.request.urlopen(f"http://{HOST}:{port}/-/ready", timeout=2) as resp:
        return resp.status == 200


def _scrape_job(name: str, folder: Path) -> dict:
    # honor_labels: a group's store series carry an instance of their own (README, Several instances as one)
    return {"job_name": name, "honor_labels": True,
            "file_sd_configs": [{"files": [str(folder / "*.json")], "refresh_interval": INTERVAL}]}


def write_prometheus_config() -> Path:
    DEMO_TARGETS.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "dashboards" / "alerts.yml", PROMETHEUS_DIR / "alerts.yml")
    config = {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL, "scrape_timeout": INTERVAL},
        "rule_files": [str(PROMETHEUS_DIR / "alerts.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{HOST}:{ALERTMANAGER_PORT}"]}]}]},
        "scrape_configs": [_scrape_job("oncewatch", TARGETS), _scrape_job(DEMO_JOB, DEMO_TARGETS)],
    }
    path = Path(PROMETHEUS.marker)
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


def _webhook(name: str, port: int) -> dict:
    return {"name": name, "webhook_configs": [{"url": f"http://{HOST}:{port}/alerts", "send_resolved": True}]}


def write_alertmanager_config() -> Path:
    ALERTMANAGER_DIR.mkdir(parents=True, exist_ok=True)
    config = {
        "route": {"receiver": "webhook", "group_by": ["alertname", "rule", "instance"], "group_wait": INTERVAL,
                  "group_interval": INTERVAL, "repeat_interval": "1h",
                  # the demo prints a line per notification: one every 10 s at most per rule, however many come
                  "routes": [{"matchers": [f'job="{DEMO_JOB}"'], "receiver": "demo", "group_interval": "10s"}]},
        "receivers": [_webhook("webhook", WEBHOOK_PORT), _webhook("demo", DEMO_WEBHOOK_PORT)],
    }
    path = Path(ALERTMANAGER.marker)
    path.write_text(json.dumps(config, indent=2))
    return path


def _reload(port: int) -> None:
    urllib.request.urlopen(urllib.request.Request(f"http://{HOST}:{port}/-/reload", method="POST"), timeout=10).close()


def prometheus_up() -> None:
    if already_up(PROMETHEUS, PROMETHEUS_PORT):  # the alert rules and jobs as this checkout has them
        write_prometheus_config()
        _reload(PROMETHEUS_PORT)
        return
    config = write_prometheus_config()
    proc = spawn(PROMETHEUS, [str(BIN / "prometheus"), f"--config.file={config}",
                              f"--storage.tsdb.path={PROMETHEUS_DIR / 'data'}", "--storage.tsdb.retention.time=1d",
                              f"--web.listen-address={HOST}:{PROMETHEUS_PORT}", "--web.enable-lifecycle"])
    wait_until("prometheus", lambda: _ready(PROMETHEUS_PORT), proc, PROMETHEUS, 60)
    log(f"prometheus listening on {HOST}:{PROMETHEUS_PORT} (targets from {shown(TARGETS)}/*.json, the "
        f"demo's from {shown(DEMO_TARGETS)}/*.json)")


def alertmanager_up() -> None:
    if already_up(ALERTMANAGER, ALERTMANAGER_PORT):  # the routes as this checkout has them
        write_alertmanager_config()
        _reload(ALERTMANAGER_PORT)
        return
    config = write_alertmanager_config()
    proc = spawn(ALERTMANAGER, [str(BIN / "prometheus-alertmanager"), f"--config.file={config}",
                                f"--storage.path={ALERTMANAGER_DIR / 'data'}",
                                f"--web.listen-address={HOST}:{ALERTMANAGER_PORT}", "--cluster.listen-address="])
    wait_until("alertmanager", lambda: _ready(ALERTMANAGER_PORT), proc, ALERTMANAGER, 60)
    log(f"alertmanager listening on {HOST}:{ALERTMANAGER_PORT} (webhook http://{HOST}:{WEBHOOK_PORT}/alerts, the "
        f"demo's http://{HOST}:{DEMO_WEBHOOK_PORT}/alerts)")


def up() -> None:
    alertmanager_up()
    prometheus_up()


def down() -> list[tuple[str, bool]]:
    return [(svc.name, stop(svc)) for svc in (PROMETHEUS, ALERTMANAGER)]


SERVICES = ((PROMETHEUS, PROMETHEUS_PORT), (ALERTMANAGER, ALERTMANAGER_PORT))
