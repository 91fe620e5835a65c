"""F2 double_charge, F5 amount_mismatch, F6 invalid_callback_status: payments against their order.

F2: more than one *successful* trade_no for one order (failed attempts do not count).
F5: a successful payment whose amount differs from its order's amount, checked whichever of
the two rows arrives last; with a callback log (`domain.callbacks`), also a success the channel
sent with an amount other than the order's. F6: a callback status outside the whitelist, in the
same transaction that changed its order's status (the callback moved the order): read from the
payment row's callback status column, or from the callback log's row, linked to its order through
the payment of its trade_no. Money is compared as Decimal, never as float, each amount divided by
its column's scale first (cents and yuan compare exactly).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from oncewatch.checks.findings import EvidenceItem, Findings, row_evidence, values_of, warn_null_key
from oncewatch.checks.horizon import BINLOG, Aging, Memory
from oncewatch.core.domain import Callbacks, Orders, Payments, in_unit
from oncewatch.core.names import key_of, key_text
from oncewatch.core.records import OP_DELETE, OP_UPDATE, RowChange, Transaction
from oncewatch.core.tables import Watched

ONE = Decimal(1)


def money(value: Any, scale: Decimal = ONE) -> Decimal | None:
    """An amount in the unit of the order: `value` divided by its column's scale (exact for a power of ten)."""
    if value is None:
        return None
    try:
        amount = value if isinstance(value, Decimal) else Decimal(str(value))
    except InvalidOperation:
        return None
    return in_unit(amount, scale)


class PaymentChecks:
    def __init__(self, payments: Payments, orders: Orders | None, callbacks: Callbacks | None, tables: Watched,
                 memory: Memory, findings: Findings, owns: Callable[[str], bool] | None = None):
        """`tables`: the engine's Watched (which entry a row's real table falls under); `owns`: sharded, whether an
        order is this shard's (F6 judges no other, checks.shards)."""
        self.owns = owns
        p = self.p = payments
        self.orders, self.log = orders, callbacks
        self.success = frozenset(p.success_statuses)
        has_order_amount = bool(orders and orders.amount_column)
        self.compare_amounts = has_order_amount and bool(p.amount_column)
        self.compare_callbacks = has_order_amount and bool(callbacks and callbacks.amount_column)
        self.columns = tuple(c for c in (p.trade_no_column, *p.order_columns, p.status_column, p.amount_column,
                                         p.callback_status_column) if c)
        self.log_columns = tuple(c for c in (callbacks.trade_no_column, callbacks.status_column,
                                             callbacks.amount_column) if c) if callbacks else ()
        self.log_success = frozenset(callbacks.success_statuses) if callbacks else frozenset()
        self.whitelist = callbacks.status_whitelist if callbacks else p.callback_status_whitelist
        self.tables = tables
        # order key -> {trade_no: evidence of the row that made it successful}
        self.successes = memory.aging("successful_payments", BINLOG, spill=True)
        # order key -> (amount as text, evidence of the row that set it)
        self.order_amounts = memory.aging("order_amounts", BINLOG, spill=True)
        # order key -> what F6 needs of it from the fragments of a transaction read so far
        # ({"moved": bool, "orders": [evidence], "bad": [[trade_no, callback status, evidence, time]]})
        self.in_tx = memory.aging("callbacks_in_tx", BINLOG, spill=True)
        if callbacks is not None:
            # trade_no -> order key, from the payment rows: what links a callback log row to its order
            self.trade_orders = memory.aging("trade_orders", BINLOG, spill=True)
            # order key -> {trade_no: evidence of a success callback}, for F5 on the amount the channel sent
            self.callback_amounts = memory.aging("callback_amounts", BINLOG, spill=True)
            # trade_no -> evidence of a success callback read before any row of its payment: a snapshot's tables
            # come in any order (a connector's may give the log first), and a log row may be written first
            self.callbacks_waiting = memory.aging("callbacks_waiting", BINLOG, spill=True)
        self.findings = findings

    def on_payment(self, change: RowChange) -> None:
        if change.op == OP_DELETE:
            return
        order, trade_no = key_of(change.row, self.p.order_columns), change.row.get(self.p.trade_no_column)
        if self.log is not None and order is not None and trade_no is not None:
            self.trade_orders.put(key_text(trade_no), key_text(order), change.commit_time)
            waiting = self.callbacks_waiting.pop(key_text(trade_no)) if self.compare_callbacks else None
            if waiting is not None:
                self._callback_sent(key_text(order), key_text(trade_no), waiting, change.commit_time)
        if change.row.get(self.p.status_column) not in self.success:
            return
        if order is None or trade_no is None:
            warn_null_key("successful payment row", change.coordinates)
            return
        order, trade_no = key_text(order), key_text(trade_no)
        trades = self.successes.get(order) or {}
        if trade_no in trades:
            self.successes.put(order, trades, change.commit_time)
            return
        trades[trade_no] = row_evidence(change, self.columns)
        self.successes.put(order, trades, change.commit_time)
        if len(trades) > 1:
            self._double_charge(order, trades, change.commit_time)
        known = self.order_amounts.get(order)
        if self.compare_amounts and known is not None:
            self._compare(order, trade_no, trades[trade_no], self._paid(trades[trade_no]), known)

    def on_callback(self, change: RowChange) -> None:
        """A callback log row: a success the channel sent is kept and compared with its order's amount (F5)."""
        c = self.log
        if not self.compare_callbacks or change.op == OP_DELETE \
                or change.row.get(c.status_column) not in self.log_success:
            return
        trade_no = change.row.get(c.trade_no_column)
        if trade_no is None:
            warn_null_key("success callback", change.coordinates)
            return
        trade_no = key_text(trade_no)
        evidence = row_evidence(change, self.log_columns)
        order = self.trade_orders.get(trade_no)
        if order is None:  # judged when a row of its payment comes (on_payment)
            self.callbacks_waiting.put(trade_no, evidence, change.commit_time)
            return
        self._callback_sent(order, trade_no, evidence, change.commit_time)

    def _callback_sent(self, order: str, trade_no: str, evidence: EvidenceItem, time: float) -> None:
        """A success callback linked to its order: kept, and compared with the order's amount if it is known."""
        sent = self.callback_amounts.get(order) or {}
        sent[trade_no] = evidence
        self.callback_amounts.put(order, sent, time)
        known = self.order_amounts.get(order)
        if known is not None:
            self._compare(order, trade_no, evidence, self._sent(evidence), known)

    def on_order(self, change: RowChange) -> None:
        if not (self.compare_amounts or self.compare_callbacks) or change.op == OP_DELETE:
            return
        o = self.orders
        order, amount = key_of(change.row, o.key_columns), money(change.row.get(o.amount_column), o.amount_scale)
        if order is None or amount is None:
            return
        order = key_text(order)
        known = self.order_amounts.get(order)
        if known is not None and known[0] == str(amount):
            return  # the row that set this amount stays the evidence, and the entry ages from it
        known = (str(amount), row_evidence(change, (*o.key_columns, o.amount_column)))
        self.order_amounts.put(order, known, change.commit_time)
        if self.compare_amounts:
            for trade_no, payment in (self.successes.get(order) or {}).items():
                self._compare(order, trade_no, payment, self._paid(payment), known)
        if self.compare_callbacks:
            for trade_no, callback in (self.callback_amounts.get(order) or {}).items():
                self._compare(order, trade_no, callback, self._sent(callback), known)

    def _paid(self, payment: EvidenceItem) -> Decimal | None:
        return money(values_of(payment).get(self.p.amount_column), self.p.amount_scale)

    def _sent(self, callback: EvidenceItem) -> Decimal | None:
        return money(values_of(callback).get(self.log.amount_column), self.log.amount_scale)

    def _double_charge(self, order: str, trades: dict[str, EvidenceItem], time: float) -> None:
        """F2, with the amounts when the payments table has them: `amount_involved` is what was charged beyond
        the largest single payment (the money to give back)."""
        keys: dict[str, Any] = {"order": order, "trade_nos": sorted(trades)}
        summary = f"order {order} paid successfully {len(trades)} times"
        amounts = [self._paid(trades[t]) for t in sorted(trades)] if self.p.amount_column else []
        if amounts and None not in amounts:
            charged = sum(amounts, Decimal(0))
            keys.update(charged=charged, amount_involved=charged - max(amounts))
            summary += f": {' + '.join(map(str, amounts))} = {charged}"
        self.findings.raise_("F2", (order,), keys=keys, summary=summary, time=time, evidence=trades.values())

    def _compare(self, order: str, trade_no: str, payment: EvidenceItem, paid: Decimal | None,
                 known: tuple[str, EvidenceItem]) -> None:
        expected = Decimal(known[0])
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
            return  # F6 needs an order row and a payment or callback row
        allowed = ", ".join(self.whitelist)
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
        """Per order of `rows`: did its status change, its rows' evidence, its payments (or callback log rows)
        with a callback status off the whitelist. With `kept` (a fragmented transaction), merged with the
        earlier fragments' and kept for the orders that moved or have such a callback (an order's rows before
        it moved are not)."""
        o, p, c = self.orders, self.p, self.log
        facts: dict[str, dict[str, Any]] = {}

        owns = self.owns

        def fact(order: str) -> dict[str, Any]:
            if owns is not None and not owns(order):
                return {"moved": False, "orders": [], "bad": []}  # another shard's: judged there, not kept here
            if order not in facts:
                facts[order] = (kept.get(order) if kept is not None else None) or {"moved": False, "orders": [],
                                                                                    "bad": []}
            return facts[order]

        entry = self.tables.entry
        for r in rows:
            if r.snapshot:
                continue
            table = entry(r.schema, r.table)
            if table == o.table:
                f = fact(key_text(key_of(r.row, o.key_columns)))
                f["orders"].append(row_evidence(r, (*o.key_columns, o.status_column)))
                f["moved"] |= r.op == OP_UPDATE and o.status(r.before or {}) != o.status(r.row)
            elif r.op == OP_DELETE:
                continue
            elif table == p.table and c is None:
                callback = r.row.get(p.callback_status_column)
                if callback not in p.callback_status_whitelist:
                    fact(key_text(key_of(r.row, p.order_columns)))["bad"].append(
                        [key_text(r.row.get(p.trade_no_column)), callback, row_evidence(r, self.columns),
                         r.commit_time])
            elif c is not None and table == c.table:
                callback = r.row.get(c.status_column)
                if callback in c.status_whitelist:
                    continue
                # the payment rows of this transaction were read by on_payment before this check runs
                trade_no = key_text(r.row.get(c.trade_no_column))
                order = self.trade_orders.get(trade_no)
                if order is None:
                    if owns is None or owns(None):  # sent to every shard (checks.shards): the leader alone warns
                        warn_null_key("callback whose payment was not read", r.coordinates)
                    continue
                fact(order)["bad"].append([trade_no, callback, row_evidence(r, self.log_columns), r.commit_time])
        if kept is not None:
            for order, f in facts.items():
                if f["moved"] or f["bad"]:
                    kept.put(order, f, rows[-1].commit_time)
        return facts
