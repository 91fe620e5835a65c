"""An unexpected exception in a reader of a running monitor, on the real services: loud, and never a hang.

The session's recorded shop run is read by a monitor in this process (so a collector method can
be made to raise a bug that no collector error type covers) with its /metrics on a port of its
own. A bug that strikes once: the failure shows on /metrics within seconds (collector_up 0, the
failure counted) and in the log with its traceback, the reader restarts from the checkpoint,
and the findings equal the undisturbed baseline's. A bug that strikes every time: the monitor
gives up after a few restarts, `oncewatch run` exits 1, and `--until-idle` does not hang on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devservices.shop_monitor import findings, free_port
from oncewatch import cli
from oncewatch.collectors.binlog import BinlogCollector
from oncewatch.collectors.kafka_events import KafkaEventCollector
from oncewatch.collectors.kafka_offsets import KafkaOffsetsCollector
from oncewatch.core.config import load
from oncewatch.monitor import Monitor, ReaderFailedError, readers

from .recorded_run import assert_same, fresh_copy, metric, wait_for
from .shop_monitor import IDLE

# collector name -> (class, method, call that fails): late enough that the reader has handed on
# some of the run, so the restart has to resume mid-stream.
TARGETS: dict[str, tuple[type, str, int]] = {
    "binlog": (BinlogCollector, "_transaction", 40),
    "kafka_events": (KafkaEventCollector, "_handle", 4),
    "kafka_offsets": (KafkaOffsetsCollector, "snapshot", 2),
}


class InjectedBug(Exception):
    """Not a collector error type: what a bug in a reader raises."""


def inject(monkeypatch: pytest.MonkeyPatch, collector: str, *, every_time: bool = False) -> threading.Event:
    """Make the collector's method raise on its Nth call (and, with `every_time`, on every call after);
    returns an event set when it first raised."""
    cls, name, nth = TARGETS[collector]
    original: Callable[..., Any] = getattr(cls, name)
    calls = [0]
    raised = threading.Event()

    def failing(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth or (every_time and calls[0] > nth):
            raised.set()
            raise InjectedBug(f"injected into {cls.__name__}.{name}, call {calls[0]}")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, failing)
    return raised


def run_in_thread(monitor: Monitor) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            monitor.run(until_idle=IDLE)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.parametrize("collector", list(TARGETS))
def test_a_bug_that_strikes_once_is_loud_and_the_reader_resumes_exactly(
        recorded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        collector: str) -> None:
    _, start, baseline, _ = recorded
    port = free_port()
    config = fresh_copy(start, tmp_path / collector, metrics_port=port)
    # A longer backoff than the default 1 s, so the outage lasts long enough to be scraped.
    monkeypatch.setattr(readers, "RESTART_BACKOFF_SECONDS", 6.0)
    raised = inject(monkeypatch, collector)
    caplog.set_level(logging.INFO, "oncewatch")
    monitor = Monitor(load(config))
    thread, errors = run_in_thread(monitor)
    labels = f'collector="{collector}"'
    assert raised.wait(120), "the injected bug was never reached"
    failed_at = time.monotonic()
    wait_for("the failure on /metrics", lambda: metric(port, "oncewatch_collector_failures_total", labels) == 1
             and metric(port, "oncewatch_collector_up", labels) == 0, timeout=5)
    seen_within = time.monotonic() - failed_at
    wait_for("the reader back up", lambda: metric(port, "oncewatch_collector_up", labels) == 1, timeout=30)
    thread.join(300)
    assert not thread.is_alive(), "--until-idle hung after a reader failure"
    assert errors == []
    failures = [r for r in caplog.records if getattr(r, "event", None) == "reader_failed"]
    assert len(failures) == 1 and failures[0].reader == collector and failures[0].exc_info
    assert failures[0].exc_info[0] is InjectedBug
    assert any(getattr(r, "event", None) == "reader_restarted" for r in caplog.records)
    assert_same(findings(config), baseline)
    print(f"\n{collector}: failure visible on /metrics {seen_within:.1f} s after it happened")


@pytest.mark.parametrize("collector", list(TARGETS))
def test_a_bug_that_strikes_every_time_ends_the_monitor_with_exit_1(
        recorded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        collector: str) -> None:
    _, start, _, _ = recorded
    config = fresh_copy(start, tmp_path / collector)
    monkeypatch.setattr(readers, "RESTART_BACKOFF_SECONDS", 0.2)
    inject(monkeypatch, collector, every_time=True)
    handlers = logging.getLogger().handlers[:]
    begun = time.monotonic()
    try:
        code = cli.main(["run", "--config", str(config), "--until-idle", str(IDLE)])
    finally:  # cli.main points the root logger at this test's captured stderr
        logging.getLogger().handlers[:] = handlers
    took = time.monotonic() - begun
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"the {collector} reader failed {readers.MAX_FAILURES} times" in err and "InjectedBug" in err
    assert took < 120, f"took {took:.0f} s to give up"
    with pytest.raises(ReaderFailedError):
        Monitor(load(config)).run(until_idle=IDLE)
