"""A reader's part in a process of its own (oncewatch.monitor.remote): what crosses, in order, and what happens
when the child fails, dies, or its monitor dies. The part here counts; the binlog tail, the CDC reader and the
Kafka events run this way in every integration test of the monitor."""

from __future__ import annotations

import itertools
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
from oncewatch.core import forkserver
from oncewatch.monitor.readers import Reader, ReaderFailed
from oncewatch.monitor import remote as remote_module
from oncewatch.monitor.remote import (CallFailedError, ReaderProcessDiedError, ReaderProcessStuckError,
                                      RemoteEventSource, RemotePart, process_cpu_seconds, remote, remote_traceback)


@dataclass(frozen=True)
class CountingStatus:
    connected: bool
    counted: int


class CountingPart:
    """Counts to `upto` unless stopped, then fails with `fail` (or waits to be stopped); each item carries the
    `ahead` it saw and the pid of the process that read it."""

    def __init__(self, ahead: Any, upto: int = 5, fail: BaseException | None = None, pause: float = 0.0):
        self.counted = 0
        self.started = False
        self._ahead, self._upto, self._fail, self._pause = ahead, upto, fail, pause

    def start(self) -> None:
        self.started = True

    def items(self, stop: threading.Event) -> Iterator[Any]:
        assert self.started
        for i in range(self._upto):
            if stop.is_set():
                return
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

    def echo(self, value: Any, after: float) -> Any:
        time.sleep(after)
        return value

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Counting:
    """What the child builds its CountingPart from: it crosses to the child's process pickled, as the monitor's
    part specs do (oncewatch.monitor.remote.PartSpec)."""

    upto: int = 5
    fail: BaseException | None = None
    pause: float = 0.0

    def __call__(self, ahead: Any) -> CountingPart:
        return CountingPart(ahead, self.upto, self.fail, self.pause)


# A library's own lock (OpenSSL's, kafka-python's, logging's): held by one of the monitor's threads at the moment a
# reader's process starts, it must not be held in the child, which never had that thread.
LIBRARY_LOCK = threading.Lock()


class LockingPart(CountingPart):
    """A CountingPart whose start takes the library's lock, as a first connection takes OpenSSL's."""

    def start(self) -> None:
        with LIBRARY_LOCK:
            super().start()


@dataclass(frozen=True)
class Locking:
    def __call__(self, ahead: Any) -> LockingPart:
        return LockingPart(ahead)


def read(part: RemotePart, count: int, stop: threading.Event | None = None) -> list[Any]:
    part.start()
    items = part.items(stop or threading.Event())
    return [next(items) for _ in range(count)]


def test_items_come_in_order_from_another_process_with_the_status_and_the_ahead_sent_there() -> None:
    part = remote("counter", Counting(), ahead=lambda: "held")
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
        # the process it was forked from says its own CPU too (/metrics' part="forkserver")
        assert forkserver.pid() not in (None, os.getpid()) and process_cpu_seconds(forkserver.pid()) is not None
    finally:
        part.stop()
        part.close()
    assert part.cpu_seconds() is None


def test_a_failure_comes_after_everything_read_before_it_with_its_type_and_its_frames() -> None:
    purged = BinlogPurgedError("the checkpoint's binlog is purged")
    part = remote("counter", Counting(upto=3, fail=purged))
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


class FirstPollTooSoon:
    """The pipe from the child as a monitor saw it that polled a moment before the child's last message came."""

    def __init__(self, conn: Any):
        self.conn, self.polled = conn, False

    def poll(self, timeout: float) -> bool:
        if not self.polled:
            self.polled = True
            return False
        return self.conn.poll(timeout)

    def recv(self) -> Any:
        return self.conn.recv()

    def close(self) -> None:
        self.conn.close()


def test_a_failure_sent_as_the_child_ends_is_that_failure_not_a_death_without_a_word() -> None:
    """A child sends its failure, then ends (exit code 0). A monitor whose poll gave up just before the failure came
    and that then found the process gone raised ReaderProcessDiedError, losing the failure's type and traceback
    (test_under_fire on a loaded fresh clone: 'ended without a word (exit code 0)')."""
    purged = BinlogPurgedError("the checkpoint's binlog is purged")
    part = remote("counter", Counting(upto=0, fail=purged))
    part.start()
    try:
        part._process.join(10)  # the child has sent its failure and ended
        assert part._process.exitcode == 0
        part._items = FirstPollTooSoon(part._items)
        with pytest.raises(BinlogPurgedError, match="purged"):
            next(part.items(threading.Event()))
    finally:
        part.close()


def test_a_reader_whose_process_is_killed_fails_and_is_counted() -> None:
    failures: list[Any] = []

    def put(item: Any, _stop: threading.Event) -> None:
        if isinstance(item, ReaderFailed):
            failures.append(item)
        elif item[0] == 1:
            os.kill(item[2], signal.SIGKILL)

    reader = Reader("counter", lambda: remote("counter", Counting(upto=50, pause=0.05)), put)
    reader.start()
    deadline = time.monotonic() + 20
    while not failures and time.monotonic() < deadline:
        time.sleep(0.05)
    reader.stop()
    reader.join(5)
    assert len(failures) == 1 and isinstance(failures[0].error, ReaderProcessDiedError), failures
    assert "killed by signal 9" in str(failures[0].error)


def test_a_child_whose_part_shows_no_life_is_killed_and_its_reader_fails_and_is_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A child stuck (here: its part waits for ever after one item, its life never moving, while the child's status
    beats go on, as in the first-start hang) must not hold up the monitor: it is killed, and its reader fails, to be
    restarted from the checkpoint."""
    monkeypatch.setattr(remote_module, "STUCK_SECONDS", 1.0)
    failures: list[Any] = []
    reader = Reader("counter", lambda: remote("counter", Counting(upto=1)),
                    lambda item, _stop: failures.append(item) if isinstance(item, ReaderFailed) else None)
    reader.start()
    deadline = time.monotonic() + 20
    while not failures and time.monotonic() < deadline:
        time.sleep(0.05)
    part = reader.part
    reader.stop()
    reader.join(5)
    assert len(failures) == 1 and isinstance(failures[0].error, ReaderProcessStuckError), failures
    assert isinstance(part, RemotePart) and part._process is not None and part._process.exitcode == -signal.SIGKILL


def test_the_late_answer_to_a_question_given_up_is_not_the_answer_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_module, "CALL_SECONDS", 0.3)
    part = remote("counter", Counting())
    try:
        read(part, 1)
        with pytest.raises(CallFailedError, match="did not answer echo"):
            part.call("echo", "late", 0.6)
        monkeypatch.setattr(remote_module, "CALL_SECONDS", 10.0)  # the late answer comes first, then this one's
        assert part.call("echo", "now", 0.0) == "now"
    finally:
        part.stop()
        part.close()


def test_stop_ends_the_child() -> None:
    stop = threading.Event()
    part = remote("counter", Counting())
    read(part, 5, stop)
    stop.set()
    part.stop()
    part.close()
    assert part._process is not None and part._process.exitcode == 0


def test_a_child_held_up_by_a_full_pipe_ends_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    # The monitor stops reading a reader's items when it stops (its store went away, say) while the child, far
    # ahead, waits on the full pipe to send its next: closing must not leave it waiting there until it is killed.
    part = remote("counter", Counting(upto=10**9))
    read(part, 5)
    assert part._items is not None
    while not part._items.poll(0):
        time.sleep(0.01)
    time.sleep(0.5)  # the child has filled the pipe and waits to send
    part.stop()
    part.close()
    assert part._process is not None and part._process.exitcode == 0
    assert not [r for r in caplog.records if getattr(r, "event", None) == "reader_process_killed"]


def test_a_lock_another_thread_of_the_monitor_holds_as_the_child_starts_is_not_held_in_the_child() -> None:
    """What hung `oncewatch run --until-idle` at a first start, 1 run in about 40: the binlog tail's process was
    forked while a thread of the monitor held OpenSSL's lock (its probe connection making an SSL context), and the
    child's first SSL_CTX_new waited for it for ever (py-spy: pthread_rwlock_wrlock under CRYPTO_THREAD_write_lock).
    Here the lock is held for certain while the child starts, and the child must read all the same."""
    part = remote("locking", Locking())
    stop = threading.Event()
    holder = threading.Thread(target=lambda: (LIBRARY_LOCK.acquire(), stop.wait(), LIBRARY_LOCK.release()))
    holder.start()
    give_up = threading.Timer(20, stop.set)  # guards the test from the hang it looks for, not a speed limit
    give_up.start()
    try:
        part.start()
        got = list(itertools.islice(part.items(stop), 5))
        assert [i for i, _, _ in got] == list(range(5)), "the child never read: it waits for a lock it inherited"
    finally:
        stop.set()
        give_up.cancel()
        holder.join()
        part.stop()
        part.close()


def test_the_child_dies_with_the_monitor() -> None:
    """A monitor SIGKILLed leaves no reader behind (a binlog dump held, a store's lock inherited)."""
    script = textwrap.dedent("""
        import sys, threading, time
        sys.path.insert(0, sys.argv[1])
        from test_remote import Counting
        from oncewatch.monitor.remote import remote
        part = remote("counter", Counting())
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
