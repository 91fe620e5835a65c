"""The downstream services that consume the shop's topic, as consumer groups that commit offsets.

A healthy group commits after every batch, so its lag stays near zero and is zero once the
run has drained. `stall()` pauses some or all of its partitions: the group stays a member
but stops committing there, so the lag grows (F11) or grows on some partitions only (F12).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import OffsetSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lag:
    """A group's lag on one topic: end offset minus committed offset, per partition."""

    end: dict[int, int]
    committed: dict[int, int | None]

    @property
    def by_partition(self) -> dict[int, int]:
        return {p: end - (self.committed[p] or 0) for p, end in self.end.items()}

    def to_dict(self) -> dict[str, object]:
        lags = self.by_partition
        return {"lag": {str(p): n for p, n in sorted(lags.items())}, "total": sum(lags.values()),
                "stddev": round(statistics.pstdev(lags.values()), 3),
                "committed": {str(p): c for p, c in sorted(self.committed.items())},
                "end": {str(p): e for p, e in sorted(self.end.items())}}


def end_offsets(admin: KafkaAdminClient, topic: str, partitions: int) -> dict[int, int]:
    specs = {TopicPartition(topic, p): OffsetSpec.LATEST for p in range(partitions)}
    return {tp.partition: r.offset for tp, r in admin.list_partition_offsets(specs).items()}


def lag(admin: KafkaAdminClient, group: str, topic: str, partitions: int) -> Lag:
    committed = admin.list_group_offsets(group).get(group, {})
    offsets = {tp.partition: om.offset for tp, om in committed.items() if tp.topic == topic}
    return Lag(end=end_offsets(admin, topic, partitions),
               committed={p: offsets.get(p) for p in range(partitions)})


class DownstreamGroup(threading.Thread):
    """One downstream service: subscribes to the topic, reads, commits after every batch."""

    def __init__(self, group: str, topic: str, bootstrap_servers: str):
        super().__init__(name=f"group-{group}", daemon=True)
        self.group = group
        self._topic = topic
        self._servers = bootstrap_servers
        self._stopping = threading.Event()
        self.ready = threading.Event()
        self._stalled: frozenset[int] | None = None  # partitions to pause; requested from another thread
        self.stalled: frozenset[int] = frozenset()
        self.error: BaseException | None = None

    def stall(self, partitions: frozenset[int]) -> None:
        self._stalled = partitions
        log.info("consumer group stalls", extra={"group": self.group, "partitions": sorted(partitions)})

    def run(self) -> None:
        try:
            consumer = KafkaConsumer(group_id=self.group, bootstrap_servers=self._servers,
                                     client_id=f"oncewatch-shop-{self.group}", enable_auto_commit=False,
                                     auto_offset_reset="earliest")
            try:
                # Join only once the topic's partitions are known: a group that joins before
                # (a just-created topic) gets no partitions until its next metadata refresh.
                deadline = time.monotonic() + 30
                while not consumer.partitions_for_topic(self._topic):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"topic {self._topic} has no partitions in the metadata")
                    time.sleep(0.2)
                consumer.subscribe([self._topic])
                self._loop(consumer)
            finally:
                consumer.close(autocommit=False)
        except Exception as exc:  # noqa: BLE001 - handed to the runner, which stops the run
            self.error = exc
            self.ready.set()

    def _loop(self, consumer: KafkaConsumer) -> None:
        while not self._stopping.is_set():
            # The consumer is not thread-safe: pauses are applied here, on its own thread.
            if self._stalled is not None and self._stalled != self.stalled:
                consumer.pause(*(TopicPartition(self._topic, p) for p in self._stalled))
                self.stalled = self._stalled
            batch = consumer.poll(timeout_ms=100)
            if batch:
                consumer.commit()
            if consumer.assignment():
                self.ready.set()

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)


def wait_drained(admin: KafkaAdminClient, groups: list[DownstreamGroup], topic: str, partitions: int,
                 timeout: float) -> None:
    """Wait until every partition a group has not stalled is committed up to its end."""
    deadline = time.monotonic() + timeout
    for group in groups:
        while True:
            behind = {p: n for p, n in lag(admin, group.group, topic, partitions).by_partition.items()
                      if n and p not in group.stalled}
            if not behind:
                break
            if group.error is not None:
                raise group.error
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumer group {group.group} still behind on partitions {sorted(behind)}")
            time.sleep(0.2)
