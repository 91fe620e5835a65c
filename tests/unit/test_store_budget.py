"""The store's disk budget (issue 47, Deliver 2): past store.max_bytes the oldest raw records go, whatever their
age, until it is back under; findings and their evidence never go; what went, and a budget that nothing left to
prune can meet, are said on /metrics and in the monitor's verdict."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devservices.samples import Shop, shipment
from oncewatch.core.protocol import StoreSpace
from oncewatch.core.records import Evidence, Finding, RowChange
from oncewatch.dashboards import metrics
from oncewatch.monitor import budget
from oncewatch.monitor.budget import Budget
from oncewatch.monitor.verdict import budget_reasons
from oncewatch.store import Store, retention

NOW = 1_800_000_000.0


def fill(store: Store, n: int, shop: Shop) -> None:
    """`n` shipments of a day ago, one transaction each, with entity entries, and an event for every other one (a
    shop writes fewer events than rows)."""
    txs = [shop.tx(NOW - 86_400 + i, shipment(f"S{i}", f"T{i}")) for i in range(n)]
    events = [shop.event("shipment.created", NOW - 86_400 + i, order_no=f"T{i}") for i in range(0, n, 2)]
    with store.batch() as tx:
        for t in txs:
            tx.add_row_changes(t.rows, [(0, f"trade_no:{t.rows[0].after['trade_no']}")])
        tx.add_events(events, [(i, f"trade_no:{e.keys['order_key']}") for i, e in enumerate(events)])


def finding(first: RowChange) -> Finding:
    return Finding(id="F1-first", rule="F1", name="duplicate_effect", severity="critical", keys={"trade_no": "T0"},
                   summary="two shipments", first_seen=NOW - 86_400, last_seen=NOW - 86_400,
                   evidence=(Evidence("row_change", first.coordinates, NOW - 86_400, {"trade_no": "T0"}),))


def filled(path: str, n: int) -> tuple[Store, Finding]:
    """A store of `n` shipments with a finding on the first."""
    store = Store(path)
    fill(store, n, Shop())
    found = finding(store.row_changes(limit=1)[0])
    with store.batch() as tx:
        tx.upsert_findings([found])
    return store, found


def test_past_the_budget_the_oldest_raw_records_go_and_the_findings_stay(tmp_path) -> None:
    store, found = filled(str(tmp_path / "s.db"), 3000)
    full = store.used_bytes()
    keeper = Budget(store, int(full / 2))
    slices = 0
    while keeper.keep(NOW):
        slices += 1
    assert slices >= 1 and not keeper.pruning
    assert store.used_bytes() <= full / 2 * budget.LOW
    rows = store.row_changes()
    assert 0 < len(rows) < 3000 and rows[-1].after["shipment_id"] == "S2999"  # the newest stay, the oldest went
    # rows and events are kept back to the same time, though there are half as many events
    events = store.events()
    assert events and abs(min(e.timestamp_ms for e in events) / 1000 - rows[0].commit_time) <= 1
    assert [f.evidence for f in store.findings()] == [found.evidence]
    went = retention.pruned_total(store, for_budget=True)
    assert went["row_changes"] == 3000 - len(rows) and went["events"] > 0 and went["entity_index"] > 0
    assert retention.pruned_total(store) == dict.fromkeys(retention.TABLES, 0)  # none of it the retention's
    assert keeper.space == StoreSpace(store.used_bytes(), int(full / 2), NOW, exhausted=False)
    assert budget_reasons(NOW + 60, keeper.space)[0].startswith("store.max_bytes: the store is at")
    assert budget_reasons(NOW + 601, keeper.space) == []
    store.close()
    text = generate_latest(metrics.registry(str(tmp_path / "s.db"))).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {s.labels["table"]: s.value for s in families["oncewatch_store_budget_pruned_rows"].samples} == {
        t: float(n) for t, n in went.items()}
    assert families["oncewatch_store_budget_pruned_last_timestamp_seconds"].samples[0].value == NOW
    assert families["oncewatch_store_used_bytes"].samples[0].value > 0


def test_a_budget_the_findings_and_open_state_alone_fill_is_said_not_met_by_losing_evidence(tmp_path) -> None:
    store, found = filled(str(tmp_path / "s.db"), 200)
    keeper = Budget(store, 4096)  # smaller than the schema itself
    while keeper.keep(NOW):
        pass
    assert store.row_changes() == [] and store.events() == []
    assert keeper.space.exhausted and store.findings() == [found]
    [reason] = budget_reasons(NOW, keeper.space)
    assert "never pruned: raise store.max_bytes" in reason
