"""Rows/s of CDC mode's change source against a bare kafka-python loop over the same Debezium topics (issue 15).

Writes N transactions (ROWS_PER_TX rows each, the shape of the shop's orders) into a fresh table of the
schema the dev connector captures, waits until Debezium has written them all, then reads them RUNS
times with each loop, alternating: the bare loop consumes the table's topic and the transaction
topic from the workload's first offsets and counts records; the CDC collector reads the same and
rebuilds the committed transactions (values decoded, rows in commit order). Beside them, the binlog
collector over the same transactions, for the direct mode's rate. Rates per CPU-second of this
process (the servers' work is not ours) and per wall-second, medians. Target: CDC collector >= 0.7
of the bare loop per CPU-second. Usage:

    .venv/bin/python bench/cdc_ingest.py [--transactions 10000] [--rows-per-tx 2] [--runs 3]
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
from kafka import KafkaConsumer, TopicPartition  # noqa: E402

from devservices import base, kafka_connect, mariadb  # noqa: E402
from oncewatch.collectors.binlog import BinlogCollector  # noqa: E402
from oncewatch.collectors.cdc.read import CdcCollector  # noqa: E402
from oncewatch.core.config import CdcConfig, parse  # noqa: E402

BOOTSTRAP = f"{base.HOST}:{base.KAFKA_PORT}"


def write_workload(table: str, transactions: int, rows_per_tx: int) -> None:
    conn = pymysql.connect(host=base.HOST, port=base.MARIADB_PORT, user=mariadb.ADMIN_USER,
                           password=mariadb.ADMIN_PASSWORD, database=kafka_connect.CDC_SCHEMA)
    with conn.cursor() as c:
        c.execute(f"CREATE TABLE {table} (order_no VARCHAR(32) PRIMARY KEY, user_id BIGINT, amount DECIMAL(12,2), "
                  "status VARCHAR(16), created_at DATETIME(3), updated_at DATETIME(3))")
        n = 0
        for _ in range(transactions):
            c.executemany(f"INSERT INTO {table} VALUES (%s, 1, %s, 'pending', NOW(3), NOW(3))",
                          [(f"O{n + j:09d}", f"{(n + j) % 1000}.99") for j in range(rows_per_tx)])
            n += rows_per_tx
            conn.commit()
    conn.close()


def end_offsets(topics: list[str]) -> dict[TopicPartition, int]:
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP)
    try:
        parts = [TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()]
        return consumer.end_offsets(parts)
    finally:
        consumer.close()


def rates(count: int, wall0: float, cpu0: float) -> tuple[float, float]:
    return count / (time.process_time() - cpu0), count / (time.perf_counter() - wall0)


def bare_loop(start: dict[TopicPartition, int], records: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, group_id=None)
    consumer.assign(list(start))
    for tp, offset in start.items():
        consumer.seek(tp, offset)
    n = 0
    while n < records:
        for batch in consumer.poll(timeout_ms=500).values():
            n += len(batch)
    out = rates(n, t0, c0)
    consumer.close()
    return out


def collector_loop(collector: CdcCollector | BinlogCollector, rows: int) -> tuple[float, float]:
    """A collector's transactions until `rows` rows: the CDC collector's or, for the direct mode, the binlog's."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for tx in collector.transactions():
        n += len(tx.rows)
        if n >= rows:
            break
    out = rates(n, t0, c0)
    collector.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transactions", type=int, default=10_000)
    ap.add_argument("--rows-per-tx", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    kafka_connect.ensure_running()
    table = f"bench_{uuid.uuid4().hex[:8]}"
    watched = f"{kafka_connect.CDC_SCHEMA}.{table}"
    cfg = parse({"mysql": {"host": base.HOST, "port": base.MARIADB_PORT, "user": mariadb.MONITOR_USER,
                           "password_file": str(mariadb.MONITOR_PASSWORD_FILE), "tables": [watched]},
                 "kafka": {"bootstrap_servers": [BOOTSTRAP], "topics": [{"name": "unused", "format": "json",
                                                                         "required": []}]}})
    start_binlog = BinlogCollector(cfg.mysql, None).current_server_position()
    tx_topic, data_topic = kafka_connect.TRANSACTION_TOPIC, kafka_connect.table_topic(table)
    tx_start = end_offsets([tx_topic])
    rows = args.transactions * args.rows_per_tx
    print(f"writing {args.transactions} transactions x {args.rows_per_tx} rows into {watched} ...", flush=True)
    write_workload(table, args.transactions, args.rows_per_tx)
    deadline = time.monotonic() + 600
    while sum(end_offsets([data_topic]).values()) < rows:  # Debezium's way to Kafka
        if time.monotonic() > deadline:
            raise SystemExit(f"Debezium did not write {rows} records to {data_topic} in 600 s")
        time.sleep(1)
    start = {**tx_start, TopicPartition(data_topic, 0): 0}
    records = sum(end_offsets([tx_topic, data_topic]).values()) - sum(tx_start.values())
    positions = {f"{tp.topic}/{tp.partition}": offset for tp, offset in start.items()}
    results: dict[str, list[tuple[float, float]]] = {"bare": [], "cdc": [], "binlog": []}
    for run in range(args.runs):
        results["bare"].append(bare_loop(start, records))
        results["cdc"].append(collector_loop(CdcCollector(cfg.mysql, cfg.kafka, CdcConfig(
            "debezium", kafka_connect.TOPIC_PREFIX), positions=positions), rows))
        results["binlog"].append(collector_loop(BinlogCollector(cfg.mysql, start_binlog), rows))
        print(f"run {run + 1}: bare {results['bare'][-1][0]:,.0f} records/CPU-s, CDC collector "
              f"{results['cdc'][-1][0]:,.0f} rows/CPU-s, binlog collector {results['binlog'][-1][0]:,.0f} "
              f"rows/CPU-s", flush=True)
    print(f"{records:,} records ({rows:,} rows, the rest the transaction topic's BEGIN/END); "
          f"median over {args.runs} runs:")
    for i, clock in enumerate(("CPU-second", "wall-second")):
        m = {k: statistics.median(r[i] for r in v) for k, v in results.items()}
        bare_rows = m["bare"] * rows / records  # the bare loop's rate in the rows those records carry
        print(f"  per {clock}: bare kafka-python {m['bare']:,.0f} records ({bare_rows:,.0f} rows), CDC collector "
              f"{m['cdc']:,.0f} rows, ratio {m['cdc'] / bare_rows:.2f}"
              + (" (target >= 0.7)" if i == 0 else "") + f"; binlog collector {m['binlog']:,.0f} rows")


if __name__ == "__main__":
    main()
