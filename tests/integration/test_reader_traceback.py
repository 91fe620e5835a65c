"""A reader that fails on a bug: the log has the whole traceback of every failure (issue 42, observation 7).

The README, the OncewatchReaderFailed alert and the exit-1 message all send a person to the log for the
traceback. The binlog reader of a real monitor, on the dev MariaDB, is made to fail on every transaction
of its table; `oncewatch run` gives up with exit code 1, and each `reader_failed` line must carry every
frame of the exception that was raised, from the reader's loop down to the bug. The binlog is read in a process
of its own (oncewatch.monitor.remote): the frames are those of that process, where the bug was.
"""

from __future__ import annotations

import json
import linecache
import logging
import re
import threading

import pytest

from oncewatch import cli
from oncewatch.collectors.binlog import BinlogCollector
from oncewatch.core.names import BINLOG
from oncewatch.monitor import readers

from .conftest import admin_connection, monitor_config_toml
from .faults import Bug, inject


def test_every_frame_of_a_reader_bug_is_in_the_log(table_name, tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    admin = admin_connection("owtest")
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
    config = monitor_config_toml([f"owtest.{table_name}"], tmp_path)

    # raised in the binlog reader's process, which the bug reaches in its part's spec
    inject(monkeypatch, BINLOG, Bug(BinlogCollector, "_transaction", every_time=True,
                                    message="injected into BinlogCollector._transaction"))
    monkeypatch.setattr(readers, "RESTART_BACKOFF_SECONDS", 0.2)
    ended = threading.Event()

    def shop() -> None:  # transactions of the watched table for the reader to fail on, whenever it tails
        with admin.cursor() as c:
            for i in range(1000):
                c.execute(f"INSERT INTO {table_name} VALUES ({i}, 'a')")
                if ended.wait(0.2):
                    return

    writes = threading.Thread(target=shop, daemon=True)
    writes.start()
    handlers = logging.getLogger().handlers[:]
    try:
        code = cli.main(["run", "--config", str(config), "--until-idle", "1"])
    finally:  # cli.main points the root logger at this test's captured stderr
        logging.getLogger().handlers[:] = handlers
        ended.set()
        writes.join()
        admin.close()
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    assert "the log, which has the tracebacks" in err
    failed = [d for d in map(json.loads, (line for line in err.splitlines() if line.startswith("{")))
              if d.get("event") == "reader_failed"]
    assert len(failed) == readers.MAX_FAILURES, err[-3000:]
    for line in failed:
        logged = line.get("traceback", "")
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)\n    (.*)', logged)
        names = [name for _, _, name, _ in frames]
        # the reader process's loop, through the binlog source and collector, down to the bug
        assert names[0] == "_child" and {"items", "transactions"} <= set(names) and names[-1] == "failing", logged
        for filename, lineno, _, text in frames:  # every frame real: the line it names is the code shown
            assert linecache.getline(filename, int(lineno)).strip() == text.strip(), (filename, lineno, text)
        assert logged.rstrip().endswith("InjectedBug: injected into BinlogCollector._transaction"), logged
        assert line["exc"].endswith("InjectedBug: injected into BinlogCollector._transaction"), line["exc"]
