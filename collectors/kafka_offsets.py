"""Polls Kafka offsets: per watched partition its earliest and end offsets, per configured consumer
group its committed offsets, lag, lag in seconds and state (what F11/F12 and the lag pages read).

Every poll gives an `OffsetsSnapshot` (oncewatch.core.records), stored by the monitor as health
component "kafka_offsets". `committed` is None for a partition the group never committed on (Kafka answers -1 or leaves
it out; it is not reported as 0 or -1), and then lag and lag_seconds are None too. A group's
partitions are those of the watched topics it committed on or its members subscribe to; a group
showing neither (never committed, no members) is listed against every watched partition. `state`
is Kafka's own name (Stable, Empty, Dead, PreparingRebalance, CompletingRebalance).

Lag in seconds is estimated as kafka-lag-exporter does: a sliding window of (end offset, time)
points per partition tells when the end offset passed the committed offset, by interpolation
between the two points around it, or by extrapolation over the whole window when it is older.
The collector only reads (Describe on topics and groups); it never joins or commits into a group.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient, TopicPartition
from kafka import errors as kerrors
from kafka.admin import OffsetSpec

from oncewatch.collectors.kafka_events import admin_client, existing_partitions, list_offsets
from oncewatch.core.config import KafkaConfig
from oncewatch.core.protocol import NO_OFFSETS
from oncewatch.core.records import GroupOffsets, GroupPartition, OffsetsSnapshot, PartitionRange

log = logging.getLogger("oncewatch.collectors.kafka_offsets")


def estimate_time(points: Sequence[tuple[int, float]], offset: int) -> float | None:
    """When the end offset passed `offset`, from (end offset, time) points, oldest first.

    Interpolates inside the window (newest matching segment first), extrapolates along the whole
    window when the offset is older than it; None when there are too few points or no movement.
    """
    if len(points) < 2:
        return None
    segments = list(zip(points, points[1:]))
    left, right = next(((a, b) for a, b in reversed(segments) if a[0] <= offset <= b[0]), (points[0], points[-1]))
    (o1, t1), (o2, t2) = left, right
    if o2 == o1:
        # A flat segment: the end stayed at `offset` until t2 (inside), or nothing moved at all (outside).
        return t2 if o2 == offset else None
    return t2 - (o2 - offset) * (t2 - t1) / (o2 - o1)


@dataclass
class LagHistory:
    """The sliding window of one partition's (end offset, time) points."""

    limit: int
    points: list[tuple[int, float]] = field(default_factory=list)

    def add(self, offset: int, at: float) -> None:
        if self.points:
            last_offset, last_at = self.points[-1]
            if at <= last_at:
                return  # out of order
            if offset < last_offset:
                self.points.clear()  # the log went backwards (topic recreated): old points mean nothing
            elif offset == last_offset and len(self.points) > 1 and self.points[-2][0] == offset:
                self.points[-1] = (offset, at)  # keep a flat stretch as one segment: move its right end
                return
        self.points.append((offset, at))
        del self.points[:-self.limit]

    def lag_seconds(self, committed: int, now: float) -> float | None:
        if self.points and committed >= self.points[-1][0]:
            return 0.0
        produced = estimate_time(self.points, committed)
        return None if produced is None else max(0.0, now - produced)


def _committed(offset: int) -> int | None:
    return offset if offset >= 0 else None  # Kafka's "no commit" is -1


def _member_topics(description: dict[str, Any]) -> set[str]:
    topics: set[str] = set()
    for member in description.get("members") or ():
        metadata, assignment = member.get("member_metadata"), member.get("member_assignment")
        if isinstance(metadata, dict):
            topics.update(metadata.get("topics") or ())
        if isinstance(assignment, dict):
            topics.update(a["topic"] for a in assignment.get("assigned_partitions") or ())
    return topics


class KafkaOffsetsCollector:
    """Call `snapshot()` every `kafka.offsets_poll_seconds`, or run it as a part (oncewatch.core.protocol.Part):
    `items` takes a snapshot every `every` seconds (kafka.offsets_poll_seconds unless given), and `status()` is
    the last one."""

    def __init__(self, cfg: KafkaConfig, *, clock: Callable[[], float] = time.time, every: float | None = None):
        self.cfg = cfg
        self._clock = clock
        self._every = cfg.offsets_poll_seconds if every is None else every
        self._timeout_ms = int(cfg.request_timeout_seconds * 1000)
        self._admin: KafkaAdminClient | None = None
        self._history: dict[TopicPartition, LagHistory] = {}
        self._last_error: str | None = None
        self._last = NO_OFFSETS
        self._alive: float | None = None

    def start(self) -> None:
        """Nothing to connect ahead: each snapshot connects the admin client if it has none."""

    def items(self, stop: threading.Event) -> Iterator[OffsetsSnapshot]:
        while not stop.is_set():
            self._last = self.snapshot()
            self._alive = time.time()
            yield self._last
            stop.wait(self._every)

    def status(self) -> OffsetsSnapshot:
        return self._last

    def alive_at(self) -> float | None:
        return self._alive

    def stop(self) -> None:
        """`items` ends at the stop event it was given."""

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def snapshot(self) -> OffsetsSnapshot:
        now = self._clock()
        partitions: tuple[PartitionRange, ...] = ()
        groups: tuple[GroupOffsets, ...] = ()
        errors: list[str] = []
        try:
            if self._admin is None:
                self._admin = admin_client(self.cfg)
            watched, _missing = existing_partitions(self._admin, [t.name for t in self.cfg.topics])
            earliest = list_offsets(self._admin, watched, OffsetSpec.EARLIEST, self._timeout_ms)
            ends = list_offsets(self._admin, watched, OffsetSpec.LATEST, self._timeout_ms)
        except kerrors.KafkaError as exc:
            errors.append(f"offsets: {type(exc).__name__}: {exc}")
        else:
            self._record(ends, now)
            partitions = tuple(PartitionRange(tp.topic, tp.partition, earliest[tp], ends[tp]) for tp in sorted(watched))
            groups = tuple(self._group(g, watched, ends, now, errors) for g in self.cfg.consumer_groups)
        error = "; ".join(errors) or None
        self._log_transition(error)
        return OffsetsSnapshot(polled_at=now, error=error, partitions=partitions, groups=groups)

    # -------------------------------------------------------------- internals

    def _record(self, ends: dict[TopicPartition, int], now: float) -> None:
        for tp in set(self._history) - set(ends):
            del self._history[tp]
        for tp, end in ends.items():
            self._history.setdefault(tp, LagHistory(self.cfg.lag_history_points)).add(end, now)

    def _group(self, group: str, watched: set[TopicPartition], ends: dict[TopicPartition, int], now: float,
               errors: list[str]) -> GroupOffsets:
        admin = self._admin
        assert admin is not None
        try:
            committed = admin.list_group_offsets(group).get(group, {})
            description = admin.describe_groups([group]).get(group, {})
        except kerrors.KafkaError as exc:
            errors.append(f"group {group}: {type(exc).__name__}: {exc}")
            return GroupOffsets(group, None, ())
        watched_topics = {tp.topic for tp in watched}
        topics = ({tp.topic for tp in committed} | _member_topics(description)) & watched_topics or watched_topics
        rows = []
        for tp in sorted(tp for tp in watched if tp.topic in topics):
            offset = _committed(committed[tp].offset) if tp in committed else None
            lag = None if offset is None else max(0, ends[tp] - offset)
            seconds = None if offset is None else self._history[tp].lag_seconds(offset, now)
            rows.append(GroupPartition(tp.topic, tp.partition, offset, lag, seconds))
        return GroupOffsets(group, description.get("group_state"), tuple(rows))

    def _log_transition(self, error: str | None) -> None:
        if error and error != self._last_error:
            log.warning("kafka offsets poll failed", extra={"event": "kafka_offsets_error", "error": error})
        elif self._last_error and not error:
            log.info("kafka offsets poll answered again", extra={"event": "kafka_offsets_ok"})
        self._last_error = error


__all__ = ["KafkaOffsetsCollector", "LagHistory", "estimate_time"]
