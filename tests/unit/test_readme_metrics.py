"""Every metric the README names exists, and its metrics table is the list /metrics serves (issue 14, item 5)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devservices import scenario
from oncewatch.dashboards import metrics

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ()}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, tuple[str, frozenset[str]]]:
    """family -> (type, labels) as /metrics serves them for the known scenario store."""
    path = str(tmp_path_factory.mktemp("readme") / "scenario.db")
    store = scenario.seed(path)
    scenario.seed_group(store)  # a group's instances and shards ([group])
    store.close()
    text = generate_latest(metrics.registry(path)).decode()
    return {f.name: (f.type, frozenset(k for s in f.samples for k in s.labels if k != "le"))
            for f in text_string_to_metric_families(text)}


def test_every_metric_the_readme_names_exists(served) -> None:
    names = {name for family, (kind, _) in served.items() for name in (family, *(family + s for s in SUFFIXES[kind]))}
    mentioned = set(re.findall(r"\boncewatch_[a-z_]+[a-z]", README))
    assert mentioned and mentioned <= names, sorted(mentioned - names)


def test_the_metrics_table_lists_what_is_served(served) -> None:
    table = re.findall(r"^\| `(oncewatch_\w+)` \| (\w+) \|\s*([\w, ]*?)\s*\|", README, re.M)
    listed = {name: (kind, frozenset(label for label in labels.replace(" ", "").split(",") if label))
              for name, kind, labels in table}
    assert listed == served
