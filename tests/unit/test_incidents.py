"""Incidents: the findings of one order or trade_no grouped, through the payment that links a
trade_no to its order; the store's links; the Incidents page."""

from __future__ import annotations

from pathlib import Path

from oncewatch.core.config import parse
from oncewatch.core.records import Evidence, Finding, RowChange
from oncewatch.dashboards import incidents
from oncewatch.store import Store, queries

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


def test_a_callback_handled_three_times_is_one_incident_with_its_f1_and_f9_parts() -> None:
    found = incidents.group(ALL, {"T1": "O1", "T3": "O3", "T4": "O3"})
    assert by_name(found) == {"order O1": ("F1-a", "F9-a"), "order O3": ("F2-c", "F5-c"), "order O2": ("F3-b",),
                              "finding F11-d": ("F11-d",)}
    o1 = found[[i.value for i in found].index("O1")]
    assert (o1.rules, o1.severity, o1.status, o1.entity) == (("F1", "F9"), "critical", "open", "O1")
    assert (o1.first_seen, o1.last_seen) == (T0, T0 + 3)
    # Open before acknowledged; the most recently seen first among equals; the F11 has no entity.
    assert [i.status for i in found] == ["open", "open", "open", "acknowledged"]
    assert found[0].value == "F11-d" and found[0].entity == ""


def test_without_the_payment_link_a_trade_no_is_its_own_incident() -> None:
    found = incidents.group(ALL, {})
    assert by_name(found)["trade_no T1"] == ("F1-a",) and by_name(found)["order O1"] == ("F9-a",)
    # F2 and F5 still meet on their own keys: both name O3.
    assert by_name(found)["order O3"] == ("F2-c", "F5-c")


def test_a_shops_own_column_names_in_the_evidence_link_findings(tmp_path: Path) -> None:
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
    assert incidents.trade_nos([missing], fields) == {"P9"}
    assert by_name(incidents.group([shipped, missing], {"P9": "B1"}, fields)) == {"order B1": ("F1-x", "F7-x")}
    assert len(incidents.group([shipped, missing], {}, incidents.Fields())) == 2  # the shop's column unknown


def payment(seq: int, trade_no: str, order: str) -> RowChange:
    return RowChange(schema="shop", table="payments", op="insert", pk=(seq,), before=None,
                     after={"id": seq, "trade_no": trade_no, "order_no": order}, txid=f"0-1-{seq}", row_index=0,
                     binlog_file="binlog.000001", end_pos=100 * seq, commit_time=T0 + seq, commit_clock="binlog")


def test_the_store_links_trade_nos_to_orders_through_stored_payment_rows(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "s.db"))
    shipment = RowChange(schema="shop", table="shipments", op="insert", pk=(1,), before=None,
                         after={"id": 1, "trade_no": "T1", "order_no": "NOT-THIS"}, txid="0-1-9", row_index=0,
                         binlog_file="binlog.000001", end_pos=900, commit_time=T0 + 9, commit_clock="binlog")
    rows = [payment(1, "T1", "O1"), payment(2, "T2", "O1"), payment(3, "T3", "O3"), shipment]
    with store.batch() as tx:
        tx.add_row_changes(rows, [(0, "trade_no:T1"), (0, "order_key:O1"), (1, "trade_no:T2"), (1, "order_key:O1"),
                                  (2, "trade_no:T3"), (3, "trade_no:T1")])
    links = queries.orders_of_trades(store, ["T1", "T2", "T9"], table="shop.payments", trade_no_column="trade_no",
                                     order_column="order_no")
    store.close()
    assert links == {"T1": "O1", "T2": "O1"}  # T9 has no row; the shipment's order_no is not the payment's
