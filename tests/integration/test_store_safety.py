"""The store under two real `oncewatch run` processes and under a disk that fills while one runs."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pymysql

from oncewatch.core.names import MONITOR
from oncewatch.store import StoreError, open_reader
from tests.unit.test_store_files import fill, small_disk  # noqa: F401 - small_disk is a fixture

from .conftest import monitor_config_toml, wait_for

# An effect table: two rows of one trade_no are an F1 finding.
EXTRA = """
[[domain.effects]]
table = "owtest.{table}"
trade_no_column = "trade_no"
"""


def effects_config(admin: pymysql.Connection, table: str, tmp_path: Path, store: Path) -> Path:
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, trade_no VARCHAR(20), note VARCHAR(50))")
    return monitor_config_toml([f"owtest.{table}"], tmp_path, store=store, extra=EXTRA.format(table=table))


def insert(admin: pymysql.Connection, table: str, rows: list[tuple[int, str]]) -> None:
    with admin.cursor() as c:
        c.executemany(f"INSERT INTO {table} VALUES (%s, %s, REPEAT('n', 50))", rows)


def start(config: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def oncewatch(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oncewatch.cli", *argv], capture_output=True, text=True,
                          timeout=120)


def running(store: Path) -> bool:
    try:
        with closing(open_reader(str(store))) as s:
            return MONITOR in s.health()
    except StoreError:
        return False


def f1_ids(store: Path) -> set[str]:
    with closing(open_reader(str(store))) as s:
        return {f.id for f in s.findings(rule="F1")}


def row_count(store: Path) -> int:
    with closing(open_reader(str(store))) as s:
        return s.count("row_changes")


def monitor_with_a_finding(admin: pymysql.Connection, table: str, tmp_path: Path,
                           store: Path) -> tuple[Path, Path, subprocess.Popen]:
    """`oncewatch run` on `store` (its config, its log, its process), once it has committed an F1."""
    config = effects_config(admin, table, tmp_path, store)
    log = tmp_path / "monitor.log"
    monitor = start(config, log)
    try:
        wait_for("the monitor", lambda: running(store))
        insert(admin, table, [(1, "T1"), (2, "T1")])
        wait_for("the F1 finding", lambda: len(f1_ids(store)) == 1)
    except BaseException:
        monitor.kill()
        monitor.wait()
        raise
    return config, log, monitor


def test_a_second_monitor_is_refused_while_the_first_runs_on_with_readers_and_reviews_beside_it(
        admin, table_name, tmp_path):
    store = tmp_path / "store.db"
    config, log, first = monitor_with_a_finding(admin, table_name, tmp_path, store)
    try:
        second = oncewatch("run", "--config", str(config), "--until-idle", "1")
        assert second.returncode == 2, second.stderr
        assert f"another oncewatch monitor (pid {first.pid}) is running on the store {store}" in second.stderr
        assert first.poll() is None

        found = json.loads(oncewatch("findings", "--config", str(config), "--format", "json").stdout)
        (fid,) = [f["id"] for f in found if f["rule"] == "F1"]
        assert oncewatch("export", "--config", str(config), "--format", "csv",
                         "--out", str(tmp_path / "report.csv")).returncode == 0
        ack = oncewatch("ack", "--config", str(config), fid, "--note", "seen while the monitor runs")
        assert ack.returncode == 0, ack.stderr
        insert(admin, table_name, [(3, "T2")])  # the first monitor goes on committing
        wait_for("the first monitor's next commit", lambda: row_count(store) == 3)
        assert first.poll() is None
    finally:
        first.terminate()
        first.wait(60)
    assert first.returncode == 0, log.read_text()[-2000:]
    assert "IntegrityError" not in log.read_text() and "internal error" not in log.read_text()
    with closing(open_reader(str(store))) as s:
        assert [f.status for f in s.findings(rule="F1")] == ["acknowledged"]


def test_a_disk_that_fills_under_a_running_monitor_ends_it_with_exit_4_at_every_start_and_loses_nothing(
        admin, table_name, tmp_path, small_disk):
    store = small_disk / "store.db"
    config, log, monitor = monitor_with_a_finding(admin, table_name, tmp_path, store)
    try:
        before = f1_ids(store)
        filler = fill(small_disk)
        more = [(i, f"T{i}") for i in range(3, 303)]
        for i in range(0, len(more), 50):
            insert(admin, table_name, more[i:i + 50])
        code = monitor.wait(120)
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait()
    said = f"store error: the disk holding the store {store} is full"
    assert code == 4, log.read_text()[-3000:]
    assert said in log.read_text() and "internal error" not in log.read_text()

    again = oncewatch("run", "--config", str(config), "--until-idle", "2")
    assert again.returncode == 4 and said in again.stderr, again.stderr
    assert "Traceback" not in again.stderr

    filler.unlink()
    final = oncewatch("run", "--config", str(config), "--until-idle", "2")
    assert final.returncode == 0, final.stderr[-3000:]
    assert f1_ids(store) == before
    assert row_count(store) == 2 + len(more)  # what was committed on the binlog while the disk was full: read again
