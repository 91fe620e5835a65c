"""A group member's consumers: when one counts as left outside its group (oncewatch.monitor.group.membership)."""

from __future__ import annotations

import pytest

from oncewatch.monitor.group import membership
from oncewatch.monitor.group.membership import JOIN_POLL_MS, REJOIN_SECONDS, Rebalance


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(membership.time, "monotonic", lambda: now[0])
    return now


def test_a_new_consumer_is_outside_only_when_its_first_join_never_brings_an_assignment(clock) -> None:
    rebalance = Rebalance("judges", "m0")
    clock[0] += REJOIN_SECONDS
    assert not rebalance.outside()
    clock[0] += 0.1
    assert rebalance.outside()


def test_an_assignment_ends_the_wait_and_a_revocation_starts_it_once(clock) -> None:
    rebalance = Rebalance("judges", "m0")
    rebalance.assigned()
    clock[0] += 10 * REJOIN_SECONDS
    assert not rebalance.outside()  # assigned long ago, no rebalance since
    rebalance.revoked()
    clock[0] += REJOIN_SECONDS / 2
    rebalance.revoked()  # a second revocation in the same rebalance does not restart the wait
    clock[0] += REJOIN_SECONDS / 2 + 0.1
    assert rebalance.outside()
    rebalance.assigned()  # an empty assignment counts too: the member is in the group, with nothing to do
    assert not rebalance.outside()


def test_a_consumer_made_again_is_counted_and_waits_afresh(clock, caplog: pytest.LogCaptureFixture) -> None:
    rebalance = Rebalance("routers", "m1")
    clock[0] += REJOIN_SECONDS + 1
    assert rebalance.outside()
    rebalance.remade()
    assert rebalance.rejoins == 1 and not rebalance.outside()
    assert [r.event for r in caplog.records] == ["group_rejoin"]
    assert (caplog.records[0].group, caplog.records[0].member, caplog.records[0].levelname) == (
        "routers", "m1", "WARNING")


def test_polls_are_long_only_while_an_assignment_is_awaited(clock) -> None:
    rebalance = Rebalance("routers", "m1")
    assert rebalance.poll_ms(0) == JOIN_POLL_MS
    rebalance.assigned()
    assert (rebalance.poll_ms(0), rebalance.poll_ms(100)) == (0, 100)
    rebalance.revoked()
    assert rebalance.poll_ms(100) == JOIN_POLL_MS


def test_each_consumer_is_a_static_member_named_after_its_member_and_group() -> None:
    assert membership.instance_id("east-1", "oncewatch.shop.judges") == "east-1.oncewatch.shop.judges"
    # Kafka takes letters, digits, '.', '_' and '-' in a group.instance.id: a member's name may hold others
    assert membership.instance_id("host a/1", "oncewatch.shop.routers") == "host_a_1.oncewatch.shop.routers"
    assert len(membership.instance_id("m" * 300, "g")) == 249
