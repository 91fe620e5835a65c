"""SIGINT and SIGTERM stop the monitor from a thread of their own (cli._on_signals). A handler that called the stop
itself ran it in the main thread, inside whatever that thread was doing: a fresh clone's monitor, sent SIGTERM as it
switched from the bootstrap to the binlog tail, hung for good in Event.set, waiting for the lock it held itself."""

from __future__ import annotations

import os
import signal
import threading
import time

from oncewatch import cli


def test_a_signal_stops_from_its_own_thread_while_the_main_thread_holds_what_the_stop_needs():
    lock = threading.Lock()  # as an Event's: not reentrant
    stopped = threading.Event()
    ran_in: list[threading.Thread] = []

    def stop() -> None:
        ran_in.append(threading.current_thread())
        if lock.acquire(timeout=2):  # in the main thread, behind its own lock, this would wait for ever
            lock.release()
            stopped.set()

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        cli._on_signals(stop)
        with lock:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # the handler runs here, in this thread, while it holds the lock
            assert not stopped.is_set()
        assert stopped.wait(5)
        assert ran_in and ran_in[0] is not threading.main_thread()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
