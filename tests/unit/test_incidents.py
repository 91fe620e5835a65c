"""Incidents: the findings of one order or trade_no grouped, through the payment that links a
trade_no to its order; the store's links; the Incidents page."""

from __future__ import annotations

from pathlib import Path

from devservices.samples import Shop, feed, grant, order, payment, shipment, shop_settings
from oncewatch.checks.engine import Engine
from oncewatch.core.config import load, parse
from oncewatch.core.records import EmittedEvent, Evidence, Finding, RowChange, Transaction
from oncewatch.dashboards import incidents, views
from oncewatch.monitor.entities import EntityIndex
from oncewatch.store import Store, queries
from tests.conftest import StoreTarget

T0 = 1_714_557_600.0


def finding(fid: str, rule: str, keys: dict, *, at: float = T0, status: str = "open", severity: str = "critical",
            evidence: tuple[Evidence, ...] = ()) -> Finding:
    return Finding(id=fid, rule=rule, name=rule.lower(), severity=severity, keys=keys, summary=f"{rule} on {keys}",
                   first_seen=at, last_seen=at + 1, status=status, evidence=evidence)


# A callback handled three times: three shipments for T1 (F1), and the order's paid event twice
# with different payloads (F9), which names the order only.
SHIPMENTS = finding("F1-a", "F1", {"trade_no": "T1", "tables": ["shop.shipments"]}, evidence=tuple(
    Evidence("row_change", f"binlog.000001:{100 * i}#0-1-{i}/0", T0 + i,
             {"table": "shop.shipments", "op": "insert", "commit_clock": "binlog", "trade_no": "T1"})
    for i in range(3)))
TWICE = finding("F9-a", "F9", {"event_type": "order.paid", "key": "O1", "table": "shop.orders"}, at=T0 + 2,
                evidence=(Evidence("event", "shop.events/0@7", T0 + 2, {"order_key": "O1", "key": "O1",
                                                                          "timestamp_type": "CreateTime"}),))
STUCK = finding("F3-b", "F3", {"order": "O2"}, at=T0 + 5, severity="warning", status="acknowledged")
DOUBLE = finding("F2-c", "F2", {"order": "O3", "trade_nos": ["T3", "T4"]}, at=T0 + 7)
AMOUNT = finding("F5-c", "F5", {"order": "O3", "trade_no": "T4"}, at=T0 + 8, status="resolved")
DRIFT = finding("F11-d", "F11", {"topic": "shop.events", "table": "shop.orders"}, at=T0 + 9, severity="warning")
ALL = [SHIPMENTS, TWICE, STUCK, DOUBLE, AMOUNT, DRIFT]


def by_name(found: list[incidents.Incident]) -> dict[str, tuple[str, ...]]:
    return {f"{i.kind} {i.value}": tuple(f.id for f in i.findings) for i in found}


SHOP = load(Path(__file__).resolve().parents[2] / "examples" / "shop.toml")
FIELDS = incidents.Fields.of(SHOP)


def row(table: str, seq: int, image: dict) -> RowChange:
    schema, name = table.split(".")
    return RowChange(schema=schema, table=name, op="insert", pk=(seq,), before=None, after=image, txid=f"0-1-{seq}",
                     row_index=0, binlog_file="binlog.000001", end_pos=100 * seq, commit_time=T0 + seq,
                     commit_clock="binlog")


def paid(links: dict[str, str]) -> dict[str, list[RowChange]]:
    """The stored payment rows of each trade_no, as store.queries.rows_by_entity gives them."""
    return {f"trade_no:{t}": [row("shop.payments", i, {"id": i, "trade_no": t, "order_no": o})]
            for i, (t, o) in enumerate(links.items())}


def test_a_callback_handled_three_times_is_one_incident_with_its_f1_and_f9_parts() -> None:
    rows = paid({"T1": "O1", "T3": "O3", "T4": "O3"})
    assert incidents.wanted(ALL, {}, FIELDS) >= {"trade_no:T1", "trade_no:T3", "trade_no:T4"}
    found = incidents.group(ALL, rows, FIELDS)
    assert by_name(found) == {"order O1": ("F1-a", "F9-a"), "order O3": ("F2-c", "F5-c"), "order O2": ("F3-b",),
                              "finding F11-d": ("F11-d",)}
    o1 = found[[i.value for i in found].index("O1")]
    assert (o1.rules, o1.severity, o1.status, o1.entity) == (("F1", "F9"), "critical", "open", "O1")
    assert (o1.first_seen, o1.last_seen) == (T0, T0 + 3)
    # Open before acknowledged; the most recently seen first among equals; the F11 has no entity.
    assert [i.status for i in found] == ["open", "open", "open", "acknowledged"]
    assert found[0].value == "F11-d" and found[0].entity == ""


def test_without_the_payment_rows_a_trade_no_is_its_own_incident() -> None:
    found = incidents.group(ALL, {}, FIELDS)
    assert by_name(found)["trade_no T1"] == ("F1-a",) and by_name(found)["order O1"] == ("F9-a",)
    # F2 and F5 still meet on their own keys: both name O3.
    assert by_name(found)["order O3"] == ("F2-c", "F5-c")


def test_a_lost_shipment_event_joins_its_order_through_the_shipment_and_payment_rows() -> None:
    """F7 on shipment.created names only the shipment id; its stored row holds the trade_no, whose
    payment row names the order: two lookups, as the page makes them."""
    lost = finding("F7-s", "F7", {"event_type": "shipment.created", "key": "77", "table": "shop.shipments"})
    assert incidents.wanted([lost, SHIPMENTS], {}, FIELDS) == {"pk:shop.shipments:77", "trade_no:T1"}
    rows = {"pk:shop.shipments:77": [row("shop.shipments", 9, {"shipment_id": 77, "trade_no": "T1"})]}
    assert incidents.wanted([lost], rows, FIELDS) == {"trade_no:T1"}
    rows |= paid({"T1": "O1"})
    assert by_name(incidents.group([lost, SHIPMENTS], rows, FIELDS)) == {"order O1": ("F1-a", "F7-s")}


def test_a_shops_own_column_names_link_findings(tmp_path: Path) -> None:
    cfg = parse({"mysql": {"user": "m", "tables": ["shop.orders", "shop.payments", "shop.shipments"]},
                 "store": {"path": str(tmp_path / "s.db")},
                 "domain": {"payments": {"table": "shop.payments", "trade_no_column": "out_trade_no",
                                         "order_column": "biz_order_id", "status_column": "state",
                                         "success_statuses": ["ok"]},
                            "effects": [{"table": "shop.shipments", "trade_no_column": "pay_ref"}]}},
                base=tmp_path)
    fields = incidents.Fields.of(cfg)
    shipped = finding("F1-x", "F1", {"trade_no": "P9", "tables": ["shop.shipments"]})
    missing = finding("F7-x", "F7", {"event_type": "shipment.created", "key": "S5", "table": "shop.shipments"},
                      evidence=(Evidence("row_change", "binlog.000001:9#0-1-9/0", T0,
                                         {"table": "shop.shipments", "op": "insert", "pay_ref": "P9"}),))
    rows = {"trade_no:P9": [row("shop.payments", 1, {"out_trade_no": "P9", "biz_order_id": "B1"})]}
    assert incidents.wanted([missing], {}, fields) == {"trade_no:P9"}
    assert by_name(incidents.group([shipped, missing], rows, fields)) == {"order B1": ("F1-x", "F7-x")}
    assert len(incidents.group([shipped, missing], {}, incidents.Fields())) == 2  # the shop's column unknown


def test_the_store_gives_the_rows_of_each_entity(store_target: StoreTarget) -> None:
    store = Store(store_target)
    stored = [row("shop.payments", 1, {"trade_no": "T1", "order_no": "O1"}),
              row("shop.shipments", 2, {"shipment_id": 7, "trade_no": "T1"}),
              row("shop.payments", 3, {"trade_no": "T2", "order_no": "O2"})]
    with store.batch() as tx:
        tx.add_row_changes(stored, [(0, "trade_no:T1"), (0, "order_key:O1"), (1, "pk:shop.shipments:7"),
                                    (1, "trade_no:T1"), (2, "trade_no:T2")])
    got = queries.rows_by_entity(store, ["trade_no:T1", "pk:shop.shipments:7", "trade_no:T9"])
    newest = queries.rows_by_entity(store, ["trade_no:T1"], per_entity=1)
    store.close()
    assert {k: [r.after for r in v] for k, v in got.items()} == {
        "trade_no:T1": [stored[0].after, stored[1].after], "pk:shop.shipments:7": [stored[1].after]}
    assert [r.after for r in newest["trade_no:T1"]] == [stored[1].after]


def test_a_trade_no_held_as_bytes_joins_as_its_text() -> None:
    """A VARBINARY trade_no in a row of the evidence is the text the rules and the keys use."""
    lost = finding("F7-b", "F7", {"event_type": "shipment.created", "key": "77", "table": "shop.shipments"},
                   evidence=(Evidence("row_change", "binlog.000001:9#0-1-9/0", T0,
                                      {"table": "shop.shipments", "op": "insert", "trade_no": b"T1"}),))
    assert by_name(incidents.group([lost, SHIPMENTS], {}, FIELDS)) == {"trade_no T1": ("F1-a", "F7-b")}


def test_a_stalled_groups_lag_and_skew_are_one_incident_named_by_the_group() -> None:
    lag = finding("F11-g", "F11", {"group": "shipping-service", "lag": 900}, severity="warning")
    skew = finding("F12-g", "F12", {"group": "shipping-service", "topic": "shop.events"}, at=T0 + 3, severity="warning")
    other = finding("F12-h", "F12", {"group": "points-service", "topic": "shop.events"}, severity="warning")
    found = {f"{i.kind} {i.value}": i for i in incidents.group([lag, skew, other, DRIFT], {}, FIELDS)}
    assert tuple(f.id for f in found["group shipping-service"].findings) == ("F11-g", "F12-g")
    assert found["group shipping-service"].entity == "group:shipping-service"  # its drill-down: the readings
    assert tuple(f.id for f in found["group points-service"].findings) == ("F12-h",)
    assert found["finding F11-d"].entity == ""  # a backlog finding names no group


def one_bad_order() -> tuple[list[Transaction | EmittedEvent], list[Finding]]:
    """Order O1 with five rules' findings, as the engine raises them: paid by T1 and T2 (F2), T1's shipment
    made twice (F1), its points granted unannounced (F7, which names the grant's id alone), a shipment announced
    that was never committed (F8, which names that shipment's id alone) and its paid event sent twice with
    different payloads (F9)."""
    shop, engine = Shop(), Engine(shop_settings())
    records = [shop.tx(T0 - 100, order("O0", "pending")), shop.tx(T0, order("O1", "pending")),
               shop.tx(T0 + 1, payment("T1", "O1", "success"), order("O1", "paid", was="pending"),
                       shipment("S1", "T1"), grant("G1", "T1")),
               shop.event("order.paid", T0 + 1.2, order_no="O1", trade_no="T1", amount="10.00"),
               shop.event("shipment.created", T0 + 1.3, entity_id="S1", trade_no="T1", order_no="O1"),
               shop.tx(T0 + 2, payment("T2", "O1", "success"), shipment("S2", "T1")),
               shop.event("shipment.created", T0 + 2.2, entity_id="S2", trade_no="T1", order_no="O1"),
               shop.event("order.paid", T0 + 2.5, order_no="O1", trade_no="T2", amount="12.00"),
               shop.event("shipment.created", T0 + 3, entity_id="S9", trade_no="T1", order_no="O1")]
    found = feed(engine, *records)
    engine.tick(now=T0 + 100, binlog_time=T0 + 100, kafka_time=T0 + 100)
    found += engine.drain()
    assert sorted(f.rule for f in found) == ["F1", "F2", "F7", "F8", "F9"]
    return records, found


def stored(target: StoreTarget, records: list[Transaction | EmittedEvent], found: list[Finding]) -> Store:
    """A store as the monitor's writer leaves it: the records with their entity index, and the findings."""
    index, store = EntityIndex(shop_settings()), Store(target)
    with store.batch() as tx:
        for r in records:
            if isinstance(r, Transaction):
                tx.add_row_changes(list(r.rows), [(i, k) for i, row in enumerate(r.rows) for k in index.of_row(row)])
            else:
                tx.add_events([r], [(0, k) for k in index.of_event(r)])
        tx.upsert_findings(found)
    return store


def test_one_orders_f1_f2_f7_f8_f9_are_one_incident(store_target: StoreTarget) -> None:
    """Issue 43: the findings of one order are one incident, however little of it each one names."""
    records, found = one_bad_order()
    store = stored(store_target, records, found)
    try:
        listed = views.incidents_of(store, found, FIELDS)
    finally:
        store.close()
    assert [(i.kind, i.value, i.rules) for i in listed] == [("order", "O1", ("F1", "F2", "F7", "F8", "F9"))]


def test_the_drilldown_of_an_order_or_its_trade_no_finds_every_rules_finding(store_target: StoreTarget) -> None:
    """Issue 43: the drill-down of an order with an F8 said "No finding mentions this entity" (the F8 names the
    shipment's id; the order is in its evidence). Its trade_no's findings are the order's too."""
    records, found = one_bad_order()
    store = stored(store_target, records, found)
    try:
        by_query = {q: sorted(f.rule for f in queries.timeline(store, q).findings) for q in ("O1", "T1", "O0")}
    finally:
        store.close()
    assert by_query == {"O1": ["F1", "F2", "F7", "F8", "F9"], "T1": ["F1", "F2", "F7", "F8", "F9"], "O0": []}
