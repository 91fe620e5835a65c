"""Rows/s of the binlog collector against a bare pymysqlreplication read loop over the same binlog.

Writes N transactions (ROWS_PER_TX rows each) into a fresh table on the dev MariaDB, then
reads them back RUNS times with each loop, alternating, and prints the medians and their
ratio (collector / bare), per CPU-second of this process (the server's work is not ours) and
per wall-second. Target (issue 16): ratio >= 2.0 per CPU-second. Usage:

    .venv/bin/python bench/binlog_ingest.py [--transactions 5000] [--rows-per-tx 4] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pymysql  # noqa: E402
from pymysqlreplication import BinLogStreamReader  # noqa: E402
from pymysqlreplication.event import MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent  # noqa: E402
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent  # noqa: E402

from devservices import base, mariadb  # noqa: E402
from oncewatch.collectors.binlog import BinlogCollector, connection_settings, library_filter  # noqa: E402
from oncewatch.core.config import parse  # noqa: E402


def write_workload(table: str, transactions: int, rows_per_tx: int) -> None:
    conn = pymysql.connect(host=base.HOST, port=base.MARIADB_PORT, user=mariadb.ADMIN_USER,
                           password=mariadb.ADMIN_PASSWORD, database="owtest")
    with conn.cursor() as c:
        c.execute(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, order_no VARCHAR(32), amount DECIMAL(12,2),"
                  " status VARCHAR(16), updated_at DATETIME(3))")
        n = 0
        for _ in range(transactions):
            c.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, 'paid', NOW(3))",
                          [(n + j, f"O{n + j}", f"{(n + j) % 1000}.99") for j in range(rows_per_tx)])
            n += rows_per_tx
            conn.commit()
    conn.close()


def rates(rows: int, wall0: float, cpu0: float) -> tuple[float, float]:
    """(rows per CPU-second, rows per wall-second) since the two clocks' readings."""
    return rows / (time.process_time() - cpu0), rows / (time.perf_counter() - wall0)


def bare_loop(cfg, start, expected: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    stream = BinLogStreamReader(connection_settings=connection_settings(cfg.mysql), server_id=cfg.mysql.server_id + 1,
                                is_mariadb=True, auto_position=start.gtid, blocking=True, resume_stream=True,
                                **library_filter(cfg.mysql),
                                only_events=[MariadbGtidEvent, XidEvent, QueryEvent, RotateEvent,
                                             WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
                                enable_logging=False)
    rows = 0
    for event in stream:
        if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
            rows += len(event.rows)
            if rows >= expected:
                break
    out = rates(rows, t0, c0)
    stream.close()
    return out


def collector_loop(cfg, start, expected: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    collector = BinlogCollector(cfg.mysql, start)
    rows = 0
    for tx in collector.transactions():
        rows += len(tx.rows)
        if rows >= expected:
            break
    out = rates(rows, t0, c0)
    collector.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transactions", type=int, default=5000)
    ap.add_argument("--rows-per-tx", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    table = f"bench_{uuid.uuid4().hex[:8]}"
    cfg = parse({"mysql": {"host": base.HOST, "port": base.MARIADB_PORT, "user": mariadb.MONITOR_USER,
                           "password_file": str(mariadb.MONITOR_PASSWORD_FILE), "tables": [f"owtest.{table}"]}})
    start = BinlogCollector(cfg.mysql, None).current_server_position()
    expected = args.transactions * args.rows_per_tx
    print(f"writing {args.transactions} transactions x {args.rows_per_tx} rows into owtest.{table} ...", flush=True)
    write_workload(table, args.transactions, args.rows_per_tx)
    bare, ours = [], []
    for run in range(args.runs):
        bare.append(bare_loop(cfg, start, expected))
        ours.append(collector_loop(cfg, start, expected))
        print(f"run {run + 1}: bare {bare[-1][0]:,.0f} rows/CPU-s ({bare[-1][1]:,.0f}/s wall), "
              f"collector {ours[-1][0]:,.0f} rows/CPU-s ({ours[-1][1]:,.0f}/s wall)", flush=True)
    for i, clock in enumerate(("CPU-second", "wall-second")):
        b, o = statistics.median(r[i] for r in bare), statistics.median(r[i] for r in ours)
        print(f"median over {args.runs} runs of {expected} rows, per {clock}: bare pymysqlreplication {b:,.0f}, "
              f"BinlogCollector {o:,.0f}, ratio {o / b:.2f}" + (" (target >= 2.0)" if i == 0 else ""))


if __name__ == "__main__":
    main()
