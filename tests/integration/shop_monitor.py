"""Scoring a monitor's findings against the shop's ground truth, and a fresh shop for a recorded run.

The configs and runs themselves are in devservices.shop_monitor, shared with bench/load.py.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import new_topic, run_until_idle, shop_config, shop_settings
from oncewatch import shop
from oncewatch.core.records import VERDICT_PENDING, VERDICT_VERIFIED, VERDICT_VIOLATED, Finding
from oncewatch.shop import GroundTruth
from oncewatch.store import Store, verdicts

from .conftest import admin_connection

# --until-idle quiet time. It waits for every verdict still due of what it read (an order not yet stuck, an event
# within its grace, a skew not yet held: Engine.undecided) on its own; this is only the quiet after the last one.
IDLE = 2.0


# --until-idle of a first checkpoint (empty tables, the topics' ends): nothing to wait for but the catching up.
FIRST_IDLE = 0.5


def prepared(folder: Path, shape: str = "shop", cdc: bool = False) -> tuple[Path, str]:
    """A fresh shop of `shape` (tables, its own topic) and a monitor that has taken its first checkpoint there:
    (config, topic) for a recorded run; `cdc`: in CDC mode (devservices.shop_monitor.shop_config)."""
    topic = new_topic()
    shop.run(shop_settings(topic, shape, schema=CDC_SCHEMA if cdc else None, orders=0, reset=True))
    config = shop_config(folder, topic=topic, shape=shape, cdc=cdc)
    run_until_idle(config, idle=FIRST_IDLE)
    return config, topic


@dataclass(frozen=True)
class Score:
    found: dict[str, int]        # per fault mode: faults with a finding
    injected: dict[str, int]     # per fault mode: faults injected
    unexplained: list[Finding]   # findings no fault explains

    def table(self) -> str:
        lines = [f"{'mode':<28} {'injected':>8} {'found':>6} {'recall':>7}"]
        for mode in sorted(self.injected):
            n, f = self.injected[mode], self.found[mode]
            lines.append(f"{mode:<28} {n:>8} {f:>6} {f / n if n else 1:>7.0%}")
        lines.append(f"findings with no fault behind them: {len(self.unexplained)}")
        return "\n".join(lines)


def score(truth: GroundTruth, found: list[Finding]) -> Score:
    injected: dict[str, int] = defaultdict(int)
    hit: dict[str, int] = defaultdict(int)
    for fault in truth.faults:
        injected[fault.mode] += 1
        if any(fault.matches(f.rule, f.keys) for f in found):
            hit[fault.mode] += 1
    unexplained = [f for f in found if not truth.explains(f.rule, f.keys)]
    return Score(found={m: hit[m] for m in injected}, injected=dict(injected), unexplained=unexplained)


# A fault whose trade is exactly once all the same: the same event sent twice with equal payloads, a replay that
# F9 finds as info and the verdict per trade allows (issue 45).
BENIGN_MODES = frozenset({"send_retried"})


@dataclass(frozen=True)
class VerdictCheck:
    """A store's verdicts per trade against the shop's ground truth and its own payments table."""

    verdicts: dict[str, tuple[str, str | None]]  # trade_no -> (verdict, rule)
    problems: list[str]  # a clean trade not verified, a faulty one not violated, a success with no verdict
    sums: dict[str, tuple[Decimal, Decimal]]  # verdict -> (the store's sum, the shop's sum of the same trades)
    totals: dict[str, Any]  # store.verdicts.totals

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for verdict, rule in self.verdicts.values():
            out[f"{verdict}/{rule}" if rule else verdict] += 1
        return dict(out)


def check_verdicts(truth: GroundTruth, store_path: Path, schema: str) -> VerdictCheck:
    """Every successful payment of the shop's `payments` table (the flat shop's, in `schema`) has a verdict: violated
    when a fault of the ground truth names its order (BENIGN_MODES aside) or, by F10, when the shop itself sent an
    event of its order late (truth.late_sends); verified otherwise. The money of each verdict is summed by the store
    and, for the same trade_nos, by SQL on the shop's table."""
    faulty = {f.keys["order_no"] for f in truth.faults if f.mode not in BENIGN_MODES and "order_no" in f.keys}
    late = {f.keys["order_no"] for f in truth.late_sends}
    conn = admin_connection(schema)
    try:
        with conn.cursor() as c:
            c.execute("SELECT trade_no, order_no FROM payments WHERE status = 'success'")
            paid = dict(c.fetchall())
    finally:
        conn.close()
    store = Store(str(store_path), readonly=True)
    try:
        found = {v.trade_no: v for v in store.trade_verdicts()}
        totals = verdicts.totals(store)
    finally:
        store.close()
    problems = [f"{t} of {o}: no verdict" for t, o in sorted(paid.items()) if t not in found]
    for t, v in sorted(found.items()):
        if v.verdict == VERDICT_PENDING:
            problems.append(f"{t} of {v.order_id}: still pending")
        elif v.order_id in faulty and v.verdict != VERDICT_VIOLATED:
            problems.append(f"{t} of {v.order_id}: a fault's trade, {v.verdict}")
        elif v.order_id not in faulty and v.verdict != VERDICT_VERIFIED and not (v.rule == "F10" and v.order_id in late):
            problems.append(f"{t} of {v.order_id}: clean, {v.verdict} by {v.rule}")
    sums = {}
    conn = admin_connection(schema)
    try:
        for verdict in (VERDICT_VERIFIED, VERDICT_VIOLATED):
            trades = sorted(t for t, v in found.items() if v.verdict == verdict)
            with conn.cursor() as c:
                c.execute(f"SELECT COALESCE(SUM(amount), 0) FROM payments WHERE trade_no IN "
                          f"({','.join(['%s'] * len(trades)) or 'NULL'})", trades)
                shop_sum = c.fetchone()[0]
            sums[verdict] = (sum((found[t].amount for t in trades), Decimal(0)), Decimal(shop_sum))
    finally:
        conn.close()
    return VerdictCheck({t: (v.verdict, v.rule) for t, v in found.items()}, problems, sums, totals)
