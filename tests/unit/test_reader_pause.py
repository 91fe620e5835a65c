"""The binlog reader waits while it is read far past Kafka (issue 12: memory bounded while behind):
between transactions only, for PAUSE_SECONDS at most at a time, alive all the while."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

from oncewatch.collectors.binlog import BinlogCollector


class Transactions(BinlogCollector):
    """The binlog collector with its read loop stood in for: it hands out numbered transactions and says when it
    was asked (its configuration is never read)."""

    def __init__(self, n: int, ahead: Callable[[], bool] = lambda: False):
        super().__init__(SimpleNamespace(), None, ahead=ahead)  # type: ignore[arg-type]
        self.n = n
        self.read_at: list[float] = []

    def transactions(self):
        for i in range(self.n):
            self.read_at.append(time.monotonic())
            self.state.last_alive = time.time()
            yield i


def test_a_pause_comes_between_transactions_and_ends_when_kafka_catches_up(monkeypatch):
    monkeypatch.setattr(BinlogCollector, "PAUSE_SECONDS", 5.0)
    kafka_caught_up = threading.Event()
    collector = Transactions(3, ahead=lambda: not kafka_caught_up.is_set())
    items = collector.items(threading.Event())
    assert next(items) == 0
    threading.Timer(0.6, kafka_caught_up.set).start()
    before = time.time()
    assert next(items) == 1  # waited for Kafka, then read on
    assert 0.5 < collector.read_at[1] - collector.read_at[0] < 4
    assert collector.alive_at() >= before  # alive while paused
    assert list(items) == [2]


def test_a_pause_never_outlasts_pause_seconds(monkeypatch):
    """The server drops a binlog dump not read for net_write_timeout: one transaction is read at least
    every PAUSE_SECONDS, however far ahead the binlog stays."""
    monkeypatch.setattr(BinlogCollector, "PAUSE_SECONDS", 0.4)
    collector = Transactions(3, ahead=lambda: True)
    assert list(collector.items(threading.Event())) == [0, 1, 2]
    gaps = [b - a for a, b in zip(collector.read_at, collector.read_at[1:])]
    assert all(0.35 < g < 1.5 for g in gaps), gaps


def test_stop_ends_a_pause():
    collector, stop = Transactions(2, ahead=lambda: True), threading.Event()
    items = collector.items(stop)
    assert next(items) == 0
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert next(items) == 1 and time.monotonic() - started < 5
