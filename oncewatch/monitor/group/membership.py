"""A member's Kafka consumer groups (the judges' and the routers'): how each consumer is made, and how a member
tells that one of them was left outside its group.

kafka-python 3.0.12 can leave a consumer outside its group for good. A leader asks to rejoin on its own when the
metadata it assigned from differs from the metadata it has now; if a poll returns (its timeout spent) while that
JoinGroup/SyncGroup is in flight, the assignment it made has made the two equal again, so the next poll finds
nothing to rejoin for and never takes the assignment the SyncGroup brought: no on_partitions_assigned and no
heartbeats, the coordinator drops it after the session timeout and the group goes on without it, while the
process looks alive and owns nothing (seen in bench/group_throughput.py: one member of three at 0 % of the work,
one run in about five). Two defences: the consumer learns its subscription's partitions before its first join
(`join`: subscribe, then a metadata fetch), which removes the usual cause, a first assignment made from no
metadata; while a rebalance is on, polls long enough for the join to finish inside one of them
(`Rebalance.poll_ms`); and `Rebalance` counts the time since a revocation with no assignment after it, past which
the member closes the consumer and makes a new one (a new member id: the group rebalances once more).

Both groups rebalance incrementally (KIP-429, kafka-python's cooperative sticky assignor): a member keeps what it
owns across a join, and only what moves is revoked from one member and then given to another, so a member that
joins or leaves does not make every judge let go of its shards and load them again from the store. And each
consumer is a static member (KIP-345, `group_instance_id` from the member's name): an instance started again
under the same name within the session timeout gets its own partitions back with no rebalance at all. Since
kafka-python calls the listener only for partitions added or revoked, a join that ends with nothing added is
heard from the assignor: a join beginning (`Rebalance.revoked`, when the join request's metadata is made) and
every assignment synced (`Rebalance.assigned`). A static member sends no LeaveGroup
when it closes: an instance stopped for good (SIGTERM) removes its members itself (`leave`), so that its shards
and sources are handed on at once, not a session timeout later.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from oncewatch.collectors.kafka_client import connection
from oncewatch.core.config import KafkaConfig

log = logging.getLogger("oncewatch.monitor.group.membership")

SESSION_TIMEOUT_MS = 10_000  # an instance that dies loses its shards and its sources this long after
HEARTBEAT_MS = 1_000
# A rebalance waits at most a session timeout for a member that went away: twice that and still nothing assigned
# is a consumer outside its group.
REJOIN_SECONDS = 2 * SESSION_TIMEOUT_MS / 1000
JOIN_POLL_MS = 1_000  # a poll's timeout while a rebalance is on: its join is seldom cut off half-way


def instance_id(member: str, group: str) -> str:
    """The static member id of `member`'s consumer in one of the group's consumer groups (Kafka takes letters,
    digits, '.', '_' and '-')."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{member}.{group}")[:249]


def _cooperative(rebalance: Rebalance) -> Any:
    """kafka-python's cooperative sticky assignor, telling `rebalance` of every assignment synced."""
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor

    class Synced(CooperativeStickyAssignor):  # type: ignore[misc]
        def metadata(self, topics: Any) -> Any:
            # a join begins (its request carries this): polls are long until it is assigned, since a member that
            # loses nothing hears no revocation, and a join cut off by a short poll's end may never complete
            rebalance.revoked()
            return super().metadata(topics)

        def on_assignment(self, assignment: Any, generation: int) -> None:
            super().on_assignment(assignment, generation)
            rebalance.assigned()

    return Synced()


def join(kafka: KafkaConfig, group_id: str, client_id: str, topics: list[str], listener: Any,
         rebalance: Rebalance, **settings: Any) -> Any:
    """A consumer of `group_id` subscribed to `topics` with `listener`, their partitions known before it joins
    (the join itself happens in its first poll); a static member, rebalanced incrementally."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(**connection(kafka), group_id=group_id,
                             client_id=client_id, enable_auto_commit=False, session_timeout_ms=SESSION_TIMEOUT_MS,
                             heartbeat_interval_ms=HEARTBEAT_MS,
                             group_instance_id=instance_id(rebalance.member, rebalance.group),
                             partition_assignment_strategy=(_cooperative(rebalance),), **settings)
    consumer.subscribe(topics, listener=listener)
    # a full metadata fetch after subscribing: the coordinator's view of the subscription's partitions is taken
    # from it, so that the first assignment is made from them (kafka-python takes that view only on a metadata
    # update that comes after the subscription)
    consumer.topics()
    return consumer


def leave(kafka: KafkaConfig, member: str, groups: list[str]) -> None:
    """`member`'s static members of `groups` removed (its consumers closed first): the groups rebalance now. Best
    effort: a broker that does not answer leaves it to the session timeout, which the log says."""
    from kafka.admin import KafkaAdminClient, MemberToRemove
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(**connection(kafka), client_id=f"{kafka.client_id}-leave-{member}")
    except KafkaError as exc:
        log.warning("this member could not leave its groups; they hand its work on after the session timeout",
                    extra={"event": "group_leave_failed", "member": member, "error": str(exc)})
        return
    try:
        for group in groups:
            try:
                admin.remove_group_members(group, [MemberToRemove(group_instance_id=instance_id(member, group))])
            except KafkaError as exc:  # gone already (expired, or never joined): nothing to hand on
                log.info("a group of this member had it no more", extra={
                    "event": "group_leave_skipped", "member": member, "group": group, "error": str(exc)})
    finally:
        admin.close()


class Rebalance:
    """One consumer's rebalances as its listener sees them: revoked (or just made) and not yet assigned since."""

    def __init__(self, group: str, member: str):
        self.group, self.member = group, member
        self.waiting_since: float | None = time.monotonic()  # a new consumer is assigned at its first join
        self.rejoins = 0  # consumers made again after being left outside the group

    def revoked(self) -> None:
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def assigned(self) -> None:
        self.waiting_since = None

    def poll_ms(self, otherwise: int) -> int:
        """The timeout for the consumer's next poll: long while waiting for an assignment (there is nothing to
        read meanwhile), so that the join runs its course inside one poll (the leader's rejoin goes astray only
        when a poll ends during it), else `otherwise`."""
        return max(otherwise, JOIN_POLL_MS) if self.waiting_since is not None else otherwise

    def outside(self) -> bool:
        """True when the consumer has waited for an assignment past REJOIN_SECONDS: the caller closes it and makes
        a new one (`remade`)."""
        return self.waiting_since is not None and time.monotonic() - self.waiting_since > REJOIN_SECONDS

    def remade(self) -> None:
        self.rejoins += 1
        self.waiting_since = time.monotonic()
        log.warning("a consumer of this member was left outside its group (no assignment %.0f s after a "
                    "rebalance began); it is made again and rejoins", REJOIN_SECONDS,
                    extra={"event": "group_rejoin", "group": self.group, "member": self.member,
                           "rejoins": self.rejoins})
