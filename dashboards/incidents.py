"""Incidents: the findings of one order (or, where no order is known, one trade_no) taken together.

A callback handled three times is one incident with its F1 part (the extra shipments) and its F9
part (the event announced twice): the SRE works the incident, the auditor still sees each finding.
Findings belong together when they name the same trade_no or order, in their keys or in the rows
and events of their evidence, directly or through the payment that links a trade_no to its order.
Pure: the page reads the findings and the trade_no -> order links from the store and passes them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from oncewatch.core import names
from oncewatch.core.config import Config
from oncewatch.core.records import Finding

# The names oncewatch itself gives these values: in finding keys (F2-F6 write order, F2 trade_nos)
# and in the keys it reads from events (order_key, trade_no).
TRADE_NO_FIELDS = frozenset({"trade_no"})
ORDER_FIELDS = frozenset({"order", "order_key"})

# Worst first: an incident is as bad as its worst part, and open while any part is.
SEVERITY_ORDER = ("critical", "warning", "info")
STATUS_ORDER = (names.OPEN, names.ACKNOWLEDGED, names.CLOSED, names.RESOLVED)


@dataclass(frozen=True)
class Fields:
    """Which value names mean a trade_no or an order: oncewatch's own, plus the shop's column names
    (rows in evidence carry the columns the rule looked at); and which announced tables are keyed
    by an order or a trade_no (F7-F10 keep the announced `key` and its `table`)."""

    trade_no: frozenset[str] = TRADE_NO_FIELDS
    order: frozenset[str] = ORDER_FIELDS
    announced: Mapping[str, str] = field(default_factory=dict)  # table -> "trade_no" | "order"

    @classmethod
    def of(cls, cfg: Config | None) -> Fields:
        if cfg is None:
            return cls()
        d = cfg.domain
        trade = {(e.table, e.trade_no_column) for e in d.effects}
        order = {(d.orders.table, d.orders.key_column)} if d.orders else set()
        if d.payments:
            trade.add((d.payments.table, d.payments.trade_no_column))
            order.add((d.payments.table, d.payments.order_column))
        announced = {a.table: kind for a in cfg.announce for kind, columns in (("trade_no", trade), ("order", order))
                     if (a.table, a.key_column) in columns}
        return cls(TRADE_NO_FIELDS | {c for _, c in trade}, ORDER_FIELDS | {c for _, c in order}, announced)


@dataclass(frozen=True)
class Incident:
    kind: str  # "order", "trade_no", or "finding" for a finding about no order or payment (F11, F12)
    value: str  # the order, the trade_no, or the finding's id
    findings: tuple[Finding, ...]  # oldest first

    @property
    def entity(self) -> str:
        """What the drill-down opens for it ('' for a finding about no order or payment)."""
        return "" if self.kind == "finding" else self.value

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
            yield from (str(v) for v in value if v is not None)
        elif value is not None:
            yield str(value)


def entities(f: Finding, fields: Fields = Fields()) -> tuple[set[str], set[str]]:
    """The trade_nos and the orders a finding names, in its keys or its evidence."""
    trades, orders = set(_values(f.keys, fields.trade_no | {"trade_nos"})), set(_values(f.keys, fields.order))
    announced = fields.announced.get(str(f.keys.get("table")))
    if announced and f.keys.get("key") is not None:
        (trades if announced == "trade_no" else orders).add(str(f.keys["key"]))
    for e in f.evidence:
        trades.update(_values(e.values, fields.trade_no))
        orders.update(_values(e.values, fields.order))
    return trades, orders


def trade_nos(findings: Iterable[Finding], fields: Fields = Fields()) -> set[str]:
    """Every trade_no the findings name: what the page asks the store to link to orders."""
    return {t for f in findings for t in entities(f, fields)[0]}


def group(findings: Sequence[Finding], order_of: Mapping[str, str], fields: Fields = Fields()) -> list[Incident]:
    """The findings as incidents, most urgent first (open before acknowledged before ended, then
    the most recently seen); `order_of` maps a trade_no to its order (store.queries.orders_of_trades)."""
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
        trades, orders = entities(f, fields)
        nodes = [f"trade_no:{t}" for t in trades] + [f"order:{o}" for o in orders]
        nodes += [f"order:{order_of[t]}" for t in trades if t in order_of]
        named[f.id] = nodes or [f"finding:{f.id}"]
        for node in named[f.id][1:]:
            join(node, named[f.id][0])
    members: dict[str, list[Finding]] = {}
    for f in findings:
        members.setdefault(root(named[f.id][0]), []).append(f)
    incidents = []
    for parts in members.values():
        nodes = {n for f in parts for n in named[f.id]}
        kind, value = min((n.split(":", 1) for n in nodes), key=lambda kv: (("order", "trade_no", "finding").index(kv[0]),
                                                                           kv[1]))
        incidents.append(Incident(kind, value, tuple(sorted(parts, key=lambda f: (f.first_seen, f.id)))))
    return sorted(incidents, key=lambda i: (_rank(STATUS_ORDER)(i.status), -i.last_seen, i.value))
