"""Shape changes of watched tables: which configured columns the rules read, and what a DDL did to them.

A column dropped, renamed away or retyped to something its rule cannot read (an amount that is no
longer a number) makes the rules that read it blind for that table: they say so (health,
`rule_can_judge{rule, table}`) and raise nothing about it until the shape is right again, rather than
guess (a renamed status column would otherwise turn every order.paid event into a false F8). The
other tables stay judged: a renamed orders status leaves F7 judging the shipments' announcements.
Each problem names the config key it breaks, so the fix is plain: change the column back, or the config.
Pure: the binlog collector reports the DDL with the table's columns as the server has them after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oncewatch.checks.settings import Settings
from oncewatch.core.records import SchemaChange

# information_schema DATA_TYPE values a rule can read as a number.
NUMERIC_TYPES = frozenset({"decimal", "numeric", "int", "integer", "bigint", "smallint", "mediumint", "tinyint",
                           "float", "double", "real"})


# Rules whose findings name the watched table they are about (keys "table", or "tables" for F1): a shape problem
# blinds them for that table only (checks.findings.Findings.blinded).
PER_TABLE = frozenset({"F1", "F7", "F8", "F9", "F10"})


@dataclass(frozen=True)
class Need:
    """A configured column a rule reads."""

    table: str  # schema.table
    column: str
    config_key: str  # where the config names it, e.g. "domain.payments.amount_column"
    rules: tuple[str, ...]
    numeric: bool = False


@dataclass(frozen=True)
class ShapeProblem:
    table: str
    column: str
    config_key: str
    rules: tuple[str, ...]
    what: str  # what is wrong, for people

    def to_dict(self) -> dict[str, object]:
        return {"table": self.table, "column": self.column, "config_key": self.config_key,
                "rules": list(self.rules), "what": self.what}

    @property
    def reason(self) -> str:
        return f"{self.config_key}: {self.what} ({', '.join(self.rules)} cannot judge)"


def needs(settings: Settings) -> tuple[Need, ...]:
    """Every configured column of a watched table and the rules that read it."""
    d = settings.domain
    out: list[Need] = []
    if d.orders:
        o, key = d.orders, "domain.orders"
        out += [*(Need(o.table, c, f"{key}.key_column", ("F3", "F4", "F5", "F6")) for c in o.key_columns),
                Need(o.table, o.status_column, f"{key}.status_column", ("F3", "F4", "F6"))]
        if o.amount_column:
            out.append(Need(o.table, o.amount_column, f"{key}.amount_column", ("F5",), numeric=True))
    if d.payments:
        p, key = d.payments, "domain.payments"
        out += [Need(p.table, p.trade_no_column, f"{key}.trade_no_column", ("F2", "F5", "F6")),
                *(Need(p.table, c, f"{key}.order_column", ("F2", "F5", "F6")) for c in p.order_columns),
                Need(p.table, p.status_column, f"{key}.status_column", ("F2", "F5"))]
        if p.amount_column:
            out.append(Need(p.table, p.amount_column, f"{key}.amount_column", ("F5",), numeric=True))
        if p.callback_status_column:
            out.append(Need(p.table, p.callback_status_column, f"{key}.callback_status_column", ("F6",)))
    if d.callbacks:
        c, key = d.callbacks, "domain.callbacks"
        out += [Need(c.table, c.trade_no_column, f"{key}.trade_no_column", ("F5", "F6")),
                Need(c.table, c.status_column, f"{key}.status_column", ("F5", "F6"))]
        if c.amount_column:
            out.append(Need(c.table, c.amount_column, f"{key}.amount_column", ("F5",), numeric=True))
    for i, e in enumerate(d.effects):
        out.append(Need(e.table, e.trade_no_column, f"domain.effects[{i}].trade_no_column", ("F1",)))
    announced = ("F7", "F8", "F9", "F10")
    for i, a in enumerate(settings.announce):
        out += [Need(a.table, c, f"announce[{i}].key_column", announced) for c in a.key_columns]
        if a.when_column:
            out.append(Need(a.table, a.when_column, f"announce[{i}].when_column", announced))
    return tuple(out)


def reads(wanted: Iterable[Need]) -> dict[str, list[str]]:
    """Rule -> the tables whose `wanted` columns it reads, sorted: what a shape problem may blind it for."""
    out: dict[str, set[str]] = {}
    for n in wanted:
        for rule in n.rules:
            out.setdefault(rule, set()).add(n.table)
    return {rule: sorted(tables) for rule, tables in sorted(out.items())}


def blinds(standing: Iterable[Mapping[str, Any]], read: Mapping[str, Sequence[str]]) -> dict[str, frozenset[str]]:
    """Rule -> the tables the `standing` problems (`ShapeProblem.to_dict`) blind it for, given what each rule
    reads (`reads`). A rule whose findings name their table (PER_TABLE) is blind for the broken table only; the
    others judge one fact across their tables (an order, its payments, its callbacks) and are blind for all."""
    out: dict[str, set[str]] = {}
    for p in standing:
        for rule in p["rules"]:
            tables = out.setdefault(rule, set())
            tables.add(p["table"])
            if rule not in PER_TABLE:
                tables.update(read.get(rule, ()))
    return {rule: frozenset(tables) for rule, tables in out.items()}


def problems(change: SchemaChange, wanted: Iterable[Need], entry: str | None = None) -> list[ShapeProblem]:
    """What the table's columns after `change` break among the `wanted` columns of its table; `entry`: the
    watched entry the changed table falls under, where that is a pattern (one shard of it changed)."""
    out = []
    for n in wanted:
        if n.table != (entry or change.table):
            continue
        kind = change.columns.get(n.column)
        if not change.columns:
            what = f"{change.table} is gone ({change.kind})"
        elif kind is None:
            what = f"{change.table}.{n.column} is gone (dropped or renamed)"
        elif n.numeric and kind not in NUMERIC_TYPES:
            what = f"{change.table}.{n.column} is now {kind}, not a number"
        else:
            continue
        out.append(ShapeProblem(n.table, n.column, n.config_key, n.rules, what))
    return out
