"""Retention and the disk budget: the store's raw records older than `store.retention_hours`, or the oldest of
them while the store is past `store.max_bytes`, pruned a slice at a time.

Row changes, Kafka events, their entity-index entries (the drill-down's way in) and the chart
series are kept for the retention; a finding keeps its own evidence for as long as it is kept,
so pruning loses no finding and no evidence. The monitor calls `prune` from its loop: each call
is one short store transaction that deletes at most `limit` of the oldest rows of each table, so
the writer is never held for long, and the file's freed pages are reused: its size levels off.
The rows pruned so far are counted in the state rows PRUNED (for the retention) and BUDGET_PRUNED
(for the budget, with when it last pruned), which /metrics shows.

Oldest first is by insertion order (row_changes.seq, the events' rowid), which follows commit and
record time; within the oldest slice only rows older than the cut-off go.
"""

from __future__ import annotations

import math

from oncewatch.store import entities
from oncewatch.store.store import Store

PRUNED = "pruned"  # state row: {"row_changes": n, "events": n, "entity_index": n, "series": n}
BUDGET_PRUNED = "budget_pruned"  # state row: the same for the budget, and "at": when it last pruned
TABLES = ("row_changes", "events", "entity_index", "series")


def prune(store: Store, before: float, limit: int = 5000, *, for_budget: bool = False, now: float = 0.0
          ) -> dict[str, int]:
    """Delete up to `limit` of the oldest row changes, events and series points stamped before `before`
    (unix time; `oldest_cut` for the budget's), with the index entries that point at them; returns what went,
    by table (all zero: nothing is older, the next call can wait). `for_budget`: counted as the budget's, at
    `now`."""
    with store.batch() as tx:
        conn = tx.conn
        seqs = conn.execute(
            "DELETE FROM row_changes WHERE seq IN (SELECT seq FROM row_changes ORDER BY seq LIMIT ?) "
            "AND commit_time < ? RETURNING seq, entities", (limit, before)).fetchall()
        rowids = conn.execute(
            "DELETE FROM events WHERE rowid IN (SELECT rowid FROM events ORDER BY rowid LIMIT ?) "
            "AND timestamp_ms < ? RETURNING rowid, entities", (limit, before * 1000)).fetchall()
        entries = entities.forget(conn, tx.entity_ids, [*seqs, *((entities.event_ref(r), n) for r, n in rowids)])
        points = conn.execute("DELETE FROM series WHERE rowid IN (SELECT rowid FROM series ORDER BY rowid LIMIT ?) "
                              "AND at < ?", (limit, before)).rowcount
        pruned = {"row_changes": len(seqs), "events": len(rowids), "entity_index": entries, "series": points}
        if any(pruned.values()):
            name = BUDGET_PRUNED if for_budget else PRUNED
            total = store.state(name, {}) or {}
            tx.set_state(name, {**{t: total.get(t, 0) + pruned[t] for t in TABLES},
                                **({"at": now} if for_budget else {})})
    return pruned


def oldest_cut(store: Store, n: int) -> float:
    """A time to prune before that takes about the `n` oldest raw records, rows and events alike: the earlier of the
    times of the n-th oldest row change and the n-th oldest event (of a quarter of a table that holds fewer than n),
    just past it. Pruning the same count of each would keep events for less time than rows (a shop writes fewer)."""
    times = [_nth_oldest(store, "SELECT commit_time FROM row_changes ORDER BY seq", "row_changes", n),
             _nth_oldest(store, "SELECT timestamp_ms / 1000.0 FROM events ORDER BY rowid", "events", n)]
    found = [t for t in times if t is not None]
    return math.nextafter(min(found), math.inf) if found else math.inf


def _nth_oldest(store: Store, oldest_first: str, table: str, n: int) -> float | None:
    row = store.conn.execute(f"{oldest_first} LIMIT 1 OFFSET ?", (n - 1,)).fetchone()
    if row is None:  # fewer than n: a small table, counted
        (count,), = store.conn.execute(f"SELECT COUNT(*) FROM {table}")
        row = store.conn.execute(f"{oldest_first} LIMIT 1 OFFSET ?", (count // 4,)).fetchone() if count else None
    return None if row is None else row[0]


def pruned_total(store: Store, *, for_budget: bool = False) -> dict[str, int]:
    """The rows pruned since the store was made, by table: for the retention, or for the budget."""
    total = store.state(BUDGET_PRUNED if for_budget else PRUNED, {}) or {}
    return {t: int(total.get(t, 0)) for t in TABLES}


def budget_pruned_at(store: Store) -> float | None:
    """When raw records were last pruned for the budget (None: never)."""
    return (store.state(BUDGET_PRUNED, {}) or {}).get("at")


__all__ = ["BUDGET_PRUNED", "PRUNED", "TABLES", "budget_pruned_at", "oldest_cut", "prune", "pruned_total"]
