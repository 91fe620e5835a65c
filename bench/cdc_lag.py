"""The CDC pipeline's lag behind the binlog under the shop's traffic, as `[cdc] mode = "check"` measures it (issue 15).

Runs the simulated shop (every fault on) at `--rate` orders/s for `--seconds` in the schema the dev connector
captures, with `oncewatch run` tailing the binlog and checking Debezium's topics against it, and samples
/metrics twice a second: the binlog transactions the topics have not delivered yet (and their rows), the age of
the oldest, and the binlog-to-CDC position gap in bytes (the alert's reading, threshold 5000). Prints p50, p99
and max of each, and the pipeline findings at the end (a healthy pipeline loses nothing: no F13, F14, F16).
Usage:

    .venv/bin/python bench/cdc_lag.py [--rate 50] [--seconds 60]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tomli_w  # noqa: E402

from devservices import kafka_connect  # noqa: E402
from devservices.shop_monitor import (ROOT, findings, free_port, new_topic, run_until_idle, shop_config,  # noqa: E402
                                      shop_settings)
from oncewatch import shop  # noqa: E402

READINGS = ("oncewatch_cdc_pipeline_lag_transactions", "oncewatch_cdc_pipeline_lag_rows",
            "oncewatch_cdc_pipeline_lag_seconds", "oncewatch_cdc_position_gap_bytes")


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(oncewatch_cdc_\w+) (\S+)$", text, re.M)}


def read_count(port: int) -> float:
    """Records the CDC reader has read (its topics' history first)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(r'^oncewatch_collector_records_read_total\{collector="cdc"\} (\S+)$', text, re.M)
    return float(found[1]) if found else 0.0


def checking(folder: Path, topic: str, port: int) -> Path:
    """The shop's config in the captured schema, the connector's topics checked against the binlog."""
    config = shop_config(folder, metrics_port=port, topic=topic, schema=kafka_connect.CDC_SCHEMA)
    data = tomllib.loads(config.read_text())
    data["cdc"] = {"format": "debezium", "topic_prefix": kafka_connect.TOPIC_PREFIX, "mode": "check"}
    config.write_text(tomli_w.dumps(data))
    return config


def quantiles(values: list[float]) -> str:
    if not values:
        return "no samples"
    cut = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return f"p50 {statistics.median(values):,.2f}  p99 {cut[98]:,.2f}  max {max(values):,.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    kafka_connect.ensure_running()
    folder = Path(tempfile.mkdtemp(prefix="oncewatch-cdc-lag-"))
    topic, port = new_topic(), free_port()
    shop.run(shop_settings(topic, schema=kafka_connect.CDC_SCHEMA, orders=0, reset=True))
    config = checking(folder, topic, port)
    run_until_idle(config, idle=1.0)  # the bootstrap of the empty tables: where the check starts
    with open(folder / "monitor.log", "ab") as log:
        monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)], cwd=ROOT,
                                   stdout=log, stderr=subprocess.STDOUT)
    samples: list[dict[str, float]] = []
    try:
        # the topics' history from before the bootstrap is read first (not judged): the traffic starts once the
        # CDC reader has read all of it (its count of records read stands still)
        before, same = -1.0, 0
        while same < 6:
            time.sleep(0.5)
            try:
                now = read_count(port)
            except OSError:
                continue
            same, before = (same + 1, before) if now == before and now > 0 else (0, now)
        selling = threading.Thread(target=shop.run, args=(shop_settings(
            topic, schema=kafka_connect.CDC_SCHEMA, seed=21, duration=args.seconds, rate=args.rate,
            faults="all"),))
        selling.start()
        while selling.is_alive():
            try:
                samples.append(scrape(port))
            except OSError:
                pass
            time.sleep(0.5)
        time.sleep(5)
    finally:
        monitor.terminate()
        monitor.wait(30)
    found = [f.rule for f in findings(config) if f.rule in ("F13", "F14", "F15", "F16")]
    print(f"{len(samples)} samples over {args.seconds:g} s of the shop at {args.rate:g} orders/s "
          f"(store in {folder}):")
    for name in READINGS:
        print(f"  {name}: {quantiles([s[name] for s in samples if name in s])}")
    print(f"  pipeline findings: {({r: found.count(r) for r in sorted(set(found))}) or 'none'}")


if __name__ == "__main__":
    main()
