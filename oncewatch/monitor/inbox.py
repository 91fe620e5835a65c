"""The queue between the readers and the writer, bounded by the records it holds, not by items.

An item is a transaction (or a fragment of one), a batch of Kafka records, an offsets reading
or a reader's failure; a bound on items would let a few thousand large ones fill memory while
the writer is behind. Here a reader waits while the records queued would pass `limit`; one
item larger than the whole limit still goes in when the queue is empty, so nothing can wait
forever. The writer takes the items in batches (`take`), one store transaction each, closed by the
age of the batch's first item.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from oncewatch.core.protocol import EventBatch, Item
from oncewatch.core.records import Transaction


def records(item: Item) -> int:
    """What an item weighs: rows, Kafka records (quarantined ones too), or 1."""
    if isinstance(item, Transaction):
        return max(1, len(item.rows))
    if isinstance(item, EventBatch):
        return max(1, len(item.events) + len(item.quarantined))
    return 1


class Inbox:
    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic):
        self.limit = limit
        self.clock = clock
        self._items: deque[tuple[Item, int, float]] = deque()  # (item, its records, when it was queued)
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
            self._items.append((item, n, self.clock()))
            self._held += n
            self._changed.notify_all()
            return True

    def take(self, seconds: float, most: int) -> list[Item]:
        """One store transaction's items, oldest first: those that come until the first of them has been
        queued for `seconds`, or until they hold `most` records; [] after `seconds` without any. Items
        queued while the last batch was applied have waited already: they are taken as they are, at once,
        and none more is waited for (a wait counted from the call would add to every detection's latency)."""
        items: list[Item] = []
        count = 0
        deadline = self.clock() + seconds
        with self._changed:
            while count < most:
                if not self._changed.wait_for(lambda: self._items, max(0.0, deadline - self.clock())):
                    break
                item, n, queued_at = self._items.popleft()
                self._held -= n
                self._changed.notify_all()  # room for a reader waiting to put
                if not items:
                    deadline = queued_at + seconds
                items.append(item)
                count += n
        return items
