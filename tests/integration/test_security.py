"""Security (issue 7): loopback by default, and a canary password never leaks anywhere.

The monitor runs as an account whose password is a canary string; the test looks for it in
`check-config` output, the monitor's logs, /metrics, every export format and the store file,
and checks that every socket the monitor and the dashboard listen on is bound to 127.0.0.1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import openpyxl

from devservices.shop_monitor import ROOT, free_port
from oncewatch.dashboards import launch

from .conftest import admin_connection, monitor_config_toml

CANARY = "canary-Pw-93ab-XYZ"


def listening(pid: int) -> list[str]:
    """Local addresses a process listens on (TCP), from `ss`."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def test_canary_password_never_leaks_and_listeners_are_loopback(table_name, tmp_path):
    admin = admin_connection()
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v VARCHAR(10))")
        c.execute("CREATE USER IF NOT EXISTS 'ow_canary'@'127.0.0.1' IDENTIFIED BY %s", (CANARY,))
        c.execute("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'ow_canary'@'127.0.0.1'")
        c.execute("GRANT SELECT ON owtest.* TO 'ow_canary'@'127.0.0.1'")
    port = free_port()
    config = monitor_config_toml([f"owtest.{table_name}"], tmp_path, metrics_port=port)
    text = config.read_text().replace('user = "oncewatch"', 'user = "ow_canary"')
    text = "\n".join('password_env = "OW_CANARY"' if line.startswith("password_file") else line
                     for line in text.splitlines())
    config.write_text(text)
    env = {**os.environ, "OW_CANARY": CANARY}

    checked = subprocess.run([sys.executable, "-m", "oncewatch.cli", "check-config", str(config)], env=env,
                             capture_output=True, text=True, check=True)
    assert "OW_CANARY" in checked.stdout and CANARY not in checked.stdout + checked.stderr

    log = tmp_path / "monitor.log"
    with open(log, "wb") as out:
        monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)],
                                   env={**env, "ONCEWATCH_LOG_LEVEL": "DEBUG"}, stdout=out, stderr=subprocess.STDOUT,
                                   cwd=ROOT)
    try:
        with admin.cursor() as c:
            c.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
        body = ""
        for _ in range(60):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
                if 'collector="binlog"} 1.0' in body:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert 'collector="binlog"} 1.0' in body and CANARY not in body
        addresses = listening(monitor.pid)
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses
    finally:
        monitor.terminate()
        monitor.wait(30)
    assert CANARY not in log.read_text(errors="replace")

    for fmt in ("csv", "json", "xlsx"):
        out = tmp_path / f"report.{fmt}"
        subprocess.run([sys.executable, "-m", "oncewatch.cli", "export", "--config", str(config), "--format", fmt,
                        "--out", str(out)], env=env, check=True, capture_output=True)
        if fmt == "xlsx":
            book = openpyxl.load_workbook(out, read_only=True)
            cells = " ".join(str(v) for ws in book.worksheets for row in ws.iter_rows(values_only=True) for v in row)
            assert CANARY not in cells
        else:
            assert CANARY.encode() not in out.read_bytes()
    for path in tmp_path.glob("store.db*"):
        assert CANARY.encode() not in path.read_bytes()

    dash_port = free_port()
    dashboard = launch.launch(config=str(config), port=dash_port)
    try:
        launch.wait_ready(dashboard, launch.url(port=dash_port))
        addresses = listening(dashboard.pid)
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses
    finally:
        launch.stop(dashboard)
