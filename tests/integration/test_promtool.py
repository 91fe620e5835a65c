"""promtool (Debian's prometheus package, installed by the dev stack) on what oncewatch ships for Prometheus:
the alert rules are valid and each alert fires on its series and stays quiet on its near miss, a
live /metrics scrape passes `check metrics`, and every Grafana query is valid PromQL."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.unit.test_alerts import README, RULE_TESTS, RULES
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


def test_the_readmes_commands_write_rules_that_their_tests_find(tmp_path: Path) -> None:
    """README, Metrics and paging, followed as written in an empty folder: the rules and their promtool cases
    written, the cases passing, and prometheus.yml's rule_files naming the file they load (issue 43, item 9)."""
    section = re.search(r"^## Metrics and paging\n(.*?)^## ", README.read_text(), re.M | re.S)[1]
    commands = re.search(r"```sh\n(.*?)```", section, re.S)[1].splitlines()
    assert [c.split()[:2] for c in commands] == [["oncewatch", "alerts"], ["oncewatch", "alert-tests"],
                                                 ["promtool", "test"]]
    for command in commands:
        argv = shlex.split(command, comments=True)
        program = [sys.executable, "-m", "oncewatch.cli"] if argv[0] == "oncewatch" else [str(PROMTOOL)]
        result = subprocess.run([*program, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    rule_files = re.search(r"^rule_files:\n\s+- (\S+)$", section, re.M)[1]
    assert (tmp_path / rule_files).read_text() == RULES.read_text()
