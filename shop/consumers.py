"""The shop's side of its downstream consumer groups: start and stall them, read their lag.

The groups themselves run in a child process (shop.downstream), as downstream services do:
inside the shop's process they would compete with its worker threads for one interpreter
lock and fall behind under load, which would show as lag without a fault behind it.
"""

from __future__ import annotations

import logging
import queue
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import OffsetSpec
from kafka.errors import KafkaError

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


class DownstreamError(RuntimeError):
    """The downstream consumer groups failed or did not start; the message says what they reported."""


class Downstream:
    """The parent's handle on the downstream groups' child process."""

    def __init__(self, groups: tuple[str, ...], topic: str, bootstrap_servers: str):
        self.groups = groups
        self.stalled: dict[str, frozenset[int]] = dict.fromkeys(groups, frozenset())
        self._args = [sys.executable, "-m", "shop.downstream", bootstrap_servers, topic, *groups]
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str] = queue.Queue()

    def start(self, timeout: float) -> None:
        self._proc = subprocess.Popen(self._args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, args=(self._proc,), name="downstream-reader", daemon=True).start()
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise DownstreamError(f"consumer groups {', '.join(self.groups)} not reading after {timeout:.0f} s") \
                from None
        if line != "ready":
            raise DownstreamError(line)

    def _read(self, proc: subprocess.Popen[str]) -> None:
        for line in proc.stdout or ():
            self._lines.put(line.strip())
        self._lines.put(f"exited with code {proc.wait()}")

    def stall(self, group: str, partitions: frozenset[int]) -> None:
        if self._proc is None or self._proc.stdin is None:
            raise DownstreamError("the downstream groups were not started")
        self.stalled[group] = partitions
        self._proc.stdin.write(f"stall {group} {','.join(map(str, sorted(partitions)))}\n")
        self._proc.stdin.flush()
        log.info("consumer group stalls", extra={"group": group, "partitions": sorted(partitions)})

    def check(self) -> None:
        """Raise what the child reported, if it failed."""
        try:
            line = self._lines.get_nowait()
        except queue.Empty:
            return
        raise DownstreamError(line)

    def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.stdin is not None:
            self._proc.stdin.close()  # end of input: the child stops its groups and exits
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def wait_drained(admin: KafkaAdminClient, downstream: Downstream, topic: str, partitions: int,
                 timeout: float) -> None:
    """Wait until every partition a group has not stalled is committed up to its end."""
    deadline = time.monotonic() + timeout
    for group in downstream.groups:
        while True:
            try:
                behind: list[int] | str = sorted(p for p, n in lag(admin, group, topic, partitions).by_partition.items()
                                                 if n and p not in downstream.stalled[group])
            except KafkaError as exc:  # the broker is away (a restart): the lag is not known, so not drained
                behind = f"its lag unknown ({exc!r})"
            if not behind:
                break
            downstream.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumer group {group} still behind: {behind}")
            time.sleep(0.2)
