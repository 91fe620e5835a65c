"""`oncewatch run` killed with SIGKILL at random points while the shop writes: every row exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

from oncewatch.store import Store

from .conftest import admin_connection, monitor_config_toml


def start_monitor(config_path, tmp_path) -> subprocess.Popen:
    log = open(tmp_path / "monitor.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config_path)],
                            stdout=log, stderr=subprocess.STDOUT)


def test_kill_9_at_random_points_loses_and_doubles_nothing(table_name, tmp_path):
    admin = admin_connection()
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
    config_path = monitor_config_toml([f"owtest.{table_name}"], tmp_path)
    total_tx = 400
    done = threading.Event()

    def writer() -> None:
        conn = admin_connection()
        with conn.cursor() as c:
            for i in range(total_tx):
                conn.begin()
                c.execute(f"INSERT INTO {table_name} VALUES (%s, 'a')", (2 * i,))
                c.execute(f"INSERT INTO {table_name} VALUES (%s, 'b')", (2 * i + 1,))
                conn.commit()
                time.sleep(0.01)
        conn.close()
        done.set()

    monitor = start_monitor(config_path, tmp_path)
    time.sleep(2.0)  # first start bootstraps the (empty) table and sets the checkpoint
    threading.Thread(target=writer, daemon=True).start()
    rng = random.Random(42)
    kills = 0
    while not done.is_set() or kills < 3:
        time.sleep(rng.uniform(0.3, 1.5))
        os.kill(monitor.pid, signal.SIGKILL)
        monitor.wait()
        kills += 1
        monitor = start_monitor(config_path, tmp_path)
    monitor.terminate()
    monitor.wait(30)
    final = subprocess.run([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config_path),
                            "--until-idle", "2"], capture_output=True, text=True, timeout=120)
    assert final.returncode == 0, final.stderr[-2000:]
    store = Store(str(tmp_path / "store.db"))
    ids = [r.pk[0] for r in store.row_changes("table_name = ?", (table_name,))]
    assert kills >= 3
    assert sorted(ids) == list(range(2 * total_tx))  # each row once: none lost, none doubled
    assert ids == list(range(2 * total_tx))  # and in commit order
