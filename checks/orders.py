"""F3 stuck_pending and F4 illegal_transition: the life of one order.

Statuses are read by their state-machine names (`Orders.status`: the config's aliases applied).
F3 is judged on the binlog clock: an order is stuck once the binlog has been read past
`since + stuck_pending_seconds` with the order still pending. When it leaves pending later
(paid, closed, deleted) the finding resolves; if it leaves after the threshold but before the
timer looked, the finding is recorded already resolved, so the result does not depend on
when the timer ran. F4 needs no state: the binlog's before image gives the old status.
"""

from __future__ import annotations

from oncewatch.checks.findings import EvidenceItem, Findings, finding_id, row_evidence, values_of, warn_null_key
from oncewatch.checks.horizon import BINLOG, Memory
from oncewatch.core.domain import Orders
from oncewatch.core.names import key_of, key_text
from oncewatch.core.records import OP_DELETE, OP_UPDATE, RowChange


class OrderLife:
    def __init__(self, orders: Orders, state_machine: dict[str, tuple[str, ...]] | None, threshold: float,
                 memory: Memory, findings: Findings):
        self.orders = orders
        self.key_column = orders.key_columns[0] if len(orders.key_columns) == 1 else None
        self.aliases = orders.status_aliases
        self.pending_statuses = frozenset(orders.pending_statuses)
        self.machine = state_machine
        self.threshold = threshold
        # order key -> [{"t": since, "ev": evidence}]
        self.pending = memory.deadlines("pending_orders", BINLOG, threshold)
        self.findings = findings

    def on_row(self, change: RowChange) -> None:
        o, row = self.orders, change.row
        # runs for every order row: the one-column key and the aliases are read inline
        key = row.get(self.key_column) if self.key_column is not None else key_of(row, o.key_columns)
        if key is None:
            warn_null_key("order row", change.coordinates)
            return
        key = key_text(key)
        status = row.get(o.status_column)
        if self.aliases:
            status = self.aliases.get(status, status)
        if change.op != OP_DELETE and status in self.pending_statuses:
            if not self.pending.has(key):
                self.pending.add(key, {"t": change.commit_time, "ev": self._evidence(change)})
        else:
            self._left_pending(key, change)
        if self.machine is not None and change.op == OP_UPDATE and not change.snapshot:
            self._check_transition(key, change)

    def _left_pending(self, key: str, change: RowChange) -> None:
        taken = self.pending.take(key)
        if taken is None:
            return
        item, overdue = taken
        if overdue or change.commit_time - item["t"] > self.threshold:
            waited = change.commit_time - item["t"]
            status = self.orders.status(change.row) if change.op != OP_DELETE else "deleted"
            self.findings.settle(
                "F3", (key,), keys={"order": key}, summary=self._summary(key),
                since=item["t"] + self.threshold,
                evidence=[item["ev"], self._evidence(change)],
                at=change.commit_time, why=f"order left pending ({status}) after {waited:.3f}s at {change.coordinates}")

    def _evidence(self, change: RowChange) -> EvidenceItem:
        o = self.orders
        return row_evidence(change, (*o.key_columns, o.status_column))

    def _summary(self, key: str) -> str:
        return f"order {key} pending longer than {self.threshold:g}s"

    def _check_transition(self, key: str, change: RowChange) -> None:
        o = self.orders
        old, new = o.status(change.before or {}), o.status(change.row)
        if old == new or new in self.machine.get(old, ()):
            return
        stored = ((change.before or {}).get(o.status_column), change.row.get(o.status_column))
        words = f" ({stored[0]} -> {stored[1]} in {change.qualified_table})" if stored != (old, new) else ""
        self.findings.raise_("F4", (key, change.txid, change.row_index), keys={"order": key, "from": old, "to": new},
                             summary=f"order {key} went {old} -> {new}{words}, not allowed by domain.state_machine",
                             time=change.commit_time, evidence=[self._evidence(change)])

    def truncated(self, at: float, where: str, shard: str | None = None) -> None:
        """The orders table was emptied: no order is pending any more (a stuck one ends here). `shard`: the one
        table of a pattern that was, whose orders are those that went pending in it."""
        for key in {*self.pending.fresh.items, *self.pending.overdue.items}:
            if shard is not None and not any(values_of(i["ev"]).get("table") == shard for space in
                                             (self.pending.fresh, self.pending.overdue) for i in space.get(key) or ()):
                continue
            while (taken := self.pending.take(key)) is not None:
                if taken[1]:  # overdue: its F3 was raised
                    table = shard or self.orders.table
                    self.findings.resolve(finding_id("F3", key), at, f"{table} truncated at {where}")

    def tick(self, binlog_time: float) -> None:
        for key, item in self.pending.due(binlog_time):
            self.findings.raise_("F3", (key,), keys={"order": key}, summary=self._summary(key),
                                 time=item["t"] + self.threshold, evidence=[item["ev"]])
