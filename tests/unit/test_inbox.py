"""The writer's batches (monitor.inbox.Inbox.take): closed by the age of their first item, not by the call."""

from __future__ import annotations

import threading
import time

from oncewatch.core.records import OffsetsSnapshot
from oncewatch.monitor.inbox import Inbox


class Clock:
    """The inbox's clock, moved by hand: when items were queued and how long they have waited."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def item(n: int) -> OffsetsSnapshot:
    return OffsetsSnapshot(polled_at=float(n), error=None)


def put_later(inbox: Inbox, value: OffsetsSnapshot, after: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(after), inbox.put(value, timeout=1.0)))
    thread.start()
    return thread


def test_items_that_waited_already_are_taken_at_once_and_nothing_more_is_waited_for():
    clock = Clock()
    inbox = Inbox(100, clock)
    for n in range(3):
        inbox.put(item(n), timeout=1.0)
    clock.now = 10.0  # they were queued while the last batch was applied
    late = put_later(inbox, item(3), after=0.3)
    assert inbox.take(1.0, 5000) == [item(0), item(1), item(2)]
    late.join()
    assert inbox.take(0.1, 5000) == [item(3)]


def test_the_first_items_age_closes_the_batch_not_the_time_of_the_call():
    clock = Clock()
    inbox = Inbox(100, clock)
    inbox.put(item(0), timeout=1.0)
    clock.now = 0.8  # of its second, 0.2 left: the next item, 0.5 s away, goes in the next batch
    late = put_later(inbox, item(1), after=0.5)
    assert inbox.take(1.0, 5000) == [item(0)]
    late.join()
    assert inbox.take(0.1, 5000) == [item(1)]


def test_items_that_come_while_the_first_waits_go_with_it():
    inbox = Inbox(100, Clock())
    # the first is queued before the next is sent (a loaded fresh clone once ran the sender's put first), and the
    # clock stands still, so the batch waits a whole second of real time for the next: room for a busy machine
    inbox.put(item(0), timeout=1.0)
    soon = put_later(inbox, item(1), after=0.05)
    assert inbox.take(1.0, 5000) == [item(0), item(1)]
    soon.join()


def test_nothing_queued_is_an_empty_batch_after_the_wait():
    assert Inbox(100, Clock()).take(0.05, 5000) == []


def test_a_batch_ends_with_the_item_that_passes_the_records_it_may_hold():
    inbox = Inbox(100, Clock())
    for n in range(3):
        inbox.put(item(n), timeout=1.0)
    assert inbox.take(1.0, 2) == [item(0), item(1)]
    assert inbox.held == 1


def test_taking_makes_room_for_a_reader_waiting_to_put():
    inbox = Inbox(2, Clock())
    inbox.put(item(0), timeout=1.0)
    inbox.put(item(1), timeout=1.0)
    waiting = threading.Thread(target=lambda: inbox.put(item(2), timeout=5.0))
    waiting.start()
    assert inbox.take(1.0, 1) == [item(0)]
    waiting.join(2.0)
    assert not waiting.is_alive() and inbox.held == 2
