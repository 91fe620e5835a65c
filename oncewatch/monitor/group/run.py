"""`oncewatch run` with `[group]`: this instance's routers and judges, and its health row, until stopped.

Each part runs in a thread of its own; one that fails stops the instance (loudly, with the error), so that the
group's protocol gives its sources and shards to the others instead of leaving them with a half-dead member.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from oncewatch.checks.settings import Settings
from oncewatch.core.config import Config, ConfigError
from oncewatch.monitor.group.judging import Judges
from oncewatch.monitor.group.routing import Routers
from oncewatch.monitor.group.wire import LEASE, RECORDS, group_name
from oncewatch.store import Store

log = logging.getLogger("oncewatch.monitor.group")

HEALTH_SECONDS = 1.0


class GroupMemberFailed(RuntimeError):
    """A part of this instance stopped on an error: the instance stops, the group goes on without it."""


def member_name(cfg: Config) -> str:
    assert cfg.group is not None
    return cfg.group.member or f"{socket.gethostname()}-{os.getpid()}"


def ensure_topics(cfg: Config) -> None:
    """The group's topics, made if missing; an internal topic of another shard count is refused."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    assert cfg.group is not None and cfg.kafka is not None
    records, lease = group_name(cfg.group.name, RECORDS), group_name(cfg.group.name, LEASE)
    admin = KafkaAdminClient(bootstrap_servers=list(cfg.kafka.bootstrap_servers),
                             client_id=f"{cfg.kafka.client_id}-group")
    try:
        for topic, partitions in ((records, cfg.group.shards), (lease, 1)):
            try:
                admin.create_topics([NewTopic(topic, partitions, 1)])
            except TopicAlreadyExistsError:
                pass
        for t in admin.describe_topics([records]):
            if len(t["partitions"]) != cfg.group.shards:
                raise ConfigError(f"group.shards: the group's topic {records} has {len(t['partitions'])} partitions, "
                                  f"the config says {cfg.group.shards}; a group keeps its shard count for its life "
                                  f"(each shard's state is in the store): set it back, or start a new group.name")
    finally:
        admin.close()


class GroupMember:
    def __init__(self, cfg: Config):
        assert cfg.group is not None
        self.cfg = cfg
        self.member = member_name(cfg)
        self.stop_event = threading.Event()
        self.failure: BaseException | None = None
        settings = Settings.from_config(cfg)
        ensure_topics(cfg)
        self.store = Store(cfg.store.target)
        self.judges = Judges(cfg, settings, Store(cfg.store.target), self.member)
        self.routers = Routers(cfg, settings, Store(cfg.store.target), self.member)

    def stop(self) -> None:
        self.stop_event.set()

    def _part(self, name: str, run: Callable[[threading.Event], None]) -> threading.Thread:
        def guarded() -> None:
            try:
                run(self.stop_event)
            except BaseException as exc:  # noqa: BLE001 - any failure stops the instance, said below
                log.exception("a part of this group instance failed; the instance stops", extra={
                    "event": "group_part_failed", "part": name, "member": self.member})
                self.failure = self.failure or exc
                self.stop_event.set()
        thread = threading.Thread(target=guarded, name=f"group-{name}", daemon=True)
        thread.start()
        return thread

    def _serve_metrics(self) -> Callable[[], None]:
        """/metrics on `metrics.port`: this member's own row, and the store's while it owns the leader shard."""
        m = self.cfg.metrics
        if m.port == 0:
            return lambda: None
        from oncewatch.dashboards.metrics import serve

        try:
            server, _ = serve(self.cfg.store.target, m.host, m.port, member=self.member, wide=self.judges.leads)
        except OSError as exc:
            raise ConfigError(f"metrics.port: cannot listen on {m.host}:{m.port} ({exc.strerror}); each member of a "
                              f"group on one machine needs a port of its own (or 0: none)") from exc
        log.info("serving /metrics", extra={"event": "metrics_listening", "host": m.host, "port": server.server_port})

        def close() -> None:
            server.shutdown()
            server.server_close()
        return close

    def _offsets(self, stop: threading.Event) -> None:
        """The consumer groups' offsets (F11 on their lag, F12), read by the owner of the leader shard alone."""
        from oncewatch.collectors.kafka_offsets import KafkaOffsetsCollector

        assert self.cfg.kafka is not None
        if not self.cfg.kafka.consumer_groups:
            return
        collector = KafkaOffsetsCollector(self.cfg.kafka)
        try:
            while not stop.wait(self.cfg.kafka.offsets_poll_seconds):
                if self.judges.leads():
                    self.judges.add_offsets(collector.snapshot())
        finally:
            collector.close()

    def run(self) -> None:
        log.info("group instance starting", extra={"event": "group_started", "member": self.member,
                                                   "group": self.cfg.group.name, "shards": self.cfg.group.shards})
        metrics = self._serve_metrics()
        parts = [self._part("judges", self.judges.run), self._part("routers", self.routers.run),
                 self._part("offsets", self._offsets)]
        while not self.stop_event.wait(HEALTH_SECONDS):
            self.store.set_health(f"group/{self.member}", {
                "at": time.time(), "member": self.member, "shards": self.judges.status(),
                "routers": self.routers.status(), "fenced": self.judges.fenced, "applied": self.judges.applied})
        for thread in parts:
            thread.join()
        metrics()
        if self.failure is not None:
            raise GroupMemberFailed(f"{type(self.failure).__name__}: {self.failure}") from self.failure
