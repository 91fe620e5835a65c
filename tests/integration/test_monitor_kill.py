"""`oncewatch run` killed with SIGKILL at random points while the shop writes: every row exactly once, from the
binlog and, in CDC mode, from Debezium's topics."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from devservices.kafka_connect import CDC_SCHEMA, TOPIC_PREFIX
from oncewatch.store import Store, StoreError, journal

from .conftest import admin_connection, cdc_toml, monitor_config_toml, wait_for


def start_monitor(config_path, tmp_path) -> subprocess.Popen:
    log = open(tmp_path / "monitor.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config_path)],
                            stdout=log, stderr=subprocess.STDOUT)


def run_until_idle(config_path) -> subprocess.CompletedProcess:
    """`oncewatch run --until-idle 2`, which must end well."""
    final = subprocess.run([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config_path),
                            "--until-idle", "2"], capture_output=True, text=True, timeout=120)
    assert final.returncode == 0, final.stderr[-2000:]
    return final


# CDC mode: the change source's checkpoint is its topics' offsets, committed with the rows (issue 15).
CDC_MODE = cdc_toml(TOPIC_PREFIX, start_from="latest")


@pytest.mark.parametrize("writer", ["judge", "process"])
def test_kill_9_at_random_points_loses_and_doubles_nothing(table_name, tmp_path, writer):
    """Either writer of the checkpoints ([store] writer): the judge itself, or a process of its own, which dies with
    the monitor."""
    schema = "owtest"
    admin = admin_connection(schema)
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
    config_path = monitor_config_toml([f"{schema}.{table_name}"], tmp_path, writer=writer)
    total_tx = 400
    done = threading.Event()

    def writer() -> None:
        conn = admin_connection(schema)
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
    # the first start's checkpoint: the bootstrap of the (empty) table, or the CDC topics' ends
    poll("the first checkpoint", lambda: checkpoint(tmp_path).get("gtid") is not None)
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
    run_until_idle(config_path)
    store = Store(str(tmp_path / "store.db"))
    ids = [r.pk[0] for r in store.row_changes("table_name = ?", (table_name,))]
    assert kills >= 3
    assert sorted(ids) == list(range(2 * total_tx))  # each row once: none lost, none doubled
    assert ids == list(range(2 * total_tx))  # and in commit order


def checkpoint(tmp_path) -> dict:
    """The monitor's binlog checkpoint and bootstrap progress as committed now ({} before the store exists)."""
    try:
        store = Store(str(tmp_path / "store.db"), readonly=True)
    except StoreError:
        return {}
    try:
        return {**(store.checkpoint("binlog") or {}), "bootstrap": store.state("bootstrap")}
    finally:
        store.close()


def poll(what: str, cond, log: Path | None = None) -> None:
    """Often enough to kill the monitor between two fragments or chunks of a few thousand rows."""
    wait_for(what, cond, timeout=60.0, every=0.05, log=log)


def test_kill_9_inside_a_transaction_too_large_to_hold_resumes_inside_it(table_name, tmp_path):
    """A 30,000-row transaction comes in fragments, each committed with a checkpoint inside the transaction;
    killed between fragments, twice, the monitor resumes after the rows it had, and every row is stored once."""
    rows = 30_000
    admin = admin_connection()
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
    config_path = monitor_config_toml([f"owtest.{table_name}"], tmp_path)
    monitor = start_monitor(config_path, tmp_path)
    poll("the bootstrap", lambda: checkpoint(tmp_path).get("gtid") is not None)
    with admin.cursor() as c:
        c.execute(f"INSERT INTO {table_name} SELECT seq, 'x' FROM seq_0_to_{rows - 1}")
    admin.commit()
    seen = []
    for _ in range(2):
        poll("a fragment committed", lambda: checkpoint(tmp_path).get("within_rows", 0) > (seen[-1] if seen else 0))
        os.kill(monitor.pid, signal.SIGKILL)
        monitor.wait()
        seen.append(checkpoint(tmp_path)["within_rows"])
        monitor = start_monitor(config_path, tmp_path)
    monitor.terminate()
    monitor.wait(30)
    run_until_idle(config_path)
    assert 0 < seen[0] < seen[1] < rows  # both kills landed inside the transaction
    store = Store(str(tmp_path / "store.db"), readonly=True)
    stored = store.row_changes("table_name = ?", (table_name,))
    assert [r.pk[0] for r in stored] == list(range(rows))  # each row once, in binlog order
    assert [r.row_index for r in stored] == list(range(rows))
    assert len({r.txid for r in stored}) == 1
    assert "within_gtid" not in store.checkpoint("binlog")


def test_kill_9_during_a_first_bootstrap_empties_the_store_and_bootstraps_again(table_name, tmp_path):
    """The first bootstrap commits chunk by chunk (it may take minutes, with health and Kafka going on);
    killed inside it, the next start begins it again on an emptied store: every row once."""
    rows = 40_000
    admin = admin_connection()
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
        c.execute(f"INSERT INTO {table_name} SELECT seq, 'x' FROM seq_0_to_{rows - 1}")
    admin.commit()
    config_path = monitor_config_toml([f"owtest.{table_name}"], tmp_path)
    monitor = start_monitor(config_path, tmp_path)
    poll("a bootstrap chunk committed", lambda: (checkpoint(tmp_path).get("bootstrap") or {}).get("rows", 0) > 0)
    os.kill(monitor.pid, signal.SIGKILL)
    monitor.wait()
    interrupted = checkpoint(tmp_path)
    final = run_until_idle(config_path)
    assert 0 < interrupted["bootstrap"]["rows"] < rows and interrupted.get("gtid") is None
    assert "bootstrap_redone" in final.stderr
    store = Store(str(tmp_path / "store.db"), readonly=True)
    stored = store.row_changes("table_name = ?", (table_name,))
    assert sorted(r.pk[0] for r in stored) == list(range(rows)) and all(r.snapshot for r in stored)
    assert store.state("bootstrap") is None and store.checkpoint("binlog")["gtid"]


def test_in_cdc_mode_the_monitor_and_the_connect_worker_killed_lose_and_double_nothing(
        cdc_connector, table_name, tmp_path):
    """Issue 15, in CDC mode: the monitor SIGKILLed at two points stores every row once, in commit order (its
    checkpoint is the topics' offsets, committed with the rows); and Kafka Connect SIGKILLed mid-run, started
    again, resumes from its last flushed offsets, so Debezium writes again what it wrote since: the monitor
    skips those transactions by GTID, counts them as replays (F15 findings, info), and stores every row once."""
    from devservices import kafka_connect

    admin = admin_connection(CDC_SCHEMA)
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
    config_path = monitor_config_toml([f"{CDC_SCHEMA}.{table_name}"], tmp_path, extra=CDC_MODE)
    monitor = start_monitor(config_path, tmp_path)
    poll("the first checkpoint", lambda: checkpoint(tmp_path).get("gtid") is not None, tmp_path / "monitor.log")
    total_tx, worker_killed_at, monitor_killed_at = 600, 300, (150, 450)
    with admin.cursor() as c:
        for i in range(total_tx):
            if i == worker_killed_at:  # while it writes: it has written records since it last flushed its offsets
                kafka_connect.stop(kafka_connect.CONNECT, sig=signal.SIGKILL)
            if i in monitor_killed_at:
                os.kill(monitor.pid, signal.SIGKILL)
                monitor.wait()
                monitor = start_monitor(config_path, tmp_path)
            admin.begin()
            c.execute(f"INSERT INTO {table_name} VALUES (%s, 'a')", (i,))
            admin.commit()
            time.sleep(0.005)
    kafka_connect.up()

    def stored() -> int:
        store = Store(str(tmp_path / "store.db"), readonly=True)
        try:
            (n,), = store.conn.execute(f"SELECT COUNT(*) FROM {journal.rows_from(store.conn)} WHERE table_name = ?",
                                       (table_name,))
            return n
        finally:
            store.close()

    wait_for("every row stored", lambda: stored() >= total_tx, timeout=120, log=tmp_path / "monitor.log")
    time.sleep(1.5)  # a health row written after the last of them
    store = Store(str(tmp_path / "store.db"), readonly=True)
    source = store.health()["binlog"].health.status
    store.close()
    monitor.terminate()
    monitor.wait(30)
    final = run_until_idle(config_path)
    store = Store(str(tmp_path / "store.db"))
    ids = [r.pk[0] for r in store.row_changes("table_name = ?", (table_name,))]
    assert ids == list(range(total_tx)), final.stderr[-2000:]  # every row once, in commit order
    assert source.cdc.replayed_records > 0, source.cdc
    found = store.findings()
    # the replays as replays (F15, info: nothing happened twice), and nothing lost, doubled or incomplete
    assert found and {(f.rule, f.severity) for f in found} == {("F15", "info")}, [(f.rule, f.summary) for f in found]
    assert sum(f.keys["records"] for f in found) == source.cdc.replayed_records
