"""`make test`'s suite: three pytest sessions side by side on two stacks of dev services.

The integration tests share their stack's services, and some restart or kill them, so one stack's tests run
one after another in one session (tests/integration/conftest.py orders them and starts the demo beside the
first ones). They mostly wait on servers and timers, not on a core, so they run in two lanes, each a session
on a stack of its own: the tests that restart, kill or pause a server (RESTARTING, on a second stack that
this suite starts in the background, `.devstack-2` on the ports of SECOND_STACK) and the rest, the demo's
among them (on the stack `make services` started). The unit tests need no server: they run meanwhile in a
session of their own. The outputs are kept in files and printed one after the other, so they never
interleave; the suite fails if any session does. Arguments are passed to every session
(`python -m devservices.suite -x`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTEGRATION = "tests/integration"
# The second stack: its own data dirs and ports (Kafka's controller, Connect, Prometheus, Alertmanager and
# PostgreSQL follow these two: devservices.stack).
SECOND_STACK = {"ONCEWATCH_DEV_STATE": ".devstack-2", "ONCEWATCH_DEV_MARIADB_PORT": "14306",
                "ONCEWATCH_DEV_KAFKA_PORT": "14092"}
# The tests that restart, kill or pause a server of their stack (or the connector): the second lane.
RESTARTING = ("test_under_fire.py", "test_broker_kill.py", "test_group.py", "test_monitor_kill.py",
              "test_kafka_restart.py", "test_binlog_collector.py", "test_cdc_clock.py", "test_cdc_replay.py",
              "test_group_start.py")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    restarting = [f"{INTEGRATION}/{name}" for name in RESTARTING if (ROOT / INTEGRATION / name).exists()]
    second = {**os.environ, **SECOND_STACK}
    with tempfile.TemporaryDirectory(prefix="oncewatch-suite-") as tmp:
        work = Path(tmp)

        def session(name: str, argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
            out = work / f"{name}.out"
            with open(out, "wb") as f:
                # A basetemp of its own: the sessions never clean up each other's tmp_path folders.
                proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                         "--basetemp", str(work / name), *argv, *args],
                                        stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            return proc, out

        stack_log = work / "second-stack.out"
        with open(stack_log, "wb") as f:
            second_stack = subprocess.Popen([sys.executable, "-m", "devservices.stack", "up"], stdout=f,
                                            stderr=subprocess.STDOUT, env=second, cwd=ROOT)
        unit = session("unit", ["-m", "not integration"])
        first = session("integration", ["-m", "integration", *(f"--ignore={p}" for p in restarting)])
        lanes = [("the integration tests", first), ("the unit tests", unit)]
        if second_stack.wait() == 0:
            lanes.insert(1, ("the integration tests that restart servers (second stack)",
                             session("restarting", ["-m", "integration", *restarting], second)))
        codes = {}
        for title, (proc, out) in lanes:
            codes[title] = proc.wait()
            print(f"\n==== {title} ====", flush=True)
            sys.stdout.write(out.read_text(errors="replace"))
        if second_stack.returncode != 0:
            print(f"\n==== the second stack did not start ({second_stack.returncode}) ====", flush=True)
            sys.stdout.write(stack_log.read_text(errors="replace"))
            codes["the second stack"] = second_stack.returncode
    print("\nsuite: " + ", ".join(f"{title} exit {code}" for title, code in codes.items()), flush=True)
    return next((code for code in codes.values() if code), 0)


if __name__ == "__main__":
    sys.exit(main())
