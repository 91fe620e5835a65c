"""`make demo` as a test runs it: the real `python -m devservices.demo` in a folder of its own, on free
ports, started once per session.

The demo needs a minute or two before its slowest rules show (F3 waits for an order to be stuck), so
the session starts it in the background as soon as its test is collected (conftest) and the suite's
first tests run meanwhile; the demo's test then finds it mostly warmed up.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from devservices.shop_monitor import ROOT, free_ports
from oncewatch.dashboards import launch

READY = "demo: config, store and logs in"  # the demo's last line once everything answers


@dataclass
class DemoRun:
    work: Path
    metrics_port: int
    dashboard_port: int
    proc: subprocess.Popen
    started: float

    @classmethod
    def start(cls) -> DemoRun:
        work = Path(tempfile.mkdtemp(prefix="oncewatch-demo-"))
        metrics_port, dashboard_port = free_ports(2)
        with open(work / "demo.out", "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "devservices.demo", "--work", str(work), "--minutes", "20",
                                     "--metrics-port", str(metrics_port), "--dashboard-port", str(dashboard_port)],
                                    cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        return cls(work, metrics_port, dashboard_port, proc, time.time())

    @property
    def store(self) -> Path:
        return self.work / "store.db"

    @property
    def config(self) -> Path:
        return self.work / "oncewatch.toml"

    @property
    def url(self) -> str:
        return launch.url(port=self.dashboard_port)

    def output(self) -> str:
        return (self.work / "demo.out").read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while READY not in self.output():
            assert self.proc.poll() is None, f"the demo exited ({self.proc.returncode}):\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"the demo was not ready within {timeout:.0f} s:\n{self.output()}"
            time.sleep(0.5)

    def stop(self) -> int:
        """Ctrl-C, as a user stops it; the demo's exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()
