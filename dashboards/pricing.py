"""The money a finding is about: a report's amount_involved, for every rule where money is at stake.

F2 and F5 carry theirs in their keys (what was charged beyond one payment; the difference from the order's
amount). For the others the amount is read at export from the shop's own rows as the store keeps them
(its entity index), and the row it was read from joins the finding's evidence, so that the figure can be
checked there:
  F1  the trade's paid amount (its payments row in a success status) for each effect row beyond the first,
      table by table: three shipments and two points grants of one trade are three effects too many. Rows
      are told apart as F1 tells them (primary key, else coordinates); a row deleted since still counts,
      since it existed and may have been shipped.
  F3  the stuck order's amount (the customer may have paid for it)
  F4  the order's amount (its status moved where the state machine forbids)
  F6  the trade's paid amount (an off-whitelist callback status moved its order)
  F7  the amount of the order or payment whose change was never announced (an effect row's announcement
      names no money)
  F8  the orphan event's amount, as its payload says (`amount` of the topic's paths)
  F9  the event's amount for each copy beyond the first
F10-F16 are about time, lag and the CDC pipeline: no money. Amounts are in the unit of the config's
amount_scale, exact. A row the store no longer has (past [store] retention_hours), or a rule whose amount
column is not configured, leaves the amount empty, never 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from oncewatch.core.domain import Domain, in_unit
from oncewatch.core.exact_json import plain
from oncewatch.core.names import key_of
from oncewatch.core.records import OP_DELETE, RowChange
from oncewatch.core.tables import Watched
from oncewatch.store import Store
from oncewatch.store.queries import TIMELINE_LIMIT, rows_by_entity


@dataclass(frozen=True)
class Priced:
    """A finding's amount (None: unknown) and the rows it was read from, as evidence items of a finding dict
    before its times are written: {"kind", "coordinates", "time" (epoch seconds), "values"}."""

    amount: Decimal | None
    rows: tuple[dict[str, Any], ...] = ()


NOTHING = Priced(None)


def money(value: Any, scale: Decimal = Decimal(1)) -> Decimal | None:
    """An amount as a Decimal in its unit, None for what is not a finite number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return None
    return in_unit(amount, scale) if amount.is_finite() else None


def _item(change: RowChange, columns: Iterable[str | None]) -> dict[str, Any]:
    """The row an amount was read from, as the rules write a row's evidence (checks.findings.row_evidence)."""
    row = change.row
    values: dict[str, Any] = {"table": change.qualified_table, "op": change.op, "commit_clock": change.commit_clock}
    values.update((c, row.get(c)) for c in columns if c)
    values["row_id"] = change.pk[0] if len(change.pk) == 1 else list(change.pk) or None
    return {"kind": "row_change", "coordinates": change.coordinates, "time": change.commit_time,
            "values": plain(values)}


class Pricing:
    """Prices the findings of one report from one store (module docstring)."""

    def __init__(self, domain: Domain, store: Store):
        self.domain, self.store = domain, store
        d = domain
        self.payments = Watched((d.payments.table,)) if d.payments else None
        self.orders = Watched((d.orders.table,)) if d.orders else None
        self.effects = Watched(tuple(e.table for e in d.effects))

    def price(self, rule: str, keys: dict[str, Any], evidence: list[dict[str, Any]]) -> Priced:
        """`keys` and `evidence` as the finding dict holds them (plain JSON data)."""
        if rule == "F1" and "trade_no" in keys:
            extra = self._extra_effects(evidence)
            if not extra:  # evidence that names no effect table's rows (a store older than its config)
                return NOTHING
            paid = self._paid(str(keys["trade_no"]))
            return paid if paid.amount is None else Priced(paid.amount * extra, paid.rows)
        if rule in ("F3", "F4") and "order" in keys:
            return self._order(str(keys["order"]))
        if rule == "F6" and "trade_no" in keys:
            return self._paid(str(keys["trade_no"]))
        if rule == "F7" and "key" in keys:
            return self._announced(str(keys.get("table")), str(keys["key"]))
        if rule in ("F8", "F9"):
            amounts = [money(e["values"].get("amount")) for e in evidence if e["kind"] == "event"]
            if not amounts or amounts[0] is None:
                return NOTHING
            return Priced(amounts[0] if rule == "F8" else amounts[0] * (len(amounts) - 1))
        return NOTHING

    def _extra_effects(self, evidence: list[dict[str, Any]]) -> int:
        rows = {(e["values"].get("table"), repr(e["values"].get("row_id") or e["coordinates"]))
                for e in evidence if e["kind"] == "row_change" and e["values"].get("op") != OP_DELETE
                and self.effects.qualified(str(e["values"].get("table"))) is not None}
        return sum(n - 1 for n in Counter(table for table, _ in rows).values())

    def _rows(self, entity: str, table: Watched | None) -> list[RowChange]:
        """The stored changes of `entity` in `table`, oldest first."""
        if table is None:
            return []
        found = rows_by_entity(self.store, [entity], per_entity=TIMELINE_LIMIT).get(entity, [])
        return [r for r in found if table.entry(r.schema, r.table) is not None and r.op != OP_DELETE]

    def _paid(self, trade_no: str, statuses: tuple[str, ...] | None = None) -> Priced:
        """The trade's amount from its newest payments row in a success status (`statuses`: these instead)."""
        p = self.domain.payments
        if p is None or p.amount_column is None:
            return NOTHING
        wanted = p.success_statuses if statuses is None else statuses
        for change in reversed(self._rows(f"trade_no:{trade_no}", self.payments)):
            amount = money(change.row.get(p.amount_column), p.amount_scale)
            if amount is not None and (not wanted or str(change.row.get(p.status_column)) in wanted):
                return Priced(amount, (_item(change, (p.trade_no_column, *p.order_columns, p.status_column,
                                                      p.amount_column)),))
        return NOTHING

    def _order(self, order: str) -> Priced:
        o = self.domain.orders
        if o is None or o.amount_column is None:
            return NOTHING
        for change in reversed(self._rows(f"order_key:{order}", self.orders)):
            if key_of(change.row, o.key_columns) is None:
                continue
            amount = money(change.row.get(o.amount_column), o.amount_scale)
            if amount is not None:
                return Priced(amount, (_item(change, (*o.key_columns, o.status_column, o.amount_column)),))
        return NOTHING

    def _announced(self, table: str, key: str) -> Priced:
        if self.orders is not None and table in self.orders.entries:
            return self._order(key)
        if self.payments is not None and table in self.payments.entries:
            return self._paid(key, ())
        return NOTHING
