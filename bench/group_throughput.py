"""Records/s and CPU per record of a group of oncewatch instances ([group]) for N = 1, 2 (and any N asked), each member
pinned to a core of its own (taskset), against the lone monitor in CDC mode on the same source, pinned too (issue
44); the work each member did; and a group of 3 with its change source's reader SIGKILLed and a fourth added mid-run
finding what 1 finds (issue 18).

A recorded workload, the shop with every fault mode, ORDERS orders (some 5 watched rows each, and their events),
is written into the schema the dev connector captures while no member runs, after every group has taken its first
checkpoint at the topics' ends; the connector is let finish capturing it. Then each group reads it from a cold
start: its members started together, timed until every shard has committed with both its clocks past the end of
the workload. Records are what the shards applied (rows and events); a member's share is what its process applied.
The killed run's findings are compared with the 1-member group's (evidence and all; F11/F12 by id, rule and
status) once every verdict is due.

The lone monitor (the same config without [group], its store SQLite as by default, or PostgreSQL with --lone-store
postgres) takes its first checkpoint before the workload as the groups do, then reads it with `oncewatch run
--until-idle`: its CPU is its process's whole (start and the idle wait included, as a member's start and rebalances
are), per record the groups applied.
Targets (issue 44): group CPU per record <= 1.5x the lone monitor's; two members >= 1.8x one member's records/s.
The machine may be shared: each run says the load average around it, and the rates per CPU-second beside the
rates per wall-second. Usage:

    .venv/bin/python bench/group_throughput.py [--orders 45000] [--shards 12] [--members 1,2] [--no-kill] [--no-pin]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import tree_cpu_memory  # noqa: E402
from devservices import postgres  # noqa: E402
from devservices.group_runs import (Member, change_source_holder, compared, difference, first_start,  # noqa: E402
                                    group_config, members_of, pinned, wait_judged_past)
from devservices.kafka_connect import CDC_SCHEMA, captured, ends, table_topic  # noqa: E402
from devservices.shop_monitor import ROOT, SHORT_RULES, findings, new_topic, shop_config, shop_settings  # noqa: E402
from oncewatch import shop  # noqa: E402
from oncewatch.core.config import load  # noqa: E402

# The scoring runs' thresholds (tests/integration/test_scoring.py): F10 above the shop's clean sends on a busy
# machine, F11 at 1,000 records.
RULES = {**SHORT_RULES, "event_delay_seconds": 1.5, "offset_drift_threshold": 1000}
LONE_IDLE = 2.0  # the lone monitor's --until-idle
VERDICTS_DUE = max(RULES["stuck_pending_seconds"], RULES["missing_event_grace_seconds"]) + 2


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def lone_run(config: Path, idle: float, cpu: int | None) -> dict:
    """`oncewatch run --until-idle` on `config`: its wall seconds (the idle wait taken off) and CPU seconds."""
    before, started_at = load_average(), time.monotonic()
    process = subprocess.Popen(pinned([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config),
                                       "--until-idle", str(idle)], cpu), cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"the lone monitor exited {process.returncode}: {process.stderr.read()[-3000:]!r}")
    return {"seconds": round(time.monotonic() - started_at - idle, 2), "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "load_before": before, "load_after": load_average()}


def read(config: Path, count: int, shards: int, end: float, kill: bool = False, pin: bool = True) -> dict:
    """`count` members started together (member i on core i when `pin`); (seconds until judged past `end`, records
    applied, CPU, each member's share)."""
    cores = os.cpu_count() or 1
    members = {f"m{i}": Member(config, f"m{i}", i % cores if pin else None) for i in range(count)}
    load_before, started_at = load_average(), time.monotonic()
    try:
        if kill:
            time.sleep(8.0)  # well into the catching up: the group formed, the change source being read
            members[change_source_holder(config, members)].kill()
            time.sleep(4.0)
            members["added"] = Member(config, "added")
        checkpoints = wait_judged_past(config, shards, end, timeout=1800)
        seconds = time.monotonic() - started_at
        cpu = sum(tree_cpu_memory(m.process.pid)[0] for m in members.values() if m.process.poll() is None)
        names = {m.name for m in members.values()}
        shares = {name: row.applied for name, row in members_of(config).items() if name in names}
        # not timed: every verdict due given, the offsets' readings (F11, F12) of the stalled group held
        wait_judged_past(config, shards, time.time() + VERDICTS_DUE, timeout=600)
        time.sleep(6.0)
    finally:
        for m in members.values():
            if m.process.returncode is None:
                m.stop()
    records = sum(c["records"] for c in checkpoints.values())
    return {"members": count, "seconds": round(seconds, 2), "records": records, "cpu_seconds": round(cpu, 2),
            "records_per_s": round(records / seconds), "records_per_cpu_s": round(records / cpu),
            "member_cpu_us_per_record": round(cpu / records * 1e6, 1), "load_before": load_before,
            "load_after": load_average(), "applied_by_member": shares,
            "share_of_1_over_n": [round(n / records * count, 3) for n in shares.values()] if not kill else None}


def summary(lone: dict, groups: dict[tuple[int, bool], dict]) -> dict:
    """The figures beside the issue's targets: group CPU per record against the lone monitor's (same records: the
    1-member group's), and 2 members' rate against 1's."""
    out: dict = {}
    for (n, kill), g in groups.items():
        if not kill:
            lone_us = lone["cpu_seconds"] / g["records"] * 1e6
            out[f"lone_cpu_us_per_record_{n}"] = round(lone_us, 1)
            out[f"group_{n}_cpu_per_record_over_lone"] = round(g["member_cpu_us_per_record"] / lone_us, 2)
            out[f"lone_records_per_s_{n}"] = round(g["records"] / lone["seconds"])
    if (1, False) in groups and (2, False) in groups:
        out["two_members_over_one"] = round(groups[(2, False)]["records_per_s"] / groups[(1, False)]["records_per_s"],
                                            2)
    out["targets"] = {"group_cpu_per_record_over_lone": "<= 1.5", "two_members_over_one": ">= 1.8"}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=45_000)
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--members", default="1,2")
    parser.add_argument("--no-kill", action="store_true")
    parser.add_argument("--no-pin", action="store_true", help="members and the lone monitor on any core")
    parser.add_argument("--lone-store", choices=("sqlite", "postgres"), default="sqlite",
                        help="the lone monitor's store (the group's is PostgreSQL)")
    args = parser.parse_args()
    counts = [int(n) for n in args.members.split(",")]
    runs = [(n, False) for n in counts] + ([] if args.no_kill else [(3, True)])
    topic = new_topic()
    shop.run(shop_settings(topic, schema=CDC_SCHEMA, orders=0, reset=True))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stores:
        configs = []
        for i, (n, kill) in enumerate(runs):
            folder = Path(tmp) / f"run{i}-{n}{'-kill' if kill else ''}"
            config = group_config(folder, topic, stores.enter_context(postgres.new_schema()), args.shards, RULES,
                                  commit_seconds=1.0)
            first_start(config)
            configs.append(config)
        (Path(tmp) / "lone").mkdir()
        lone = shop_config(Path(tmp) / "lone", topic=topic, rules=RULES, cdc=True,
                           postgres=stores.enter_context(postgres.new_schema()) if args.lone_store == "postgres"
                           else None)
        lone_run(lone, LONE_IDLE, None)  # its first checkpoint, at the topics' ends
        watched = [table_topic(t.partition(".")[2]) for t in load(configs[0]).mysql.tables]
        rows_before, written = ends(watched), time.time()
        truth = shop.run(shop_settings(topic, schema=CDC_SCHEMA, seed=31, orders=args.orders, rate=5000,
                                       faults="all"))
        end = time.time()
        captured()
        print(json.dumps({"orders": args.orders, "watched_rows": ends(watched) - rows_before,
                          "write_seconds": round(end - written, 1), "shards": args.shards,
                          "incidents": len(truth.incidents)}), flush=True)
        lone_result = lone_run(lone, LONE_IDLE, None if args.no_pin else 0)
        print(json.dumps({"lone_monitor_cdc": {**lone_result, "store": args.lone_store}}), flush=True)
        results, found = {}, {}
        for (n, kill), config in zip(runs, configs):
            result = read(config, n, args.shards, end, kill, not args.no_pin)
            results[(n, kill)] = result
            print(json.dumps({**result, "kill": kill}), flush=True)
            found[(n, kill)] = compared(findings(config))
        print(json.dumps(summary(lone_result, results)), flush=True)
        if not args.no_kill and 1 in counts:
            one, killed = found[(1, False)], found[(3, True)]
            print(json.dumps({"killed_run_findings_identical": one == killed, "findings": len(one),
                              **({} if one == killed else {"difference": difference(one, killed)})},
                             default=str), flush=True)


if __name__ == "__main__":
    main()
