"""`oncewatch run`: the monitor, started again from its checkpoint whenever its store's server goes away.

A SQLite store is a file beside the monitor and never goes away; a PostgreSQL store does (a
restart, a failover, the network). Its batch under way then never commits, so what the engine
made of it in memory is not in the store: rather than mend that state, the monitor is stopped and
a new one built from the store once the server answers, exactly as after a kill -9 (DESIGN §7):
the readers resume at the committed checkpoints, nothing is lost and nothing is counted twice.

/metrics, up since the first monitor's sources answered, stays up meanwhile, saying
`oncewatch_store_up 0`, and the outages and their length are counted
(`oncewatch_store_outages_total`, `oncewatch_store_outage_seconds_total`).
"""

from __future__ import annotations

import logging
import threading
import time

from oncewatch.core.config import Config
from oncewatch.monitor.health import StoreOutages
from oncewatch.monitor.loop import Monitor, served_once
from oncewatch.store import StoreUnavailableError

log = logging.getLogger("oncewatch.monitor")

RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)  # between tries while the store is away, the last one repeated


class Supervisor:
    """Runs monitors one after the other on `cfg` until `stop()` (or until idle)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.outages = StoreOutages()
        self.monitor: Monitor | None = None
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()
        if self.monitor is not None:
            self.monitor.stop()

    def run(self, until_idle: float | None = None) -> None:
        serve, close_metrics = served_once()
        tries = 0
        try:
            while not self._stop.is_set():
                try:
                    self.monitor = Monitor(self.cfg, outages=self.outages)
                except StoreUnavailableError as exc:
                    self._away(exc, tries)
                    tries += 1
                    continue
                gap = self.outages.end(time.time())
                if gap is not None:
                    log.warning("the store answers again; the monitor resumes from its checkpoint", extra={
                        "event": "store_back", "outage_seconds": round(gap, 3), "outages": self.outages.count})
                tries = 0
                try:
                    if self._stop.is_set():  # stopped while it was being built
                        return
                    self.monitor.run(until_idle, metrics=serve)
                    return
                except StoreUnavailableError as exc:
                    self._away(exc, tries)
                    tries += 1
                finally:
                    self.monitor.close()
        finally:
            close_metrics()

    def _away(self, exc: StoreUnavailableError, tries: int) -> None:
        if self.outages.begin(time.time()):
            log.error("the store cannot be reached; the monitor stops and starts again from its checkpoint once "
                      "it answers", extra={"event": "store_unavailable", "error": str(exc),
                                           "outages": self.outages.count})
        self._stop.wait(RETRY_SECONDS[min(tries, len(RETRY_SECONDS) - 1)])
