"""The alert rules: valid, each alert fired by its series and quiet on its near miss (promtool),
and every metric they use exported by the store collector."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from oncewatch.dashboards import metrics
from devservices import scenario

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = ROOT / ".devstack" / "bin" / "promtool"
RULES = ROOT / "dashboards" / "alerts.yml"
RULE_TESTS = ROOT / "dashboards" / "alerts_test.yml"


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    if not PROMTOOL.exists():
        pytest.fail(f"{PROMTOOL} is missing: run `make services` (python -m devservices.stack up) to install it",
                    pytrace=False)
    return subprocess.run([str(PROMTOOL), *args], input=stdin, capture_output=True, timeout=60)


def assert_ok(result: subprocess.CompletedProcess[bytes]) -> None:
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


def test_rules_are_valid() -> None:
    assert_ok(promtool("check", "rules", str(RULES)))


def test_alerts_fire_on_their_series_and_not_on_near_misses() -> None:
    assert_ok(promtool("test", "rules", str(RULE_TESTS)))


def test_every_alert_has_a_firing_case() -> None:
    alerts = set(re.findall(r"^\s*- alert: (\w+)", RULES.read_text(), re.M))
    fired = set(re.findall(r"alertname: (\w+)\n\s*exp_alerts:\n\s*- exp_labels", RULE_TESTS.read_text()))
    assert len(alerts) >= 21
    assert alerts - fired == set()


def exported_metric_names(tmp_path: Path) -> set[str]:
    """Names of every sample the collector exports for the scenario store (with _total, _bucket...)."""
    scenario.seed(str(tmp_path / "s.db")).close()
    exported = generate_latest(metrics.registry(str(tmp_path / "s.db"))).decode()
    return set(re.findall(r"^(oncewatch_\w+?)(?:\{| )", exported, re.M))


def test_alerts_use_only_exported_metrics(tmp_path: Path) -> None:
    exprs = "\n".join(re.findall(r"expr: (.*(?:\n {10}.*)*)", RULES.read_text()))
    used = set(re.findall(r"\b(oncewatch_\w+)", exprs))
    assert used and used - exported_metric_names(tmp_path) == set()
