"""`oncewatch run`: the monitor, started again from its checkpoint whenever its store's server goes away.

A SQLite store is a file beside the monitor and never goes away; a PostgreSQL store does (a
restart, a failover, the network). Its batch under way then never commits, so what the engine
made of it in memory is not in the store: rather than mend that state, the monitor is stopped and
a new one built from the store once the server answers, exactly as after a kill -9 (docs/architecture.md §7):
the readers resume at the committed checkpoints, nothing is lost and nothing is counted twice.

/metrics, up since the first monitor's sources answered, stays up meanwhile, saying
`oncewatch_store_up 0`, and the outages and their length are counted
(`oncewatch_store_outages_total`, `oncewatch_store_outage_seconds_total`).

The store's writer process (`[store] writer = "process"`, oncewatch.monitor.saver) dying without a word (the
kernel's out-of-memory killer, a kill -9) loses the checkpoint it was writing, and nothing else: the monitor is
started again from the last one written in the same way, at once (then after RETRY_SECONDS as deaths recur), and
each death is counted (`oncewatch_store_writer_deaths_total`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from oncewatch.core.config import Config
from oncewatch.monitor.health import Outages
from oncewatch.monitor.loop import Monitor, served_once
from oncewatch.monitor.saver import SaverDiedError
from oncewatch.store import StoreUnavailableError

log = logging.getLogger("oncewatch.monitor")

RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)  # between tries while the store is away, the last one repeated

Made = TypeVar("Made")


def through_outages(stop: threading.Event, outages: Outages, build: Callable[[], Made],
                    run: Callable[[Made], None], close: Callable[[Made], None], resumes: str) -> None:
    """`build` and `run` one after the other until `stop` is set or a run ends: a StoreUnavailableError from
    either is an outage, counted in `outages`, waited out (RETRY_SECONDS) and followed by a new `build` from the
    store's commits; so is the death of the store's writer process (SaverDiedError) from `run`, counted apart.
    `resumes` says in the log what starts again."""
    tries = 0
    while not stop.is_set():
        try:
            made = build()
        except StoreUnavailableError as exc:
            _away(stop, outages, exc, tries, resumes)
            tries += 1
            continue
        gap = outages.end(time.time())
        if gap is not None:
            log.warning(f"the store answers again; {resumes} from its commits", extra={
                "event": "store_back", "outage_seconds": round(gap, 3), "outages": outages.count})
        tries = 0
        try:
            if stop.is_set():  # stopped while it was being built
                return
            run(made)
            return
        except StoreUnavailableError as exc:
            _away(stop, outages, exc, tries, resumes)
            tries += 1
        except SaverDiedError as exc:
            outages.writer_deaths += 1
            log.error(f"the store's writer process died; {resumes} from the last checkpoint written", extra={
                "event": "store_writer_died", "error": str(exc), "deaths": outages.writer_deaths})
            stop.wait(0 if outages.writer_deaths == 1 else
                      RETRY_SECONDS[min(outages.writer_deaths - 2, len(RETRY_SECONDS) - 1)])
        finally:
            close(made)


def _away(stop: threading.Event, outages: Outages, exc: StoreUnavailableError, tries: int,
          resumes: str) -> None:
    if outages.begin(exc.at):
        log.error(f"the store cannot be reached; {resumes} from its commits once it answers",
                  extra={"event": "store_unavailable", "error": str(exc), "outages": outages.count})
    stop.wait(RETRY_SECONDS[min(tries, len(RETRY_SECONDS) - 1)])


class Supervisor:
    """Runs monitors one after the other on `cfg` until `stop()` (or until idle)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.outages = Outages()
        self.monitor: Monitor | None = None
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()
        if self.monitor is not None:
            self.monitor.stop()

    def run(self, until_idle: float | None = None) -> None:
        serve, close_metrics = served_once()

        def build() -> Monitor:
            self.monitor = Monitor(self.cfg, outages=self.outages)
            return self.monitor

        try:
            through_outages(self._stop, self.outages, build, lambda m: m.run(until_idle, metrics=serve),
                            Monitor.close, "the monitor starts again")
        finally:
            close_metrics()
