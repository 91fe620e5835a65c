"""dashboards/grafana.json: importable (datasource input, unique ids, no overlapping panels), every
query valid PromQL (promtool) and over metrics the collector exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.unit.test_alerts import ROOT, assert_ok, exported_metric_names, promtool

DASHBOARD = json.loads((ROOT / "dashboards" / "grafana.json").read_text())
PANELS = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
EXPRS = [t["expr"] for p in PANELS for t in p["targets"]]
# Grafana's variables, as Grafana would substitute them, so promtool can parse the queries.
VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


def test_importable() -> None:
    assert [i["name"] for i in DASHBOARD["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
    assert all(p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in PANELS)


def test_queries_are_valid_promql(tmp_path: Path) -> None:
    rules = tmp_path / "queries.yml"
    exprs = []
    for e in EXPRS:
        for name, value in VARIABLES.items():
            e = e.replace(name, value)
        exprs.append(e)
    rules.write_text("groups:\n  - name: grafana\n    rules:\n" + "".join(
        f"      - record: grafana:query{i}\n        expr: {json.dumps(e)}\n" for i, e in enumerate(exprs)))
    assert_ok(promtool("check", "rules", str(rules)))


def test_queries_use_only_exported_metrics(tmp_path: Path) -> None:
    used = {name for e in EXPRS for name in re.findall(r"\b(oncewatch_\w+)", e)}
    assert len(used) >= 15
    assert used - exported_metric_names(tmp_path) == set()
