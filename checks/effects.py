"""F1 duplicate_effect: more than one effect row (shipment, pick-up code, ...) for one trade_no.

Each configured effect table is counted on its own: one shipment and one points grant for a
trade_no are two different effects, two shipments are one too many. One payment handled twice
usually duplicates every effect at once, so the finding is one per trade_no: it names each
table that has too many rows and carries all of their rows as evidence. Rows are told apart by
primary key, so an update of the same shipment is not a second one; in a table without one, each
inserted row is an effect (by its binlog coordinates) and updates add none.

F1 counts the rows that exist. A deleted row no longer counts (in a table without a primary key a
delete takes away one row of its trade_no: nothing else tells them apart), and a TRUNCATE takes
away every row of its table. When that leaves no table with too many rows of the trade_no, its F1
is resolved: the fact ended, with the delete in its evidence (or the truncate named in its
resolution) and the rows that were duplicated kept, so a person still sees what happened and
may have been shipped. The same trade_no duplicated again opens the same finding again.

A truncate is not walked through the rows it empties (they may be in the store's cold tier):
each row keeps how many truncates of its real table (a shard, for a pattern) had been seen when
it was written, the engine counts them, and a row of an older count is gone. The trade_nos with
an F1 still open are kept apart, in memory, for the truncate to end theirs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from oncewatch.checks.findings import EvidenceItem, Findings, finding_id, row_evidence, values_of, warn_null_key
from oncewatch.checks.horizon import BINLOG, Memory
from oncewatch.core.domain import Effect
from oncewatch.core.names import key_text
from oncewatch.core.records import OP_DELETE, OP_INSERT, RowChange
from oncewatch.core.tables import is_pattern

Rows = dict[str, list[Any]]  # primary key -> [truncates of its table seen when written, evidence]


class DuplicateEffects:
    def __init__(self, memory: Memory, findings: Findings, tables: tuple[str, ...], truncates: dict[str, int]):
        """`truncates`: real table -> TRUNCATEs of it seen, which the engine counts."""
        # "table\x1ftrade_no" -> Rows
        self.rows = memory.aging("effects", BINLOG, spill=True)
        # trade_no -> the real tables of its duplicated rows, while its F1 stands
        self.duplicated = memory.aging("duplicated_effects", BINLOG)
        self.findings = findings
        self.tables = tables
        self.sharded = {t: is_pattern(t) for t in tables}
        self.truncates = truncates

    def on_row(self, effect: Effect, change: RowChange) -> None:
        trade_no = change.row.get(effect.trade_no_column)
        if trade_no is None:
            if change.op != OP_DELETE:  # a row without one was never counted: its delete takes nothing away
                warn_null_key("effect row", change.coordinates)
            return
        trade_no = key_text(trade_no)
        key = f"{effect.table}\x1f{trade_no}"
        rows = self._rows(key)
        if change.op == OP_DELETE:
            self._deleted(effect, key, trade_no, rows, change)
            return
        if change.pk:
            pk = self._pk(effect, change)
        elif change.op == OP_INSERT:
            pk = change.coordinates  # no primary key: each inserted row is an effect of its own
        else:
            return  # an update of a row without a primary key cannot be told from another row: no new effect
        if pk not in rows:
            rows[pk] = [self.truncates.get(change.qualified_table, 0),
                        row_evidence(change, (effect.trade_no_column,), with_id=True)]
        self.rows.put(key, rows, change.commit_time)
        if len(rows) > 1:
            self._judge(trade_no, change.commit_time)

    def count(self, table: str, trade_no: str) -> int:
        """The rows of `trade_no` that exist in the effect table `table` (a configured entry)."""
        return len(self._rows(f"{table}\x1f{trade_no}"))

    def truncated(self, table: str, at: float, where: str) -> None:
        """Every row of `table` (a real table) is gone, the engine has counted it: the F1s that stood on its rows
        end, unless their trade_no still has too many rows elsewhere."""
        for trade_no in [t for t, (_, tables) in self.duplicated.items.items() if table in tables]:
            self._judge(trade_no, at, ended=f"{table} truncated at {where}")

    def _pk(self, effect: Effect, change: RowChange) -> str:
        # shards of one pattern number their rows each on its own: the real table tells them apart
        parts = (change.qualified_table, *change.pk) if self.sharded[effect.table] else change.pk
        return "\x1f".join(map(str, parts))

    def _rows(self, key: str) -> Rows:
        """The rows of `key` that exist: those written since the last truncate of their table."""
        rows = self.rows.get(key) or {}
        if not self.truncates:
            return rows
        return {pk: r for pk, r in rows.items() if r[0] == self.truncates.get(values_of(r[1])["table"], 0)}

    def _deleted(self, effect: Effect, key: str, trade_no: str, rows: Rows, change: RowChange) -> None:
        if change.pk:
            pk = self._pk(effect, change)
        else:  # rows without a primary key differ by nothing but their count: one of its table's goes
            pk = next((p for p, r in rows.items() if values_of(r[1])["table"] == change.qualified_table), None)
        if pk not in rows:
            return  # a row written before the monitor's watch, or fallen off the horizon: it was never counted
        del rows[pk]
        if rows:
            self.rows.put(key, rows, change.commit_time)
        else:
            self.rows.pop(key)
        if change.qualified_table in (self.duplicated.get(trade_no) or ()):  # a row its F1 stands on
            where = f"{change.qualified_table} row deleted at {change.coordinates}"
            self._judge(trade_no, change.commit_time, ended=where,
                        evidence=[row_evidence(change, (effect.trade_no_column,), with_id=True)])

    def _judge(self, trade_no: str, time: float, *, ended: str = "",
               evidence: Iterable[EvidenceItem] = ()) -> None:
        """The F1 of `trade_no` as its rows now stand, `evidence` added: raised (or updated) while a table has
        too many; resolved, `ended` saying why, once none has."""
        duplicated = {t: r for t in self.tables if len(r := self._rows(f"{t}\x1f{trade_no}")) > 1}
        if not duplicated:
            self.duplicated.pop(trade_no)
            old = self.findings.get(finding_id("F1", trade_no))
            if old is not None:
                self.findings.resolve(old.id, time, ended, evidence)
            return
        items = [r[1] for _, rows in sorted(duplicated.items()) for r in rows.values()]
        # the summary names the real tables (a pattern's shards), the keys the configured ones
        rows_in = Counter(values_of(e)["table"] for e in items)
        found = self.findings.raise_("F1", (trade_no,), keys={"trade_no": trade_no, "tables": sorted(duplicated)},
                                     summary=f"trade_no {trade_no}: " + ", ".join(
                                         f"{n} rows in {t}" for t, n in sorted(rows_in.items())),
                                     time=time, evidence=[*items, *evidence])
        if found is not None:
            self.duplicated.put(trade_no, sorted(rows_in), time)
