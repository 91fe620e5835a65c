"""F1 duplicate_effect: more than one effect row (shipment, pick-up code, ...) for one trade_no.

Each configured effect table is counted on its own: one shipment and one points grant for a
trade_no are two different effects, two shipments are one too many. One payment handled twice
usually duplicates every effect at once, so the finding is one per trade_no: it names each
table that has too many rows and carries all of their rows as evidence. Rows are told apart by
primary key, so an update of the same shipment is not a second one; in a table without one, each
inserted row is an effect (by its binlog coordinates) and updates add none. Deletes do not undo a
finding: the duplicate happened (and may already have been shipped).
"""

from __future__ import annotations

from collections import Counter

from oncewatch.checks.findings import Findings, row_evidence, values_of, warn_null_key
from oncewatch.checks.horizon import BINLOG, Memory
from oncewatch.core.domain import Effect
from oncewatch.core.names import key_text
from oncewatch.core.tables import is_pattern
from oncewatch.core.records import OP_DELETE, OP_INSERT, RowChange


class DuplicateEffects:
    def __init__(self, memory: Memory, findings: Findings, tables: tuple[str, ...]):
        # "table\x1ftrade_no" -> {primary key: evidence}
        self.rows = memory.aging("effects", BINLOG, spill=True)
        self.findings = findings
        self.tables = tables
        self.sharded = {t: is_pattern(t) for t in tables}

    def on_row(self, effect: Effect, change: RowChange) -> None:
        trade_no = change.row.get(effect.trade_no_column)
        if change.op == OP_DELETE:
            return
        if trade_no is None:
            warn_null_key("effect row", change.coordinates)
            return
        trade_no = key_text(trade_no)
        key = f"{effect.table}\x1f{trade_no}"
        if change.pk:
            # shards of one pattern number their rows each on its own: the real table tells them apart
            parts = (change.qualified_table, *change.pk) if self.sharded[effect.table] else change.pk
            pk = "\x1f".join(map(str, parts))
        elif change.op == OP_INSERT:
            pk = change.coordinates  # no primary key: each inserted row is an effect of its own
        else:
            return  # an update of a row without a primary key cannot be told from another row: no new effect
        rows = self.rows.get(key) or {}
        if pk not in rows:
            rows[pk] = row_evidence(change, (effect.trade_no_column,), with_id=True)
        self.rows.put(key, rows, change.commit_time)
        if len(rows) > 1:
            duplicated = {t: r for t in self.tables if len(r := self.rows.get(f"{t}\x1f{trade_no}") or {}) > 1}
            evidence = [e for _, r in sorted(duplicated.items()) for e in r.values()]
            # the summary names the real tables (a pattern's shards), the keys the configured ones
            rows_in = Counter(values_of(e)["table"] for e in evidence)
            self.findings.raise_("F1", (trade_no,), keys={"trade_no": trade_no, "tables": sorted(duplicated)},
                                 summary=f"trade_no {trade_no}: " + ", ".join(
                                     f"{n} rows in {t}" for t, n in sorted(rows_in.items())),
                                 time=change.commit_time, evidence=evidence)
