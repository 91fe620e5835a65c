"""The alert rules: every alert has a firing case and uses only metrics the store collector exports.
promtool's checks of the same files are in tests/integration/test_promtool.py."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

from devservices import scenario
from oncewatch.dashboards import metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "dashboards" / "alerts.yml"
RULE_TESTS = ROOT / "dashboards" / "alerts_test.yml"


def test_every_alert_has_a_firing_case_and_a_case_where_it_has_ended() -> None:
    alerts = set(re.findall(r"^\s*- alert: (\w+)", RULES.read_text(), re.M))
    fired = set(re.findall(r"alertname: (\w+)\n\s*exp_alerts:\n\s*- exp_labels", RULE_TESTS.read_text()))
    quiet = set(re.findall(r"alertname: (\w+)\n\s*exp_alerts: \[\]", RULE_TESTS.read_text()))
    assert len(alerts) >= 24
    assert alerts - fired == set()
    assert alerts - quiet == set()


def exported_metric_names(tmp_path: Path) -> set[str]:
    """Names of every sample the collector exports for the scenario store (with _total, _bucket...)."""
    scenario.seed(str(tmp_path / "s.db")).close()
    exported = generate_latest(metrics.registry(str(tmp_path / "s.db"))).decode()
    return set(re.findall(r"^(oncewatch_\w+?)(?:\{| )", exported, re.M))


def test_alerts_use_only_exported_metrics(tmp_path: Path) -> None:
    exprs = "\n".join(re.findall(r"expr: (.*(?:\n {10}.*)*)", RULES.read_text()))
    used = set(re.findall(r"\b(oncewatch_\w+)", exprs))
    assert used and used - exported_metric_names(tmp_path) == set()
