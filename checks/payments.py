"""F2 double_charge, F5 amount_mismatch, F6 invalid_callback_status: payments against their order.

F2: more than one *successful* trade_no for one order (failed attempts do not count).
F5: a successful payment whose amount differs from its order's amount, checked whichever of
the two rows arrives last. F6: a payment row whose callback status is outside the whitelist,
in the same transaction that changed its order's status (the callback moved the order).
Money is compared as Decimal, never as float.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from oncewatch.checks.findings import EvidenceItem, Findings, row_evidence, values_of, warn_null_key
from oncewatch.checks.horizon import BINLOG, Memory
from oncewatch.core.domain import Orders, Payments
from oncewatch.core.names import key_text
from oncewatch.core.records import OP_DELETE, OP_UPDATE, RowChange, Transaction


def money(value: Any) -> Decimal | None:
    if value is None or isinstance(value, Decimal):
        return value
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


class PaymentChecks:
    def __init__(self, payments: Payments, orders: Orders | None, memory: Memory, findings: Findings):
        p = self.p = payments
        self.orders = orders
        self.success = frozenset(p.success_statuses)
        self.compare_amounts = bool(orders and orders.amount_column and p.amount_column)
        self.columns = tuple(c for c in (p.trade_no_column, p.order_column, p.status_column, p.amount_column,
                                         p.callback_status_column) if c)
        # order key -> {trade_no: evidence of the row that made it successful}
        self.successes = memory.aging("successful_payments", BINLOG)
        # order key -> (amount as text, evidence of the row that set it)
        self.order_amounts = memory.aging("order_amounts", BINLOG)
        self.findings = findings

    def on_payment(self, change: RowChange) -> None:
        if change.op == OP_DELETE or change.row.get(self.p.status_column) not in self.success:
            return
        order, trade_no = change.row.get(self.p.order_column), change.row.get(self.p.trade_no_column)
        if order is None or trade_no is None:
            warn_null_key("successful payment row", change.coordinates)
            return
        order, trade_no = key_text(order), key_text(trade_no)
        trades = self.successes.get(order) or {}
        if trade_no in trades:
            self.successes.put(order, trades, change.commit_time)
            return
        trades[trade_no] = row_evidence(change, self.p.table, self.columns)
        self.successes.put(order, trades, change.commit_time)
        if len(trades) > 1:
            self.findings.raise_("F2", (order,), keys={"order": order, "trade_nos": sorted(trades)},
                                 summary=f"order {order} paid successfully {len(trades)} times",
                                 time=change.commit_time, evidence=trades.values())
        known = self.order_amounts.get(order)
        if self.compare_amounts and known is not None:
            self._compare(order, trade_no, trades[trade_no], known)

    def on_order(self, change: RowChange) -> None:
        if not self.compare_amounts or change.op == OP_DELETE:
            return
        o = self.orders
        order, amount = change.row.get(o.key_column), money(change.row.get(o.amount_column))
        if order is None or amount is None:
            return
        order = key_text(order)
        known = self.order_amounts.get(order)
        if known is not None and known[0] == str(amount):
            return  # the row that set this amount stays the evidence, and the entry ages from it
        known = (str(amount), row_evidence(change, o.table, (o.key_column, o.amount_column)))
        self.order_amounts.put(order, known, change.commit_time)
        for trade_no, payment in (self.successes.get(order) or {}).items():
            self._compare(order, trade_no, payment, known)

    def _compare(self, order: str, trade_no: str, payment: EvidenceItem, known: tuple[str, EvidenceItem]) -> None:
        paid, expected = money(values_of(payment).get(self.p.amount_column)), Decimal(known[0])
        if paid is None or paid == expected:
            return
        self.findings.raise_("F5", (trade_no,), keys={"order": order, "trade_no": trade_no},
                             summary=f"trade_no {trade_no} paid {paid}, order {order} is for {expected}",
                             time=max(payment[2], known[1][2]), evidence=[payment, known[1]])

    def check_callbacks(self, tx: Transaction) -> None:
        """F6 over one transaction: orders whose status changed, payments with a status off the whitelist."""
        o, p = self.orders, self.p
        moved = {key_text(r.row.get(o.key_column)) for r in tx.rows
                 if r.qualified_table == o.table and r.op == OP_UPDATE and not r.snapshot
                 and (r.before or {}).get(o.status_column) != r.row.get(o.status_column)}
        if not moved:
            return
        order_rows = [r for r in tx.rows if r.qualified_table == o.table and key_text(r.row.get(o.key_column)) in moved]
        for r in tx.rows:
            if r.qualified_table != p.table or r.op == OP_DELETE or r.snapshot:
                continue
            callback, order = r.row.get(p.callback_status_column), key_text(r.row.get(p.order_column))
            if order not in moved or callback in p.callback_status_whitelist:
                continue
            trade_no = key_text(r.row.get(p.trade_no_column))
            allowed = ", ".join(p.callback_status_whitelist)
            self.findings.raise_(
                "F6", (trade_no, tx.rows[0].txid),
                keys={"order": order, "trade_no": trade_no, "callback_status": callback},
                summary=f"callback status {callback!r} (not in {allowed}) moved order {order}",
                time=r.commit_time,
                evidence=[row_evidence(r, p.table, self.columns)] + [
                    row_evidence(x, o.table, (o.key_column, o.status_column)) for x in order_rows
                    if key_text(x.row.get(o.key_column)) == order])
