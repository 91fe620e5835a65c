"""Store size over a long run at a steady rate: it levels off once retention applies (issue 14, item 3).

Runs the simulated shop with every fault on at `--rate` orders/s for `--minutes` against the dev
services, with `oncewatch run` watching it at `store.retention_hours = --retention-minutes / 60`,
and samples every `--every` seconds the store's size on disk (the database and its WAL), its
row changes and events, and what retention has pruned (/metrics). Prints the curve, then the
growth per minute before the retention first applied and over the last third of the run: level
means the last is near zero. Usage:

    .venv/bin/python bench/store_size.py [--minutes 30] [--rate 20] [--retention-minutes 6]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tomli_w  # noqa: E402

from devservices.shop_monitor import free_port, new_topic, run_until_idle, shop_config, shop_settings  # noqa: E402
from load import scrape  # noqa: E402 - bench/load.py, beside this script
from oncewatch import shop  # noqa: E402


def size_mib(store: Path) -> float:
    return sum(os.path.getsize(p) for p in (store, Path(f"{store}-wal")) if p.exists()) / 2**20


def total(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx, my = sum(t for t, _ in points) / n, sum(s for _, s in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 60 * sum((t - mx) * (s - my) for t, s in points) / var if var else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=20.0, help="orders per second asked of the shop")
    ap.add_argument("--retention-minutes", type=float, default=6.0)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="oncewatch-size-"))
    port, topic = free_port(), new_topic()
    shop.run(shop_settings(topic, orders=0, reset=True))
    config = shop_config(work, metrics_port=port, topic=topic)
    data = tomllib.loads(config.read_text())
    data["store"]["retention_hours"] = args.retention_minutes / 60
    config.write_text(tomli_w.dumps(data))
    run_until_idle(config, idle=1.0)
    store = work / "store.db"
    monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)],
                               stdout=subprocess.DEVNULL, stderr=open(work / "monitor.log", "wb"))
    runner = threading.Thread(target=lambda: shop.run(shop_settings(
        topic, seed=7, duration=args.minutes * 60, rate=args.rate, faults="all")))
    time.sleep(3)
    started = time.time()
    runner.start()
    curve: list[tuple[float, float, float]] = []  # (seconds, MiB, rows pruned)
    print("minute  store MiB  row changes read  events read  pruned rows")
    try:
        while runner.is_alive():
            time.sleep(args.every)
            try:
                m = scrape(port)
            except OSError:
                continue
            at, mib, pruned = time.time() - started, size_mib(store), total(m, "oncewatch_store_pruned_rows_total")
            curve.append((at, mib, pruned))
            rows, events = (m.get(f'oncewatch_collector_records_read_total{{collector="{c}"}}', 0.0)
                            for c in ("binlog", "kafka_events"))
            print(f"{at / 60:6.1f}  {mib:9.1f}  {rows:16.0f}  {events:11.0f}  {pruned:11.0f}", flush=True)
    finally:
        monitor.terminate()
        monitor.wait(60)
    before = [(t, s) for t, s, p in curve if p == 0]
    last = [(t, s) for t, s, _ in curve if t >= curve[-1][0] * 2 / 3]
    print(f"growth before retention applied: {per_minute(before):.2f} MiB/min; over the last third: "
          f"{per_minute(last):.2f} MiB/min; size at the end {curve[-1][1]:.1f} MiB, "
          f"peak {max(s for _, s, _ in curve):.1f} MiB")
    print(f"work dir (store, logs): {work}")


if __name__ == "__main__":
    main()
