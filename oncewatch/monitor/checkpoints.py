"""A checkpoint (docs/architecture.md §7): what the judge has applied since the last one, and the one function that
writes it into the store, in the caller's transaction.

The judge takes a checkpoint (`Checkpoint`: plain values, which cross to the store's writer process pickled) and the
store's writer writes it (`write`): the raw records read and their entity index, the findings and verdicts the engine
drained, its state delta and stats, the read positions and the states that go with them (a bootstrap under way),
and whether retention deleted entity names since the last one. Whoever writes, it is one transaction, so a kill -9
at any instant resumes from the last checkpoint with nothing lost and nothing doubled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oncewatch.core.names import ENGINE_STATS
from oncewatch.core.records import EmittedEvent, Finding, QuarantinedRecord, QuarantinedRows, RowChange, TradeVerdict
from oncewatch.monitor.entities import EntityIndex
from oncewatch.store import Batch, engine_state, reviews, verdicts


@dataclass(frozen=True)
class Checkpoint:
    rows: Sequence[Sequence[RowChange]]  # in batches as read: a reader's cross to the store's writer as they came
    binlog_quarantined: Sequence[QuarantinedRows]
    events: Sequence[Sequence[EmittedEvent]]  # likewise
    quarantined: Sequence[QuarantinedRecord]
    positions: dict[str, Any]  # checkpoint name -> the position read to
    states: dict[str, Any]  # state name -> its value, None to clear it (a bootstrap under way)
    findings: Sequence[Finding]
    verdicts: Sequence[TradeVerdict]
    delta: dict[str, Any]  # the engine's state_delta()
    stats: dict[str, Any]  # the engine's stats()
    names_pruned: bool  # retention deleted entity names since the last checkpoint: the writer's numbers of them go
    at: float  # when it was taken (reviews lapse by it)


def write(tx: Batch, cp: Checkpoint, index: EntityIndex, within_seconds: float) -> bool:
    """`cp` in `tx`; whether one of its findings is new to the store or changed its status (--until-idle waits for
    findings to settle: a standing one refreshed by the next offsets reading, F11 and F12, is no change)."""
    if cp.names_pruned:
        tx.entity_ids.clear()
    rows = [r for batch in cp.rows for r in batch]
    if rows:
        tx.add_row_changes(rows, [(i, k) for i, r in enumerate(rows) for k in index.of_row(r)])
    tx.add_binlog_quarantined(cp.binlog_quarantined)
    events = [e for batch in cp.events for e in batch]
    if events:
        tx.add_events(events, [(i, k) for i, e in enumerate(events) for k in index.of_event(e)])
    tx.add_quarantined(cp.quarantined)
    reviews.expire(tx, cp.at)
    for name, value in cp.positions.items():
        tx.set_checkpoint(name, value)
    for name, value in cp.states.items():
        if value is None:
            tx.clear_state(name)
        else:
            tx.set_state(name, value)
    changed = bool(cp.findings) and tx.status_changes(list(cp.findings))
    tx.upsert_findings(cp.findings)
    verdicts.save(tx, cp.verdicts, within_seconds)
    engine_state.save(tx, cp.delta)
    tx.set_state(ENGINE_STATS, cp.stats)
    return changed

