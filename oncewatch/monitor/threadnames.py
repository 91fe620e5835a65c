"""The monitor's threads named for the operating system, so that CPU per thread can be read from outside.

Python 3.11 keeps a thread's name to itself: every thread of the monitor shows as `python` in
/proc/PID/task/TID/comm, top -H and py-spy's native view. Linux lets a process rename any of its own
threads by writing that file, so the loop names them all (readers, kafka-python's I/O thread, /metrics,
the main thread, which does the judging) from one place, including threads a library started.
bench/monitor_throughput.py reads them back to give the judge's share of the CPU.
"""

from __future__ import annotations

import threading
from pathlib import Path

COMM_BYTES = 15  # the kernel keeps 16 bytes of a thread's name, its terminating NUL included
JUDGE = "judge"  # the main thread's name: the writer and the engine run there

_named: dict[int, str] = {}


def name_os_threads() -> None:
    """Every live thread of this process named after its Python name (the main thread `judge`); threads
    already named are left alone, so this costs one enumeration when nothing started."""
    main = threading.main_thread()
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None:
            continue
        name = (JUDGE if thread is main else thread.name).encode()[:COMM_BYTES].decode(errors="ignore")
        if _named.get(tid) == name:
            continue
        try:
            Path(f"/proc/self/task/{tid}/comm").write_text(name)
        except OSError:  # not Linux, or the thread ended meanwhile: its name is only for measuring
            continue
        _named[tid] = name
