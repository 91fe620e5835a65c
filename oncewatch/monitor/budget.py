"""The store kept within its disk budget (`[store] max_bytes`): the oldest raw records go, a slice at a time.

Past HIGH of the budget the monitor prunes the oldest row changes and events (store.retention, whatever their
age; both up to one time, so that events are kept as long as rows), with their entity index entries and chart
points, until the store is back under LOW: the gap between
the two keeps it from pruning a slice at every look. Findings and their evidence never go, nor the engine's
open state: when they alone fill the budget, nothing is left to prune, and the monitor says so (its verdict,
/metrics, an error in the log) rather than lose evidence. SQLite's used pages are what is measured: the file
keeps its size, and new rows fill the pages freed.
"""

from __future__ import annotations

import logging

from oncewatch.core.protocol import StoreSpace
from oncewatch.store import Store, StoreError, retention

log = logging.getLogger(__name__)

HIGH, LOW = 0.90, 0.80
LOOK_SECONDS = 5.0  # between two looks at the store's size: at 200 records/s the store grows about 1 MiB in 5 s
SLICE = 2000  # rows of each table a slice prunes: one short transaction of the writer's


class Budget:
    """A SQLite store's budget (core.config refuses one for PostgreSQL)."""

    def __init__(self, store: Store, max_bytes: int):
        self.store = store
        self.max_bytes = max_bytes
        self.pruning = False
        self.space = StoreSpace(self._used(), max_bytes, retention.budget_pruned_at(store))

    def _used(self) -> int:
        used = self.store.used_bytes()
        if used is None:
            raise StoreError("store.max_bytes is a SQLite store's budget; this store is in PostgreSQL")
        return used

    def keep(self, now: float) -> bool:
        """One look, and one slice pruned when due; True while more slices are due."""
        used = self._used()
        if used > self.max_bytes * HIGH:
            self.pruning = True
        if not self.pruning or used <= self.max_bytes * LOW:
            self.pruning = False
            self.space = StoreSpace(used, self.max_bytes, self.space.pruned_at)
            return False
        pruned = retention.prune(self.store, retention.oldest_cut(self.store, SLICE), SLICE, for_budget=True, now=now)
        if not any(pruned.values()):
            if not self.space.exhausted:
                log.error("the store's budget is spent on what is never pruned", extra={
                    "event": "store_budget_exhausted", "used_bytes": used, "max_bytes": self.max_bytes})
            self.pruning = False
            self.space = StoreSpace(used, self.max_bytes, self.space.pruned_at, exhausted=True)
            return False
        log.info("pruned for the store's budget", extra={"event": "store_budget_pruned", "used_bytes": used,
                                                         "max_bytes": self.max_bytes, **pruned})
        self.space = StoreSpace(self._used(), self.max_bytes, now)
        return True
