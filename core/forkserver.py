"""The process the readers' processes (oncewatch.monitor.remote) and the store's writer's (oncewatch.monitor.saver)
are forked from: the multiprocessing forkserver, one thread, started once per monitor process with their modules
imported ahead (`PRELOAD`).

Here, in the leaf, so that `oncewatch run` can start it first thing, before it imports the monitor (most of a
second, which the forkserver's own imports then overlap) rather than when the first reader starts. The modules are
named, not imported: the forkserver imports them.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver

PRELOAD = ("oncewatch.monitor.remote", "oncewatch.collectors.binlog", "oncewatch.collectors.kafka_events",
           "oncewatch.collectors.cdc.read", "oncewatch.monitor.saver")


def context() -> multiprocessing.context.BaseContext:
    """The forkserver's multiprocessing context, its preload set (before the server first starts)."""
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(list(PRELOAD))
    return forkserver


def pid() -> int | None:
    """The forkserver's process id while it runs, None before it started (for its CPU on /metrics). multiprocessing
    says it only on its module's private server, the one `start` started."""
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def start() -> None:
    """Start the forkserver now if it is not running (its imports take about a second of its own)."""
    context()
    multiprocessing.forkserver.ensure_running()


__all__ = ["PRELOAD", "context", "pid", "start"]
