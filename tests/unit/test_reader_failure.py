"""A reader's failure shows at once (its part down, its failures counted), not once the writer reaches it in the
queue: a judge behind, its queue full, held a fresh clone's failures off /metrics for 9 s (test_under_fire.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from oncewatch.core.protocol import Item, ReaderFailed
from oncewatch.monitor.readers import Reader


class InjectedBug(Exception):
    pass


class FailingPart:
    """Reads one item, then strikes a bug."""

    def start(self) -> None:
        pass

    def items(self, stop: threading.Event) -> Iterator[object]:
        yield "an item read before the bug"
        raise InjectedBug("strikes")

    def alive_at(self) -> float | None:
        return time.time()

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_failure_is_counted_and_the_part_down_while_the_queue_has_no_room_for_it():
    room = threading.Event()  # the writer makes room in the queue only when the test says so
    queued: list[Item] = []

    def put(item: Item, stop: threading.Event) -> None:
        if isinstance(item, ReaderFailed):
            room.wait(10)
        queued.append(item)

    reader = Reader("binlog", FailingPart, put)
    reader.start()
    deadline = time.monotonic() + 5
    while reader.failures == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert reader.failures == 1 and not reader.running
        assert reader.last_failure == "InjectedBug: strikes"
        assert reader.health().failures == 1 and not reader.health().running
        assert queued == ["an item read before the bug"]  # the failure still waits behind what was read
    finally:
        room.set()
    reader.join(5)
    failure = queued[-1]
    assert isinstance(failure, ReaderFailed)
    reader.failed(failure)  # the writer reaches it: the restart is scheduled, the failure not counted again
    assert reader.failures == 1 and reader.restart_at is not None
