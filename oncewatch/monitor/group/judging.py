"""The judges: every instance of a group is a member of one Kafka consumer group on the internal topic, and judges
the shards (internal partitions) the group protocol assigns it, each with an engine of its own.

A shard's findings, engine state and checkpoint (the internal offset to read from, the highest `seq` applied of
each source, its clocks) go to the shared store in one transaction, fenced by the epoch its owner claimed
(store.group). When the group rebalances, the instance that loses a shard commits it and lets it go; the one that
gets it claims it and reads on from that commit. An instance that dies leaves its shards to the others at its last
commit: what it applied after that is applied again by the next owner, which is the same as applying it once,
since nothing of it was committed.

Clocks (checks.engine.tick): the binlog clock is the change source's router's last mark; the Kafka clock the
oldest of the marks of every partition of every announced topic, and the floor until each has spoken: an event is
never judged missing while a partition of its topic has not been heard from.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from oncewatch.checks.engine import Engine
from oncewatch.checks.settings import Settings
from oncewatch.checks.shards import LEADER, Shard, merge_stats
from oncewatch.core.config import Config
from oncewatch.core.records import OffsetsSnapshot, QuarantinedRows
from oncewatch.monitor.group.membership import Rebalance, join
from oncewatch.monitor.group.wire import CDC_SOURCE, JUDGES, RECORDS, Mark, Message, Part, decode, group_name
from oncewatch.core.names import ENGINE_STATS
from oncewatch.store import Store, StoreUnavailableError, reviews, verdicts
from oncewatch.store.group import FencedError, claim, load_shard, save_shard, shard_checkpoints

log = logging.getLogger("oncewatch.monitor.group.judging")

FLOOR = 0.0  # a clock no source has vouched for yet


class ShardJudge:
    """One shard: its engine, what it has applied of each source, its clocks, how far it read the internal topic."""

    def __init__(self, settings: Settings, shard: Shard):
        self.engine = Engine(settings, shard)
        self.shard = shard
        self.topics = sorted({a.topic for a in settings.announce})
        self.applied: dict[str, int] = {}  # source -> the highest seq applied
        self.marks: dict[str, list[float]] = {}  # source -> [at, partitions of its topic]
        self.offset = 0  # the next internal-topic offset to read
        self.committed = -1  # the offset of the last commit (-1: none in this process)
        self.end = 0  # the internal partition's end as last fetched: end - offset is this shard's lag
        self.records = 0  # rows and events applied: this shard's work
        self.repeated = 0  # messages a router wrote again (after a restart or a move), not applied twice
        self.quarantined: list[QuarantinedRows] = []  # the leader's: to commit with the next checkpoint

    def apply(self, message: Message, offset: int) -> None:
        self.offset = offset + 1
        if isinstance(message, Mark):
            held = self.marks.get(message.source)
            if held is None or message.at > held[0]:  # a mark written again after a router restart is older
                self.marks[message.source] = [message.at, message.partitions]
            return
        if message.seq >= 0:
            if message.seq <= self.applied.get(message.source, -1):
                self.repeated += 1
                return
            self.applied[message.source] = message.seq
        if isinstance(message, Part):
            if message.watch_start is not None:
                self.engine.start_watch(message.watch_start)
            self.engine.on_transaction(message.tx)
            self.records += len(message.tx.rows)
            self.quarantined += message.tx.quarantined
        else:
            self.engine.on_events((message.event,))
            self.records += 1

    def binlog_time(self) -> float:
        held = self.marks.get(CDC_SOURCE)
        return FLOOR if held is None else held[0]

    def kafka_time(self) -> float:
        if not self.topics:
            return self.binlog_time()
        vouched = []
        for topic in self.topics:
            parts = [m for source, m in self.marks.items() if source.rpartition("/")[0] == topic]
            # a count of 0: its router did not know the topic's partitions yet, so none vouches for the topic
            if not parts or len(parts) < max(n for _, n in parts) or not all(n for _, n in parts):
                return FLOOR
            vouched += [at for at, _ in parts]
        return min(vouched)

    def tick(self, now: float, backlog_elsewhere: dict[str, int] | None = None) -> None:
        self.engine.tick(now, self.binlog_time(), self.kafka_time(), backlog_elsewhere)

    def checkpoint(self) -> dict[str, Any]:
        return {"offset": self.offset, "end": self.end, "applied": self.applied, "marks": self.marks,
                "records": self.records, "repeated": self.repeated, "stats": self.engine.stats(),
                "binlog_time": self.binlog_time(), "kafka_time": self.kafka_time()}

    def restore(self, checkpoint: dict[str, Any] | None, state: dict[str, Any] | None) -> None:
        if checkpoint is not None:
            self.offset, self.applied, self.marks = checkpoint["offset"], checkpoint["applied"], checkpoint["marks"]
            self.end = checkpoint["end"]
            self.records, self.repeated = checkpoint["records"], checkpoint["repeated"]
        if state is not None:
            self.engine.restore(state)


class Judges:
    """This instance's shards: claimed, fed from the internal topic, committed every `commit_seconds`."""

    def __init__(self, cfg: Config, settings: Settings, store: Store, member: str):
        assert cfg.group is not None
        self.cfg, self.settings, self.store, self.member = cfg, settings, store, member
        self.group = cfg.group
        self.owned: dict[int, tuple[ShardJudge, int]] = {}  # shard -> (its judge, the epoch claimed)
        self.offsets: list[OffsetsSnapshot] = []  # the offsets collector's, for the leader shard
        self.fenced = 0
        self.applied = 0  # rows and events this instance applied (its share of the work)
        self.store_lost: StoreUnavailableError | None = None  # met inside a rebalance (revoked)
        self.rebalance = Rebalance(JUDGES, member)
        self.lock = threading.Lock()

    # ------------------------------------------------------------ the group's callbacks (inside poll)

    def assigned(self, shards: list[int]) -> dict[int, int]:
        """Claim and load each new shard; the offset to read each from."""
        starts = {}
        for shard in shards:
            if shard in self.owned:
                continue
            epoch = claim(self.store, shard, self.member)
            judge = ShardJudge(self.settings, Shard(shard, self.group.shards))
            judge.restore(*load_shard(self.store, shard))
            with self.lock:
                self.owned[shard] = (judge, epoch)
            starts[shard] = judge.offset
            log.info("shard taken", extra={"event": "shard_assigned", "shard": shard, "epoch": epoch,
                                           "offset": judge.offset, "member": self.member})
        return starts

    def revoked(self, shards: list[int]) -> None:
        """Commit each shard and let it go. Inside Kafka's rebalance: a store that went away is kept in
        `store_lost` (the shard goes anyway; its next owner reads on from its last commit) and raised by `run`, not
        here, where kafka-python would turn it into an error of its own."""
        for shard in shards:
            if shard in self.owned:
                try:
                    self.commit(shard)
                except StoreUnavailableError as exc:
                    self.store_lost = self.store_lost or exc
                with self.lock:
                    self.owned.pop(shard, None)
                log.info("shard let go", extra={"event": "shard_revoked", "shard": shard, "member": self.member})

    def leads(self) -> bool:
        return LEADER in self.owned

    def add_offsets(self, snapshot: OffsetsSnapshot) -> None:
        with self.lock:
            self.offsets.append(snapshot)

    # ------------------------------------------------------------ work

    def apply(self, shard: int, offset: int, value: bytes) -> None:
        held = self.owned.get(shard)
        if held is not None:
            judge = held[0]
            before = judge.records
            for message in decode(value):
                judge.apply(message, offset)
            self.applied += judge.records - before

    def tick_and_commit(self, now: float) -> None:
        for shard in sorted(self.owned):
            judge, _ = self.owned[shard]
            elsewhere = backlog = None
            if shard == LEADER:
                with self.lock:
                    snapshots, self.offsets = self.offsets, []
                for snapshot in snapshots:
                    judge.engine.on_offsets(snapshot)
                elsewhere = self._elsewhere()
                backlog = merge_stats(elsewhere.values()).get("backlog_by_table", {})
            judge.tick(now, backlog)
            self.commit(shard, elsewhere)

    def _elsewhere(self) -> dict[int, dict[str, Any]]:
        """The other shards' engine stats: as committed, or as they are here for those this instance owns."""
        stats = {shard: c["stats"] for shard, c in shard_checkpoints(self.store).items()}
        stats.update((shard, judge.engine.stats()) for shard, (judge, _) in self.owned.items())
        stats.pop(LEADER, None)
        return stats

    def commit(self, shard: int, elsewhere: dict[int, dict[str, Any]] | None = None) -> None:
        """`elsewhere` (the leader's): the other shards' stats, merged with its own as the group's engine stats."""
        judge, epoch = self.owned[shard]
        drained = judge.engine.drain()
        if not drained and judge.offset == judge.committed and elsewhere is None:
            return  # nothing read or found since the last commit: its state's changes wait for the next
        try:
            with self.store.batch() as tx:
                # a group of one shard judges the trades too (checks.verdicts: one engine must see all of a trade)
                verdicts.save(tx, judge.engine.drain_verdicts(), self.cfg.slo.within_seconds)
                save_shard(tx, shard, epoch, judge.checkpoint(), judge.engine.state_delta(), drained,
                           judge.quarantined)
                if elsewhere is not None:
                    tx.set_state(ENGINE_STATS, merge_stats([judge.engine.stats(), *elsewhere.values()]))
                    reviews.expire(tx, time.time())
            judge.quarantined, judge.committed = [], judge.offset
        except FencedError as exc:
            self.fenced += 1
            log.error("a shard was taken by another instance; dropped here", extra={
                "event": "shard_fenced", "shard": shard, "epoch": epoch, "error": str(exc)})
            with self.lock:
                self.owned.pop(shard, None)

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {str(shard): {"records": judge.records, "repeated": judge.repeated, "offset": judge.offset,
                                 "binlog_time": judge.binlog_time(), "kafka_time": judge.kafka_time()}
                    for shard, (judge, _) in sorted(self.owned.items())}

    def run(self, stop: threading.Event) -> None:
        """Until `stop`: a consumer of the judges' group, made again when it is left outside the group
        (membership)."""
        while not self._read(stop):
            self.rebalance.remade()

    def _read(self, stop: threading.Event) -> bool:
        """Poll, apply and commit with one consumer until `stop` (True) or until it is left outside the group
        (False: its shards are let go first)."""
        from kafka import ConsumerRebalanceListener, TopicPartition

        topic = group_name(self.group.name, RECORDS)
        judges = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Any) -> None:
                judges.rebalance.revoked()
                judges.revoked(sorted(tp.partition for tp in revoked))

            def on_partitions_assigned(self, assigned: Any) -> None:
                judges.rebalance.assigned()
                for shard, offset in judges.assigned(sorted(tp.partition for tp in assigned)).items():
                    consumer.seek(TopicPartition(topic, shard), offset)

        kafka = self.cfg.kafka
        assert kafka is not None
        consumer = join(kafka, group_name(self.group.name, JUDGES), f"{kafka.client_id}-judge-{self.member}",
                        [topic], Listener(), auto_offset_reset="earliest", max_poll_records=2000)
        next_commit = time.monotonic() + self.group.commit_seconds
        try:
            while not stop.is_set():
                for tp, records in consumer.poll(timeout_ms=self.rebalance.poll_ms(100)).items():
                    for r in records:
                        self.apply(tp.partition, r.offset, r.value)
                    held = self.owned.get(tp.partition)
                    if held is not None:
                        held[0].end = consumer.highwater(tp) or held[0].end
                if self.store_lost is not None:
                    raise self.store_lost
                if time.monotonic() >= next_commit:
                    self.tick_and_commit(time.time())
                    next_commit = time.monotonic() + self.group.commit_seconds
                if self.rebalance.outside():
                    self.revoked(sorted(self.owned))
                    return False
            self.tick_and_commit(time.time())
        finally:
            consumer.close(autocommit=False)
        if self.store_lost is not None:  # met while leaving the group
            raise self.store_lost
        return True
