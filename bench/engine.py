"""Records/s through the checks engine alone (no servers), and its memory as the run grows.

Synthetic shop traffic (checks.samples, examples/shop.toml): per order a pending insert, a
payment + paid update, a shipment, and the order.paid / shipment.created events, read in time
order, with a few faults (lost, late and duplicated events, duplicate shipments, double
charges). Orders arrive every `--gap` seconds of stream time; with the bench's horizon of
`--horizon` seconds the open state reaches its steady size early, so memory must stay flat.
The timer ticks and findings are drained every 1,000 records, as the monitor loop would.

Records are built in chunks ahead of timing; only the engine's work is timed, as CPU time
of this process (records/s on one core, less disturbed by other load on the machine; wall
time is printed too). Printed at 250k, 500k and 1M records: records/s so far, peak RSS of
the process, open state entries held, findings so far. `--writer` times the judge's whole path instead: the
same records through the monitor's `Writer.apply` (the engine and its checkpoints into a SQLite store), the CPU
of the process a record (issue 44's target: >= 25,000 records per CPU-second of the judge). Every tick also takes a
`state_delta()` through `to_json`, as a checkpoint would (timed apart: its mean is printed),
and the run ends with the cost of one whole `state()`. `--bare` adds the floor: the same
records through a loop that only reads one attribute of each; `--process` has the checkpoints written by a process
of their own (`[store] writer = "process"`), whose CPU is printed apart. Every mode runs under the monitor's
garbage-collector settings (`oncewatch.monitor.tune_gc`, as `oncewatch run` sets them): under Python's defaults a
full collection walks the engine's state, and the records built ahead of timing, every few seconds. Target: >=
50,000 records/s on one core, memory flat. Usage:

    .venv/bin/python bench/engine.py [--records 1000000] [--gap 0.05] [--horizon 1800] [--bare] [--writer [--process]]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import resource
import sys
import tempfile
import time
from operator import itemgetter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devservices.samples import EXAMPLE_CONFIG, Shop, order, payment, shipment, shop_settings  # noqa: E402
from oncewatch.checks.engine import Engine  # noqa: E402
from oncewatch.collectors.kafka_events import EventBatch  # noqa: E402
from oncewatch.core import logs  # noqa: E402
from oncewatch.core.config import load  # noqa: E402
from oncewatch.core.exact_json import to_json  # noqa: E402
from oncewatch.core.names import partition_key  # noqa: E402
from oncewatch.core.records import EmittedEvent, Transaction  # noqa: E402
from oncewatch.monitor.entities import EntityIndex  # noqa: E402
from oncewatch.core import forkserver  # noqa: E402
from oncewatch.monitor.garbage import tune_gc  # noqa: E402
from oncewatch.monitor.loop import BATCH_RECORDS  # noqa: E402
from oncewatch.monitor.remote import process_cpu_seconds  # noqa: E402
from oncewatch.monitor.saver import ProcessSaver  # noqa: E402
from oncewatch.monitor.writer import Writer  # noqa: E402
from oncewatch.store import Store  # noqa: E402

T0 = 1_700_000_000.0
CHUNK_ORDERS = 100  # about 600 records: a batch as the collectors hand them on
REPORT_AT = (250_000, 500_000, 1_000_000)
TICK_EVERY = 1_000


def traffic(shop: Shop, first: int, count: int, gap: float, rng: random.Random) -> list[Transaction | EmittedEvent]:
    """`count` orders from order number `first` on, as the monitor would read them: in time order."""
    txs: list[tuple[float, tuple]] = []
    events: list[tuple[float, str, dict, int]] = []
    for i in range(first, first + count):
        o, t, s = f"O{i}", f"T{i}", f"S{i}"
        start = T0 + i * gap
        fault = rng.random()
        txs += [(start, (order(o, "pending"),)),
                (start + 3, (payment(t, o, "success"), order(o, "paid", was="pending"))),
                (start + 4, (shipment(s, t),))]
        if fault < 0.002:
            txs.append((start + 5, (shipment(f"{s}b", t),)))
        elif fault < 0.004:
            txs.append((start + 5, (payment(f"{t}b", o, "success"),)))
        delay = 45.0 if 0.004 <= fault < 0.006 else rng.uniform(0.005, 0.3)
        if not 0.006 <= fault < 0.008:
            events.append((start + 3 + delay, "order.paid", {"order_no": o}, i % 3))
        events.append((start + 4 + delay, "shipment.created", {"entity_id": s, "trade_no": t}, i % 3))
        if fault >= 0.99:
            events.append((start + 4.5 + delay, "shipment.created", {"entity_id": s, "trade_no": t}, i % 3))
    by_time = itemgetter(0)
    timed = [(at, 0, shop.tx(at, *rows)) for at, rows in sorted(txs, key=by_time)]
    timed += [(at, 1, shop.event(kind, at, partition=p, **fields)) for at, kind, fields, p in sorted(events, key=by_time)]
    return [r for _, _, r in sorted(timed, key=itemgetter(0, 1))]


def size(r: Transaction | EmittedEvent) -> int:
    return len(r.rows) if isinstance(r, Transaction) else 1


def chunks(records_wanted: int, gap: float):
    """The same synthetic records for every run: chunks of records, built ahead of timing."""
    shop, rng = Shop(), random.Random(7)
    first, made = 0, 0
    while made < records_wanted:
        chunk = traffic(shop, first, CHUNK_ORDERS, gap, rng)
        first += CHUNK_ORDERS
        made += sum(map(size, chunk))
        yield chunk


def run_engine(records_wanted: int, gap: float, horizon: float) -> None:
    engine = Engine(shop_settings(horizon_seconds=horizon))
    done, busy, wall, next_tick, reports = 0, 0.0, 0.0, TICK_EVERY, list(REPORT_AT)
    deltas, delta_cpu, delta_bytes = 0, 0.0, 0
    binlog_time = kafka_time = T0
    print(f"{'records':>9} {'records/s':>10} {'(wall)':>10} {'peak RSS MiB':>13} {'state entries':>14} "
          f"{'findings':>9}")
    for chunk in chunks(records_wanted, gap):
        t0, w0 = time.process_time(), time.perf_counter()
        for r in chunk:
            if isinstance(r, Transaction):
                engine.on_transaction(r)
                binlog_time = r.commit_time
            else:
                engine.on_events((r,))
                kafka_time = r.timestamp_ms / 1000
            done += size(r)
            if done >= next_tick:
                next_tick += TICK_EVERY
                # the Kafka watermark trails the newest event read a little (three partitions)
                engine.tick(now=binlog_time, binlog_time=binlog_time, kafka_time=kafka_time - 1.0)
                engine.drain()
                engine.drain_verdicts()
                c0, d0 = time.process_time(), time.perf_counter()
                delta_bytes += len(to_json(engine.state_delta()))
                spent = time.process_time() - c0
                deltas, delta_cpu = deltas + 1, delta_cpu + spent
                t0, w0 = t0 + spent, w0 + time.perf_counter() - d0  # a checkpoint's cost is reported apart
            if reports and done >= reports[0]:
                busy, wall = busy + time.process_time() - t0, wall + time.perf_counter() - w0
                found = sum(engine.stats()["found_total"].values())
                print(f"{done:>9,} {done / busy:>10,.0f} {done / wall:>10,.0f} {rss_mib():>13.1f} "
                      f"{engine.memory.held():>14,} {found:>9,}", flush=True)
                reports.pop(0)
                t0, w0 = time.process_time(), time.perf_counter()
        busy, wall = busy + time.process_time() - t0, wall + time.perf_counter() - w0
    t0 = time.process_time()
    saved = to_json(engine.state())
    stats = engine.stats()
    print(f"state_delta() + to_json per tick: {delta_cpu / deltas * 1000:.1f} ms CPU, "
          f"{delta_bytes / deltas / 1024:.0f} KiB (mean of {deltas:,})")
    print(f"state() + to_json at the end: {time.process_time() - t0:.2f}s CPU, {len(saved) / 2**20:.1f} MiB")
    print(f"found: {stats['found_total']}; horizon dropped: {stats['horizon_dropped_total']:,}")


def writer_batches(records_wanted: int, gap: float) -> list[list[Transaction | EventBatch]]:
    """The same records as the monitor's loop hands them to its writer: batches of BATCH_RECORDS, each event
    run one poll's `EventBatch`."""
    batches: list[list[Transaction | EventBatch]] = [[]]
    size_now = 0
    for chunk in chunks(records_wanted, gap):
        for r in chunk:
            batch = batches[-1]
            if isinstance(r, Transaction):
                batch.append(r)
            elif batch and isinstance(batch[-1], EventBatch):
                last = batch[-1]
                batch[-1] = EventBatch((*last.events, r), (), {**last.positions, partition_key(r.topic, r.partition):
                                                               r.offset + 1}, True)
            else:
                batch.append(EventBatch((r,), (), {partition_key(r.topic, r.partition): r.offset + 1}, True))
            size_now += size(r)
            if size_now >= BATCH_RECORDS:
                batches.append([])
                size_now = 0
    return batches


def run_writer(records_wanted: int, gap: float, horizon: float, process: bool) -> None:
    """The judge's whole path, servers aside: the records through `Writer.apply` (the engine, its checkpoints
    into a SQLite store) as `oncewatch run` commits them; the clocks are the streams' (not the host's)."""
    batches = writer_batches(records_wanted, gap)
    records = sum(size(i) if isinstance(i, Transaction) else len(i.events) for batch in batches for i in batch)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load(EXAMPLE_CONFIG)
        cfg = dataclasses.replace(cfg, store=dataclasses.replace(cfg.store, path=f"{tmp}/store.db"))
        settings = shop_settings(horizon_seconds=horizon)
        store = Store(cfg.store.path)
        saver = ProcessSaver(cfg) if process else None
        writer = Writer(cfg, store, Engine(settings), EntityIndex(settings), saver)
        writer.restore()
        forkserver.start()
        writer.saver.start()
        p = writer.progress

        def tick(_partitions: object) -> None:
            kafka_time = max(p.newest_event_ms.values(), default=0) / 1000 - 1.0  # a little behind, as in run_engine
            writer.engine.tick(p.binlog_time, p.binlog_time, kafka_time)

        writer._tick = tick  # type: ignore[method-assign]
        t0, w0 = time.process_time(), time.perf_counter()
        for batch in batches:
            writer.apply(batch, None)
        writer.checkpoint()
        busy, wall = time.process_time() - t0, time.perf_counter() - w0
        saving = process_cpu_seconds(writer.saver.pid) if writer.saver.pid is not None else None
        writer.saver.stop()
        store.close()
    apart = "" if saving is None else (f"; the store's writer process {saving:.2f} s CPU "
                                        f"({saving / records * 1e6:.1f} us a record)")
    judge = "engine; the store written apart" if process else "engine and SQLite store"
    print(f"judge ({judge}): {records:,} records, "
          f"{busy:.2f} s CPU ({busy / records * 1e6:.1f} us a record, {records / busy:,.0f} per CPU-second; target >= "
          f"25,000), {records / wall:,.0f} records/s wall{apart}")


def run_bare(records_wanted: int, gap: float) -> None:
    done, busy = 0, 0.0
    for chunk in chunks(records_wanted, gap):
        t0 = time.process_time()
        for r in chunk:
            done += len(r.rows) if isinstance(r, Transaction) else r.offset * 0 + 1
        busy += time.process_time() - t0
    print(f"bare loop (type test + one attribute per record): {done / busy:,.0f} records/s")


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--gap", type=float, default=0.05, help="seconds of stream time between orders")
    p.add_argument("--horizon", type=float, default=1800.0, help="rules.horizon_seconds for the run")
    p.add_argument("--bare", action="store_true", help="also time the bare loop over the same records")
    p.add_argument("--writer", action="store_true", help="time the judge's whole path instead: engine and store")
    p.add_argument("--process", action="store_true", help="with --writer: the store written by a process of its own "
                   "([store] writer = \"process\")")
    args = p.parse_args()
    logs.setup("ERROR")  # the horizon's per-minute log lines; the run ends with their total
    tune_gc()
    print(f"engine: {args.records:,} records, an order every {args.gap}s of stream time, horizon {args.horizon:g}s")
    if args.writer:
        run_writer(args.records, args.gap, args.horizon, args.process)
    else:
        run_engine(args.records, args.gap, args.horizon)
    if args.bare:
        run_bare(args.records, args.gap)


if __name__ == "__main__":
    main()
