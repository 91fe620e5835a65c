"""A group's parts share one lifecycle (issue 44): a constructor connects nothing, `start` opens, `stop` closes,
`status` is a typed value. Without servers: a member and its parts are made for a broker and a store nobody
listens at, and not one connection is tried; a part whose thread fails hands the error to its owner and still
closes what it opened.
"""

from __future__ import annotations

import socket
import threading

import pytest

from oncewatch.core.config import parse
from oncewatch.core.protocol import GroupMemberStatus, JudgesStatus, RoutersStatus
from oncewatch.core.records import PartitionStatus
from oncewatch.monitor.group import routing
from oncewatch.monitor.group.part import STUCK_SECONDS, GroupPart
from oncewatch.monitor.group.run import GroupMember, health_row
from oncewatch.monitor.health import Outages
from oncewatch.store import Store, StoreUnavailableError
from oncewatch.store.group import advance_source_position
from tests.unit.test_config_core import GROUP_BASE


@pytest.fixture
def no_connections(monkeypatch):
    """Every connection this process tries, refused and listed."""
    tried: list[object] = []

    def refuse(self, address):
        tried.append(address)
        raise ConnectionRefusedError(f"the test allows no connection ({address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return tried


def test_a_member_and_its_parts_are_made_without_a_connection_and_say_how_they_stand(no_connections):
    cfg = parse({**GROUP_BASE, "group": {"name": "g", "shards": 4, "member": "m1"}})
    member = GroupMember(cfg, "m1", Outages(), Outages())
    assert member.routers.output.producer is None
    status = member.status()
    assert isinstance(status, GroupMemberStatus) and status.member == "m1"
    assert status.judges == JudgesStatus(running=False, shards=(), fenced=0, applied=0, rejoins=0)
    assert status.routers == RoutersStatus(running=False, partitions=(), change_source=False, written=0, records=0,
                                           change_transactions=0, rejoins=0)
    assert not status.offsets.running
    row = health_row(status)
    assert (row.member, row.shards, row.routers.change_source, row.applied) == ("m1", {}, False, 0)
    member.stop()  # a member never started stops at once
    assert no_connections == []


class Failing(GroupPart):
    name = "failing"

    def __init__(self, failed):
        super().__init__(failed)
        self.closed = threading.Event()

    def _run(self, stop: threading.Event) -> None:
        raise RuntimeError("the part broke")

    def _close(self) -> None:
        self.closed.set()


def test_a_part_that_fails_hands_its_error_to_its_owner_and_closes_what_it_opened():
    seen: list[tuple[str, BaseException]] = []
    part = Failing(lambda name, exc: seen.append((name, exc)))
    part.start()
    part.stop()
    assert [(name, str(exc)) for name, exc in seen] == [("failing", "the part broke")]
    assert part.closed.is_set() and not part.running


class OpensHalfway(Failing):
    def _open(self) -> None:
        raise ConnectionRefusedError("the store is away")


def test_a_part_that_cannot_open_raises_to_its_starter_and_closes_what_it_had_opened():
    part = OpensHalfway(lambda name, exc: None)
    with pytest.raises(ConnectionRefusedError, match="the store is away"):
        part.start()
    assert part.closed.is_set() and not part.running


def test_a_change_source_position_behind_the_stored_one_is_refused(tmp_path):
    """A router paused past its session resumes behind the one that took the change source over (seen in
    tests/integration/test_group_fencing.py on main: it stored '__debezium-heartbeat.cdc/0' at 1976 after its
    successor's 1977): its position is not stored."""
    store = Store(str(tmp_path / "store.db"))
    try:
        def stores(offsets: dict[str, int]) -> bool:
            with store.batch() as tx:
                return advance_source_position(tx, "cdc", {"positions": offsets, "gtid": "0-1-9"})

        assert stores({"t/0": 10, "hb/0": 5})
        assert stores({"t/0": 12, "hb/0": 5})  # forward, or level
        assert not stores({"t/0": 11, "hb/0": 9})  # one partition behind: a zombie's
        assert not stores({"hb/0": 9})  # a partition it never read
        assert store.checkpoint("group/source/cdc")["positions"] == {"t/0": 12, "hb/0": 5}
    finally:
        store.close()


class StoreAway:
    """A store that went away: every read and write says so, as the store does when PostgreSQL stops."""

    def checkpoint(self, name: str) -> None:
        raise StoreUnavailableError(f"the store is away (reading {name})")

    def batch(self) -> None:
        raise StoreUnavailableError("the store is away (writing)")


class Topics:
    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1}


def test_a_store_gone_inside_a_rebalance_is_an_outage_raised_after_it_and_no_half_started_part_is_kept(
        no_connections):
    """Seen on CI: PostgreSQL stopped while a group rebalanced. A router's listener started a reader of the event
    partitions it was given, whose first read of the store failed; the reader was kept unstarted, the next
    revocation marked it (AssertionError), and kafka-python turned that into 'User rebalance callback throws an
    error', which stopped the instance with exit 3 instead of waiting the outage out."""
    cfg = parse({**GROUP_BASE, "group": {"name": "g", "shards": 4, "member": "m1"}})
    member = GroupMember(cfg, "m1", Outages(), Outages())
    routers, judges = member.routers, member.judges
    routers.store, routers.membership = StoreAway(), Topics()
    routers._assigned({"orders/0", "orders/1"})
    routers._rebuild()  # as a revocation's listener calls it
    assert isinstance(routers.store_lost, StoreUnavailableError)
    assert routers.events is None and routers.change is None
    routers._assigned({"orders/0"})
    routers._rebuild()  # the next revocation: nothing half-started to mark
    assert routers.events is None

    judges.store = StoreAway()
    assert judges.assigned([0, 1]) == {}
    assert isinstance(judges.store_lost, StoreUnavailableError) and judges.owned == {}
    assert no_connections == []


def test_an_event_partition_whose_clock_stands_still_is_said_once_until_it_moves(monkeypatch, caplog):
    """Every judge's Kafka clock waits for each event partition's mark: one that stands (read to below its end and
    nothing read since, or its end held) is logged after HELD_SECONDS, once, and again only after it moved."""
    cfg = parse({**GROUP_BASE, "group": {"name": "g", "shards": 2, "member": "m1"}})
    member = GroupMember(cfg, "m1", Outages(), Outages())
    router = routing.EventRouter(cfg, member.judges.settings, member.routers.output, None, {"t/0"}, {"t": 1})
    clock = [100.0]
    monkeypatch.setattr(routing.time, "monotonic", lambda: clock[0])
    behind, done = PartitionStatus("t", 0, 5, 9, 50.0), PartitionStatus("t", 0, 9, 9, 60.0)

    def held_after(seconds: float, status: PartitionStatus, at: float | None) -> int:
        clock[0] += seconds
        caplog.clear()
        router._held(status, at)
        return sum(r.event == "group_partition_clock_held" for r in caplog.records)

    assert held_after(0, behind, None) == 0
    assert held_after(routing.HELD_SECONDS - 1, behind, None) == 0
    assert held_after(1, behind, None) == 1
    assert held_after(routing.HELD_SECONDS * 2, behind, None) == 0  # said once
    assert held_after(1, done, 60.0) == 0  # it moved
    assert held_after(routing.HELD_SECONDS, done, 60.0) == 1  # and stood again


class Blocks(GroupPart):
    """A part whose thread goes round once, then waits in a call that does not return (until released)."""

    name = "blocks"

    def __init__(self):
        super().__init__(lambda name, exc: None)
        self.release = threading.Event()

    def _run(self, stop: threading.Event) -> None:
        self.lap()
        self.release.wait()


def test_a_part_that_has_not_gone_round_its_loop_for_a_minute_says_where_its_thread_stands_once():
    part = Blocks()
    part.start()
    try:
        assert part.stuck(part.lapped + STUCK_SECONDS - 1) is None
        stack = part.stuck(part.lapped + STUCK_SECONDS)
        assert stack is not None and stack.index("self.release.wait()") < stack.index("_guarded")  # innermost first
        assert part.stuck(part.lapped + STUCK_SECONDS * 2) is None  # said once
        part.lap()
        assert part.stuck(part.lapped + STUCK_SECONDS) is not None  # went round, then stuck again
    finally:
        part.release.set()
        part.stop()
    assert part.stuck(part.lapped + STUCK_SECONDS) is None  # not running
