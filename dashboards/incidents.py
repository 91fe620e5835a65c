"""Incidents: the findings of one order (or, where no order is known, one trade_no) taken together.

A callback handled three times is one incident with its F1 part (the extra shipments) and its F9
part (the event announced twice): the SRE works the incident, the auditor still sees each finding.
Findings belong together when they name the same trade_no or order: in their keys, in the rows
and events of their evidence, through the stored row an announced key names (a shipment's row
holds its trade_no), and through the stored payment row that links a trade_no to its order.
Pure: the page reads the findings and the rows `wanted` names from the store and passes them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from oncewatch.core import names
from oncewatch.core.config import Config
from oncewatch.core.names import key_of, key_text
from oncewatch.core.records import Finding, RowChange
from oncewatch.core.tables import Watched

# The names oncewatch itself gives these values: in finding keys (F2-F6 write order, F2 trade_nos)
# and in the keys it reads from events (order_key, trade_no).
TRADE_NO_FIELDS = frozenset({"trade_no"})
ORDER_FIELDS = frozenset({"order", "order_key"})

# What an incident is named by, of the keys its findings share: the first kind there is, then the least value.
NAMED_BY = ("order", "trade_no", "group", "finding")

# Worst first: an incident is as bad as its worst part, and open while any part is.
SEVERITY_ORDER = ("critical", "warning", "info")
STATUS_ORDER = (names.OPEN, names.ACKNOWLEDGED, names.CLOSED, names.RESOLVED)


@dataclass(frozen=True)
class Fields:
    """Where a shop keeps trade_nos and orders. Value names: oncewatch's own (finding keys, the keys
    it reads from events) plus the shop's columns (rows in evidence carry the columns the rule
    looked at). Per table: which column of a stored row holds its trade_no or its order. And which
    tables F7-F10 announce by an order, by a trade_no, or by a key of their own (an effect's id: its
    stored row, found by primary key, holds the trade_no)."""

    trade_no: frozenset[str] = TRADE_NO_FIELDS
    order: frozenset[str] = ORDER_FIELDS
    trade_no_columns: Mapping[str, str] = field(default_factory=dict)  # watched entry -> column
    order_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # the order key's columns
    announced: Mapping[str, str] = field(default_factory=dict)  # watched entry -> "trade_no" | "order" | "row"
    tables: Watched = field(default_factory=lambda: Watched(()))  # a stored row's real table -> its entry

    @classmethod
    def of(cls, cfg: Config | None) -> Fields:
        if cfg is None:
            return cls()
        d = cfg.domain
        trade = {e.table: e.trade_no_column for e in d.effects}
        order = {d.orders.table: d.orders.key_columns} if d.orders else {}
        if d.callbacks:
            trade[d.callbacks.table] = d.callbacks.trade_no_column
        if d.payments:
            trade[d.payments.table] = d.payments.trade_no_column
            order[d.payments.table] = d.payments.order_columns
        announced = {a.table: "trade_no" if (trade.get(a.table),) == a.key_columns
                     else "order" if order.get(a.table) == a.key_columns else "row" for a in cfg.announce}
        # a composite key's parts are not orders each: only one-column keys name an order by a value's name
        single = {columns[0] for columns in order.values() if len(columns) == 1}
        return cls(TRADE_NO_FIELDS | set(trade.values()), ORDER_FIELDS | single, trade, order, announced,
                   cfg.mysql.watched)


# Stored rows by entity key ('trade_no:T1', 'pk:shop.shipments:7'), as store.queries.rows_by_entity reads them.
Rows = Mapping[str, Sequence[RowChange]]


@dataclass(frozen=True)
class Incident:
    kind: str  # "order", "trade_no", "group" (F11's lag and F12 of one consumer group), or "finding" for another
    value: str  # the order, the trade_no, the group, or the finding's id
    findings: tuple[Finding, ...]  # oldest first

    @property
    def entity(self) -> str:
        """What the drill-down opens for it ('' for a finding about no order, payment or group)."""
        return "" if self.kind == "finding" else f"group:{self.value}" if self.kind == "group" else self.value

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(sorted({f.rule for f in self.findings}, key=lambda r: int(r[1:]) if r[1:].isdigit() else 99))

    @property
    def severity(self) -> str:
        return min((f.severity for f in self.findings), key=_rank(SEVERITY_ORDER))

    @property
    def status(self) -> str:
        return min((f.status for f in self.findings), key=_rank(STATUS_ORDER))

    @property
    def first_seen(self) -> float:
        return min(f.first_seen for f in self.findings)

    @property
    def last_seen(self) -> float:
        return max(f.last_seen for f in self.findings)


def _rank(order: Sequence[str]):
    return lambda value: order.index(value) if value in order else len(order)


def _values(data: Mapping[str, object], fields: frozenset[str]) -> Iterable[str]:
    for name in fields:
        value = data.get(name)
        if isinstance(value, list):
            yield from (key_text(v) for v in value if v is not None)
        elif value is not None:
            yield key_text(value)


def _announced_row(f: Finding, fields: Fields) -> str | None:
    """The entity key of the stored row an F7-F10 finding's announced key names, if it is a row's own key."""
    table, key = f.keys.get("table"), f.keys.get("key")
    return f"pk:{table}:{key}" if key is not None and fields.announced.get(str(table)) == "row" else None


def _named(f: Finding, fields: Fields, rows: Rows) -> tuple[set[str], set[str]]:
    """The trade_nos and orders a finding names: in its keys, its evidence, its announced key, and
    the stored row that key names."""
    trades, orders = set(_values(f.keys, fields.trade_no | {"trade_nos"})), set(_values(f.keys, fields.order))
    for e in f.evidence:
        trades.update(_values(e.values, fields.trade_no))
        orders.update(_values(e.values, fields.order))
    kind = fields.announced.get(str(f.keys.get("table")))
    if kind in ("trade_no", "order") and f.keys.get("key") is not None:
        (trades if kind == "trade_no" else orders).add(key_text(f.keys["key"]))
    row_key = _announced_row(f, fields)
    for row in rows.get(row_key, ()) if row_key else ():
        column = fields.trade_no_columns.get(fields.tables.entry(row.schema, row.table) or row.qualified_table)
        if column and row.row.get(column) is not None:
            trades.add(key_text(row.row[column]))
    return trades, orders


def _orders_of(trade_no: str, fields: Fields, rows: Rows) -> set[str]:
    """The orders named by the stored rows of a trade_no in a table that holds both (the payments)."""
    out = set()
    for row in rows.get(f"trade_no:{trade_no}", ()):
        table = fields.tables.entry(row.schema, row.table) or row.qualified_table
        columns = fields.order_columns.get(table)
        order = key_of(row.row, columns) if columns and table in fields.trade_no_columns else None
        if order is not None:
            out.add(key_text(order))
    return out


def wanted(findings: Iterable[Finding], rows: Rows, fields: Fields = Fields()) -> set[str]:
    """The entity keys whose stored rows would join more of these findings (the announced rows
    named by key, the payments of each trade_no), less those already in `rows`. The page asks the
    store twice: the second time for the trade_nos the first rows revealed."""
    keys = set()
    for f in findings:
        row_key = _announced_row(f, fields)
        if row_key:
            keys.add(row_key)
        keys.update(f"trade_no:{t}" for t in _named(f, fields, rows)[0])
    return keys - set(rows)


def group(findings: Sequence[Finding], rows: Rows, fields: Fields = Fields()) -> list[Incident]:
    """The findings as incidents, most urgent first (open before acknowledged before ended, then
    the most recently seen); `rows` are the stored rows `wanted` asked for."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def join(a: str, b: str) -> None:
        parent[root(a)] = root(b)

    named: dict[str, list[str]] = {}
    for f in findings:
        trades, orders = _named(f, fields, rows)
        for t in trades:
            orders |= _orders_of(t, fields, rows)
        nodes = [f"trade_no:{t}" for t in sorted(trades)] + [f"order:{o}" for o in sorted(orders)]
        named[f.id] = nodes or [f"group:{f.keys['group']}" if f.keys.get("group") else f"finding:{f.id}"]
        for node in named[f.id][1:]:
            join(node, named[f.id][0])
    members: dict[str, list[Finding]] = {}
    for f in findings:
        members.setdefault(root(named[f.id][0]), []).append(f)
    incidents = []
    for parts in members.values():
        nodes = {n for f in parts for n in named[f.id]}
        kind, value = min((n.split(":", 1) for n in nodes), key=lambda kv: (NAMED_BY.index(kv[0]), kv[1]))
        incidents.append(Incident(kind, value, tuple(sorted(parts, key=lambda f: (f.first_seen, f.id)))))
    return sorted(incidents, key=lambda i: (_rank(STATUS_ORDER)(i.status), -i.last_seen, i.value))
