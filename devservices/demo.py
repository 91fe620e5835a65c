"""`make demo`: the simulated shop with faults, the monitor watching it, the dashboard.

Assumes the dev services run (`make demo` starts them first). Resets the shop's tables and
topic and the demo's store, starts the monitor (which bootstraps on the empty shop), then the
shop at a few orders per second with the default fault mix (and a small second shop that sends its
events from inside its transactions, the only way to show F8), then the Streamlit dashboard;
prints one line per address and stops everything it started on Ctrl-C or SIGTERM.

It pages as a deployment would: its /metrics is listed for the dev stack's Prometheus (a target file in
devservices.paging.DEMO_TARGETS, job oncewatch-demo), whose Alertmanager routes that job's alerts to a
webhook receiver the demo runs on DEMO_WEBHOOK_PORT, and the demo prints a line per notification it gets.

The monitor's config is examples/shop.toml written into the demo's folder with the dev stack's
ports and DEMO_RULES: at a few orders per second the design's thresholds would take a quarter of
an hour to show F3 and F11, and the demo shows every rule within its first few minutes. It signs period
attestations with a key pair of its own (`oncewatch attest-key`, made once in the demo's folder), so the Reports page
makes and lists them.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kafka import KafkaAdminClient

from devservices import paging
from devservices.receiver import Notification, Receiver
from devservices.shop_monitor import ROOT, edit_config, shop_config
from devservices.base import STATE
from oncewatch.core.config import load
from oncewatch.dashboards import launch
from oncewatch.shop.schema import prepare_tables, prepare_topic
from oncewatch.shop.settings import KafkaTarget, MySQLTarget

WORK = STATE / "demo"
# Stuck after a minute, not 15 (F3: the demo's clean orders are paid within seconds); a stalled group drifts
# at 500 records, some 40 s of the demo's traffic, not 5,000 (F11); skew held for 30 s, not 60 (F12).
DEMO_RULES = {"stuck_pending_seconds": 60, "offset_drift_threshold": 500, "partition_skew_seconds": 30}
# A mix where every rule shows within the first minutes at a few orders per second.
DEFAULT_FAULTS = "all"
IN_TRANSACTION_RATE = 0.5
IN_TRANSACTION_FAULTS = "send_then_rollback=0.2"


def wait_http(url: str, what: str, proc: subprocess.Popen, logs: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"demo: {what} exited (code {proc.returncode}); see {logs}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"demo: {what} did not answer at {url} within {timeout:.0f}s; see {logs}")


def reset_shop() -> None:
    """Fresh shop tables and topic, so the demo's findings are this run's alone."""
    target = KafkaTarget()
    prepare_tables(MySQLTarget(), reset=True)
    admin = KafkaAdminClient(bootstrap_servers=target.bootstrap_servers, client_id="oncewatch-demo")
    try:
        prepare_topic(admin, target, reset=True)
    finally:
        admin.close()


LOGS: dict[subprocess.Popen, Path] = {}  # each spawned process's log, to name it when it dies


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    LOGS[proc] = log
    return proc


def report_failed(procs: list[subprocess.Popen], reported: set[subprocess.Popen]) -> None:
    """Say so, once, when a process of the demo has failed: a shop that died leaves its rules unshown."""
    for p in procs:
        if p not in reported and p.poll() not in (None, 0):
            reported.add(p)
            print(f"demo: {Path(p.args[0]).name} failed (exit {p.returncode}); see {LOGS.get(p, 'its log')}",
                  flush=True)


def print_page(notification: Notification) -> None:
    print(f"demo: {notification.line()}", flush=True)


def start_paging(metrics_host: str, metrics_port: int) -> tuple[Receiver, Path]:
    """The demo's receiver, and its /metrics listed for the stack's Prometheus: (receiver, target file)."""
    try:
        receiver = Receiver(paging.DEMO_WEBHOOK_PORT, print_page)
    except OSError as exc:
        raise SystemExit(f"demo: cannot receive pages on {paging.DEMO_WEBHOOK_PORT} ({exc.strerror}): is another "
                         f"demo running on this stack? Stop it first") from exc
    # Holding the demo's port, this is the stack's only demo: a target file left by one that was killed is stale.
    for stale in paging.DEMO_TARGETS.glob("*.json"):
        stale.unlink()
    paging.DEMO_TARGETS.mkdir(parents=True, exist_ok=True)
    target = paging.DEMO_TARGETS / f"demo-{metrics_port}.json"
    target.write_text(json.dumps([{"targets": [f"{metrics_host}:{metrics_port}"]}]))
    return receiver, target


def with_attestations(config: Path, bin_dir: Path) -> None:
    """The config's [attest]: the demo's own key pair (made once, kept in its folder) and folder of attestations."""
    keys = config.parent / "keys"
    if not (keys / "attest.key").exists():
        subprocess.run([str(bin_dir / "oncewatch"), "attest-key", "--out", str(keys)], check=True,
                       stderr=subprocess.DEVNULL)
    edit_config(config, lambda data: data.update(attest={"key_file": str(keys / "attest.key"),
                                                         "directory": str(config.parent / "attestations")}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=3.0, help="new orders per second (default %(default)s)")
    ap.add_argument("--faults", default=DEFAULT_FAULTS, help="the shop's fault mix (default %(default)s)")
    ap.add_argument("--minutes", type=float, default=600.0, help="how long the shop keeps selling")
    ap.add_argument("--work", type=Path, default=WORK, help="the demo's config, store, logs (default %(default)s)")
    ap.add_argument("--metrics-port", type=int, default=9464, help="the monitor's /metrics (default %(default)s)")
    ap.add_argument("--dashboard-port", type=int, default=launch.DEFAULT_PORT, help="default %(default)s")
    args = ap.parse_args(argv)
    work: Path = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    config = shop_config(work, metrics_port=args.metrics_port, rules=DEMO_RULES, topic=KafkaTarget().topic,
                         schema=MySQLTarget().database)
    bin_dir = Path(sys.executable).parent
    with_attestations(config, bin_dir)
    cfg = load(config)
    procs: list[subprocess.Popen] = []
    stopping = False
    receiver, target = start_paging(cfg.metrics.host, cfg.metrics.port)

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        print("demo: resetting the shop's tables and topic", flush=True)
        reset_shop()
        for suffix in ("", "-wal", "-shm"):
            Path(cfg.store.path + suffix).unlink(missing_ok=True)
        monitor = spawn([str(bin_dir / "oncewatch"), "run", "--config", str(config)], work / "monitor.log")
        procs.append(monitor)
        metrics_url = f"http://{cfg.metrics.host}:{cfg.metrics.port}/metrics"
        wait_http(metrics_url, "the monitor", monitor, work)
        procs.append(spawn([str(bin_dir / "oncewatch-shop"), "--duration", str(args.minutes * 60),
                            "--rate", str(args.rate), "--faults", args.faults], work / "shop.log"))
        # One style cannot show every rule: an event sent inside a transaction that then rolls back (F8)
        # needs the in-transaction style, a slow send (F10) another. A second, small shop beside the first
        # (its own order numbers, its own consumer groups, which the monitor does not watch) sends that way.
        procs.append(spawn([str(bin_dir / "oncewatch-shop"), "--duration", str(args.minutes * 60),
                            "--rate", str(IN_TRANSACTION_RATE), "--style", "in_transaction", "--seed", "2",
                            "--groups", "shipping-service-tx,points-service-tx",
                            "--faults", IN_TRANSACTION_FAULTS],
                           work / "shop-in-transaction.log"))
        dashboard = launch.launch(config=str(config), port=args.dashboard_port, log=work / "dashboard.log")
        procs.append(dashboard)
        launch.wait_ready(dashboard, launch.url(port=args.dashboard_port))
        print(f"demo: dashboard  {launch.url(port=args.dashboard_port)}", flush=True)
        print(f"demo: /metrics   {metrics_url}", flush=True)
        print(f"demo: paging     Prometheus http://{paging.HOST}:{paging.PROMETHEUS_PORT}/alerts, Alertmanager "
              f"http://{paging.HOST}:{paging.ALERTMANAGER_PORT}; each notification prints a `demo: page` line",
              flush=True)
        print(f"demo: config, store and logs in {work}; Ctrl-C stops the shop, the monitor and the dashboard",
              flush=True)
        reported: set[subprocess.Popen] = set()
        while not stopping and all(p.poll() is None for p in procs[:1]):
            report_failed(procs, reported)
            time.sleep(0.5)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        target.unlink(missing_ok=True)
        receiver.close()
        print("demo: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
