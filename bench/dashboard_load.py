"""Page-load figures of the dashboard on a store with 100,000 findings and 1,000,000 row changes.

Builds that store once (through `Store.batch()`, as the monitor writes it; kept in
artifacts/bench/ and reused while its counts match), then per page times its data queries alone
and its whole AppTest render (script + queries + elements, no browser), and prints the medians.
Usage:

    .venv/bin/python bench/dashboard_load.py [--findings 100000] [--row-changes 1000000] [--runs 5] [--rebuild]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamlit import config as st_config  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from devservices import scenario  # noqa: E402
from oncewatch.core.records import (  # noqa: E402
    CLOCK_GTID_COMMIT_TS, OP_INSERT, OP_UPDATE, EmittedEvent, Evidence, Finding, RowChange)
from oncewatch.dashboards import reports, views  # noqa: E402
from oncewatch.store import Store, queries  # noqa: E402

CHUNK = 20_000
TABLES = ("orders", "payments", "orders", "shipments", "points_grants")  # the rows one paid order makes
RULES = list(views.RULES)
DAY = 86_400.0


def build(path: Path, findings: int, row_changes: int, now: float) -> None:
    """Orders of five rows each (insert, payment, paid, shipment, points), one event per row,
    findings spread over 30 days and all rules, a day of series points every 5 s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    store = Store(str(path))
    start = now - 30 * DAY
    step = 30 * DAY / row_changes
    rng = random.Random(6)
    for base in range(0, row_changes, CHUNK):
        rows, events, row_keys, event_keys = [], [], [], []
        for i in range(base, min(base + CHUNK, row_changes)):
            order, kind = divmod(i, len(TABLES))
            at = start + i * step
            table = TABLES[kind]
            entity = f"order_key:O{order}" if table == "orders" else f"trade_no:T{order}"
            after = {"order_no": f"O{order}", "trade_no": f"T{order}", "status": "paid", "amount": "99.00"}
            rows.append(RowChange(schema="shop", table=table, op=OP_UPDATE if kind == 2 else OP_INSERT,
                                  pk=(f"{table}-{order}",),
                                  before={**after, "status": "pending"} if kind == 2 else None,
                                  after=after, txid=f"0-1-{i}", row_index=0, binlog_file="mysql-bin.000042",
                                  end_pos=4 + i * 300, commit_time=at, commit_clock=CLOCK_GTID_COMMIT_TS))
            row_keys.append((len(rows) - 1, entity))
            events.append(EmittedEvent(topic="shop.events", partition=i % 6, offset=i // 6,
                                       timestamp_ms=int((at + 0.05) * 1000), timestamp_type="CreateTime",
                                       key=f"O{order}", headers=(), payload={"type": f"{table}.changed", **after},
                                       format="json", keys={"order_key": f"O{order}", "trade_no": f"T{order}"}))
            event_keys.append((len(events) - 1, entity))
        with store.batch() as tx:
            tx.add_row_changes(rows, row_keys)
            tx.add_events(events, event_keys)
    orders = row_changes // len(TABLES)
    for base in range(0, findings, CHUNK):
        batch = []
        for n in range(base, min(base + CHUNK, findings)):
            order = rng.randrange(orders)
            at = start + rng.random() * 30 * DAY
            resolved = n % 10 >= 3  # 30 % open
            batch.append(Finding(
                id=f"bench-{n}", rule=RULES[n % len(RULES)], name=views.RULES[RULES[n % len(RULES)]],
                severity=("critical", "warning", "info")[n % 3],
                keys={"trade_no": f"T{order}", "order_key": f"O{order}"},
                summary=f"bench finding {n} on order O{order}", first_seen=at, last_seen=at + 60,
                evidence=(Evidence("row_change", f"mysql-bin.000042:{order}", at, {"order_no": f"O{order}"}),
                          Evidence("event", f"shop.events/0@{order}", at + 1, {"type": "order.paid"})),
                status="resolved" if resolved else "open", resolved_at=at + 120 if resolved else None,
                resolution="bench" if resolved else None))
        with store.batch() as tx:
            tx.upsert_findings(batch)
    with store.batch() as tx:
        points = [(name, labels, t, float(k % 50)) for k, t in enumerate(range(int(now - DAY), int(now), 5))
                  for name, labels in (("backlog", {"table": "shop.orders"}), ("backlog", {"table": "shop.shipments"}),
                                       ("delay_p99", {}), ("group_lag", {"group": "shipping-service",
                                                                         "topic": "shop.events"}))]
        tx.add_series(points)
        tx.set_state("engine_stats", scenario.ENGINE_STATS)
    scenario.write_health(store, now)
    store.close()


def counts(path: Path) -> tuple[int, int]:
    with closing(views.open_store(str(path))) as store:
        return (store.count("findings"),
                store.count("row_changes"))


def median_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def page_queries(path: Path, findings: int) -> dict[str, Callable[[], object]]:
    """Per page, what it reads on a load (the same calls the page makes)."""
    trade_no = f"T{findings // 7}"
    last_page = queries.FindingFilter()

    def with_store(fn: Callable[[Store], object]) -> Callable[[], object]:
        def run() -> object:
            with closing(views.open_store(str(path))) as store:
                return fn(store)
        return run

    def overview(store: Store) -> object:
        now = time.time()
        return (views.components(store, now), views.engine_stats(store), queries.latest(store, "delay_p99"),
                [queries.series(store, n, now - 3600) for n in ("backlog", "delay_p99", "group_lag")])

    def findings_first(store: Store) -> object:
        return queries.count_findings(store, last_page), queries.findings_page(store, last_page, 100)

    def findings_filtered(store: Store) -> object:
        flt = queries.FindingFilter(rules=("F1", "F7"), statuses=("open",), severities=("critical",))
        return queries.count_findings(store, flt), queries.findings_page(store, flt, 100)

    def findings_search(store: Store) -> object:
        flt = queries.FindingFilter(search=trade_no)
        return queries.count_findings(store, flt), queries.findings_page(store, flt, 100)

    def findings_last(store: Store) -> object:
        total = queries.count_findings(store, last_page)
        return queries.findings_page(store, last_page, 100, offset=total - 100)

    return {
        "overview": with_store(overview),
        "findings: first page": with_store(findings_first),
        "findings: rule+status+severity": with_store(findings_filtered),
        "findings: search trade_no": with_store(findings_search),
        "findings: last page": with_store(findings_last),
        "drill-down: one trade_no": with_store(lambda s: queries.timeline(s, trade_no)),
        "drift": with_store(lambda s: (views.components(s), views.engine_stats(s))),
        "reports: count": with_store(lambda s: queries.count_findings(s, queries.FindingFilter())),
    }


def render_ms(page: str, query: dict[str, str]) -> float:
    """One AppTest render of a page in a fresh session, as a new visitor gets it."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    if page != "overview":
        at.switch_page(f"dashboards/screens/{page}.py")
    for k, v in query.items():
        at.query_params[k] = v
    t0 = time.perf_counter()
    at.run()
    elapsed = (time.perf_counter() - t0) * 1000
    assert not at.exception, at.exception
    return elapsed


def render_times(config: Path, runs: int, trade_no: str) -> dict[str, float]:
    os.environ[views.ENV_CONFIG] = str(config)
    st_config.set_option("server.address", "127.0.0.1")
    pages = (("overview", {}), ("findings", {}), ("drilldown", {"q": trade_no}), ("drift", {}), ("reports", {}))
    return {page: statistics.median(render_ms(page, query) for _ in range(runs)) for page, query in pages}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--findings", type=int, default=100_000)
    p.add_argument("--row-changes", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--rebuild", action="store_true")
    args = p.parse_args()
    path = ROOT / "artifacts" / "bench" / f"dashboard-{args.findings}-{args.row_changes}.db"
    if args.rebuild or not path.exists() or counts(path) != (args.findings, args.row_changes):
        t0 = time.perf_counter()
        build(path, args.findings, args.row_changes, time.time())
        print(f"built {path.name} in {time.perf_counter() - t0:.0f} s ({path.stat().st_size / 2**20:.0f} MiB)")
    else:
        with closing(Store(str(path))) as store:  # fresh health, so the pages do not call the monitor stale
            scenario.write_health(store, time.time())
    config = path.with_suffix(".toml")
    config.write_text(f'[mysql]\nuser = "oncewatch"\ntables = ["shop.orders"]\n\n[store]\npath = "{path}"\n')

    print(f"store: {args.findings:,} findings, {args.row_changes:,} row changes; medians of {args.runs} runs")
    print(f"{'data queries of a page load':40} {'ms':>8}")
    for name, fn in page_queries(path, args.findings).items():
        print(f"{name:40} {median_ms(fn, args.runs):8.1f}")
    cfg = views.config({views.ENV_CONFIG: str(config)})
    for rule in ("F1", None):
        ms = median_ms(lambda: reports.report(cfg, "csv", rule=rule), 1)
        print(f"{'reports: CSV of ' + (rule or 'all findings') + ' (on click)':40} {ms:8.1f}")
    print(f"{'AppTest render (script + queries)':40} {'ms':>8}")
    for page, ms in render_times(config, args.runs, f"T{args.findings // 7}").items():
        print(f"{page:40} {ms:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
