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


def test_queries_use_only_exported_metrics(tmp_path: Path) -> None:
    used = {name for e in EXPRS for name in re.findall(r"\b(oncewatch_\w+)", e)}
    assert len(used) >= 15
    assert used - exported_metric_names(tmp_path) == set()
