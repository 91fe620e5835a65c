"""`oncewatch run` with `[group]`: this instance's routers and judges, and its health row, until stopped.

Each part runs in a thread of its own; one that fails stops the instance (loudly, with the error), so that the
group's protocol gives its sources and shards to the others instead of leaving them with a half-dead member. A
store that goes away stops it too, and a new one starts once the store answers (GroupSupervisor).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable


from oncewatch.checks.settings import Settings
from oncewatch.collectors.kafka_client import connection
from oncewatch.core.config import Config, ConfigError
from oncewatch.core.protocol import (GroupMemberHealth, GroupMemberStatus, OffsetsPollerStatus, RoutersHealth,
                                     ShardHealth)
from oncewatch.monitor.group.judging import Judges
from oncewatch.monitor.group.part import Failed, GroupPart
from oncewatch.monitor.group.routing import Routers
from oncewatch.monitor.group.membership import leave
from oncewatch.monitor.group.wire import JUDGES, LEASE, RECORDS, ROUTERS, group_name
from oncewatch.monitor.health import Outages
from oncewatch.monitor.supervise import RETRY_SECONDS, through_outages
from oncewatch.store import Store, StoreUnavailableError

log = logging.getLogger("oncewatch.monitor.group")

HEALTH_SECONDS = 1.0
TOPICS_READY_SECONDS = 30.0  # for the group's topics, just made, to have their leaders


class GroupMemberFailed(RuntimeError):
    """A part of this instance stopped on an error: the instance stops, the group goes on without it."""


class GroupStopped(Exception):
    """The instance was stopped while it waited for the Kafka broker, before it had started."""


class BrokerAway(RuntimeError):
    """A part of this instance lost the Kafka broker (restarting, or cut off): the instance stops its parts and
    starts again once the broker answers, as it does when the store goes away."""


def broker_away(exc: BaseException) -> bool:
    """An error that says the broker cannot be reached now, not that something is wrong with what was asked."""
    from kafka.errors import BrokerNotAvailableError, KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError

    return isinstance(exc, (BrokerNotAvailableError, KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError))


def member_name(cfg: Config) -> str:
    assert cfg.group is not None
    return cfg.group.member or f"{socket.gethostname()}-{os.getpid()}"


def ensure_topics(cfg: Config) -> None:
    """The group's topics, made if missing with `group.replication_factor` replicas (and, past one, at least two of
    them in sync for a write to count: the routers write with acks=all); an internal topic of another shard count is
    refused."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import InvalidReplicationFactorError, TopicAlreadyExistsError

    assert cfg.group is not None and cfg.kafka is not None
    records, lease = group_name(cfg.group.name, RECORDS), group_name(cfg.group.name, LEASE)
    replicas = cfg.group.replication_factor
    settings = {"min.insync.replicas": str(min(2, replicas))}
    admin = KafkaAdminClient(**connection(cfg.kafka), client_id=f"{cfg.kafka.client_id}-group")
    try:
        for topic, partitions in ((records, cfg.group.shards), (lease, 1)):
            try:
                admin.create_topics([NewTopic(topic, partitions, replicas, topic_configs=settings)])
            except TopicAlreadyExistsError:
                pass
            except InvalidReplicationFactorError as exc:
                raise ConfigError(f"group.replication_factor: the broker cannot make {topic} with {replicas} "
                                  f"replicas ({exc}); give at most its number of brokers (1 on a single dev broker, "
                                  f"3 in production)") from exc
        # a topic just made has no leader for a moment: a group that joins then is assigned none of it
        deadline = time.monotonic() + TOPICS_READY_SECONDS
        while not all(t["partitions"] and all(p["leader_id"] >= 0 for p in t["partitions"])
                      for t in admin.describe_topics([records, lease])) and time.monotonic() < deadline:
            time.sleep(0.2)
        for t in admin.describe_topics([records]):
            if len(t["partitions"]) != cfg.group.shards:
                raise ConfigError(f"group.shards: the group's topic {records} has {len(t['partitions'])} partitions, "
                                  f"the config says {cfg.group.shards}; a group keeps its shard count for its life "
                                  f"(each shard's state is in the store): set it back, or start a new group.name")
    finally:
        admin.close()


class OffsetsPoller(GroupPart):
    """The consumer groups' offsets (F11 on their lag, F12), read by the owner of the leader shard alone and handed
    to its judge."""

    name = "offsets"

    def __init__(self, cfg: Config, judges: Judges, failed: Failed):
        assert cfg.kafka is not None
        super().__init__(failed)
        self.kafka, self.judges = cfg.kafka, judges
        self.collector: Any = None
        self.snapshots = 0

    def _open(self) -> None:
        from oncewatch.collectors.kafka_offsets import KafkaOffsetsCollector

        if self.kafka.consumer_groups:
            self.collector = KafkaOffsetsCollector(self.kafka)

    def _run(self, stop: threading.Event) -> None:
        if self.collector is None:
            return  # no consumer group configured: nothing to read
        while not stop.wait(self.kafka.offsets_poll_seconds):
            self.lap()
            if self.judges.leads():
                self.judges.add_offsets(self.collector.snapshot())
                self.snapshots += 1

    def _close(self) -> None:
        if self.collector is not None:
            self.collector.close()

    def status(self) -> OffsetsPollerStatus:
        return OffsetsPollerStatus(self.running, self.snapshots)


def health_row(status: GroupMemberStatus) -> GroupMemberHealth:
    """A member's status as its health row in the store (what the dashboards read)."""
    r, j = status.routers, status.judges
    return GroupMemberHealth(
        at=status.at, member=status.member,
        shards={str(s.shard): ShardHealth(s.records, s.repeated, s.offset, s.binlog_time, s.kafka_time)
                for s in j.shards},
        routers=RoutersHealth(r.partitions, r.change_source, r.written, r.change_transactions, r.records,
                              r.stale_positions),
        fenced=j.fenced, applied=j.applied, rejoins=j.rejoins + r.rejoins, store_outages=status.store_outages,
        store_outage_seconds=status.store_outage_seconds, kafka_outages=status.kafka_outages,
        kafka_outage_seconds=status.kafka_outage_seconds, purged=j.purged, purge_failures=j.purge_failures)


class GroupMember:
    """This instance's routers, judges and offsets poller (each a GroupPart: a thread and connections of its own),
    and its health row every second. The constructor connects nothing; `start` makes the group's topics if missing,
    opens the health row's store and starts the parts; `run` keeps the health row until `stop()` or a part fails,
    then stops every part."""

    def __init__(self, cfg: Config, member: str, outages: Outages, kafka_outages: Outages):
        assert cfg.group is not None
        self.cfg, self.member, self.outages, self.kafka_outages = cfg, member, outages, kafka_outages
        self.stop_event = threading.Event()
        self.failure: BaseException | None = None
        settings = Settings.from_config(cfg)
        self.store: Store | None = None  # the health row's
        self.judges = Judges(cfg, settings, member, self._failed)
        self.routers = Routers(cfg, settings, member, self._failed)
        self.offsets = OffsetsPoller(cfg, self.judges, self._failed)
        self.parts: list[GroupPart] = [self.judges, self.routers, self.offsets]

    def start(self) -> None:
        """The topics, the health row's store and every part; what was started is stopped again if one fails."""
        log.info("group instance starting", extra={"event": "group_started", "member": self.member,
                                                   "group": self.cfg.group.name, "shards": self.cfg.group.shards})
        try:
            ensure_topics(self.cfg)
            self.store = Store(self.cfg.store.target)
            for part in self.parts:
                part.start()
        except BaseException:
            self._stop_parts()
            raise

    def stop(self) -> None:
        self.stop_event.set()

    def status(self) -> GroupMemberStatus:
        return GroupMemberStatus(time.time(), self.member, self.judges.status(), self.routers.status(),
                                 self.offsets.status(), self.outages.count, self.outages.seconds,
                                 self.kafka_outages.count, self.kafka_outages.seconds)

    def _failed(self, part: str, exc: BaseException) -> None:
        if isinstance(exc, StoreUnavailableError):  # the outage itself is logged once, by through_outages
            log.warning("a part of this group instance lost the store; the instance stops", extra={
                "event": "group_part_store_lost", "part": part, "member": self.member, "error": str(exc)})
        else:
            log.error("a part of this group instance failed; the instance stops", exc_info=exc, extra={
                "event": "group_part_failed", "part": part, "member": self.member})
        # a store or broker gone away is why the others fail too (a rebalance that cannot commit): start again
        if self.failure is None or isinstance(exc, StoreUnavailableError):
            self.failure = exc
        self.stop_event.set()

    def _stop_parts(self) -> None:
        """Every part asked at once, then waited for; the health row's store closed."""
        for part in self.parts:
            part.ask_stop()
        for part in self.parts:
            part.stop()
        if self.store is not None:
            self.store.close()

    def _say_stuck(self) -> None:
        """Each part (the change source's reader among them) that has not gone round its loop for a minute, logged
        once with where its thread stands: a part stuck in a client's call would otherwise hold the group's clocks
        with nothing said."""
        now = time.monotonic()
        for part in (*self.parts, self.routers.change):
            if part is not None and (stack := part.stuck(now)) is not None:
                log.error("a part of this group instance has not gone round its loop for a minute", extra={
                    "event": "group_part_stuck", "part": part.name, "member": self.member,
                    "seconds": round(now - part.lapped, 1), "stack": stack[-4000:]})

    def run(self) -> None:
        """Until `stop()` or a part fails: StoreUnavailableError when the store went away, else GroupMemberFailed."""
        assert self.store is not None, "start() first"
        try:
            while not self.stop_event.wait(HEALTH_SECONDS):
                self._say_stuck()
                try:
                    self.store.set_health(f"group/{self.member}", health_row(self.status()))
                except StoreUnavailableError as exc:
                    self._failed("health", exc)
        finally:
            self.stop_event.set()
            self._stop_parts()
        if isinstance(self.failure, StoreUnavailableError):
            raise self.failure
        if self.failure is not None and broker_away(self.failure):
            raise BrokerAway(f"{type(self.failure).__name__}: {self.failure}") from self.failure
        if self.failure is not None:
            raise GroupMemberFailed(f"{type(self.failure).__name__}: {self.failure}") from self.failure


class GroupSupervisor:
    """Group instances one after the other until stopped. A store that goes away (PostgreSQL restarted, failed
    over) stops the instance, which leaves the Kafka groups (its shards and sources wait, or go to members that
    reach the store), and a new one starts from the store's commits once it answers: nothing is lost, what it had
    not committed is read again. /metrics stays up meanwhile (`oncewatch_store_up 0`), and the outages and their
    length are counted in the member's row."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.name = member_name(cfg)
        self.outages = Outages()
        self.kafka_outages = Outages()  # the broker away as an instance starts or runs: waited out, never its end
        self.member: GroupMember | None = None
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()
        if self.member is not None:
            self.member.stop()

    def leads(self) -> bool:
        return self.member is not None and self.member.judges.leads()

    def run(self) -> None:
        close_metrics = self._serve_metrics()

        def build() -> GroupMember:
            self.member = self._new_member()
            return self.member

        def gone(_: GroupMember) -> None:  # its run closed its parts; it leads no more
            self.member = None

        try:
            while not self._stop.is_set():
                try:
                    through_outages(self._stop, self.outages, build, GroupMember.run, gone,
                                    "this group instance starts again")
                    return
                except BrokerAway as exc:  # its parts are stopped; the next build waits for the broker
                    self.kafka_outages.begin(time.time())
                    log.error("a part of this group instance lost the Kafka broker; the instance starts again once "
                              "it answers", extra={"event": "group_kafka_unavailable", "member": self.name,
                                                   "error": str(exc), "outages": self.kafka_outages.count})
        except GroupStopped:
            pass
        finally:
            if self._stop.is_set():  # for good: hand the work on now (static members send no LeaveGroup)
                leave(self.cfg.kafka, self.name, [group_name(self.cfg.group.name, g) for g in (JUDGES, ROUTERS)])
            close_metrics()

    def _new_member(self) -> GroupMember:
        """A new instance, once the Kafka broker answers: one away (restarting, or this machine up before it, or
        lost by the instance before this one) is waited out, logged once and counted on the instance's health row,
        as the store's outages are."""
        from kafka.errors import KafkaError

        tries = 0
        while True:
            asked = time.time()  # the broker was away from then on, at the latest: the outage counts from there
            member = GroupMember(self.cfg, self.name, self.outages, self.kafka_outages)
            try:
                member.start()
            except KafkaError as exc:  # any: a new instance's first calls are all to the broker
                if self.kafka_outages.begin(asked):
                    log.error("the Kafka broker cannot be reached; this group instance starts once it answers",
                              extra={"event": "group_kafka_unavailable", "member": self.name, "error": str(exc),
                                     "outages": self.kafka_outages.count})
                if self._stop.wait(RETRY_SECONDS[min(tries, len(RETRY_SECONDS) - 1)]):
                    raise GroupStopped from exc
                tries += 1
                continue
            gap = self.kafka_outages.end(time.time())
            if gap is not None:
                log.warning("the Kafka broker answers again; this group instance starts", extra={
                    "event": "group_kafka_back", "member": self.name, "outage_seconds": round(gap, 3)})
            return member

    def _serve_metrics(self) -> Callable[[], None]:
        """/metrics on `metrics.port`: this member's own row, and the store's while it owns the leader shard."""
        m = self.cfg.metrics
        if m.port == 0:
            return lambda: None
        from oncewatch.dashboards.metrics import serve

        try:
            server, _ = serve(self.cfg.store.target, m.host, m.port, member=self.name, wide=self.leads,
                              group=self.cfg.group.name, paging_max=m.paging_max_findings)
        except OSError as exc:
            raise ConfigError(f"metrics.port: cannot listen on {m.host}:{m.port} ({exc.strerror}); each member of a "
                              f"group on one machine needs a port of its own (or 0: none)") from exc
        log.info("serving /metrics", extra={"event": "metrics_listening", "host": m.host, "port": server.server_port})

        def close() -> None:
            server.shutdown()
            server.server_close()
        return close
