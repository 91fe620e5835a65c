"""The downstream services: consumer groups that read the shop's topic and commit offsets.

Run as a child process of the shop (`python -m shop.downstream BOOTSTRAP TOPIC GROUP...`).
A healthy group commits after every batch, so its lag stays near zero and is zero once the
run has drained. A stall pauses some or all of a group's partitions: it keeps running but
stops committing there, so its lag grows (F11) or grows on some partitions only (F12).
Protocol with the parent (shop.consumers): the child prints `ready` once every group reads
its partitions (or one line saying what failed), reads `stall <group> <p,p,...>` lines, and
stops at the end of its input.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError


class DownstreamGroup(threading.Thread):
    """One downstream service: reads every partition of the topic, commits after every batch.

    Partitions are assigned by the service itself rather than by group membership: the group
    is only where its offsets are committed, so no rebalance (a heartbeat missed on a loaded
    machine) can take partitions away in the middle of a run and show lag no fault explains.
    """

    def __init__(self, group: str, topic: str, bootstrap_servers: str):
        super().__init__(name=f"group-{group}", daemon=True)
        self.group = group
        self._topic = topic
        self._servers = bootstrap_servers
        self._stopping = threading.Event()
        self.ready = threading.Event()
        self.stalled: frozenset[int] = frozenset()  # set by the command loop, read on this thread
        self.error: BaseException | None = None

    def stall(self, partitions: frozenset[int]) -> None:
        self.stalled = partitions

    def run(self) -> None:
        try:
            consumer = KafkaConsumer(group_id=self.group, bootstrap_servers=self._servers,
                                     client_id=f"oncewatch-shop-{self.group}", enable_auto_commit=False,
                                     auto_offset_reset="earliest")
            try:
                partitions = self._partitions(consumer)
                consumer.assign(partitions)
                # Commit where reading starts: a group that stalls before its first batch must
                # still show its lag (a partition never committed has no lag to read).
                for tp in partitions:
                    consumer.position(tp)
                consumer.commit()
                self.ready.set()
                self._loop(consumer)
            finally:
                consumer.close(autocommit=False)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops the run
            self.error = exc
            self.ready.set()

    def _partitions(self, consumer: KafkaConsumer) -> list[TopicPartition]:
        # A just-created topic can take a moment to show up in the metadata.
        deadline = time.monotonic() + 30
        while not (partitions := consumer.partitions_for_topic(self._topic)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {self._topic} has no partitions in the metadata")
            time.sleep(0.2)
        return [TopicPartition(self._topic, p) for p in sorted(partitions)]

    def _loop(self, consumer: KafkaConsumer) -> None:
        uncommitted = False
        while not self._stopping.is_set():
            # The consumer is not thread-safe: stall() is applied here, on its own thread.
            consumer.pause(*(tp for tp in consumer.assignment() if tp.partition in self.stalled))
            uncommitted = bool(consumer.poll(timeout_ms=100)) or uncommitted
            if uncommitted:
                try:
                    consumer.commit()
                    uncommitted = False
                except KafkaError:  # the broker is away (a restart): commit once it is back, as a service would
                    time.sleep(0.5)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)


def _serve(bootstrap_servers: str, topic: str, names: list[str]) -> None:
    """The child process: run the groups, apply stall commands until stdin ends."""
    groups = {name: DownstreamGroup(name, topic, bootstrap_servers) for name in names}
    for group in groups.values():
        group.start()
    for group in groups.values():
        if not group.ready.wait(40) or group.error is not None:
            print(f"consumer group {group.group} could not start: {group.error!r}", flush=True)
            return
    print("ready", flush=True)

    def watch() -> None:
        while True:
            failed = next((g for g in groups.values() if g.error is not None), None)
            if failed is not None:
                print(f"consumer group {failed.group} failed: {failed.error!r}", flush=True)
                os._exit(1)  # the parent sees the line, then the exit; nothing here is worth saving
            time.sleep(0.5)

    threading.Thread(target=watch, name="watch-groups", daemon=True).start()
    try:
        for line in sys.stdin:
            _, name, partitions = line.split()
            groups[name].stall(frozenset(int(p) for p in partitions.split(",")))
    except KeyboardInterrupt:
        pass  # Ctrl-C reaches the whole process group; the parent stops the run
    finally:
        for group in groups.values():
            group.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.ERROR)  # connection chatter under load
    _serve(sys.argv[1], sys.argv[2], sys.argv[3:])
