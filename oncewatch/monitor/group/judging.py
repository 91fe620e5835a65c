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
from oncewatch.collectors.kafka_client import connection
from oncewatch.core.config import Config
from oncewatch.core.protocol import JudgesStatus, ShardStatus
from oncewatch.core.records import OffsetsSnapshot, QuarantinedRows
from oncewatch.monitor.group.membership import Rebalance, join
from oncewatch.monitor.group.part import Failed, GroupPart
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


class Judges(GroupPart):
    """This instance's shards: claimed, fed from the internal topic, committed every `commit_seconds` to a store
    connection of their own (opened by `start`)."""

    name = "judges"

    def __init__(self, cfg: Config, settings: Settings, member: str, failed: Failed):
        assert cfg.group is not None
        super().__init__(failed)
        self.cfg, self.settings, self.member = cfg, settings, member
        self.store: Store | None = None
        self.admin: Any = None  # the leader's, to purge the records every shard has committed past
        self.purged: dict[int, int] = {}  # shard -> the offset its records were purged before
        self.purged_records = 0
        self.purge_failures = 0
        self.group = cfg.group
        self.owned: dict[int, tuple[ShardJudge, int]] = {}  # shard -> (its judge, the epoch claimed)
        self.offsets: list[OffsetsSnapshot] = []  # the offsets collector's, for the leader shard
        self.fenced = 0
        self.applied = 0  # rows and events this instance applied (its share of the work)
        self.store_lost: StoreUnavailableError | None = None  # met inside a rebalance (assigned, revoked)
        self.rebalance = Rebalance(JUDGES, member)
        self.lock = threading.Lock()

    # ------------------------------------------------------------ the group's callbacks (inside poll)

    def assigned(self, shards: list[int]) -> dict[int, int]:
        """Claim and load each new shard; the offset to read each from. Inside Kafka's rebalance: a store that went
        away is kept in `store_lost` and raised by `run`, as `revoked` does (the shards not loaded are not owned)."""
        starts: dict[int, int] = {}
        try:
            for shard in shards:
                if shard not in self.owned:
                    starts[shard] = self._claim(shard)
        except StoreUnavailableError as exc:
            self.store_lost = self.store_lost or exc
        return starts

    def _claim(self, shard: int) -> int:
        """Claim and load one shard; the offset to read it from."""
        epoch = claim(self.store, shard, self.member)
        judge = ShardJudge(self.settings, Shard(shard, self.group.shards))
        judge.restore(*load_shard(self.store, shard))
        with self.lock:
            self.owned[shard] = (judge, epoch)
        log.info("shard taken", extra={"event": "shard_assigned", "shard": shard, "epoch": epoch,
                                       "offset": judge.offset, "member": self.member})
        return judge.offset

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

    def lost(self, shards: list[int]) -> None:
        """Let go of shards without committing them: this member was dropped from the group, and their new owners
        read on from their last commit."""
        with self.lock:
            for shard in shards:
                if self.owned.pop(shard, None) is not None:
                    log.warning("shard lost: this member was dropped from the group", extra={
                        "event": "shard_lost", "shard": shard, "member": self.member})

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

    def status(self) -> JudgesStatus:
        with self.lock:
            shards = tuple(ShardStatus(shard, judge.records, judge.repeated, judge.offset, judge.binlog_time(),
                                       judge.kafka_time()) for shard, (judge, _) in sorted(self.owned.items()))
        return JudgesStatus(self.running, shards, self.fenced, self.applied, self.rebalance.rejoins,
                            self.purged_records, self.purge_failures)

    def _open(self) -> None:
        from kafka.admin import KafkaAdminClient

        assert self.cfg.kafka is not None
        self.store = Store(self.cfg.store.target)
        self.admin = KafkaAdminClient(**connection(self.cfg.kafka), client_id=f"{self.cfg.kafka.client_id}-purge")

    def _close(self) -> None:
        if self.admin is not None:
            self.admin.close()
        if self.store is not None:
            self.store.close()

    def purge(self) -> None:
        """The leader's, every `purge_seconds`: each shard's records before its last commit deleted from the
        internal topic. A shard's next owner reads on from that commit, so nothing before it is read again; a
        purge Kafka refuses is logged and counted, and tried again at the next."""
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        topic = group_name(self.group.name, RECORDS)
        upto = {shard: c["offset"] for shard, c in shard_checkpoints(self.store).items()
                if c["offset"] > self.purged.get(shard, 0)}
        if not upto:
            return
        try:
            self.admin.delete_records({TopicPartition(topic, shard): offset for shard, offset in upto.items()},
                                      timeout_ms=10_000)
        except KafkaError as exc:
            self.purge_failures += 1
            log.warning("the records every shard has committed past could not be purged; tried again later",
                        extra={"event": "group_purge_failed", "member": self.member, "error": str(exc),
                               "failures": self.purge_failures})
            return
        self.purged_records += sum(offset - self.purged.get(shard, 0) for shard, offset in upto.items())
        self.purged.update(upto)

    def _run(self, stop: threading.Event) -> None:
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
            # cooperative: only the shards that move are revoked or assigned; the others are kept as they are
            def on_partitions_revoked(self, revoked: Any) -> None:
                judges.rebalance.revoked()
                judges.revoked(sorted(tp.partition for tp in revoked))

            def on_partitions_lost(self, lost: Any) -> None:
                # taken from this member (its session expired): let go without committing; whatever it would
                # commit, its shards' new owners claimed them with a newer epoch (store.group fences it)
                judges.rebalance.revoked()
                judges.lost(sorted(tp.partition for tp in lost))

            def on_partitions_assigned(self, assigned: Any) -> None:
                for shard, offset in judges.assigned(sorted(tp.partition for tp in assigned)).items():
                    consumer.seek(TopicPartition(topic, shard), offset)

        kafka = self.cfg.kafka
        assert kafka is not None
        consumer = join(kafka, group_name(self.group.name, JUDGES), f"{kafka.client_id}-judge-{self.member}",
                        [topic], Listener(), self.rebalance, auto_offset_reset="earliest", max_poll_records=2000)
        next_commit = time.monotonic() + self.group.commit_seconds
        next_purge = time.monotonic() + self.group.purge_seconds
        try:
            while not stop.is_set():
                self.lap()
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
                if time.monotonic() >= next_purge:
                    if self.leads():
                        self.purge()
                    next_purge = time.monotonic() + self.group.purge_seconds
                if self.rebalance.outside():
                    self.revoked(sorted(self.owned))
                    return False
            self.tick_and_commit(time.time())
        finally:
            consumer.close(autocommit=False)
        if self.store_lost is not None:  # met while leaving the group
            raise self.store_lost
        return True
