"""The store's files: one monitor per store, an empty or foreign file refused, 0600 modes, a full disk
said as such (on a real 2 MB tmpfs) at the write and at every start; each time nothing committed lost."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from oncewatch.store import (NotAStoreError, Store, StoreFullError, StoreLockedError, open_monitor, open_reader,
                             open_writer, reviews)
from oncewatch.store.schema import SCHEMA
from oncewatch.core.config import PostgresTarget
from tests.conftest import StoreTarget, store_section
from tests.unit.test_reports import FINDINGS, seed

IDS = {f.id for f in FINDINGS}
# Holds the store as a monitor does, in a process of its own, until its stdin closes: a file's path, or a
# PostgreSQL URL and its password file.
HOLD = ("import sys; from oncewatch.store import open_monitor; from oncewatch.core.config import PostgresTarget; "
        "from oncewatch.core.sections import Secret; "
        "store = open_monitor(PostgresTarget(sys.argv[1], Secret(file=sys.argv[2])) if len(sys.argv) > 2 "
        "else sys.argv[1]); print('held', flush=True); sys.stdin.read()")


def write_config(tmp_path: Path, store: StoreTarget) -> Path:
    path = tmp_path / "oncewatch.toml"
    path.write_text(f'[mysql]\nuser = "oncewatch"\ntables = ["shop.orders"]\n\n{store_section(store)}')
    return path


def oncewatch(*argv: str) -> subprocess.CompletedProcess:
    """The installed command in a process of its own; a refused store ends it before any source is asked
    (no MySQL here: reaching it would be exit 3)."""
    return subprocess.run([sys.executable, "-m", "oncewatch.cli", *argv], capture_output=True, text=True, timeout=60)


def finding_ids(path: Path) -> set[str]:
    with closing(open_reader(str(path))) as store:
        return store.finding_ids()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def monitor_elsewhere(target: Path | StoreTarget) -> Iterator[subprocess.Popen]:
    where = [target.url, target.password.file] if isinstance(target, PostgresTarget) else [str(target)]
    proc = subprocess.Popen([sys.executable, "-c", HOLD, *where], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- one monitor per store

def test_a_second_monitor_is_refused_naming_the_store_and_the_holder_while_readers_and_reviews_work(tmp_path,
                                                                                                    store_target):
    seed(store_target).close()
    config = write_config(tmp_path, store_target)
    with monitor_elsewhere(store_target) as holder:
        with pytest.raises(StoreLockedError) as refused:
            open_monitor(store_target)
        said = str(refused.value)
        assert f"pid {holder.pid}" in said and f") is running on the store {store_target}" in said

        run = oncewatch("run", "--config", str(config), "--until-idle", "1")
        assert run.returncode == 2, run.stderr
        assert "another oncewatch monitor (" in run.stderr and f"pid {holder.pid}" in run.stderr
        assert f"is running on the store {store_target}" in run.stderr
        assert "Traceback" not in run.stderr
        assert oncewatch("bootstrap", "--config", str(config)).returncode == 2

        # Readers and a person's review go on beside the monitor.
        assert oncewatch("findings", "--config", str(config)).returncode == 0
        export = oncewatch("export", "--config", str(config), "--format", "json", "--out", str(tmp_path / "r.json"))
        assert export.returncode == 0, export.stderr
        ack = oncewatch("ack", "--config", str(config), "f-dup", "--note", "on it")
        assert ack.returncode == 0, ack.stderr
        assert holder.poll() is None
    # Killed (as by kill -9): the kernel (or PostgreSQL, with the session) has dropped its lock, there is
    # nothing stale to clean up.
    with closing(open_monitor(store_target)) as store:
        assert store.finding_ids() == IDS
        assert store.findings_by_id(["f-dup"])[0].status == "acknowledged"


def test_the_lock_is_given_up_on_close(store_target):
    open_monitor(store_target).close()
    open_monitor(store_target).close()


# ---------------------------------------------------------------- what a store file is

def test_a_missing_store_is_created_whole_and_private(tmp_path):
    path = tmp_path / "new" / "dir" / "oncewatch.db"
    umask = os.umask(0o022)  # the usual umask would leave files 0644
    try:
        store = open_monitor(str(path))
        with store.batch() as tx:
            tx.upsert_findings(FINDINGS)
        files = sorted(p.name for p in path.parent.iterdir())
        assert files == ["oncewatch.db", "oncewatch.db-shm", "oncewatch.db-wal", "oncewatch.db.lock"]
        assert {name: mode(path.parent / name) for name in files} == dict.fromkeys(files, 0o600)
        store.backup(str(tmp_path / "copy.db"))  # a copy holds the same rows
        assert mode(tmp_path / "copy.db") == 0o600
        store.close()
        # SQLite gives -wal and -shm the database's mode, whoever opens it next.
        with closing(open_writer(str(path))) as writer:
            reviews.acknowledge(writer, ["f-dup"], by="tester", note="seen", until=2e9, now=1e9)
            assert mode(path.parent / "oncewatch.db-wal") == 0o600
    finally:
        os.umask(umask)
    assert finding_ids(path) == IDS


def test_a_store_made_before_its_files_were_private_is_made_private(tmp_path):
    path = tmp_path / "oncewatch.db"
    seed(path).close()
    path.chmod(0o644)
    with closing(open_monitor(str(path))):
        assert {p.name: mode(p) for p in tmp_path.iterdir()} == {
            "oncewatch.db": 0o600, "oncewatch.db-wal": 0o600, "oncewatch.db-shm": 0o600, "oncewatch.db.lock": 0o600}


def test_an_empty_store_is_refused_and_left_as_it_was(tmp_path):
    """A store truncated to 0 bytes, with the -wal of its last commits still beside it: SQLite would take
    the file for a new database and drop that -wal; the monitor would bootstrap a new store there."""
    path = tmp_path / "oncewatch.db"
    with closing(seed(path)):
        wal = (tmp_path / "oncewatch.db-wal").read_bytes()
    assert wal  # the commits of seed(), not yet in the database file
    path.write_bytes(b"")
    (tmp_path / "oncewatch.db-wal").write_bytes(wal)
    config = write_config(tmp_path, path)
    with pytest.raises(NotAStoreError, match=f"{path} is empty"):
        open_monitor(str(path))
    for argv in (("run", "--until-idle", "1"), ("findings",), ("ack", "f-dup", "--note", "x")):
        result = oncewatch(argv[0], "--config", str(config), *argv[1:])
        assert result.returncode == 2 and f"{path} is empty (0 bytes)" in result.stderr, result.stderr
        assert "restore the store from a backup, or delete the file" in result.stderr
    assert path.stat().st_size == 0 and (tmp_path / "oncewatch.db-wal").read_bytes() == wal
    assert not (tmp_path / "oncewatch.db-shm").exists()


def sqlite_of_another_program(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, phone TEXT)")
        conn.execute("INSERT INTO customers VALUES (1, '13800000000')")
        conn.commit()


def sqlite_without_tables(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA user_version = 7")


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_text("store.path = 'here'\n"), "is not an oncewatch store (it is not a SQLite database)"),
    (sqlite_of_another_program, "is a SQLite database but not an oncewatch store (tables: customers)"),
    (sqlite_without_tables, "is a SQLite database but not an oncewatch store (tables: none)"),
])
def test_a_foreign_file_is_refused_and_left_as_it_was(tmp_path, make, message):
    path = tmp_path / "oncewatch.db"
    make(path)
    path.chmod(0o644)
    before = digest(path)
    config = write_config(tmp_path, path)
    with pytest.raises(NotAStoreError, match=message.replace("(", r"\(").replace(")", r"\)")):
        open_monitor(str(path))
    for argv in (("run", "--until-idle", "1"), ("findings",)):
        result = oncewatch(argv[0], "--config", str(config), *argv[1:])
        assert result.returncode == 2 and f"{path} {message}" in result.stderr, result.stderr
    assert digest(path) == before and mode(path) == 0o644
    assert not (tmp_path / "oncewatch.db-wal").exists()


def test_a_store_made_before_the_mark_is_still_a_store(tmp_path):
    path = tmp_path / "oncewatch.db"
    with closing(sqlite3.connect(path)) as conn:  # what an older oncewatch made: its tables, no application_id
        conn.executescript(SCHEMA)
    with closing(Store(str(path))) as store, store.batch() as tx:
        tx.upsert_findings(FINDINGS)
    with closing(open_monitor(str(path))) as store:
        assert store.finding_ids() == IDS


# ---------------------------------------------------------------- a full disk

@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MB tmpfs (needs root to mount; said as the reason when it cannot be)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): the full-disk tests need root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def fill(disk: Path) -> Path:
    """A file that takes every byte the disk has left."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        assert exc.errno == 28  # ENOSPC
    finally:
        os.close(fd)
    assert shutil.disk_usage(disk).free == 0
    return filler


def test_a_full_disk_is_said_at_the_write_and_at_every_start_until_there_is_room(small_disk, tmp_path):
    path = small_disk / "oncewatch.db"
    store = open_monitor(str(path))
    with store.batch() as tx:
        tx.upsert_findings(FINDINGS)
    filler = fill(small_disk)
    written = 0
    with pytest.raises(StoreFullError, match=f"the disk holding the store {path} is full"):
        for written in range(1000):  # any room the WAL has left goes first
            with store.batch() as tx:
                tx.set_state(f"ballast-{written}", "x" * 4096)
    assert finding_ids(path) == IDS  # still readable, on the full disk
    store.close()

    with pytest.raises(StoreFullError, match=f"the disk holding the store {path} is full"):
        open_monitor(str(path))
    config = write_config(tmp_path, path)
    for _ in range(2):  # the second start says the same, not something else
        run = oncewatch("run", "--config", str(config), "--until-idle", "1")
        assert run.returncode == 4, run.stderr
        assert f"store error: the disk holding the store {path} is full" in run.stderr
        assert "internal error" not in run.stderr and "Traceback" not in run.stderr

    filler.unlink()
    with closing(open_monitor(str(path))) as store:
        assert store.finding_ids() == IDS
        assert [store.state(f"ballast-{i}") is not None for i in range(written + 1)] == [True] * written + [False]
        with store.batch() as tx:
            tx.set_state("after", "room again")


def test_a_store_that_cannot_be_made_on_a_full_disk_leaves_no_file_behind(small_disk):
    """Else the next start would find an empty file and call it that, hiding the full disk."""
    fill(small_disk)
    path = small_disk / "oncewatch.db"
    for _ in range(2):
        with pytest.raises(StoreFullError, match=f"the disk holding the store {path} is full"):
            Store(str(path))
        with pytest.raises(StoreFullError, match=f"the disk holding the store {path} is full"):
            open_monitor(str(path))
    assert sorted(p.name for p in small_disk.iterdir()) in (["filler"], ["filler", "oncewatch.db.lock"])
