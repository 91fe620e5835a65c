"""`[store] writer = "process"`: the store's writer process killed with SIGKILL (as the kernel kills for memory) while
the shop writes. The monitor starts again from the last checkpoint written, without stopping, and counts the death.
In a file of its own, so that it runs in the suite's first lane (devservices.suite): the lane of test_monitor_kill,
which restarts servers, is the longest."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from devservices.shop_monitor import free_port
from oncewatch.core.processes import descendants, parent_of
from oncewatch.store import Store, StoreError

from .conftest import admin_connection, monitor_config_toml, wait_for
from .recorded_run import metric
from .test_monitor_kill import checkpoint, poll, run_until_idle, start_monitor


def store_writer_pid(monitor: int) -> int | None:
    """The pid of `monitor`'s store writer process (`ow-store`, forked from the monitor's forkserver)."""
    for pid in descendants(monitor):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "ow-store" and parent_of(parent_of(pid)) == monitor:
                return pid
        except (OSError, ValueError, IndexError):  # a process that ended meanwhile
            continue
    return None


def test_the_store_writer_process_killed_loses_and_doubles_nothing_and_is_counted(table_name, tmp_path):
    schema = "owtest"
    admin = admin_connection(schema)
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
    port = free_port()
    config_path = monitor_config_toml([f"{schema}.{table_name}"], tmp_path, writer="process", metrics_port=port)
    total = 300
    monitor = start_monitor(config_path, tmp_path)
    try:
        poll("the first checkpoint", lambda: checkpoint(tmp_path).get("gtid") is not None)
        conn = admin_connection(schema)
        with conn.cursor() as c:
            for i in range(total):
                c.execute(f"INSERT INTO {table_name} VALUES (%s, 'a')", (i,))
                conn.commit()
                if i in (100, 200):
                    writer = store_writer_pid(monitor.pid)
                    assert writer is not None, "no ow-store process under the monitor"
                    os.kill(writer, signal.SIGKILL)
                    wait_for("the monitor started again with a new store writer",
                             lambda: store_writer_pid(monitor.pid) not in (None, writer))
                time.sleep(0.005)
        conn.close()
        wait_for("both deaths counted on /metrics",
                 lambda: metric(port, "oncewatch_store_writer_deaths_total") == 2)
        assert monitor.poll() is None, "the monitor stopped"
        wait_for("every row stored", lambda: len(stored_ids(tmp_path, table_name)) >= total)
    finally:
        monitor.terminate()
        monitor.wait(30)
    log = (tmp_path / "monitor.log").read_text()
    assert log.count('"event": "store_writer_died"') == 2
    run_until_idle(config_path)
    assert stored_ids(tmp_path, table_name) == list(range(total))  # each row once, in commit order


def stored_ids(tmp_path, table_name) -> list[int]:
    try:
        store = Store(str(tmp_path / "store.db"), readonly=True)
    except StoreError:
        return []
    try:
        return [r.pk[0] for r in store.row_changes("table_name = ?", (table_name,))]
    finally:
        store.close()
