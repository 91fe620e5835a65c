"""A Debezium connector's heartbeats, read beside its other topics and placed among its records (issue 42).

With `heartbeat.interval.ms` the connector writes a record to `__debezium-heartbeat.<prefix>` after a binlog
event once that interval is up, also when the server only sent it a heartbeat of its own (no captured table
changed). Its value is `{"ts_ms": ...}`: the time it was written, by the connector's clock, and nothing of the
binlog position (Debezium MariaDB 3.5.0). Where it stands among the connector's other records is told by their
Kafka timestamps (the Connect producer stamps every record as it sends it, in the order the connector made
them): `HeartbeatReader` counts, for each heartbeat, the records of the topics read that were written between
the heartbeat before it and it, and whether a transaction was open then. It reads and counts; what that vouches
for is checks.clocks.heartbeat_watermark's to say.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from typing import Any

import msgspec

from oncewatch.core.records import Heartbeat

log = logging.getLogger("oncewatch.collectors.heartbeats")

# Record timestamps kept between two heartbeats; past it (heartbeats stopped while records go on) the span they
# cover is kept instead, and a heartbeat gap that meets it counts as busy.
TIMES_KEPT = 200_000


class _Payload(msgspec.Struct):
    ts_ms: int


class _Envelope(msgspec.Struct):
    payload: _Payload


def heartbeat_time(value: bytes) -> float:
    """A heartbeat record's `ts_ms` in seconds, from the JsonConverter's value with or without its schema."""
    try:
        return msgspec.json.decode(value, type=_Envelope).payload.ts_ms / 1000
    except msgspec.ValidationError:
        return msgspec.json.decode(value, type=_Payload).ts_ms / 1000


class HeartbeatReader:
    """Heartbeats and the Kafka timestamps of the other records read, until `take` places them: call it only when
    every partition is read to its end and every record read is handed on, so that every record the connector
    wrote before the heartbeats taken has been seen (a record is readable once one written after it is)."""

    def __init__(self, topic: str):
        self.topic = topic
        self.read = 0
        self.unreadable = 0
        self._beats: list[tuple[int, float]] = []  # (Kafka timestamp, ts_ms in seconds) read, not yet taken
        self._times: list[int] = []  # Kafka timestamps of the other records read since the last heartbeat taken
        self._busy: tuple[int, int] | None = None  # the span of timestamps given up past TIMES_KEPT
        # (timestamp, a transaction open after it, the binlog time of the newest END as of it) of transaction markers
        self._marks: list[tuple[int, bool, float]] = []
        self._open = False  # a transaction open as of the last heartbeat taken
        self._ended = 0.0  # the binlog time of the newest END written before the last heartbeat taken
        self._last: int | None = None  # the Kafka timestamp of the last heartbeat taken
        self._newest = -1  # the Kafka timestamp of the newest record read before it (-1: none yet)

    def on_heartbeat(self, rec: Any) -> None:
        """A record of the heartbeat topic (kafka-python's ConsumerRecord)."""
        if rec.value is None:
            return
        try:
            at = heartbeat_time(rec.value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.unreadable += 1
            log.error("a record of the heartbeat topic is not a Debezium heartbeat; the change clock does not move "
                      "by it", extra={"event": "cdc_heartbeat_unreadable", "at": f"{rec.topic}/{rec.partition}@"
                                                                                 f"{rec.offset}", "detail": str(exc)})
            return
        self.read += 1
        self._beats.append((rec.timestamp, at))

    def on_record(self, timestamp: int, open_after: bool | None = None, newest_end: float = 0.0) -> None:
        """Another record of the connector's, by its Kafka timestamp; a transaction marker with whether a
        transaction is open after it (`open_after`) and the binlog time of the newest END read so far."""
        self._times.append(timestamp)
        if open_after is not None:
            self._marks.append((timestamp, open_after, newest_end))
        if len(self._times) > TIMES_KEPT:
            low, high = min(self._times), max(self._times)
            self._busy = (min(low, self._busy[0]), max(high, self._busy[1])) if self._busy else (low, high)
            self._times = []

    @property
    def waiting(self) -> bool:
        """Heartbeats read and not taken yet."""
        return bool(self._beats)

    def take(self) -> list[Heartbeat]:
        """The heartbeats read since the last call, in the order written, each placed among the records."""
        if not self._beats:
            return []
        # markers by their timestamps alone, in the order read among equals: a BEGIN and its END often share one
        times, marks = sorted(self._times), sorted(self._marks, key=lambda mark: mark[0])
        beats: list[Heartbeat] = []
        state, ended, i = self._open, self._ended, 0
        for sent, at in sorted(self._beats):
            while i < len(marks) and marks[i][0] <= sent:
                state, ended, i = marks[i][1], max(ended, marks[i][2]), i + 1
            between, busy, upto = -1, self._busy, bisect_right(times, sent)
            if self._last is not None:
                between = upto - bisect_left(times, self._last)
                between += busy is not None and busy[0] <= sent and busy[1] >= self._last
            self._newest = max(self._newest, times[upto - 1] if upto else -1,
                               min(busy[1], sent) if busy is not None and busy[0] <= sent else -1)
            quiet = (sent - self._newest) / 1000 if state and self._newest >= 0 else 0.0
            beats.append(Heartbeat(at, between, state, quiet, ended))
            self._last = sent
        self._beats, self._open, self._ended, self._marks = [], state, ended, marks[i:]
        self._times = times[bisect_left(times, self._last):]  # a tie with the last heartbeat is between it and the next
        if self._busy is not None and self._busy[1] < self._last:
            self._busy = None
        return beats
