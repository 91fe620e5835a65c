"""Store size over a long run at a steady rate: it levels off once retention applies (issue 14, item 3).

Runs the simulated shop with every fault on (`--faults`) at `--rate` orders/s for `--minutes`
against the dev services, with `oncewatch run` watching it at `store.retention_hours =
--retention-minutes / 60` and `rules.horizon_seconds = --horizon-minutes * 60` (the raw records
and the engine's open state are the two things that grow with traffic; each is kept for its own
time). Every `--every` seconds it samples the store's size on disk (the database and its WAL),
what each part of it holds (SQLite's dbstat: raw records, the entity index, the engine's state,
findings), and what retention has pruned (/metrics). Prints the curve, then the growth per minute
before the retention first applied and over the last third of the run: level means the last is
near zero, but for the findings, which are kept (they grow with the faults, not the traffic).
Usage:

    .venv/bin/python bench/store_size.py [--minutes 30] [--rate 20] [--retention-minutes 6] [--max-mib 50]

`--max-mib` sets store.max_bytes: the run then also prints the largest the file grew (its WAL left out), and
checks at the end that `oncewatch export` still gives every finding with all its evidence. Each sample prints
the bytes per record read, in the file and in use, while nothing has been pruned (issue 47's figure).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tomli_w  # noqa: E402

from devservices.shop_monitor import free_port, new_topic, run_until_idle, shop_config, shop_settings  # noqa: E402
from load import scrape  # noqa: E402 - bench/load.py, beside this script
from oncewatch import shop  # noqa: E402
from oncewatch.store import Store  # noqa: E402


def size_mib(store: Path) -> float:
    return sum(os.path.getsize(p) for p in (store, Path(f"{store}-wal")) if p.exists()) / 2**20


def file_bytes(store: Path) -> int:
    """The store's file without its WAL: what a budget (store.max_bytes) bounds."""
    return os.path.getsize(store)


# What each part of the store holds, by the tables (and their indexes) that make it.
PARTS = {"raw": ("row_changes", "events"), "entities": ("entity_names", "entity_entries", "event_entries"),
         "state": ("open_state", "open_state_spaces", "open_state_prefixes"),
         "findings": ("findings", "finding_history", "reviews")}


def parts_mib(store: Path) -> dict[str, float]:
    """MiB in use per part of PARTS (and "other"), from SQLite's dbstat; free pages are not counted."""
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        owner = {name: tbl for name, tbl in conn.execute("SELECT name, tbl_name FROM sqlite_schema")}
        used: dict[str, float] = {}
        for name, size in conn.execute("SELECT name, SUM(pgsize - unused) FROM dbstat GROUP BY name"):
            table = owner.get(name, name)
            part = next((p for p, tables in PARTS.items() if table in tables), "other")
            used[part] = used.get(part, 0.0) + size / 2**20
        return used
    finally:
        conn.close()


def evidence_whole(config: Path, store: Path, out: Path) -> str:
    """Whether `oncewatch export` gives every finding the store keeps with each of its evidence items (one row of the
    report each; an F1 has one more, the payment row its amount was read from, when the store still has it), after
    the budget pruned raw records."""
    subprocess.run([sys.executable, "-m", "oncewatch.cli", "export", "--config", str(config), "--format", "json",
                    "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    exported = {f["id"]: Counter(e["coordinates"] for e in f["evidence"])
                for f in json.loads(out.read_text())["findings"]}
    kept = Store(str(store), readonly=True)
    try:
        stored = {f.id: Counter(e.coordinates for e in f.evidence) for f in kept.findings()}
    finally:
        kept.close()
    missing = sum(1 for fid, items in stored.items() if not items or items - exported.get(fid, Counter()))
    return (f"evidence: {len(stored)} findings with {sum(map(len, stored.values()))} evidence items in the store, "
            f"{len(exported)} exported; {missing} missing an item: {'whole' if not missing else 'NOT WHOLE'}")


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
    ap.add_argument("--horizon-minutes", type=float, help="the engine's horizon (default: the retention)")
    ap.add_argument("--faults", default="all=0.001", help="the shop's fault mix (default %(default)s)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--max-mib", type=float, help="store.max_bytes in MiB (default: no budget)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="oncewatch-size-"))
    port, topic = free_port(), new_topic()
    shop.run(shop_settings(topic, orders=0, reset=True))
    config = shop_config(work, metrics_port=port, topic=topic)
    data = tomllib.loads(config.read_text())
    data["store"]["retention_hours"] = args.retention_minutes / 60
    data["rules"]["horizon_seconds"] = (args.horizon_minutes or args.retention_minutes) * 60
    if args.max_mib:
        data["store"]["max_bytes"] = f"{args.max_mib} MiB"
    config.write_text(tomli_w.dumps(data))
    run_until_idle(config, idle=1.0)
    store = work / "store.db"
    monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)],
                               stdout=subprocess.DEVNULL, stderr=open(work / "monitor.log", "wb"))
    runner = threading.Thread(target=lambda: shop.run(shop_settings(
        topic, seed=7, duration=args.minutes * 60, rate=args.rate, faults=args.faults)))
    time.sleep(3)
    started = time.time()
    runner.start()
    curve: list[tuple[float, float, float, dict[str, float]]] = []  # (seconds, MiB, rows pruned, parts)
    names = [*PARTS, "other"]
    per_record: list[tuple[float, float]] = []  # (file bytes, bytes in use) per record read, while nothing is pruned
    largest = 0
    print("minute  store MiB  file MiB  " + "  ".join(f"{n:>8}" for n in names)
          + "  row changes read  events read  pruned rows  budget pruned  B/record (file, in use)")
    try:
        while runner.is_alive():
            time.sleep(args.every)
            try:
                m = scrape(port)
            except OSError:
                continue
            at, mib, pruned = time.time() - started, size_mib(store), total(m, "oncewatch_store_pruned_rows_total")
            budget_pruned = total(m, "oncewatch_store_budget_pruned_rows_total")
            parts = parts_mib(store)
            curve.append((at, mib, pruned, parts))
            rows, events = (m.get(f'oncewatch_collector_records_read_total{{collector="{c}"}}', 0.0)
                            for c in ("binlog", "kafka_events"))
            on_disk = file_bytes(store)
            largest = max(largest, on_disk)
            used = sum(parts.values()) * 2**20
            ratio = (on_disk / (rows + events), used / (rows + events)) if rows + events else (0.0, 0.0)
            if not pruned and not budget_pruned and rows + events:
                per_record.append(ratio)
            print(f"{at / 60:6.1f}  {mib:9.1f}  {on_disk / 2**20:8.1f}  "
                  + "  ".join(f"{parts.get(n, 0.0):8.1f}" for n in names)
                  + f"  {rows:16.0f}  {events:11.0f}  {pruned:11.0f}  {budget_pruned:13.0f}"
                  + f"  {ratio[0]:5.0f}, {ratio[1]:5.0f}", flush=True)
    finally:
        monitor.terminate()
        monitor.wait(60)
    before = [(t, s) for t, s, p, _ in curve if p == 0]
    last = [(t, s) for t, s, _, _ in curve if t >= curve[-1][0] * 2 / 3]
    print(f"growth before retention applied: {per_minute(before):.2f} MiB/min; over the last third: "
          f"{per_minute(last):.2f} MiB/min; size at the end {curve[-1][1]:.1f} MiB, "
          f"peak {max(s for _, s, _, _ in curve):.1f} MiB")
    last_parts = [(t, p) for t, _, _, p in curve if t >= curve[-1][0] * 2 / 3]
    print("growth over the last third, per part: " + ", ".join(
        f"{n} {per_minute([(t, p.get(n, 0.0)) for t, p in last_parts]):.2f}" for n in names) + " MiB/min")
    if per_record:
        print(f"on disk per record read before anything was pruned (the last sample): {per_record[-1][0]:.0f} B in the "
              f"file (its WAL left out), {per_record[-1][1]:.0f} B in use")
    if args.max_mib:
        print(f"largest file (its WAL left out) {largest / 2**20:.1f} MiB against store.max_bytes {args.max_mib:g} MiB")
        print(evidence_whole(config, store, work / "export.json"))
    print(f"work dir (store, logs): {work}")


if __name__ == "__main__":
    main()
