"""Trade verdicts in the store (issue 45): written forward only, idempotent, read by commit time, and counted in
totals that only grow, in SQLite and PostgreSQL alike."""

from __future__ import annotations

from decimal import Decimal

from oncewatch.core.records import VERDICT_PENDING, VERDICT_VERIFIED, VERDICT_VIOLATED, TradeVerdict
from oncewatch.store import Store, verdicts


def verdict(trade_no: str, state: str, *, at: float = 100.0, reached: float | None = 130.0, rule: str | None = None,
            amount: str | None = "12.34") -> TradeVerdict:
    return TradeVerdict(trade_no=trade_no, order_id=f"O{trade_no}", amount=None if amount is None else Decimal(amount),
                        verdict=state, rule=rule, committed_at=at, reached_at=None if state == VERDICT_PENDING
                        else reached)


def save(store: Store, *vs: TradeVerdict, within: float = 60.0) -> int:
    with store.batch() as tx:
        return verdicts.save(tx, vs, within)


def test_verdicts_move_forward_only_and_are_read_by_commit_time(store_target) -> None:
    store = Store(store_target)
    assert save(store, verdict("T2", VERDICT_PENDING, at=200.0), verdict("T1", VERDICT_PENDING)) == 2
    assert save(store, verdict("T1", VERDICT_VERIFIED)) == 1
    # the same verdict again, and a pending one after it, change nothing (a restart hands them over again)
    assert save(store, verdict("T1", VERDICT_VERIFIED), verdict("T1", VERDICT_PENDING)) == 0
    assert save(store, verdict("T1", VERDICT_VIOLATED, reached=500.0, rule="F9")) == 1
    assert save(store, verdict("T1", VERDICT_VIOLATED, reached=600.0, rule="F1")) == 0  # the first rule stays
    got = store.trade_verdicts()
    assert [v.trade_no for v in got] == ["T1", "T2"]
    t1 = got[0]
    assert (t1.verdict, t1.rule, t1.reached_at, t1.verified_at, t1.amount) == (
        VERDICT_VIOLATED, "F9", 500.0, 130.0, Decimal("12.34"))
    assert got[1].verdict == VERDICT_PENDING and got[1].reached_at is None
    assert [v.trade_no for v in store.trade_verdicts(since=150.0)] == ["T2"]
    assert [v.trade_no for v in store.trade_verdicts(until=200.0)] == ["T1"]
    assert verdicts.pending(store) == 1


def test_totals_count_each_move_once_in_exact_money(store_target) -> None:
    store = Store(store_target)
    save(store, verdict("A", VERDICT_VERIFIED, amount="0.10"), verdict("B", VERDICT_VERIFIED, amount="0.20",
                                                                          reached=200.0))
    save(store, verdict("C", VERDICT_VIOLATED, amount="1.00", rule="F2"), verdict("A", VERDICT_VERIFIED))
    save(store, verdict("A", VERDICT_VIOLATED, amount="0.10", rule="F1", reached=300.0))
    save(store, verdict("D", VERDICT_PENDING, amount=None), verdict("D", VERDICT_VERIFIED, amount=None))
    t = verdicts.totals(store)
    assert (t["verified"], t["amount_verified"], t["violated"], t["amount_violated"]) == (
        3, "0.30", {"F2": 1, "F1": 1}, "1.10")
    assert (t["late"], t["amount_late"], t["reversed"], t["amount_reversed"]) == (1, "0.20", 1, "0.10")
    # a first verdict each (A's move is no second one): 30 s, 100 s, 30 s, 30 s
    assert t["seconds"]["count"] == 4 and t["seconds"]["sum"] == 190.0
    assert store.trade_verdicts()[0].verified_at == 130.0  # A: verified, then violated
