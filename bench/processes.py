"""What a process and the processes below it use, read from /proc: the benches' CPU and memory figures.

`oncewatch run` reads the binlog and Kafka in processes of its own (oncewatch.monitor.remote), and with `[store]
writer = "process"` writes its store from another, all forked from a forkserver it starts
(oncewatch.core.forkserver). A figure of the monitor's own process leaves them out: `tree_cpu_memory` counts them.
Their resident memories do not add up: a process forked shares the pages of the one it was forked from until either
writes them, and each one's RSS counts them whole. Each one's proportional share (PSS) does add up.
"""

from __future__ import annotations

import os
from pathlib import Path

from oncewatch.core import processes

TICKS = os.sysconf("SC_CLK_TCK")


def stat_cpu(stat: Path) -> float:
    """User + system CPU seconds so far from a /proc stat file: a process's (its threads included) or a thread's."""
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds so far of a live process; 0 once it has ended."""
    try:
        return stat_cpu(Path(f"/proc/{pid}/stat"))
    except OSError:
        return 0.0


def pss_mib(pid: int) -> float:
    """Proportional resident memory of a live process, MiB (each page shared with n processes counts 1/n);
    0 once it has ended."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    for line in rollup.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def descendants(pid: int) -> dict[str, int]:
    """Every process below `pid`, name -> pid: the monitor's readers and store writer (named ow-<part> by
    oncewatch.monitor.remote), the forkserver they are forked from and multiprocessing's resource tracker."""
    found: dict[str, int] = {}
    for child in processes.descendants(pid):
        stat = Path(f"/proc/{child}/stat")
        try:
            name = stat.read_text().partition("(")[2].rpartition(")")[0]
            command = (stat.parent / "cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        # a reader forked from the forkserver has its command line too: it is told by the name it gives itself
        helper = next((h for h in (b"forkserver", b"resource_tracker") if h in command), None)
        found[name if name.startswith("ow-") or helper is None else helper.decode()] = child
    return found


def tree_cpu_memory(pid: int) -> tuple[float, float]:
    """CPU seconds so far and proportional resident MiB (PSS) of `pid` and every process below it, summed. A
    process below it that ended takes its CPU with it: a reader's process started again counts from its new start."""
    pids = [pid, *descendants(pid).values()]
    return sum(map(cpu_seconds, pids)), sum(map(pss_mib, pids))
