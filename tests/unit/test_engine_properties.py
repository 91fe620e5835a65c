"""Any interleaving of the same changes and events, with timer ticks and restarts anywhere, gives the same findings.

A scenario is a handful of orders, each with some faults (lost, late, duplicated, early,
phantom events; stuck, double-charged, mis-priced orders; duplicate shipments, one of them
deleted again; duplicate points grants, their table truncated after them; illegal
transitions), some of them paid, refunded and paid again (one key announced by two changes;
the second event on time, lost, late or early). The binlog is one ordered stream; Kafka is
two partitions, each in timestamp order. Hypothesis picks how the three streams interleave
(so an event may be read before its change, the first pair's or the second's), where the
timer runs and where the monitor restarts (state through JSON into a fresh engine, saved
whole or as deltas taken at chosen checkpoints). The timer's clocks are what
the monitor loop would pass: the newest commit read (or the end, once all is read) and the
Kafka watermark of `oncewatch.checks.clocks`, the production function.

The same holds when the engine keeps almost none of its spillable state in memory (the rest in
a real store, saved at each checkpoint and read back on a miss) and when every transaction of
several rows comes as one fragment per row, as the binlog collector hands on a transaction too
large to hold.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devservices.samples import Shop, deleted, grant, order, payment, shipment, shop_settings
from oncewatch.checks.clocks import kafka_watermark
from oncewatch.checks.engine import Engine, merge_delta
from oncewatch.core.exact_json import from_json, to_json
from oncewatch.core.records import Finding, PartitionStatus, Transaction
from oncewatch.store import Store, engine_state

T = 10_000.0
FAULTS = ("lost", "late", "late_in_grace", "duplicate", "conflicting", "early", "very_early", "phantom", "stuck",
          "double_charge", "mispriced", "bad_callback", "illegal", "duplicate_shipment", "shipment_deleted",
          "grants_truncated")
TRUNCATE_GRANTS = "TRUNCATE"  # in place of a transaction's rows: a TRUNCATE of the points grants
# order.paid arrives this long after its commit (default 0.2 s)
DELAYS = {"late": 45.0, "late_in_grace": 12.0, "early": -4.0, "very_early": -45.0}
SETTINGS = shop_settings()


@dataclass(frozen=True)
class Plan:
    """One order of a scenario: its faults and when things happen (seconds after T)."""

    faults: frozenset[str]
    start: int = 0
    pay_after: int = 3
    phantom_after: int = 10
    # refunded this long after it was paid, and paid again as long after that (refunded -> paid is
    # one more F4 under examples/shop.toml)
    repay_after: int | None = None
    repay_delay: float | None = 0.2  # the second order.paid arrives this long after its commit; None: lost


def build(plans: list[Plan]):
    """Returns (transactions in binlog order, [events of partition 0, events of partition 1], end time)."""
    txs: list[tuple[float, tuple]] = []
    events: list[tuple[int, float, str, dict]] = []
    for i, plan in enumerate(plans):
        faults, o, t, p = plan.faults, f"O{i}", f"T{i}", i % 2
        start = T + plan.start + i
        txs.append((start, (order(o, "pending"),)))
        if "phantom" in faults:
            events.append((p, start + plan.phantom_after, "order.paid", {"order_no": f"{o}x"}))
        if "stuck" in faults:
            continue
        at = start + plan.pay_after
        amount = "9.00" if "mispriced" in faults else "10.00"
        callback = "SUCCESS" if "bad_callback" in faults else "success"
        txs.append((at, (payment(t, o, "success", amount=amount, callback=callback), order(o, "paid", was="pending"))))
        if "double_charge" in faults:
            txs.append((at + 1, (payment(f"{t}b", o, "success"),)))
        if "illegal" in faults:
            txs.append((at + 2, (order(o, "closed", was="paid"),)))
        delay = next((DELAYS[f] for f in sorted(faults) if f in DELAYS), 0.2)
        if "lost" not in faults:
            events.append((p, at + delay, "order.paid", {"order_no": o, "amount": "10.00"}))
            if faults & {"duplicate", "conflicting"}:
                events.append((p, at + delay + 1, "order.paid",
                               {"order_no": o, "amount": "11.00" if "conflicting" in faults else "10.00"}))
        if plan.repay_after is not None:
            refund, repay = at + plan.repay_after, at + 2 * plan.repay_after
            txs += [(refund, (order(o, "refunded", was="paid"),)), (repay, (order(o, "paid", was="refunded"),))]
            events.append((p, refund + 0.2, "order.refunded", {"order_no": o}))
            if plan.repay_delay is not None:  # another payment: its payload differs from the first one's
                events.append((p, repay + plan.repay_delay, "order.paid",
                               {"order_no": o, "amount": "10.00", "trade_no": f"{t}r"}))
        shipments = [f"S{i}", f"S{i}b"] if faults & {"duplicate_shipment", "shipment_deleted"} else [f"S{i}"]
        for j, s in enumerate(shipments):
            txs.append((at + 3 + j, (shipment(s, t),)))
            events.append((1 - p, at + 3.1 + j, "shipment.created", {"entity_id": s, "trade_no": t}))
        if "shipment_deleted" in faults:
            txs.append((at + 5, (deleted(shipment(f"S{i}b", t)),)))
        if "grants_truncated" in faults:  # the only grants: the truncate takes no other scenario's rows away
            for j, g in enumerate((f"G{i}", f"G{i}b")):
                txs.append((at + 3 + j, (grant(g, t),)))
                events.append((p, at + 3.1 + j, "points.granted", {"entity_id": g, "trade_no": t}))
            txs.append((at + 6, TRUNCATE_GRANTS))
    shop = Shop()
    binlog = [shop.truncate(at, "shop.points_grants") if rows == TRUNCATE_GRANTS else shop.tx(at, *rows)
              for at, rows in sorted(txs, key=lambda x: x[0])]
    partitions = [[shop.event(kind, at, partition=p, **fields)
                   for q, at, kind, fields in sorted(events, key=lambda x: x[1]) if q == p] for p in (0, 1)]
    end = max([tx.commit_time for tx in binlog] + [e.timestamp_ms / 1000 for p in partitions for e in p]) + 2000
    return binlog, partitions, end


plans = st.lists(st.builds(Plan, faults=st.frozensets(st.sampled_from(FAULTS), max_size=3),
                           start=st.integers(0, 50), pay_after=st.sampled_from([3, 600, 950]),
                           phantom_after=st.integers(1, 60), repay_after=st.none() | st.sampled_from([2, 20, 200]),
                           repay_delay=st.none() | st.sampled_from([0.2, -4.0, 12.0, 45.0, -45.0])),
                 min_size=1, max_size=4)


def clocks(binlog, partitions, end, read: list[int]) -> tuple[float, float]:
    """The timer's clocks once `read` (per stream: the binlog, each partition) has been read and applied."""
    binlog_time = end if read[0] == len(binlog) else (binlog[read[0] - 1].commit_time if read[0] else T - 1)
    # The monitor's own Kafka clock: each partition's whole length is known from the start (learned
    # at `end`), what has been read of it is applied.
    status = [PartitionStatus("t", i, read[i + 1], len(p), end) for i, p in enumerate(partitions)]
    applied = {s.key: s.position for s in status}
    newest = {s.key: partitions[s.partition][s.position - 1].timestamp_ms for s in status if s.position}
    return binlog_time, kafka_watermark(status, applied, newest, T - 1)


def run(binlog, partitions, end, order_of_streams, ticks=frozenset(), restarts=frozenset(),
        checkpoints: frozenset[int] | None = None, spill: int | None = None) -> dict[str, tuple]:
    """Feed the streams in the given interleaving; returns what a store would hold (upserted by id).

    A restart saves `state()` whole, or, with `checkpoints`, the `state_delta()`s taken at
    those steps and at the restart, merged the way a store would keep them. With `spill`, the
    deltas go into a real store instead, the engine keeps `spill` entries of each spillable space
    in memory and the rest in that store, and a restart restores from it as the monitor does."""
    cold = Store(":memory:") if spill is not None else None

    def new_engine() -> Engine:
        engine = Engine(SETTINGS)
        if cold is not None:
            engine.memory.spill_to(engine_state.ColdEntries(cold), spill)
        return engine

    engine, store, saved = new_engine(), {}, None
    streams = [binlog, *partitions]
    read = [0, 0, 0]

    for step, stream in enumerate(order_of_streams):
        item = streams[stream][read[stream]]
        read[stream] += 1
        if stream == 0:
            engine.on_transaction(item)
        else:
            engine.on_events([item])
        if step in ticks:
            binlog_time, kafka_time = clocks(binlog, partitions, end, read)
            engine.tick(now=max(binlog_time, kafka_time), binlog_time=binlog_time, kafka_time=kafka_time)
        if cold is not None and (step in checkpoints or step in restarts):
            with cold.batch() as tx:
                engine_state.save(tx, engine.state_delta())
        elif checkpoints is not None and (step in checkpoints or step in restarts):
            saved = merge_delta(saved, from_json(to_json(engine.state_delta())))
        if step in restarts:
            if cold is not None:
                state = engine_state.load(cold, engine.memory.hot_limits())
            else:
                state = saved if checkpoints is not None else from_json(to_json(engine.state()))
            engine = new_engine()
            engine.restore(state)
        store.update({f.id: f for f in engine.drain()})
        kept = dict(engine.announcements.backlog)  # the running count is what a restore would count
        engine.announcements.recount()
        assert engine.announcements.backlog == kept
    engine.tick(now=end, binlog_time=end, kafka_time=end)
    store.update({f.id: f for f in engine.drain()})
    return {fid: summary(f) for fid, f in store.items()}


def summary(f: Finding) -> tuple:
    return f.rule, f.status, f.severity, f.first_seen, f.resolved_at


@st.composite
def runs(draw):
    chosen = draw(plans)
    binlog, partitions, _ = build(chosen)
    order_of_streams = draw(st.permutations(straight(binlog, partitions)))
    steps = st.frozensets(st.integers(0, len(order_of_streams) - 1))
    return chosen, order_of_streams, draw(steps), draw(steps), draw(st.none() | steps)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_any_interleaving_ticks_and_restarts_give_the_same_findings(case):
    chosen, order_of_streams, ticks, restarts, checkpoints = case
    binlog, partitions, end = build(chosen)
    reference = run(binlog, partitions, end, straight(binlog, partitions))
    assert run(binlog, partitions, end, order_of_streams, ticks, restarts, checkpoints) == reference


def straight(binlog, partitions) -> list[int]:
    return [0] * len(binlog) + [1] * len(partitions[0]) + [2] * len(partitions[1])


def test_the_scenarios_cover_every_outcome_of_f1_to_f10():
    """The property is only as good as its scenarios: with every fault once, every outcome shows."""
    binlog, partitions, end = build([Plan(frozenset([f]), pay_after=950 if f in ("late", "very_early") else 3)
                                     for f in FAULTS])
    seen = {f"{rule}:{status}:{severity}"
            for rule, status, severity, *_ in run(binlog, partitions, end, straight(binlog, partitions)).values()}
    assert seen == {"F1:open:critical", "F1:resolved:critical", "F2:open:critical", "F3:open:warning",
                    "F3:resolved:warning", "F4:open:critical", "F5:open:critical", "F6:open:warning", "F7:open:critical",
                    "F7:resolved:critical", "F8:open:critical", "F8:resolved:critical", "F9:open:info",
                    "F9:open:critical", "F10:open:warning"}


def fragments(tx: Transaction) -> list[Transaction]:
    """`tx` one row at a time, as the collector hands on a transaction larger than it holds."""
    if len(tx.rows) < 2:
        return [tx]
    last = len(tx.rows) - 1
    return [dataclasses.replace(tx, rows=(row,), complete=i == last) for i, row in enumerate(tx.rows)]


@st.composite
def spilled_runs(draw):
    chosen = draw(plans)
    binlog, partitions, _ = build(chosen)
    order_of_streams = draw(st.permutations(straight(binlog, partitions)))
    fragmented = draw(st.booleans())
    if fragmented:  # each binlog step becomes as many steps as the transaction has fragments
        sizes = iter(len(fragments(tx)) for tx in binlog)
        order_of_streams = [s for stream in order_of_streams for s in ([0] * next(sizes) if stream == 0 else [stream])]
    steps = st.frozensets(st.integers(0, len(order_of_streams) - 1))
    return chosen, fragmented, order_of_streams, draw(steps), draw(steps), draw(steps), draw(st.integers(0, 3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spilled_runs())
def test_spilled_state_and_fragmented_transactions_give_the_same_findings(case):
    chosen, fragmented, order_of_streams, ticks, restarts, checkpoints, hot = case
    binlog, partitions, end = build(chosen)
    reference = run(binlog, partitions, end, straight(binlog, partitions))
    if fragmented:
        binlog = [f for tx in binlog for f in fragments(tx)]
    assert run(binlog, partitions, end, order_of_streams, ticks, restarts, checkpoints, spill=hot) == reference


def test_spilled_runs_really_read_back_from_the_store_and_f6_spans_fragments(monkeypatch):
    """The property above is only as good as its runs: with one entry in memory, entries are read back
    from the store, and the bad callback is found across the fragments of its transaction."""
    binlog, partitions, end = build([Plan(frozenset([f])) for f in ("bad_callback", "duplicate_shipment",
                                                                     "double_charge", "mispriced")])
    reference = run(binlog, partitions, end, straight(binlog, partitions))
    fragmented = [f for tx in binlog for f in fragments(tx)]
    order_of_streams = [0] * len(fragmented) + [1] * len(partitions[0]) + [2] * len(partitions[1])
    every_step = frozenset(range(len(order_of_streams)))
    reads = []
    original = engine_state.ColdEntries.get

    def counted(self, space, key):
        found = original(self, space, key)
        reads.append(found is not None)
        return found

    monkeypatch.setattr(engine_state.ColdEntries, "get", counted)
    result = run(fragmented, partitions, end, order_of_streams, frozenset(), frozenset(), every_step, spill=0)
    assert result == reference
    assert any(reads), "no entry was read back from the store"
    assert {"F1", "F2", "F5", "F6"} <= {rule for rule, *_ in result.values()}
