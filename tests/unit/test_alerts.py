"""The alert rules: every alert has a firing case and uses only metrics the store collector exports.
promtool's checks of the same files are in tests/integration/test_promtool.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from devservices import scenario
from oncewatch.cli import EXIT_CONFIG, EXIT_OK, RUNBOOK_BASE, main
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
    store = scenario.seed(str(tmp_path / "s.db"))
    scenario.seed_group(store)  # a group's members and shards ([group])
    store.close()
    exported = generate_latest(metrics.registry(str(tmp_path / "s.db"))).decode()
    return set(re.findall(r"^(oncewatch_\w+?)(?:\{| )", exported, re.M))


def test_alerts_use_only_exported_metrics(tmp_path: Path) -> None:
    exprs = "\n".join(re.findall(r"expr: (.*(?:\n {10}.*)*)", RULES.read_text()))
    used = set(re.findall(r"\b(oncewatch_\w+)", exprs))
    assert used and used - exported_metric_names(tmp_path) == set()


def test_every_rule_paged_per_finding_has_its_alert_and_no_other() -> None:
    """The findings' alerts read oncewatch_finding_paging, which serves the findings of PAGED_BY_FINDING alone."""
    findings = re.search(r"- name: oncewatch-findings\n(.*?)(?=^  - name: )", RULES.read_text(), re.M | re.S)[1]
    assert "oncewatch_findings_by_status" not in findings
    assert set(re.findall(r'oncewatch_finding_paging\{rule="(F\d+)"', findings)) == set(metrics.PAGED_BY_FINDING)


# ---------------------------------------------------------------- annotations and the README's Runbook
README = ROOT / "README.md"
ANNOTATIONS = {"summary", "description", "runbook_url"}


def alert_chunks() -> dict[str, str]:
    """Each alert's text in alerts.yml, from its `- alert:` line to the next one (or the next group)."""
    chunks = re.split(r"^\s*- (?:alert: |name: )", RULES.read_text(), flags=re.M)[1:]
    return {c.split("\n", 1)[0].strip(): c for c in chunks if not c.startswith("oncewatch-")}


def annotations(chunk: str) -> dict[str, str]:
    block = re.search(r"^( *)annotations:\n((?:\1 +\S.*\n?)*)", chunk, re.M)
    assert block, chunk
    pairs = re.findall(r'^\s+(\w+): "(.*)"$', block[2], re.M)
    assert len(pairs) == len(block[2].strip().splitlines()), block[2]  # one quoted string a line, nothing else
    return dict(pairs)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lowercase, punctuation but - and _ dropped, spaces -> -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_headings() -> list[str]:
    section = re.search(r"^## Runbook\n(.*?)(?=^## )", README.read_text(), re.M | re.S)
    assert section, "README.md has no `## Runbook` section followed by another `## ` section"
    return re.findall(r"^### (.+)$", section[1], re.M)


def rule_names() -> dict[str, str]:
    """F1 -> duplicate_effect, ... from the README's Rules table."""
    return dict(re.findall(r"^\| (F\d+) (\w+) \|", README.read_text(), re.M))


def test_slug_is_githubs() -> None:
    assert github_slug("F1 duplicate_effect") == "f1-duplicate_effect"
    assert github_slug("OncewatchDown") == "oncewatchdown"
    assert github_slug("What it needs from your database") == "what-it-needs-from-your-database"
    assert github_slug("F10: event_delay (p99)") == "f10-event_delay-p99"


def test_every_alert_has_a_summary_a_description_and_a_runbook_url() -> None:
    chunks = alert_chunks()
    assert len(chunks) >= 24
    for name, chunk in chunks.items():
        found = annotations(chunk)
        assert set(found) == ANNOTATIONS, name
        assert all(v.strip() for v in found.values()), name
        assert found["runbook_url"].startswith(f"{RUNBOOK_BASE}#"), name
        assert found["description"] != found["summary"], name


def test_runbook_urls_point_at_runbook_sections() -> None:
    anchors = {github_slug(h) for h in runbook_headings()}
    groups = re.split(r"^  - name: ", RULES.read_text(), flags=re.M)[1:]
    by_group = {g.split("\n", 1)[0]: set(re.findall(r"^\s*- alert: (\w+)", g, re.M)) for g in groups}
    assert set(by_group) == {"oncewatch-monitor", "oncewatch-findings", "oncewatch-drift", "oncewatch-slo",
                             "oncewatch-group"}
    for name, chunk in alert_chunks().items():
        anchor = annotations(chunk)["runbook_url"].removeprefix(f"{RUNBOOK_BASE}#")
        assert anchor in anchors, f"{name}: #{anchor} is no `###` heading under README's `## Runbook`"
        if name in by_group["oncewatch-monitor"] | by_group["oncewatch-slo"] | by_group["oncewatch-group"]:
            assert anchor == github_slug(name), name
        else:  # a rule's alert points at its rule's section
            rule = re.search(r'rule="(F\d+)"|rule: (F\d+)', chunk)
            assert rule, name
            rule_id = rule[1] or rule[2]
            assert anchor == github_slug(f"{rule_id} {rule_names()[rule_id]}"), name


def test_every_rule_and_every_monitor_alert_has_a_runbook_section() -> None:
    names = rule_names()
    assert list(names) == [f"F{i}" for i in range(1, 17)]
    headings = runbook_headings()
    assert [h for h in headings if re.match(r"F\d+ ", h)] == [f"{rule} {name}" for rule, name in names.items()]
    for group in ("oncewatch-monitor", "oncewatch-slo", "oncewatch-group"):
        alerts = re.search(rf"- name: {group}\n(.*?)(?=^  - name: |\Z)", RULES.read_text(), re.M | re.S)
        assert set(re.findall(r"- alert: (\w+)", alerts[1])) <= set(headings), group
    assert len(headings) == len(set(headings))  # one anchor each


def test_every_expected_alert_in_the_rule_tests_has_the_same_annotations() -> None:
    blocks = re.findall(r"exp_annotations:\n((?: {14,}\w+: .*\n?)+)", RULE_TESTS.read_text())
    assert len(blocks) >= 24
    urls = {annotations(c)["runbook_url"] for c in alert_chunks().values()}
    for block in blocks:
        found = dict(re.findall(r'^\s+(\w+): "(.*)"$', block, re.M))
        assert set(found) == ANNOTATIONS, block
        assert found["runbook_url"] in urls, block


def test_the_runbook_base_is_the_documentation_url() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["urls"]["Documentation"] == RUNBOOK_BASE


def test_alerts_print_the_shipped_rules(capsys) -> None:
    assert main(["alerts"]) == EXIT_OK
    assert capsys.readouterr().out == RULES.read_text()


def test_runbook_base_points_the_runbook_urls_elsewhere(capsys) -> None:
    base = "https://wiki.example/x"
    assert main(["alerts", "--runbook-base", base]) == EXIT_OK
    out = capsys.readouterr().out
    assert RUNBOOK_BASE not in out
    urls = re.findall(r'^\s+runbook_url: "(.*)"$', out, re.M)
    assert len(urls) == len(alert_chunks())
    assert all(re.fullmatch(re.escape(base) + r"#[\w-]+", u) for u in urls), urls
    assert out.replace(base, RUNBOOK_BASE) == RULES.read_text()  # nothing else changed
    # The promtool tests printed with the same base expect the same links.
    assert main(["alert-tests", "--runbook-base", base]) == EXIT_OK
    tests = capsys.readouterr().out
    assert RUNBOOK_BASE not in tests
    assert set(re.findall(r'runbook_url: "(.*)"', tests)) == set(urls)


def test_runbook_base_must_be_a_plain_url(capsys) -> None:
    for bad in ("wiki.example/x", 'https://wiki.example/"x', "https://wiki.example/x#runbook", "https://a b"):
        with pytest.raises(SystemExit) as exc:
            main(["alerts", "--runbook-base", bad])
        assert exc.value.code == EXIT_CONFIG
        assert "--runbook-base" in capsys.readouterr().err
