"""A reader's part run in a process of its own, so that reading (binlog decoding, Kafka fetching and parsing)
takes another core than judging (the rules and the store, in the monitor's process): docs/architecture.md §9.

`remote(name, build)` is a part (oncewatch.core.protocol.Part) to the monitor's `Reader`. Its `start()` forks a
child that builds the real part, starts it, reads it and sends each item back over a pipe, in order, with a
snapshot of the part's status and when it last showed life. The reader's thread in the monitor only receives:
what it puts on the queue is what the child read, with the same back-pressure (a full queue stops the reader's
thread, a full pipe stops the child).

Why fork: the child starts with the monitor's modules and config already loaded (milliseconds, not the second an
interpreter takes to import them) and builds its part from the positions the writer has committed, as a reader
thread does. It touches nothing it inherited but its pipes and the factory, and it dies with the monitor
(PR_SET_PDEATHSIG): a monitor SIGKILLed leaves no reader holding a binlog dump or a store's lock.

What the monitor asks of a part beyond its items:
- the flow control (the binlog paused while read far past Kafka, Kafka partitions held while read far past the
  binlog) is judged in the monitor and sent to the child when it changes;
- a question only the child can answer now (has every partition been read to its end?) is a call on a pipe of
  its own, answered by a thread of the child; one the monitor can answer itself (where does the server's binlog
  end?) is asked of the monitor's own copy of the part, configured and never started.

A failure in the child ends its items with the exception, sent behind everything read before it and raised in
the reader's thread, so a failed reader is counted and restarted from the checkpoint as before, with the child's
traceback (`remote_traceback`); a child that dies without a word (killed, out of memory) raises
`ReaderProcessDiedError`.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from oncewatch.core.protocol import BinlogTail, EventSource, Item, Part, Status
from oncewatch.core.records import BinlogPosition

log = logging.getLogger("oncewatch.monitor.remote")

STATUS_SECONDS = 0.2  # between snapshots while the part reads nothing (an idle binlog, quiet topics)
CALL_SECONDS = 10.0  # what a question to the child may take before it is given up (answered "not known")
STOP_SECONDS = 5.0  # what a child stopped is given to end on its own before it is killed
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


class ReaderProcessDiedError(RuntimeError):
    """A reader's process ended without a word (killed, out of memory): the reader is restarted from the checkpoint."""


class CallFailedError(RuntimeError):
    """A question to a reader's process got no answer in time, or the process is gone."""


Build = Callable[[Callable[[], Any]], Part]  # ahead -> the part, configured (no I/O)


class Snapshot(NamedTuple):
    """What the child last said of its part: its status and when it last showed life."""

    status: Status
    alive_at: float | None


class RemotePart:
    """A part (oncewatch.core.protocol.Part) read in a child process; see the module docstring. `build` makes the
    part: in the monitor, with `ahead`, for its status until the child's first and for the questions the monitor
    answers itself; in the child, with the flow control the monitor sends it."""

    def __init__(self, name: str, build: Build, local: Part, ahead: Callable[[], Any] | None = None):
        self.name = name
        self._build = build
        self._ahead = ahead
        self._local = local
        self.snapshot = Snapshot(local.status(), None)
        self._process: multiprocessing.process.BaseProcess | None = None
        self._items: Connection | None = None
        self._control: Connection | None = None
        self._calls: Connection | None = None
        self._send_lock = threading.Lock()
        self._call_lock = threading.Lock()
        self._sent_ahead: Any = None
        self.pid: int | None = None

    # -------------------------------------------------------------- the lifecycle

    def start(self) -> None:
        context = multiprocessing.get_context("fork")
        self._items, items_child = context.Pipe(duplex=False)
        control_child, self._control = context.Pipe(duplex=False)
        self._calls, calls_child = context.Pipe(duplex=True)
        # the flow control as of now goes with the child: it reads before the first value sent after it comes
        self._sent_ahead = self._ahead() if self._ahead is not None else None
        self._process = context.Process(target=_child, name=f"oncewatch-{self.name}", daemon=True,
                                        args=(self.name, self._build, self._sent_ahead, items_child, control_child,
                                              calls_child, os.getpid()))
        self._process.start()
        self.pid = self._process.pid
        for conn in (items_child, control_child, calls_child):
            conn.close()
        log.info("reader process started", extra={"event": "reader_process_started", "reader": self.name,
                                                   "pid": self.pid})

    def items(self, stop: threading.Event) -> Iterator[Item]:
        assert self._items is not None and self._process is not None, "start() first"
        while not stop.is_set():
            if self._ahead is not None:
                ahead = self._ahead()
                if ahead != self._sent_ahead:
                    self._send(("ahead", ahead))
                    self._sent_ahead = ahead
            if not self._items.poll(0.1):
                if not self._process.is_alive():
                    raise self._died()
                continue
            try:
                message = self._items.recv()
            except (EOFError, OSError):
                raise self._died() from None
            kind = message[0]
            if kind == "item":
                self.snapshot = message[2]
                yield message[1]
            elif kind == "status":
                self.snapshot = message[1]
            elif kind == "failed":
                raise message[1]
            else:  # "ended": the part's loop ended on its own; the reader says so
                return

    def stop(self) -> None:
        self._send(("stop",))

    def close(self) -> None:
        process = self._process
        if process is not None:
            self._send(("stop",))
            process.join(STOP_SECONDS)
            if process.is_alive():
                log.warning("a reader's process did not end when asked: killed", extra={
                    "event": "reader_process_killed", "reader": self.name, "pid": process.pid})
                process.kill()
                process.join(STOP_SECONDS)
        for conn in (self._items, self._control, self._calls):
            if conn is not None:
                conn.close()
        self._items = self._control = self._calls = None
        self._local.close()

    def status(self) -> Status:
        return self.snapshot.status

    def alive_at(self) -> float | None:
        return self.snapshot.alive_at

    def cpu_seconds(self) -> float | None:
        """The child's CPU time so far (user + system), for /metrics' CPU per part; None once it is gone."""
        return process_cpu_seconds(self.pid) if self.pid is not None else None

    def call(self, method: str, *args: Any) -> Any:
        """The child's part's `method` called with `args`, in the child, now."""
        with self._call_lock:
            conn = self._calls
            if conn is None:
                raise CallFailedError(f"the {self.name} reader's process is not running")
            try:
                conn.send((method, args))
                if not conn.poll(CALL_SECONDS):
                    raise CallFailedError(f"the {self.name} reader's process did not answer {method} "
                                          f"within {CALL_SECONDS:.0f} s")
                ok, value = conn.recv()
            except (EOFError, OSError) as exc:
                raise CallFailedError(f"the {self.name} reader's process is gone ({exc})") from exc
        if not ok:
            raise value
        return value

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            if self._control is not None:
                try:
                    self._control.send(message)
                except OSError:  # the child is gone: its items say so
                    pass

    def _died(self) -> ReaderProcessDiedError:
        assert self._process is not None
        self._process.join(1.0)
        code = self._process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return ReaderProcessDiedError(f"the {self.name} reader's process (pid {self.pid}) ended without a word "
                                      f"({how}); the reader starts again from the checkpoint")


class RemoteBinlogTail(RemotePart):
    """The binlog tail read in a child; the server's binlog end is asked here, on the probe connection of the
    monitor's own copy of the part (a query the child's stream need not wait for)."""

    def current_server_position(self) -> BinlogPosition:
        return self._local.current_server_position()


class RemoteEventSource(RemotePart):
    """The events collector read in a child; whether every partition is read to its end is asked of the child,
    which alone knows where it has read."""

    def caught_up(self, timeout_ms: int | None = None) -> bool:
        try:
            return bool(self.call("caught_up", timeout_ms))
        except CallFailedError:
            return False  # a reader that cannot say is not caught up with


def remote(name: str, build: Build, ahead: Callable[[], Any] | None = None) -> RemotePart:
    """`build`'s part read in a process of its own, answering the questions its kind of part answers."""
    local = build(ahead or _nothing)
    kind = (RemoteBinlogTail if isinstance(local, BinlogTail) else RemoteEventSource if isinstance(local, EventSource)
            else RemotePart)
    return kind(name, build, local, ahead)


def _nothing() -> None:
    return None


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process `pid` (all its threads), from /proc; None when it is gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _die_with(parent: int, name: str) -> None:
    """SIGKILL this process when the monitor's thread that forked it ends (the monitor SIGKILLed, or crashed), and
    name it `ow-<reader>` for ps, top and the CPU per part (15 characters at most: the kernel's limit)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    libc.prctl(_PR_SET_NAME, f"ow-{name}"[:15].encode())
    if os.getppid() != parent:  # it died before the call: no signal will come
        os._exit(1)


def _snapshot(part: Part) -> Snapshot:
    return Snapshot(part.status(), part.alive_at())


def remote_traceback(exc: BaseException) -> str | None:
    """The traceback an exception raised in a reader's process had there (its frames do not travel with it)."""
    return getattr(exc, "remote_traceback", None)


def _sendable(exc: BaseException, trace: str) -> BaseException:
    """`exc` carrying the child's traceback (`remote_traceback`), or a RuntimeError saying what it was when it cannot
    be pickled (an exception whose constructor takes other arguments than its args)."""
    try:
        exc.remote_traceback = trace  # type: ignore[attr-defined]
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception that does not travel is described instead
        plain = RuntimeError(f"{type(exc).__name__}: {exc}")
        plain.remote_traceback = trace  # type: ignore[attr-defined]
        return plain


def _child(name: str, build: Build, first_ahead: Any, items: Connection, control: Connection, calls: Connection,
           parent: int) -> None:
    _die_with(parent, name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the monitor, which stops its readers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ahead: list[Any] = [first_ahead]
    stop = threading.Event()
    send_lock = threading.Lock()
    part = build(lambda: ahead[0])

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            items.send(message)

    def listen() -> None:
        while True:
            try:
                message = control.recv()
            except (EOFError, OSError):
                message = ("stop",)
            if message[0] == "ahead":
                ahead[0] = message[1]
            else:
                stop.set()
                part.stop()
                return

    def answer() -> None:
        while True:
            try:
                method, args = calls.recv()
            except (EOFError, OSError):
                return
            try:
                calls.send((True, getattr(part, method)(*args)))
            except Exception as exc:  # noqa: BLE001 - the caller raises it
                calls.send((False, _sendable(exc, traceback.format_exc())))

    def beat() -> None:
        while not stop.wait(STATUS_SECONDS):
            try:
                send(("status", _snapshot(part)))
            except OSError:
                return

    for target in (listen, answer, beat):
        threading.Thread(target=target, name=f"{name}-{target.__name__}", daemon=True).start()
    try:
        part.start()
        for item in part.items(stop):
            send(("item", item, _snapshot(part)))
        send(("ended",))
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the monitor, which counts and restarts
        try:
            send(("failed", _sendable(exc, traceback.format_exc())))
        except OSError:
            pass
    finally:
        stop.set()
        part.close()


__all__ = ["CallFailedError", "ReaderProcessDiedError", "RemoteBinlogTail", "RemoteEventSource", "RemotePart",
           "process_cpu_seconds", "remote", "remote_traceback"]
