"""Seconds per auditor's report (`dashboards.reports.export`) on a store with 100,000 findings.

Builds the store once with the dashboard bench's builder (bench/dashboard_load.py: findings over
30 days and all twelve rules, two evidence items each; only a few row changes, which reports do
not read), keeps it under /tmp and reuses it while its count matches. Then, per format (CSV,
JSON, XLSX) and per selection (all findings, one rule, one day), times `export()` from opening
the store read-only to the finished bytes, by the wall clock and by the process's CPU time, and
prints the medians. On a machine shared with other work the wall clock swings with the load;
CPU time is the steadier comparison. Each line also gives the report's size and a digest that
does not depend on when it was made (the whole file for CSV and JSON, whose `generated_at` is
fixed here; data_sha256 for XLSX, whose zip entries carry the time), so two versions of the
code can be checked to write the same reports. Usage:

    .venv/bin/python bench/export_speed.py [--findings 100000] [--runs 3] [--rebuild]
                                           [--profile csv|json|xlsx] [--rule F1]

--profile runs that format once on all findings under cProfile and prints where the time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import hashlib
import pstats
import statistics
import sys
import time
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.dashboard_load import build  # noqa: E402
from oncewatch.dashboards import report_check, reports  # noqa: E402
from oncewatch.store import Store  # noqa: E402

CACHE = Path("/tmp/oncewatch-bench")
ROW_CHANGES = 10_000  # the builder's findings point at orders made of these rows
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)  # generated_at, so equal data gives equal bytes


def store_path(findings: int, rebuild: bool) -> Path:
    path = CACHE / f"export-{findings}.db"
    if not rebuild and path.exists():
        with closing(Store(str(path), readonly=True)) as store:
            if store.count("findings") == findings:
                return path
    t0 = time.perf_counter()
    build(path, findings, ROW_CHANGES, time.time())
    print(f"built {path} in {time.perf_counter() - t0:.0f} s ({path.stat().st_size / 2**20:.0f} MiB)")
    return path


def one_day(path: Path) -> tuple[dt.datetime, dt.datetime]:
    """The middle day of the store's findings."""
    with closing(Store(str(path), readonly=True)) as store:
        low, high = store.seen_span()
    middle = dt.datetime.fromtimestamp((low + high) / 2, dt.timezone.utc)
    return middle, middle + dt.timedelta(days=1)


def export(path: Path, fmt: str, filters: dict[str, object]) -> bytes:
    with closing(Store(str(path), readonly=True)) as store:
        return reports.export(store, fmt, config_fingerprint="bench", now=NOW, **filters)


def digest(fmt: str, data: bytes) -> str:
    if fmt == "xlsx":
        return "data " + hashlib.sha256(report_check.READERS["xlsx"](data).section).hexdigest()[:16]
    return "file " + hashlib.sha256(data).hexdigest()[:16]


def timed(path: Path, fmt: str, filters: dict[str, object], runs: int) -> tuple[float, float, bytes]:
    walls, cpus, data = [], [], b""
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        data = export(path, fmt, filters)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), data


def profile(path: Path, fmt: str) -> None:
    prof = cProfile.Profile()
    prof.runcall(export, path, fmt, {})
    stats = pstats.Stats(prof, stream=sys.stdout).strip_dirs()
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(25)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--findings", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rule", default="F1", help="the rule of the one-rule report")
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--profile", choices=reports.FORMATS)
    args = p.parse_args()
    path = store_path(args.findings, args.rebuild)
    if args.profile:
        profile(path, args.profile)
        return 0
    since, until = one_day(path)
    selections = {"all findings": {}, f"rule {args.rule}": {"rule": args.rule},
                  "one day": {"since": since, "until": until}}
    print(f"store: {args.findings:,} findings ({path}); medians of {args.runs} runs")
    print(f"{'report':28} {'wall s':>8} {'cpu s':>8} {'MiB':>8}  digest")
    for fmt in reports.FORMATS:
        for name, filters in selections.items():
            wall, cpu, data = timed(path, fmt, filters, args.runs)
            print(f"{fmt.upper() + ' of ' + name:28} {wall:8.2f} {cpu:8.2f} {len(data) / 2**20:8.1f}  "
                  f"{digest(fmt, data)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
