"""Retention (issue 14, item 3): raw records past store.retention_hours go, slice by slice, with their
index entries and chart points; findings and their evidence stay; what went is counted on /metrics."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devservices.samples import Shop, shipment
from oncewatch.core.records import Evidence, Finding
from oncewatch.dashboards import metrics
from oncewatch.store import Store, queries, retention

OLD, NEW, CUT = 1_000.0, 5_000.0, 2_000.0


def filled(target) -> Store:
    shop, store = Shop(), Store(target)
    old = [shop.tx(OLD + i, shipment(f"S{i}", f"T{i}")) for i in range(7)]
    new = [shop.tx(NEW + i, shipment(f"N{i}", f"T{i}")) for i in range(3)]
    events = [shop.event("shipment.created", OLD + i, order_no=f"T{i}") for i in range(5)] + \
        [shop.event("shipment.created", NEW, order_no="T0")]
    with store.batch() as tx:
        for t in old + new:
            seqs = tx.add_row_changes(t.rows, [(0, f"trade_no:{t.rows[0].after['trade_no']}")])
            assert len(seqs) == 1
        tx.add_events(events, [(i, f"trade_no:{e.keys['order_key']}") for i, e in enumerate(events)])
        tx.add_series([("backlog", {"table": "shop.shipments"}, at, 1.0) for at in (OLD, OLD + 1, NEW)])
        tx.upsert_findings([Finding(id="F1-old", rule="F1", name="duplicate_effect", severity="critical",
                                    keys={"trade_no": "T0"}, summary="old", first_seen=OLD, last_seen=OLD,
                                    evidence=(Evidence("row_change", old[0].rows[0].coordinates, OLD,
                                                       {"trade_no": "T0"}),))])
    return store


def test_records_past_the_retention_go_slice_by_slice_and_findings_stay(store_target) -> None:
    store = filled(store_target)
    slices = []
    while any((pruned := retention.prune(store, CUT, limit=3)).values()):
        slices.append(pruned)
    assert [s["row_changes"] for s in slices] == [3, 3, 1]  # the oldest first, at most `limit` at a time
    assert sum(s["events"] for s in slices) == 5 and sum(s["series"] for s in slices) == 2
    assert [r.commit_time for r in store.row_changes()] == [NEW, NEW + 1, NEW + 2]
    assert [e.timestamp_ms for e in store.events()] == [NEW * 1000]
    assert store.count("series") == 1
    # the drill-down finds only what is kept; no entry points at a pruned record
    assert (store.count("entity_entries"), store.count("event_entries")) == (3, 1)
    kept = queries.rows_by_entity(store, ["trade_no:T0", "trade_no:T5"])
    assert {k: [r.commit_time for r in v] for k, v in kept.items()} == {"trade_no:T0": [NEW]}
    [finding] = store.findings()
    assert finding.id == "F1-old" and finding.evidence[0].values == {"trade_no": "T0"}
    assert retention.pruned_total(store) == {"row_changes": 7, "events": 5, "entity_index": 12, "series": 2}
    assert retention.prune(store, CUT) == dict.fromkeys(retention.TABLES, 0)
    store.close()


def test_what_went_is_counted_on_metrics_across_restarts(store_target) -> None:
    store = filled(store_target)
    retention.prune(store, CUT)
    store.close()
    text = generate_latest(metrics.registry(store_target)).decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == "oncewatch_store_pruned_rows")
    assert {s.labels["table"]: s.value for s in family.samples} == {
        "row_changes": 7, "events": 5, "entity_index": 12, "series": 2}
