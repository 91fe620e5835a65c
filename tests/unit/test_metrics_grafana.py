"""dashboards/grafana.json: importable (datasource input, unique ids, no overlapping panels), every
query over metrics the collector exports (promtool parses them in tests/integration/test_promtool.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.unit.test_alerts import ROOT, exported_metric_names

DASHBOARD = json.loads((ROOT / "dashboards" / "grafana.json").read_text())
PANELS = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
EXPRS = [t["expr"] for p in PANELS for t in p["targets"]]


def test_importable() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
    assert all(p["datasource"]["uid"] == "${datasource}" for p in PANELS)
    assert all(t["datasource"]["uid"] == "${datasource}" for p in PANELS for t in p["targets"])
    assert "${DS_PROMETHEUS}" not in json.dumps(DASHBOARD)


def test_the_seeds_three_signals_draw_their_thresholds() -> None:
    """Consumer-group lag against F11's threshold, event delay against F10's, the lag spread against F12's:
    each a dashed static line and the monitor's own value (oncewatch_rule_threshold) as a dashed series."""
    for title, rule, value in (("Consumer-group lag (records)", "F11", 5000), ("Event delay p50 / p99", "F10", 0.5),
                               ("Partition lag stddev (F12)", "F12", 3)):
        [panel] = [p for p in PANELS if p["title"].startswith(title)]
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults["thresholds"]["steps"][-1]["value"] == value
        assert defaults["custom"]["thresholdsStyle"]["mode"] == "dashed"
        [line] = [t for t in panel["targets"] if t["legendFormat"] == "threshold"]
        assert f'rule="{rule}"' in line["expr"] and line["expr"].startswith("max(oncewatch_rule_threshold{")


def test_links_lead_into_the_oncewatch_dashboard() -> None:
    urls = [link["url"] for link in DASHBOARD["links"]]
    assert urls == ["${dashboard_url}/", "${dashboard_url}/findings", "${dashboard_url}/drilldown"]
    [found] = [p for p in PANELS if p["title"] == "Open findings by rule and severity"]
    assert found["fieldConfig"]["defaults"]["links"][0]["url"] == "${dashboard_url}/findings?rule=${__field.labels.rule}"


def test_queries_use_only_exported_metrics(tmp_path: Path) -> None:
    used = {name for e in EXPRS for name in re.findall(r"\b(oncewatch_\w+)", e)}
    assert len(used) >= 15
    assert used - exported_metric_names(tmp_path) == set()


def test_the_exactly_once_slo_leads_with_its_share_of_money() -> None:
    """Issue 45: the share of money verified exactly once in time over 24 h, the same over an hour against the
    objective, and the violated trades by rule."""
    [share] = [p for p in PANELS if p["title"].startswith("Verified exactly once in time, share of money (24 h)")]
    [expr] = [t["expr"] for t in share["targets"]]
    for name in ("violated", "verified_late", "verified", "reversed"):
        assert f"increase(oncewatch_amount_{name}_total{{" in expr and "[24h])" in expr
    assert share["fieldConfig"]["defaults"]["unit"] == "percentunit"
    [trend] = [p for p in PANELS if p["title"].startswith("Verified exactly once in time (1 h windows)")]
    assert any(t["expr"].startswith("oncewatch_slo_objective{") for t in trend["targets"])
