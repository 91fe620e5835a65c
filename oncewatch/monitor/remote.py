"""A reader's part run in a process of its own, so that reading (binlog decoding, Kafka fetching and parsing)
takes another core than judging (the rules and the store, in the monitor's process): docs/architecture.md §9.

`remote(name, spec)` is a part (oncewatch.core.protocol.Part) to the monitor's `Reader`. Its `start()` starts a
child that builds the real part from `spec`, starts it, reads it and sends each item back over a pipe, in order,
with a snapshot of the part's status and when it last showed life. The reader's thread in the monitor only
receives: what it puts on the queue is what the child read, with the same back-pressure (a full queue stops the
reader's thread, a full pipe stops the child).

Why not fork the monitor: a fork copies every lock as it is at that moment, held ones included, and the monitor's
other threads hold library locks at any moment (OpenSSL's, while a connection makes its SSL context; the Kafka
client's; the import lock). A reader forked then waited for ever at its first use of that lock: `oncewatch run
--until-idle` hung at a first start now and then (py-spy: the binlog tail's process in SSL_CTX_new, waiting on
CRYPTO_THREAD_write_lock; the tail starts just as the monitor's copy of the part makes its first probe connection).
So a reader's process is forked from the multiprocessing forkserver, a process of one thread started once per
monitor, with the readers' modules imported ahead (oncewatch.core.forkserver): a child starts in milliseconds and
inherits no lock. What the child needs crosses pickled: the part's spec (its class and the config and positions it
is built from, `PartSpec`: the config says where secrets are, never holds them), the flow control as of the start,
the pipes and the monitor's log levels. The child dies with its monitor (PR_SET_PDEATHSIG on the forkserver, which
ends when the monitor does; and its control pipe's end): a monitor SIGKILLed leaves no reader holding a binlog
dump or a store's lock.

What the monitor asks of a part beyond its items:
- the flow control (the binlog paused while read far past Kafka, Kafka partitions held while read far past the
  binlog) is judged in the monitor and sent to the child when it changes;
- a question only the child can answer now (has every partition been read to its end?) is a call on a pipe of
  its own, answered by a thread of the child, within CALL_SECONDS; one the monitor can answer itself (where does
  the server's binlog end?) is asked of the monitor's own copy of the part, configured and never started.

No wait on a child is unbounded. A failure in the child ends its items with the exception, sent behind everything
read before it and raised in the reader's thread, so a failed reader is counted and restarted from the checkpoint
as before, with the child's traceback (`remote_traceback`); a child that dies without a word (killed, out of
memory) raises `ReaderProcessDiedError`; a child whose part shows no life for STUCK_SECONDS while the monitor
waits for it (a deadlock, a process stopped) is killed and raises `ReaderProcessStuckError`. Both are reader
failures: counted on /metrics (oncewatch_collector_failures_total) and restarted from the checkpoint.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import multiprocessing
import os
import pickle
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from oncewatch.core import forkserver, logs
from oncewatch.core.protocol import BinlogTail, EventSource, Item, Part, Status
from oncewatch.core.records import BinlogPosition
from oncewatch.monitor.garbage import tune_gc

log = logging.getLogger("oncewatch.monitor.remote")

STATUS_SECONDS = 0.2  # between snapshots while the part reads nothing (an idle binlog, quiet topics)
CALL_SECONDS = 10.0  # what a question to the child may take before it is given up (answered "not known")
STOP_SECONDS = 5.0  # what a child stopped is given to end on its own before it is killed
# A part's alive_at moves while it is well, connected or not: a binlog event or heartbeat, a Kafka poll, a reconnect
# attempt (the binlog's come within read_timeout + reconnect_max_seconds, 60 s by default); the monitor's health
# calls it silent after a minute (verdict.STALE_SECONDS). Twice that with no life while the monitor waits for it,
# and its process is stuck.
STUCK_SECONDS = 120.0
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


class ReaderProcessDiedError(RuntimeError):
    """A reader's process ended without a word (killed, out of memory): the reader is restarted from the checkpoint."""


class ReaderProcessStuckError(RuntimeError):
    """A reader's process showed no life for STUCK_SECONDS while the monitor waited for it: it was killed and the
    reader is restarted from the checkpoint."""


class CallFailedError(RuntimeError):
    """A question to a reader's process got no answer in time, or the process is gone."""


# ahead -> the part, configured (no I/O). Pickled to the child's process: a PartSpec, or another object of a
# module-level class (not a lambda, nor a function defined in a function).
Build = Callable[[Callable[[], Any]], Part]


@dataclass(frozen=True)
class PartSpec:
    """What a reader's process builds its part from: `make(*args, **kwargs)`, with the flow control as the keyword
    `ahead_as` when the part takes one. `make` is a class or a module-level function (pickled by its name)."""

    make: Callable[..., Part]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    ahead_as: str | None = None

    def __call__(self, ahead: Callable[[], Any]) -> Part:
        flow = {self.ahead_as: ahead} if self.ahead_as is not None else {}
        return self.make(*self.args, **self.kwargs, **flow)


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
        self._call_numbers = itertools.count()
        self._sent_ahead: Any = None
        self.pid: int | None = None

    # -------------------------------------------------------------- the lifecycle

    def start(self) -> None:
        context = forkserver.context()
        self._items, items_child = context.Pipe(duplex=False)
        control_child, self._control = context.Pipe(duplex=False)
        self._calls, calls_child = context.Pipe(duplex=True)
        # the flow control as of now goes with the child: it reads before the first value sent after it comes
        self._sent_ahead = self._ahead() if self._ahead is not None else None
        self._process = context.Process(target=_child, name=f"oncewatch-{self.name}", daemon=True,
                                        args=(self.name, self._build, self._sent_ahead, items_child, control_child,
                                              calls_child, os.getpid(), log_levels()))
        self._process.start()
        self.pid = self._process.pid
        for conn in (items_child, control_child, calls_child):
            conn.close()
        log.info("reader process started", extra={"event": "reader_process_started", "reader": self.name,
                                                   "pid": self.pid})

    def items(self, stop: threading.Event) -> Iterator[Item]:
        assert self._items is not None and self._process is not None, "start() first"
        # when the part last showed life (an item, or a newer alive_at), as the monitor saw it while it waited: the
        # time the reader's thread spends handing an item on (a full queue) is no silence of the child's. Not any
        # change of its status: a stuck child's answers to caught_up still move what its status says of the ends.
        life_at, alive_at = time.monotonic(), self.snapshot.alive_at
        while not stop.is_set():
            if self._ahead is not None:
                ahead = self._ahead()
                if ahead != self._sent_ahead and self._send(("ahead", ahead)):
                    self._sent_ahead = ahead
            if not self._items.poll(0.1):
                # a child writes everything before it ends, so once it has ended its last words are in the pipe: a
                # failure sent just after the poll above gave up is the failure, not a death without a word
                if not self._process.is_alive() and not self._items.poll(0):
                    raise self._died()
                if time.monotonic() - life_at > STUCK_SECONDS:
                    raise self._stuck()
                continue
            try:
                message = self._items.recv()
            except (EOFError, OSError):
                raise self._died() from None
            kind = message[0]
            if kind == "item":
                self.snapshot = message[2]
                yield message[1]
                life_at, alive_at = time.monotonic(), self.snapshot.alive_at
            elif kind == "status":
                self.snapshot = message[1]
                if self.snapshot.alive_at != alive_at:
                    life_at, alive_at = time.monotonic(), self.snapshot.alive_at
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
            self._drain(process)
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

    def _drain(self, process: multiprocessing.process.BaseProcess) -> None:
        """Wait up to STOP_SECONDS for the child to end, taking what it still sends: a child read far ahead waits on
        the full pipe to send its next item, and would wait there until killed. What is taken is dropped: the
        reader's next start reads it again from the checkpoint."""
        deadline = time.monotonic() + STOP_SECONDS
        while process.is_alive() and time.monotonic() < deadline:
            try:
                if self._items is not None and self._items.poll(0.05):
                    self._items.recv()
                else:
                    process.join(0.05)
            except (EOFError, OSError):  # the child has closed its end: it is ending
                process.join(max(0.0, deadline - time.monotonic()))

    def status(self) -> Status:
        return self.snapshot.status

    def alive_at(self) -> float | None:
        return self.snapshot.alive_at

    def cpu_seconds(self) -> float | None:
        """The child's CPU time so far (user + system), for /metrics' CPU per part; None once it is gone."""
        return process_cpu_seconds(self.pid) if self.pid is not None else None

    def call(self, method: str, *args: Any) -> Any:
        """The child's part's `method` called with `args`, in the child, now; CallFailedError when it does not
        answer within CALL_SECONDS. Questions are numbered: the late answer to one given up is not taken for the
        answer to the next."""
        with self._call_lock:
            conn = self._calls
            if conn is None:
                raise CallFailedError(f"the {self.name} reader's process is not running")
            number = next(self._call_numbers)
            deadline = time.monotonic() + CALL_SECONDS
            try:
                if not _writable(conn, CALL_SECONDS):
                    raise CallFailedError(f"the {self.name} reader's process takes no questions (its pipe is full)")
                conn.send((number, method, args))
                while True:
                    if not conn.poll(max(0.0, deadline - time.monotonic())):
                        log.warning("a reader's process did not answer in time", extra={
                            "event": "reader_call_timeout", "reader": self.name, "method": method,
                            "seconds": CALL_SECONDS})
                        raise CallFailedError(f"the {self.name} reader's process did not answer {method} "
                                              f"within {CALL_SECONDS:g} s")
                    answered, ok, value = conn.recv()
                    if answered == number:
                        break
            except (EOFError, OSError) as exc:
                raise CallFailedError(f"the {self.name} reader's process is gone ({exc})") from exc
        if not ok:
            raise value
        return value

    def _send(self, message: tuple[Any, ...]) -> bool:
        """`message` sent to the child's listening thread, if its pipe takes it now (a stuck child's may be full:
        the monitor does not wait on it); whether it was."""
        with self._send_lock:
            if self._control is None or not _writable(self._control, 0):
                return False
            try:
                self._control.send(message)
            except OSError:  # the child is gone: its items say so
                return False
            return True

    def _died(self) -> ReaderProcessDiedError:
        assert self._process is not None
        return ReaderProcessDiedError(f"the {self.name} reader's process (pid {self.pid}) ended without a word "
                                      f"({how_it_ended(self._process)}); the reader starts again from the checkpoint")

    def _stuck(self) -> ReaderProcessStuckError:
        assert self._process is not None
        log.error("a reader's process shows no life: killed", extra={
            "event": "reader_process_stuck", "reader": self.name, "pid": self.pid, "seconds": STUCK_SECONDS})
        self._process.kill()
        self._process.join(STOP_SECONDS)
        return ReaderProcessStuckError(
            f"the {self.name} reader's process (pid {self.pid}) showed no life for {STUCK_SECONDS:.0f} s while the "
            f"monitor waited for it: killed; the reader starts again from the checkpoint (if it recurs, "
            f"`py-spy dump --pid` of the stuck process shows what it waits for)")


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


def _writable(conn: Connection, timeout: float) -> bool:
    """Whether a small message can be written to `conn` within `timeout` without blocking (a pipe with room)."""
    return bool(select.select([], [conn.fileno()], [], timeout)[1])


def log_levels() -> dict[str, int]:
    """The monitor's log levels, which the child's logging takes (oncewatch.core.logs: JSON lines on stderr)."""
    return {name: logging.getLogger(name).getEffectiveLevel() for name in ("", "kafka")}


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process `pid` (all its threads), from /proc; None when it is gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def how_it_ended(process: multiprocessing.process.BaseProcess) -> str:
    """How a child process that ended without a word ended ("killed by signal 9", "exit code 1"), once it has."""
    process.join(1.0)
    code = process.exitcode
    return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"


def die_with(monitor: int, name: str) -> None:
    """SIGKILL this process when the forkserver that forked it ends, which it does when the monitor ends
    (SIGKILLed, or crashed), and name it `ow-<reader>` for ps, top and the CPU per part (15 characters at most:
    the kernel's limit)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    libc.prctl(_PR_SET_NAME, f"ow-{name}"[:15].encode())
    if not _running(monitor):  # it ended before the call: no signal may come
        os._exit(1)


def _running(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def as_child(name: str, monitor: int, levels: dict[str, int]) -> None:
    """This process, forked for the monitor's part `name`, set up as the monitor's: it dies with the monitor
    (`die_with`), logs JSON lines on the same stderr at the same levels, runs the cycle collector as rarely
    (oncewatch.monitor.garbage) and leaves Ctrl-C to the monitor, which stops it."""
    die_with(monitor, name)
    logs.setup(logging.getLevelName(levels[""]))
    logging.getLogger("kafka").setLevel(levels["kafka"])
    tune_gc()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _snapshot(part: Part) -> Snapshot:
    return Snapshot(part.status(), part.alive_at())


def remote_traceback(exc: BaseException) -> str | None:
    """The traceback an exception raised in a reader's process had there (its frames do not travel with it)."""
    return getattr(exc, "remote_traceback", None)


def sendable(exc: BaseException, trace: str) -> BaseException:
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
           monitor: int, levels: dict[str, int]) -> None:
    as_child(name, monitor, levels)
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
                number, method, args = calls.recv()
            except (EOFError, OSError):
                return
            try:
                calls.send((number, True, getattr(part, method)(*args)))
            except Exception as exc:  # noqa: BLE001 - the caller raises it
                calls.send((number, False, sendable(exc, traceback.format_exc())))

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
            send(("failed", sendable(exc, traceback.format_exc())))
        except OSError:
            pass
    finally:
        stop.set()
        part.close()


__all__ = ["CallFailedError", "PartSpec", "ReaderProcessDiedError", "ReaderProcessStuckError", "RemoteBinlogTail",
           "RemoteEventSource", "RemotePart", "as_child", "how_it_ended", "log_levels",
           "process_cpu_seconds", "remote", "remote_traceback", "sendable"]
