"""The verdict of each trade in the store (issue 45), and the running totals /metrics counts them by.

The engine hands its verdicts over with its state (checks.verdicts); `save` writes them inside the same store
transaction as that state and the checkpoints, so a kill -9 and restart neither loses one nor judges one twice.
A verdict only moves forward (pending, then verified or violated; verified, then violated), whatever order
or how often it is handed over: a verdict written again, or an older one, changes nothing and counts nothing.

The totals (`TOTALS`, a state row) grow with each move actually written, in the same transaction, so the
counters /metrics shows from them carry on across a restart where they stood: Prometheus sees no reset, and
no burn the restart did not cause. A scrape reads one row, however many trades the table holds.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from oncewatch.core.exact_json import from_json
from oncewatch.core.records import VERDICT_PENDING, VERDICT_VERIFIED, VERDICT_VIOLATED, TradeVerdict
from oncewatch.store.batch import Batch
from oncewatch.store.codec import VERDICT_COLUMNS, verdict_from_row
from oncewatch.store.store import Store

TOTALS = "verdict_totals"  # state row: see `empty_totals`
RANK = {VERDICT_PENDING: 0, VERDICT_VERIFIED: 1, VERDICT_VIOLATED: 2}
# Upper bounds (seconds) of the commit-to-verdict histogram: a verdict waits out the rules' graces (30 s by
# default), so the bounds gather around a minute.
SECONDS_BUCKETS = (1.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
PER_STATEMENT = 200


def empty_totals() -> dict[str, Any]:
    """verified, violated (by rule), late (verified after the objective's time), reversed (verified, then
    violated): trades and their amounts (decimal text); `seconds`: the commit-to-verdict histogram."""
    return {"verified": 0, "amount_verified": "0", "violated": {}, "amount_violated": "0", "late": 0,
            "amount_late": "0", "reversed": 0, "amount_reversed": "0",
            "seconds": {"counts": [0] * (len(SECONDS_BUCKETS) + 1), "sum": 0.0, "count": 0}}


def _add(totals: dict[str, Any], name: str, amount: Decimal | None) -> None:
    if amount is not None:
        totals[f"amount_{name}"] = str(Decimal(totals[f"amount_{name}"]) + amount)


def _count(totals: dict[str, Any], old: TradeVerdict | None, new: TradeVerdict, within: float) -> None:
    """Count the move from `old` (the stored verdict) to `new`, one that goes forward."""
    if old is None or old.verdict == VERDICT_PENDING:
        seconds = (new.reached_at or new.committed_at) - new.committed_at
        h = totals["seconds"]
        h["counts"][bisect.bisect_left(SECONDS_BUCKETS, seconds)] += 1
        h["sum"] += seconds
        h["count"] += 1
    if new.verdict == VERDICT_VERIFIED:
        totals["verified"] += 1
        _add(totals, "verified", new.amount)
        if (new.reached_at or new.committed_at) - new.committed_at > within:
            totals["late"] += 1
            _add(totals, "late", new.amount)
        return
    rule = new.rule or "unknown"
    totals["violated"][rule] = totals["violated"].get(rule, 0) + 1
    _add(totals, "violated", new.amount)
    if old is not None and old.verdict == VERDICT_VERIFIED:
        totals["reversed"] += 1
        _add(totals, "reversed", new.amount)


def _stored(tx: Batch, trade_nos: list[str]) -> dict[str, TradeVerdict]:
    out: dict[str, TradeVerdict] = {}
    for i in range(0, len(trade_nos), 500):
        chunk = trade_nos[i:i + 500]
        out.update((r[0], verdict_from_row(r)) for r in tx.conn.execute(
            f"SELECT {VERDICT_COLUMNS} FROM trade_verdicts WHERE trade_no IN ({','.join('?' * len(chunk))})", chunk))
    return out


def _saved_totals(tx: Batch) -> dict[str, Any] | None:
    row = tx.conn.execute("SELECT value FROM state WHERE name = ?", (TOTALS,)).fetchone()
    return None if row is None else from_json(row[0])


def save(tx: Batch, verdicts: Iterable[TradeVerdict], within_seconds: float) -> int:
    """Write, in the order given, the verdicts that move a trade forward, inside the caller's transaction, and
    count those moves in the totals (`within_seconds`: a verification later than this after the commit is
    counted late). Returns how many moves there were."""
    verdicts = list(verdicts)
    if not verdicts:
        return 0
    stored = _stored(tx, sorted({v.trade_no for v in verdicts}))
    totals = {**empty_totals(), **(_saved_totals(tx) or {})}
    moved: dict[str, TradeVerdict] = {}
    counted = 0
    for new in verdicts:
        old = stored.get(new.trade_no)
        if old is not None and RANK[new.verdict] <= RANK[old.verdict]:
            continue
        if old is not None and old.verdict == VERDICT_VERIFIED:
            new = dataclasses.replace(new, verified_at=old.verified_at)
        elif new.verdict == VERDICT_VERIFIED:
            new = dataclasses.replace(new, verified_at=new.reached_at)
        if new.verdict != VERDICT_PENDING:
            _count(totals, old, new, within_seconds)
        stored[new.trade_no] = moved[new.trade_no] = new
        counted += 1
    rows = [(v.trade_no, v.order_id, None if v.amount is None else str(v.amount), v.verdict, v.rule, v.committed_at,
             v.reached_at, v.verified_at) for v in moved.values()]
    tx.insert_rows(f"INSERT INTO trade_verdicts ({VERDICT_COLUMNS}) VALUES ", "(?,?,?,?,?,?,?,?)", PER_STATEMENT, rows,
                   " ON CONFLICT(trade_no) DO UPDATE SET verdict = excluded.verdict, rule = excluded.rule, "
                   "reached_at = excluded.reached_at, verified_at = excluded.verified_at, "
                   "amount = COALESCE(excluded.amount, trade_verdicts.amount), "
                   "order_id = COALESCE(excluded.order_id, trade_verdicts.order_id)")
    if any(v.verdict != VERDICT_PENDING for v in moved.values()):
        tx.set_state(TOTALS, totals)
    return counted


def totals(store: Store) -> dict[str, Any]:
    """The running totals (`empty_totals` before any verdict)."""
    return {**empty_totals(), **(store.state(TOTALS) or {})}


def pending(store: Store) -> int:
    """Trades whose verdict is still to come."""
    return store.conn.execute("SELECT count(*) FROM trade_verdicts WHERE verdict = ?", (VERDICT_PENDING,)).fetchone()[0]


def share(store: Store, since: float, within_seconds: float) -> tuple[float, float, int]:
    """Of the trades committed since `since`: (money verified within `within_seconds` of its commit, money judged
    (verified or violated), trades still pending). Floats: a share to show, not money to book."""
    good, judged, pending_ = store.conn.execute(
        "SELECT COALESCE(SUM(CASE WHEN verdict = ? AND reached_at - committed_at <= ? "
        "THEN CAST(amount AS DOUBLE PRECISION) ELSE 0 END), 0), "
        "COALESCE(SUM(CASE WHEN verdict <> ? THEN CAST(amount AS DOUBLE PRECISION) ELSE 0 END), 0), "
        "COUNT(CASE WHEN verdict = ? THEN 1 END) FROM trade_verdicts WHERE committed_at >= ?",
        (VERDICT_VERIFIED, within_seconds, VERDICT_PENDING, VERDICT_PENDING, since)).fetchone()
    return float(good), float(judged), int(pending_)
