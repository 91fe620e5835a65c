"""The read queries behind the pages: entity search, drill-down lookups, quantiles, store location."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncewatch.core import histogram
from oncewatch.core.config import SloConfig
from oncewatch.core.records import Evidence, Finding
from oncewatch.dashboards import views
from oncewatch.store import Store, queries
from tests.conftest import StoreTarget
from tests.unit.test_metrics import scenario_store  # noqa: F401 - the scenario store fixture


def finding(fid: str, keys: dict, first_seen: float) -> Finding:
    return Finding(id=fid, rule="F2", name="double_charge", severity="critical", keys=keys, summary="s",
                   first_seen=first_seen, last_seen=first_seen, evidence=(Evidence("offsets", "x", 0.0, {}),))


def test_search_matches_whole_key_values_lists_included(scenario_store: StoreTarget) -> None:
    store = Store(scenario_store)
    with store.batch() as tx:
        tx.upsert_findings([finding("list", {"order": "O9", "trade_nos": ["T7", "T8"]}, 1.0),
                            finding("number", {"order": 4242}, 2.0),
                            finding("longer", {"trade_no": "T77"}, 3.0)])
    ids = {v: [r["id"] for r in queries.findings_page(store, queries.FindingFilter(search=v))]
           for v in ("T8", "4242", "T7", "T1001", "T100", "T2006")}
    assert ids == {"T8": ["list"], "4242": ["number"], "T7": ["list"], "T1001": ["f1-t1001"], "T100": [],
                   "T2006": ["f2-o505"]}
    assert queries.count_findings(store, queries.FindingFilter(search="T7")) == 1


def test_filters_and_newest_first(scenario_store: StoreTarget) -> None:
    store = Store(scenario_store, readonly=True)
    flt = queries.FindingFilter(rules=("F7", "F9"), statuses=("open",))
    assert [r["id"] for r in queries.findings_page(store, flt)] == ["f9-o507", "f9-o506", "f9-o503", "f7-o502"]
    assert [r["id"] for r in queries.findings_page(store, flt, limit=2, offset=2)] == ["f9-o503", "f7-o502"]
    assert queries.count_findings(store, queries.FindingFilter(severities=("info",))) == 2


def test_entity_of_a_finding() -> None:
    assert views.entity_of({"table": "shop.shipments", "trade_no": "T1"}) == "T1"
    assert views.entity_of({"from": "refunded", "order": "O1", "to": "paid"}) == "O1"
    assert views.entity_of({"event_type": "order.paid", "key": "O2", "table": "shop.orders"}) == "key:shop.orders:O2"
    assert views.entity_of({"event_type": "shipment.created", "key": "7", "table": "shop.shipments"}) == \
        "key:shop.shipments:7"
    assert views.entity_of({"group": "g", "topic": "t"}) == "group:g"  # F12, and F11 on a group's lag
    assert views.entity_of({"group": "g", "lag": 6000}) == "group:g"
    assert views.entity_of({"table": "shop.orders", "backlog": 6000}) == "backlog:shop.orders"  # F11 on a backlog


def test_a_reading_entity_has_its_series_and_findings(scenario_store: StoreTarget) -> None:
    store = Store(scenario_store)
    with store.batch() as tx:
        tx.upsert_findings([finding("f12", {"group": "shipping-service", "topic": "shop.events"}, 5.0)])
    group = queries.readings(store, "group:shipping-service", 0.0)
    assert {name: len(points) for name, points in group.items()} == {"group_lag": 21, "lag_stddev": 21}
    assert {p["group"] for p in group["group_lag"]} == {"shipping-service"}
    assert queries.readings(store, "group:points-service", 0.0) == {"group_lag": [], "lag_stddev": []}
    backlog = queries.readings(store, "backlog:shop.orders", 0.0)["backlog"]
    assert [p["value"] for p in backlog][-2:] == [7.0, 7.0] and {p["table"] for p in backlog} == {"shop.orders"}
    assert queries.readings(store, "T1001", 0.0) == {}
    found = queries.timeline(store, "group:shipping-service")
    assert ([f.id for f in found.findings], found.rows, found.events) == (["f12"], [], [])


def test_timeline_takes_bare_values_and_kind_value(scenario_store: StoreTarget) -> None:
    store = Store(scenario_store, readonly=True)
    assert queries.entity_keys(" T1 ") == ("trade_no:T1", "order_key:T1")
    assert queries.entity_keys("order_key:O501") == ("order_key:O501",)
    explicit = queries.timeline(store, "order_key:O501")
    # O501 was paid by T1001, whose shipment was made twice: that F1 is the order's too (issue 43)
    assert (len(explicit.rows), len(explicit.events), [f.id for f in explicit.findings]) == (3, 1, ["f1-t1001"])
    assert [f.id for f in queries.timeline(store, "O502").findings] == ["f7-o502"]
    assert queries.timeline(store, "").entities == ()


def test_quantile_interpolates_like_histogram_quantile() -> None:
    buckets = [("0.25", 9.0), ("0.5", 10.0), ("1.0", 10.0), ("+Inf", 10.0)]
    assert histogram.quantile(buckets, 0.99) == pytest.approx(0.475)
    assert histogram.quantile([("0.5", 0.0), ("+Inf", 4.0)], 0.5) == 0.5  # in the open bucket: highest bound
    assert histogram.quantile([("+Inf", 0.0)], 0.5) is None


def test_the_p99_of_a_window_shows_a_burst_the_cumulative_one_hides() -> None:
    """1000 pairs at 10 ms, then 5 at 2 s: since the start the p99 stays low; over the window it is 2 s."""
    def stats(fast: int, slow: int) -> dict:
        return {"delay": {"gtid_commit_ts": {"buckets": {"0.025": fast, "2.5": fast + slow, "+Inf": fast + slow}}}}
    then, now = stats(1000, 0), stats(1000, 5)
    assert histogram.delay_p99(now) < 0.03
    assert histogram.delay_p99(now, then) > 2.0
    assert histogram.delay_p99(then, then) is None  # nothing matched in the window


def test_store_location(tmp_path: Path) -> None:
    assert views.store_target({views.ENV_STORE: "/x/s.db"}) == "/x/s.db"
    cfg = tmp_path / "c.toml"
    cfg.write_text('[mysql]\nuser = "u"\ntables = ["shop.orders"]\n\n[store]\npath = "w.db"\n')
    assert views.store_target({views.ENV_CONFIG: str(cfg)}) == str(tmp_path / "w.db")
    with pytest.raises(views.StoreNotConfigured, match="ONCEWATCH_STORE"):
        views.store_target({})


def test_a_shipment_and_its_event_share_the_key_its_findings_name(tmp_path: Path) -> None:
    """F7-F10 about a shipment name 'key:shop.shipments:S1': its row and its event are both found by it,
    and not a grant or an order that happens to have the id S1 too."""
    from devservices.samples import Shop, grant, shipment, shop_settings
    from oncewatch.monitor.entities import EntityIndex

    shop, index = Shop(), EntityIndex(shop_settings())
    row = shop.tx(1, shipment("S1", "T1")).rows[0]
    other = shop.tx(2, grant("S1", "T2")).rows[0]
    event = shop.event("shipment.created", 3, entity_id="S1", trade_no="T1")
    assert "key:shop.shipments:S1" in index.of_row(row) and "key:shop.shipments:S1" in index.of_event(event)
    assert "key:shop.shipments:S1" not in index.of_row(other)
    store = Store(str(tmp_path / "s.db"))
    with store.batch() as tx:
        for r in (row, other):
            tx.add_row_changes([r], [(0, k) for k in index.of_row(r)])
        tx.add_events([event], [(0, k) for k in index.of_event(event)])
    found = queries.timeline(store, views.entity_of({"event_type": "shipment.created", "key": "S1",
                                                      "table": "shop.shipments"}))
    assert [r.table for r in found.rows] == ["shipments"] and len(found.events) == 1
    store.close()


@pytest.mark.parametrize("good, judged, shown", [
    (9998.0, 10000.0, "99.98% of ¥ in 24 h"),  # exactly: no float's last bit takes a hundredth off
    (99999.0, 100000.0, "99.99% of ¥ in 24 h"),  # money violated never shows as 100.00%
    (1.0, 1.0, "100.00% of ¥ in 24 h"),
    (0.0, 0.0, "no trade judged in 24 h"),
])
def test_the_exactly_once_tile_floors_its_share(good: float, judged: float, shown: str) -> None:
    value, help_ = views.exactly_once(good, judged, 3, SloConfig(unit="¥"))
    assert value == shown
    assert help_.endswith("within 60 s of its commit; the objective is 99.9%; 3 pending")
