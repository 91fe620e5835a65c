"""Load: the simulated shop at a high rate for minutes, the monitor keeping up (issue 7).

Runs the shop with every fault on at `--rate` orders/s for `--minutes` against the dev
services, with `oncewatch run` watching it, and samples once a second (the store's new findings ten times a second):
- monitor lag on both streams: the binlog collector's seconds behind, and for Kafka the age of
  the monitor's Kafka watermark (0 when every partition is read to its end);
- detection latency: from the moment a finding became decidable (the commit of the faulty
  change, plus the rule's own threshold for stuck orders and missing/orphan events) to the
  moment it is in the store, i.e. visible on /metrics, which is read from the store per scrape;
- the monitor's CPU (user+system seconds per wall second) and memory (PSS, which adds up over processes): its
  process and those below it, its readers' (bench/processes.py).
Prints p50/p99 of each, memory at each quarter of the run (flat means no growth), and how much
the shop really placed. With `--catch-up`, the monitor then runs on until it has caught up, and
the findings are held against the shop's ground truth: any the truth does not explain (such as
an F11 that was only the monitor's own lag) are listed. Usage:

    .venv/bin/python bench/load.py [--minutes 10] [--rate 90] [--catch-up]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import tree_cpu_memory  # noqa: E402
from devservices.shop_monitor import (SHORT_RULES, free_port, new_topic, run_until_idle, shop_config,  # noqa: E402
                                      shop_settings)
from oncewatch import shop  # noqa: E402
from oncewatch.core.config import load  # noqa: E402
from oncewatch.core.records import Finding  # noqa: E402
from oncewatch.store import Store  # noqa: E402

FINDINGS_EVERY = 0.1  # seconds between looks for new findings: what the detection latency's sampling adds

def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def decidable_at(f: Finding, delay_of: dict[str, float]) -> float:
    """When the fault behind a finding could first be known: its newest evidence, plus the
    rule's own wait for stuck orders and missing or orphan events."""
    return max(e.time for e in f.evidence) + delay_of.get(f.rule, 0.0)


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line.startswith("#") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=90.0, help="orders per second asked of the shop")
    ap.add_argument("--horizon", type=float, default=300.0,
                    help="rules.horizon_seconds: open state older than this is let go (memory stays flat)")
    ap.add_argument("--catch-up", action="store_true",
                    help="after the shop stops, run on until caught up and hold the findings against the truth")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="oncewatch-load-"))
    port = free_port()
    topic = new_topic()
    shop.run(shop_settings(topic, orders=0, reset=True))
    config = shop_config(work, metrics_port=port, rules={**SHORT_RULES, "horizon_seconds": args.horizon}, topic=topic)
    rules = load(config).rules
    run_until_idle(config, idle=1.0)
    monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)],
                               stdout=subprocess.DEVNULL, stderr=open(work / "monitor.log", "wb"))
    result: dict[str, object] = {}
    runner = threading.Thread(target=lambda: result.update(truth=shop.run(shop_settings(
        topic, seed=99, duration=args.minutes * 60, rate=args.rate, faults="all"))))
    time.sleep(3)
    started = time.time()
    runner.start()
    binlog_lag, kafka_lag, memory, cpu_rate = [], [], [], []
    latency: dict[str, list[float]] = {}  # rule -> seconds from decidable to stored
    seen: set[str] = set()
    cpu0, _ = tree_cpu_memory(monitor.pid)
    last_cpu, last_at = cpu0, time.time()
    store = Store(str(work / "store.db"), readonly=True)
    delay_of = {"F3": rules.stuck_pending_seconds, "F7": rules.missing_event_grace_seconds,
                "F8": rules.orphan_event_grace_seconds, "F9": rules.orphan_event_grace_seconds}
    caught_up_at: float | None = None
    shop_done_at: float | None = None
    next_sample = time.time()
    while runner.is_alive() or (args.catch_up and caught_up_at is None and time.time() - started < 3600):
        time.sleep(FINDINGS_EVERY)
        now = time.time()
        new = store.finding_ids() - seen
        seen.update(new)
        for finding in store.findings_by_id(new):
            if finding.rule not in ("F11", "F12"):  # offsets findings have no commit behind them
                latency.setdefault(finding.rule, []).append(now - decidable_at(finding, delay_of))
        if now < next_sample:
            continue
        next_sample = now + 1.0
        if shop_done_at is None and not runner.is_alive():
            shop_done_at = now
        try:
            m = scrape(port)
            if "oncewatch_binlog_behind_seconds" in m:
                binlog_lag.append(m["oncewatch_binlog_behind_seconds"])
            kafka_lag.append(max(0.0, now - m.get('oncewatch_stream_time_seconds{stream="kafka"}', now)))
            if not runner.is_alive() and m.get("oncewatch_monitor_caught_up") == 1.0:
                caught_up_at = now
        except OSError:
            pass
        c, r = tree_cpu_memory(monitor.pid)
        cpu_rate.append((c - last_cpu) / (now - last_at))
        last_cpu, last_at = c, now
        memory.append(r)
    elapsed = (shop_done_at or time.time()) - started
    if caught_up_at is not None:
        time.sleep(5)  # the last findings of the timer rules
    monitor.terminate()
    monitor.wait(60)
    truth = result["truth"]
    quarters = [memory[int(i * (len(memory) - 1) / 4)] for i in range(5)] if memory else []
    print(f"shop: {truth.orders} orders in {elapsed:.0f} s ({truth.orders / elapsed:.1f}/s asked {args.rate}), "
          f"{len(truth.faults)} faults; stats {truth.stats}")
    print(f"monitor lag, binlog: p50 {pct(binlog_lag, .5):.2f} s, p99 {pct(binlog_lag, .99):.2f} s, "
          f"max {max(binlog_lag, default=float('nan')):.2f} s")
    print(f"monitor lag, kafka:  p50 {pct(kafka_lag, .5):.2f} s, p99 {pct(kafka_lag, .99):.2f} s, "
          f"max {max(kafka_lag, default=float('nan')):.2f} s")
    every = [x for values in latency.values() for x in values]
    print(f"detection latency ({len(every)} findings): p50 {pct(every, .5):.2f} s, p99 {pct(every, .99):.2f} s "
          f"(sampling adds up to {FINDINGS_EVERY} s)")
    for rule, values in sorted(latency.items()):
        print(f"  {rule}: {len(values)} findings, p50 {pct(values, .5):.2f} s, p99 {pct(values, .99):.2f} s")
    print(f"monitor CPU: mean {statistics.fmean(cpu_rate):.2f} cores, p99 {pct(cpu_rate, .99):.2f}; "
          f"memory (PSS, its readers' processes with it) peak {max(memory):.0f} MiB, at 0/25/50/75/100%: "
          f"{' '.join(f'{q:.0f}' for q in quarters)} MiB")
    if args.catch_up:
        print(f"caught up {caught_up_at - shop_done_at:.0f} s after the shop stopped" if caught_up_at
              else "never caught up", flush=True)
        found = store.findings()
        unexplained = [f for f in found if not truth.explains(f.rule, f.keys)]
        by_rule: dict[str, int] = {}
        for f in found:
            by_rule[f.rule] = by_rule.get(f.rule, 0) + 1
        print(f"findings by rule {dict(sorted(by_rule.items()))}; not explained by the truth: {len(unexplained)}")
        for f in unexplained[:20]:
            print(f"  {f.rule} {f.severity} {f.summary}")
    print(f"work dir (store, logs): {work}")


if __name__ == "__main__":
    main()
