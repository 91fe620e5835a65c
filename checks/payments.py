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
from oncewatch.checks.horizon import BINLOG, Aging, Memory
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
        self.successes = memory.aging("successful_payments", BINLOG, spill=True)
        # order key -> (amount as text, evidence of the row that set it)
        self.order_amounts = memory.aging("order_amounts", BINLOG, spill=True)
        # order key -> what F6 needs of it from the fragments of a transaction read so far
        # ({"moved": bool, "orders": [evidence], "bad": [[trade_no, callback status, evidence, time]]})
        self.in_tx = memory.aging("callbacks_in_tx", BINLOG, spill=True)
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
            self._double_charge(order, trades, change.commit_time)
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

    def _double_charge(self, order: str, trades: dict[str, EvidenceItem], time: float) -> None:
        """F2, with the amounts when the payments table has them: `amount_involved` is what was charged beyond
        the largest single payment (the money to give back)."""
        keys: dict[str, Any] = {"order": order, "trade_nos": sorted(trades)}
        summary = f"order {order} paid successfully {len(trades)} times"
        amounts = [money(values_of(trades[t]).get(self.p.amount_column)) for t in sorted(trades)] \
            if self.p.amount_column else []
        if amounts and None not in amounts:
            charged = sum(amounts, Decimal(0))
            keys.update(charged=charged, amount_involved=charged - max(amounts))
            summary += f": {' + '.join(map(str, amounts))} = {charged}"
        self.findings.raise_("F2", (order,), keys=keys, summary=summary, time=time, evidence=trades.values())

    def _compare(self, order: str, trade_no: str, payment: EvidenceItem, known: tuple[str, EvidenceItem]) -> None:
        paid, expected = money(values_of(payment).get(self.p.amount_column)), Decimal(known[0])
        if paid is None or paid == expected:
            return
        self.findings.raise_("F5", (trade_no,), keys={"order": order, "trade_no": trade_no,
                                                       "amount_involved": abs(paid - expected)},
                             summary=f"trade_no {trade_no} paid {paid}, order {order} is for {expected}",
                             time=max(payment[2], known[1][2]), evidence=[payment, known[1]])

    def check_callbacks(self, tx: Transaction) -> None:
        """F6 over one transaction, or over the fragments of one read so far (kept in `in_tx` until its last)."""
        whole = tx.complete and not len(self.in_tx)
        if whole and len(tx.rows) < 2:
            return  # F6 needs an order row and a payment row
        allowed = ", ".join(self.p.callback_status_whitelist)
        for order, fact in self._callback_facts(tx.rows, None if whole else self.in_tx).items():
            if not fact["moved"]:
                continue
            for trade_no, callback, payment, at in fact["bad"]:  # facts come from rows: tx.rows is not empty
                self.findings.raise_(
                    "F6", (trade_no, tx.rows[0].txid),
                    keys={"order": order, "trade_no": trade_no, "callback_status": callback},
                    summary=f"callback status {callback!r} (not in {allowed}) moved order {order}",
                    time=at, evidence=[payment, *fact["orders"]])
        if tx.complete and not whole:
            self.in_tx.clear()

    def _callback_facts(self, rows: tuple[RowChange, ...], kept: Aging | None) -> dict[str, dict[str, Any]]:
        """Per order of `rows`: did its status change, its rows' evidence, its payments with a callback status
        off the whitelist. With `kept` (a fragmented transaction), merged with the earlier fragments' and kept
        for the orders that moved or have such a payment (an order's rows before it moved are not)."""
        o, p = self.orders, self.p
        facts: dict[str, dict[str, Any]] = {}

        def fact(order: str) -> dict[str, Any]:
            if order not in facts:
                facts[order] = (kept.get(order) if kept is not None else None) or {"moved": False, "orders": [],
                                                                                    "bad": []}
            return facts[order]

        for r in rows:
            if r.snapshot:
                continue
            if r.qualified_table == o.table:
                f = fact(key_text(r.row.get(o.key_column)))
                f["orders"].append(row_evidence(r, o.table, (o.key_column, o.status_column)))
                f["moved"] |= r.op == OP_UPDATE and (r.before or {}).get(o.status_column) != r.row.get(o.status_column)
            elif r.qualified_table == p.table and r.op != OP_DELETE:
                callback = r.row.get(p.callback_status_column)
                if callback not in p.callback_status_whitelist:
                    fact(key_text(r.row.get(p.order_column)))["bad"].append(
                        [key_text(r.row.get(p.trade_no_column)), callback, row_evidence(r, p.table, self.columns),
                         r.commit_time])
        if kept is not None:
            for order, f in facts.items():
                if f["moved"] or f["bad"]:
                    kept.put(order, f, rows[-1].commit_time)
        return facts
