"""Memory of the real `oncewatch run` under one huge transaction and under a huge first bootstrap (issue 12).

Both runs use the shop's tables in the test schema and a topic of their own on the dev services, and
sample the monitor's memory (PSS: its process and its readers' processes, bench/processes.py) and its
/metrics twice a second, while a producer writes one record every 0.2 s to the watched topic:

- `transaction`: a monitor caught up on empty tables, then three transactions of `--rows` rows each,
  one after the other: an INSERT of orders, an UPDATE of every one of them (before and after images),
  a DELETE of them all;
- `bootstrap`: `--rows` rows in orders, payments and shipments (a third each, every payment
  successful, every order shipped) before the monitor's first start, which bootstraps them.

For each phase it prints the peak memory, the memory once caught up, how far behind the monitor read Kafka
at worst (records between its read offset and the end offset) and the oldest its health got (now
minus the health row's update time), and checks that every row was read, none twice, and that no
finding came of it. `--bound` (MiB): exit 1 if any peak passes it. Usage:

    .venv/bin/python bench/memory.py transaction [--rows 1000000] [--bound 300]
    .venv/bin/python bench/memory.py bootstrap [--rows 3000000] [--bound 300]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pymysql  # noqa: E402
import tomli_w  # noqa: E402
from kafka import KafkaAdminClient, KafkaProducer  # noqa: E402

from bench.processes import tree_cpu_memory  # noqa: E402
from devservices import base, mariadb  # noqa: E402
from devservices.shop_monitor import SCHEMA, free_port, new_topic, shop_config, shop_settings  # noqa: E402
from load import scrape  # noqa: E402 - bench/load.py, beside this script
from oncewatch.shop.schema import prepare_tables, prepare_topic  # noqa: E402
from oncewatch.store import Store  # noqa: E402


def memory_mib(pid: int) -> float:
    return tree_cpu_memory(pid)[1]


def read_metrics(port: int) -> dict[str, float]:
    """/metrics as name{labels} -> value; {} when it does not answer (yet)."""
    try:
        return scrape(port)
    except OSError:
        return {}


def total(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def admin() -> pymysql.Connection:
    return pymysql.connect(host=base.HOST, port=base.MARIADB_PORT, user=mariadb.ADMIN_USER,
                           password=mariadb.ADMIN_PASSWORD, database=SCHEMA, autocommit=False,
                           init_command="SET time_zone = '+00:00'", read_timeout=3600)


def sql(statement: str) -> float:
    """Run one statement as one transaction; seconds it took."""
    t0 = time.monotonic()
    conn = admin()
    with conn.cursor() as cur:
        cur.execute(statement)
    conn.commit()
    conn.close()
    return time.monotonic() - t0


class Sampler:
    """Memory and /metrics of the monitor twice a second, per phase."""

    def __init__(self, pid: int, port: int):
        self.pid, self.port = pid, port
        self.metrics: dict[str, float] = {}
        self.phase = "start"
        self.peaks: dict[str, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            now, memory = time.time(), memory_mib(self.pid)
            m = read_metrics(self.port)
            peak = self.peaks.setdefault(self.phase, {"memory": 0.0, "kafka_behind": 0.0, "health_age": 0.0})
            peak["memory"] = max(peak["memory"], memory)
            if m:
                self.metrics = m
                behind = total(m, "oncewatch_kafka_end_offset") - total(m, "oncewatch_kafka_read_offset")
                peak["kafka_behind"] = max(peak["kafka_behind"], behind)
                updated = m.get('oncewatch_health_updated_timestamp_seconds{component="monitor"}')
                if updated:
                    peak["health_age"] = max(peak["health_age"], now - updated)

    def binlog_rows(self) -> float:
        return self.metrics.get('oncewatch_collector_records_read_total{collector="binlog"}', 0.0)

    def caught_up(self) -> bool:
        return self.metrics.get("oncewatch_monitor_caught_up") == 1.0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def wait_for(what: str, done, timeout: float) -> float:
    t0 = time.monotonic()
    while not done():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)
    return time.monotonic() - t0


def produce(topic: str, stop: threading.Event) -> None:
    producer = KafkaProducer(bootstrap_servers=f"{base.HOST}:{base.KAFKA_PORT}")
    while not stop.wait(0.2):
        producer.send(topic, json.dumps({"type": "bench.tick", "at": time.time()}).encode())
    producer.flush()
    producer.close()


def run(mode: str, rows: int, bound: float, memory_entries: int | None) -> int:
    work = Path(tempfile.mkdtemp(prefix=f"oncewatch-memory-{mode}-"))
    topic = new_topic()
    port = free_port()
    prepare_tables(shop_settings(topic).mysql, reset=True)
    third = rows // 3
    if mode == "bootstrap":
        t = sql(f"INSERT INTO orders SELECT CONCAT('B', seq), seq % 1000, 10.00, 'paid', NOW(3), NOW(3) "
                f"FROM seq_1_to_{third}")
        t += sql(f"INSERT INTO payments SELECT CONCAT('BT', seq), CONCAT('B', seq), 'alipay', 10.00, 'success', "
                 f"'success', NOW(3), NOW(3) FROM seq_1_to_{third}")
        t += sql(f"INSERT INTO shipments (trade_no, order_no, pickup_code, created_at) SELECT CONCAT('BT', seq), "
                 f"CONCAT('B', seq), '000000', NOW(3) FROM seq_1_to_{third}")
        print(f"{3 * third:,} rows written in {t:.0f} s before the monitor's first start", flush=True)
    kafka_admin = KafkaAdminClient(bootstrap_servers=f"{base.HOST}:{base.KAFKA_PORT}")
    prepare_topic(kafka_admin, shop_settings(topic).kafka, reset=True)
    kafka_admin.close()
    config = shop_config(work, metrics_port=port, topic=topic, start_from="earliest")
    if memory_entries is not None:
        data = tomllib.loads(config.read_text())
        data["store"]["memory_entries"] = memory_entries
        config.write_text(tomli_w.dumps(data))
    monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)],
                               stdout=subprocess.DEVNULL, stderr=open(work / "monitor.log", "wb"))
    stop_producing = threading.Event()
    threading.Thread(target=produce, args=(topic, stop_producing), daemon=True).start()
    sampler = Sampler(monitor.pid, port)
    report: list[tuple[str, float, float]] = []
    try:
        if mode == "bootstrap":
            sampler.phase = f"bootstrap of {3 * third:,} rows"
            took = wait_for("the bootstrap", sampler.caught_up, 3600)  # caught up: the tail runs, so it is done
            report.append((sampler.phase, took, memory_mib(monitor.pid)))
        else:
            wait_for("the monitor to catch up", sampler.caught_up, 120)
            sampler.phase = "idle"
            time.sleep(3)
            report.append((sampler.phase, 3.0, memory_mib(monitor.pid)))
            expected_rows = sampler.binlog_rows()
            for phase, statement in [
                    ("insert", f"INSERT INTO orders SELECT CONCAT('M', seq), seq % 1000, 10.00, 'closed', NOW(3), "
                               f"NOW(3) FROM seq_1_to_{rows}"),
                    ("update", "UPDATE orders SET updated_at = updated_at + INTERVAL 1 SECOND"),
                    ("delete", "DELETE FROM orders")]:
                sampler.phase = f"{phase} of {rows:,} rows in one transaction"
                written = sql(statement)
                expected_rows += rows
                took = wait_for(phase, lambda: sampler.binlog_rows() >= expected_rows and sampler.caught_up(), 3600)
                time.sleep(3)
                report.append((sampler.phase, written + took, memory_mib(monitor.pid)))
    finally:
        stop_producing.set()
        sampler.stop()
        monitor.terminate()
        monitor.wait(60)
    store = Store(str(work / "store.db"), readonly=True)
    stored = store.count("row_changes")
    findings = store.findings()
    store.close()
    expected = 3 * third if mode == "bootstrap" else 3 * rows
    print(f"{'phase':<42} {'seconds':>8} {'peak PSS':>9} {'PSS after':>9} {'Kafka behind':>12} {'health age':>10}")
    worst = 0.0
    for phase, took, after in report:
        peak = sampler.peaks[phase]
        worst = max(worst, peak["memory"])
        print(f"{phase:<42} {took:>8.0f} {peak['memory']:>7.0f} M {after:>7.0f} M {peak['kafka_behind']:>12.0f} "
              f"{peak['health_age']:>8.1f} s")
    print(f"rows stored {stored:,} (expected {expected:,}); findings {len(findings)}; "
          f"peak memory (PSS) {worst:.0f} MiB against a bound of {bound:.0f} MiB; log {work / 'monitor.log'}")
    ok = stored == expected and not findings and worst <= bound
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("transaction", "bootstrap"))
    ap.add_argument("--rows", type=int, help="rows per transaction (1,000,000) or in the bootstrap (3,000,000)")
    ap.add_argument("--bound", type=float, default=300.0, help="MiB the peak memory (PSS) must stay under")
    ap.add_argument("--memory-entries", type=int, help="store.memory_entries (default: the config's default)")
    args = ap.parse_args()
    rows = args.rows or (1_000_000 if args.mode == "transaction" else 3_000_000)
    raise SystemExit(run(args.mode, rows, args.bound, args.memory_entries))


if __name__ == "__main__":
    main()
