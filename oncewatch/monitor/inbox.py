"""The queue between the readers and the writer, bounded by the records it holds, not by items.

An item is a transaction (or a fragment of one), a batch of Kafka records, an offsets reading
or a reader's failure; a bound on items would let a few thousand large ones fill memory while
the writer is behind. Here a reader waits while the records queued would pass `limit`; one
item larger than the whole limit still goes in when the queue is empty, so nothing can wait
forever.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from oncewatch.collectors.kafka_events import EventBatch
from oncewatch.core.records import Transaction
from oncewatch.monitor.readers import Item


def records(item: Item) -> int:
    """What an item weighs: rows, Kafka records (quarantined ones too), or 1."""
    if isinstance(item, Transaction):
        return max(1, len(item.rows))
    if isinstance(item, EventBatch):
        return max(1, len(item.events) + len(item.quarantined))
    return 1


class Inbox:
    def __init__(self, limit: int):
        self.limit = limit
        self._items: deque[tuple[Item, int]] = deque()
        self._held = 0
        self._changed = threading.Condition()

    @property
    def held(self) -> int:
        """Records queued now."""
        return self._held

    def empty(self) -> bool:
        return not self._items

    def put(self, item: Item, timeout: float) -> bool:
        """Queue `item`, waiting up to `timeout` seconds for room; False if there was none."""
        n = records(item)
        with self._changed:
            if not self._changed.wait_for(lambda: not self._items or self._held + n <= self.limit, timeout):
                return False
            self._items.append((item, n))
            self._held += n
            self._changed.notify_all()
            return True

    def get(self, timeout: float) -> Item | None:
        """The oldest item, waiting up to `timeout` seconds for one; None if none came."""
        deadline = time.monotonic() + timeout
        with self._changed:
            if not self._changed.wait_for(lambda: self._items, max(0.0, deadline - time.monotonic())):
                return None
            item, n = self._items.popleft()
            self._held -= n
            self._changed.notify_all()
            return item
