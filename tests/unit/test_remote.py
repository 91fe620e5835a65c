"""A reader's part in a process of its own (oncewatch.monitor.remote): what crosses, in order, and what happens
when the child fails, dies, or its monitor dies. The part here counts; the binlog tail, the CDC reader and the
Kafka events run this way in every integration test of the monitor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from oncewatch.collectors.binlog import BinlogPurgedError
from oncewatch.monitor.readers import Reader, ReaderFailed
from oncewatch.monitor.remote import (ReaderProcessDiedError, RemoteEventSource, RemotePart, remote,
                                      remote_traceback)


@dataclass(frozen=True)
class CountingStatus:
    connected: bool
    counted: int


class CountingPart:
    """Counts to `upto`, then fails with `fail` (or waits to be stopped); each item carries the `ahead` it saw and
    the pid of the process that read it."""

    def __init__(self, ahead: Any, upto: int = 5, fail: BaseException | None = None, pause: float = 0.0):
        self.counted = 0
        self.started = False
        self._ahead, self._upto, self._fail, self._pause = ahead, upto, fail, pause

    def start(self) -> None:
        self.started = True

    def items(self, stop: threading.Event) -> Iterator[Any]:
        assert self.started
        for i in range(self._upto):
            self.counted = i + 1
            yield (i, self._ahead(), os.getpid())
            time.sleep(self._pause)
        if self._fail is not None:
            raise self._fail
        stop.wait()

    def status(self) -> CountingStatus:
        return CountingStatus(self.started, self.counted)

    def alive_at(self) -> float | None:
        return 1.5 if self.started else None

    def caught_up(self, timeout_ms: int | None = None) -> bool:  # an EventSource: asked of the child, now
        return self.counted >= 5

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


def read(part: RemotePart, count: int, stop: threading.Event | None = None) -> list[Any]:
    part.start()
    items = part.items(stop or threading.Event())
    return [next(items) for _ in range(count)]


def test_items_come_in_order_from_another_process_with_the_status_and_the_ahead_sent_there() -> None:
    part = remote("counter", lambda ahead: CountingPart(ahead), ahead=lambda: "held")
    assert isinstance(part, RemoteEventSource) and part.status() == CountingStatus(False, 0)  # before the child's
    try:
        got = read(part, 5)
        assert [i for i, _, _ in got] == list(range(5))
        assert {pid for _, _, pid in got} == {part.pid} and part.pid != os.getpid()
        # the monitor's flow control reached the child, from the first item on (it reads before any message)
        assert [ahead for _, ahead, _ in got] == ["held"] * 5
        assert part.status() == CountingStatus(True, 5)
        assert part.alive_at() == 1.5
        assert part.caught_up() is True  # asked of the child now
        assert part.call("status") == CountingStatus(True, 5)
        assert part.cpu_seconds() is not None
    finally:
        part.stop()
        part.close()
    assert part.cpu_seconds() is None


def test_a_failure_comes_after_everything_read_before_it_with_its_type_and_its_frames() -> None:
    purged = BinlogPurgedError("the checkpoint's binlog is purged")
    part = remote("counter", lambda ahead: CountingPart(ahead, upto=3, fail=purged))
    part.start()
    items = part.items(threading.Event())
    try:
        assert [next(items)[0] for _ in range(3)] == [0, 1, 2]
        with pytest.raises(BinlogPurgedError, match="purged") as raised:
            next(items)
        trace = remote_traceback(raised.value)
        assert trace is not None and "in items" in trace and "in _child" in trace
    finally:
        part.close()


def test_a_reader_whose_process_is_killed_fails_and_is_counted() -> None:
    failures: list[Any] = []

    def put(item: Any, _stop: threading.Event) -> None:
        if isinstance(item, ReaderFailed):
            failures.append(item)
        elif item[0] == 1:
            os.kill(item[2], signal.SIGKILL)

    reader = Reader("counter", lambda: remote("counter", lambda ahead: CountingPart(ahead, upto=50, pause=0.05)), put)
    reader.start()
    deadline = time.monotonic() + 20
    while not failures and time.monotonic() < deadline:
        time.sleep(0.05)
    reader.stop()
    reader.join(5)
    assert len(failures) == 1 and isinstance(failures[0].error, ReaderProcessDiedError), failures
    assert "killed by signal 9" in str(failures[0].error)


def test_stop_ends_the_child() -> None:
    stop = threading.Event()
    part = remote("counter", lambda ahead: CountingPart(ahead))
    read(part, 5, stop)
    stop.set()
    part.stop()
    part.close()
    assert part._process is not None and part._process.exitcode == 0


def test_the_child_dies_with_the_monitor() -> None:
    """A monitor SIGKILLed leaves no reader behind (a binlog dump held, a store's lock inherited)."""
    script = textwrap.dedent("""
        import sys, threading, time
        sys.path.insert(0, sys.argv[1])
        from test_remote import CountingPart
        from oncewatch.monitor.remote import remote
        part = remote("counter", lambda ahead: CountingPart(ahead))
        part.start()
        items = part.items(threading.Event())
        next(items)
        print(part.pid, flush=True)
        time.sleep(60)
    """)
    monitor = subprocess.Popen([sys.executable, "-c", script, os.path.dirname(__file__)], stdout=subprocess.PIPE,
                               text=True)
    try:
        child = int(monitor.stdout.readline())
        assert os.path.exists(f"/proc/{child}")
        monitor.kill()
        monitor.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        monitor.kill()


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"
