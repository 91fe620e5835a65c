"""`make test`'s suite: five pytest sessions on four stacks of dev services, four of them side by side.

The integration tests share their stack's services, and some restart or kill them, so one stack's tests run one
after another in one session (tests/integration/conftest.py orders them and starts the demo beside the first ones).
They mostly wait on servers and timers, not on a core, so they run in lanes, each a session on a stack of its own: the
short chaos soak, the groups' tests and the CDC tests that pause or kill the connector, with the shape changes' (CHAOS,
on a third stack), the other tests that restart, kill or pause a server, with two short ones that do not (RESTARTING,
on a second stack), the tests that restart nothing but take minutes (MINUTES, on a fourth stack: the secured
connections' and the CDC pipeline's) and the rest, the demo's among them (on the stack `make services` started). The
suite starts the second to fourth stacks in the background (`.devstack-2` to `.devstack-4`, on the ports of LANES), the
second and third without the paging path, which none of their tests use. The unit
tests run meanwhile in a session of their own, with their PostgreSQL cases (marked integration: each on a schema of
its own on the first stack, which `make test` starts before the suite) among them; they keep both cores busy, so the
fourth lane starts once they are done. Each session's header says when it ended after the suite's start and the
CPU-seconds it used with the monitors and shops it ran (os.wait4): the lanes are balanced by those figures on a fresh
clone. The outputs are kept in files and printed one after the other, so they never interleave; the suite fails if
any session does. Arguments are passed to every session (`python -m devservices.suite -x`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTEGRATION = "tests/integration"
UNIT = "tests/unit"
# The lanes' tests, chosen so that the lanes end about together on a fresh clone here. Stop 55, three lanes: the
# first 863 s, the restarting 941 s, the chaos 834 s, the unit tests 351 s beside them, the suite 988 s. Stop 56 tried
# four and five lanes started together (942 s, and the dashboard's browser tests failed on a machine that busy in the
# first minutes, when the stacks start) and other splits (921 s, 990 s); this one, with the fourth lane started once
# the unit tests are done, gave the best: the first lane 696 s, the restarting 866 s, the chaos 777 s, the fourth
# 755 s, the suite 882 s. Stop 63, once audits (--until-idle) ended when due and the connector polled every 0.1 s: the
# first lane 824 s, the restarting 828 s, the chaos 897 s, the fourth 355 s after the unit tests' 570 s, the suite
# 929 s. The fourth lane started beside the others (five sessions at once) made every lane slower (the unit tests
# 797 s, the first lane 948 s) and three load-bound tests fail, so it still waits; it gives the live clock's and the
# report money's tests (55 s) to the restarting lane. Stop 64 (the restarting and chaos stacks without the paging
# path): the first lane 899 s, the chaos 840 s, the restarting 900 s, the fourth 935 s (311 s after the unit tests'
# 620 s); the shape changes' tests (55 s) move from the fourth lane to the chaos lane.
RESTARTING = ("test_under_fire.py", "test_broker_kill.py", "test_monitor_kill.py", "test_kafka_restart.py",
              "test_binlog_collector.py", "test_cdc_snapshot_kill.py", "test_group_fencing.py",
              "test_effect_deletes.py", "test_live_clock.py", "test_report_money.py")
CHAOS = ("test_chaos.py", "test_group.py", "test_group_start.py", "test_cdc_rebalance.py", "test_cdc_clock.py",
         "test_cdc_replay.py", "test_shape_changes.py")
MINUTES = ("test_kafka_security.py", "test_mysql_tls.py", "test_postgres_tls.py", "test_cdc_pipeline.py")


@dataclass(frozen=True)
class Lane:
    """Integration tests on a stack of their own: its data dirs and ports (Kafka's controller, Connect,
    Prometheus, Alertmanager and PostgreSQL follow these two: devservices.base)."""

    name: str
    title: str
    tests: tuple[str, ...]
    stack: dict[str, str]
    after_unit: bool = False  # the session starts once the unit tests' has ended (they keep both cores busy)
    paging: bool = True  # Prometheus and the Alertmanager on its stack: only the lanes whose tests page need them


LANES = (Lane("chaos", "the short chaos soak, the groups and the connector's pauses and kills (third stack)", CHAOS,
              {"ONCEWATCH_DEV_STATE": ".devstack-3", "ONCEWATCH_DEV_MARIADB_PORT": "17306",
               "ONCEWATCH_DEV_KAFKA_PORT": "17092"}, paging=False),
         Lane("restarting", "the integration tests that restart servers (second stack)", RESTARTING,
              {"ONCEWATCH_DEV_STATE": ".devstack-2", "ONCEWATCH_DEV_MARIADB_PORT": "14306",
               "ONCEWATCH_DEV_KAFKA_PORT": "14092"}, paging=False),
         Lane("minutes", "the integration tests that take minutes and restart nothing (fourth stack)", MINUTES,
              {"ONCEWATCH_DEV_STATE": ".devstack-4", "ONCEWATCH_DEV_MARIADB_PORT": "21306",
               "ONCEWATCH_DEV_KAFKA_PORT": "21092"}, after_unit=True))


def wait_all(procs: list[subprocess.Popen], started: float) -> dict[int, tuple[int, float, float]]:
    """Per session's pid, once every one has ended: its exit code, when it ended (seconds after `started`; for one
    that had ended before this call, when this call began) and the CPU-seconds it used with the children it waited
    for (its monitors, shops and servers' clients)."""
    pending = {proc.pid: proc for proc in procs}
    ended: dict[int, tuple[int, float, float]] = {}
    while pending:
        pid, status, usage = os.wait4(-1, 0)
        proc = pending.pop(pid, None)
        if proc is not None:
            proc.returncode = os.waitstatus_to_exitcode(status)
            ended[pid] = (proc.returncode, time.monotonic() - started, usage.ru_utime + usage.ru_stime)
    return ended


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    own = {lane.name: [f"{INTEGRATION}/{t}" for t in lane.tests if (ROOT / INTEGRATION / t).exists()]
           for lane in LANES}
    started = time.monotonic()
    # kept when a session fails: its tests' monitor logs, stores and configs are how a fresh clone's failure is read
    work = Path(tempfile.mkdtemp(prefix="oncewatch-suite-"))

    def session(name: str, argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        out = work / f"{name}.out"
        with open(out, "wb") as f:
            # A basetemp of its own: the sessions never clean up each other's tmp_path folders.
            proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                     "--basetemp", str(work / name), *argv, *args],
                                    stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        return proc, out

    stacks = {}
    for lane in LANES:
        with open(work / f"{lane.name}-stack.out", "wb") as f:
            stacks[lane.name] = subprocess.Popen([sys.executable, "-m", "devservices.stack", "up",
                                                  *(() if lane.paging else ("--no-paging",))], stdout=f,
                                                 stderr=subprocess.STDOUT, env={**os.environ, **lane.stack},
                                                 cwd=ROOT)
    unit = session("unit", [UNIT])
    first = session("integration", ["-m", "integration", f"--ignore={UNIT}",
                                     *(f"--ignore={p}" for tests in own.values() for p in tests)])
    lanes = [("the integration tests", first)]
    codes = {}
    for lane in sorted(LANES, key=lambda lane: lane.after_unit):
        if lane.after_unit:  # ended, and left for wait_all to reap with its CPU-seconds
            os.waitid(os.P_PID, unit[0].pid, os.WEXITED | os.WNOWAIT)
        if stacks[lane.name].wait() == 0:
            lanes.append((lane.title, session(lane.name, ["-m", "integration", *own[lane.name]],
                                              {**os.environ, **lane.stack})))
        else:
            codes[f"the stack of {lane.title}"] = stacks[lane.name].returncode
    lanes.append(("the unit tests", unit))
    ended = wait_all([proc for _, (proc, _) in lanes], started)
    for title, (proc, out) in lanes:
        codes[title], at, cpu = ended[proc.pid]
        print(f"\n==== {title} (ended {at:.0f} s after the suite's start; {cpu:.0f} CPU-seconds) ====", flush=True)
        sys.stdout.write(out.read_text(errors="replace"))
    for lane in LANES:
        if stacks[lane.name].returncode != 0:
            print(f"\n==== the stack of {lane.title} did not start ({stacks[lane.name].returncode}) ====",
                  flush=True)
            sys.stdout.write((work / f"{lane.name}-stack.out").read_text(errors="replace"))
    print("\nsuite: " + ", ".join(f"{title} exit {code}" for title, code in codes.items()), flush=True)
    failed = next((code for code in codes.values() if code), 0)
    if failed:
        print(f"suite: the sessions' folders (their tests' logs, stores and configs) are kept in {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
