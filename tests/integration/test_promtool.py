"""promtool (Debian's prometheus package, installed by the dev stack) on what oncewatch ships for Prometheus:
the alert rules are valid and each alert fires on its series and stays quiet on its near miss, a
live /metrics scrape passes `check metrics`, and every Grafana query is valid PromQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.unit.test_alerts import RULE_TESTS, RULES
from tests.unit.test_metrics import scrape, served, scenario_store  # noqa: F401 - fixtures
from tests.unit.test_metrics_grafana import EXPRS

PROMTOOL = Path("/usr/bin/promtool")
# Grafana's variables, as Grafana would substitute them, so promtool can parse the queries.
VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


def promtool(*args: str, stdin: bytes | None = None) -> None:
    assert PROMTOOL.exists(), f"{PROMTOOL} is missing: run `make services` (python -m devservices.stack up)"
    result = subprocess.run([str(PROMTOOL), *args], input=stdin, capture_output=True, timeout=60)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


def test_rules_are_valid() -> None:
    promtool("check", "rules", str(RULES))


def test_alerts_fire_on_their_series_and_not_on_near_misses() -> None:
    promtool("test", "rules", str(RULE_TESTS))


def test_scrape_passes_promtool_check_metrics(served) -> None:
    promtool("check", "metrics", stdin=scrape(served[0]).encode())


def test_grafana_queries_are_valid_promql(tmp_path: Path) -> None:
    rules = tmp_path / "grafana_queries.yml"
    exprs = []
    for e in EXPRS:
        for name, value in VARIABLES.items():
            e = e.replace(name, value)
        exprs.append(e)
    rules.write_text("groups:\n  - name: grafana\n    rules:\n" + "".join(
        f"      - record: grafana:query{i}\n        expr: {json.dumps(e)}\n" for i, e in enumerate(exprs)))
    promtool("check", "rules", str(rules))
