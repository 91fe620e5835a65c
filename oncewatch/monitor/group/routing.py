"""The routers: every instance reads the sources the group assigns it and writes them, split by key, to the
internal topic (one partition per shard, checks.shards), with clock marks.

Which instance reads what is Kafka's choice: every instance is a member of the routers' consumer group,
subscribed to the event topics and to the lease topic (one partition) and reading none of them through it (its
partitions stay paused): the group protocol spreads the event partitions over the members, and whoever holds the
lease reads the change source (the CDC topics, which one reader must assemble into transactions). The sources
are read by the collectors from the positions kept in the shared store (store.group), which a router writes
only once what it handed on is acknowledged by Kafka: an instance that dies leaves its sources to others at that
point, and what they write again the judges apply once (wire: each source's `seq`).

Marks: every `mark_seconds`, after what it vouches for, a router writes to every shard how far each of its
sources is read (the change source: the newest commit handed on, or what the connector's heartbeats vouch for,
checks.clocks.heartbeat_watermark, never the host's clock: a paused connector's topics are read to their ends
too; an event partition: now when read to its end, else its newest event's time).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from oncewatch.checks.clocks import heartbeat_watermark
from oncewatch.checks.settings import Settings
from oncewatch.checks.shards import Router
from oncewatch.collectors.cdc.read import CdcCollector
from oncewatch.collectors.kafka_client import connection
from oncewatch.collectors.kafka_events import KafkaEventCollector, tp_key
from oncewatch.core.config import Config
from oncewatch.core.gtids import parse
from oncewatch.core.protocol import BrokerKnown, EndKnown, RoutersStatus
from oncewatch.core.records import Heartbeat, PartitionStatus, Transaction
from oncewatch.monitor.group.membership import Rebalance, join
from oncewatch.monitor.group.part import Failed, GroupPart
from oncewatch.monitor.group.wire import (CDC_SOURCE, LEASE, RECORDS, ROUTERS, Batch, Event, Mark, Message, Part,
                                          encode, group_name)
from oncewatch.store import Store, StoreUnavailableError
from oncewatch.store.group import advance_source_position, save_source_position, source_position

log = logging.getLogger("oncewatch.monitor.group.routing")


METADATA_MS = 5_000  # a topic made or grown is in the routers' assignment this soon
# A shard's batch is written once it holds this much (a broker takes records up to 1 MB by default).
BATCH_BYTES = 256 * 1024
# beside an event partition's position, the end and leader epoch its router last learned: the next router to read it
# (after a rebalance, or this instance started again) holds its end back if the broker restarted meanwhile
KNOWN = "{}#known"  # per partition [end, leader epoch, end held or null, settle until]; older stores: the first two
# A partition whose mark has not moved for this long (read to below its end, or its end held) is said so in the log
# (once, until it moves again): every judge's Kafka clock waits for it.
HELD_SECONDS = 60.0


class Standing:
    """A router's clock as it marks it: says, once until it moves again, that it has stood still HELD_SECONDS."""

    def __init__(self) -> None:
        self.value: float | None = None
        self.since: float | None = time.monotonic()  # None once said

    def stood(self, value: float | None) -> float | None:
        """Seconds the clock has stood at this mark (None: it moved, stood less long, or was said already)."""
        now = time.monotonic()
        if value is not None and value != self.value:
            self.value, self.since = value, now
        elif self.since is not None and now - self.since >= HELD_SECONDS:
            seconds, self.since = now - self.since, None
            return seconds
        return None


class RouterWriteError(RuntimeError):
    """Kafka refused a batch for the group's topic: what the router read since its last stored position is read
    again by the next owner of its sources."""


class Output:
    """The internal topic, written in order per shard (one request in flight: a retry cannot reorder). What a router
    sends a shard waits in that shard's batch (wire.Batch) until the batch holds BATCH_BYTES or the router flushes
    at its marks: Kafka's cost is per record, and a record per message spent most of a router in the producer's send
    and wake-up. A mark that vouches for no more than the last one of its source is not written again. Shared by the
    routers' threads; its producer is made by `start` and closed by `stop`."""

    def __init__(self, cfg: Config, member: str):
        assert cfg.kafka is not None and cfg.group is not None
        self.kafka, self.member = cfg.kafka, member
        self.topic, self.shards = group_name(cfg.group.name, RECORDS), cfg.group.shards
        self.producer: Any = None
        self.lock = threading.Lock()
        self.flushing = threading.Lock()
        self.batches = [Batch() for _ in range(self.shards)]
        self.marked: dict[str, tuple[float, int]] = {}  # source -> its last mark written
        self.sent: list[Any] = []  # the sends since the last flush, checked by it
        self.written = 0  # messages
        self.records = 0  # internal-topic records (batches)

    def _send(self, shard: int) -> None:
        """The shard's batch as one record (the caller holds the lock)."""
        held = self.batches[shard]
        if held.encoded:
            self.sent.append(self.producer.send(self.topic, value=held.value(), partition=shard))
            self.batches[shard] = Batch()
            self.records += 1

    def send(self, shard: int, message: Message) -> None:
        encoded = encode(message)
        with self.lock:
            held = self.batches[shard]
            held.add(encoded)
            self.written += 1
            if held.size >= BATCH_BYTES:
                self._send(shard)

    def mark(self, source: str, at: float, partitions: int = 1) -> None:
        """To every shard, after what this source sent it; nothing when it vouches for what its last mark did."""
        with self.lock:
            if self.marked.get(source) == (at, partitions):
                return
            self.marked[source] = (at, partitions)
            encoded = encode(Mark(source, 0, at, partitions))
            for held in self.batches:
                held.add(encoded)

    def flush(self) -> None:
        """Everything sent so far written and acknowledged; RouterWriteError if Kafka refused any of it."""
        with self.flushing:  # one flush at a time: the routers' two threads both flush
            with self.lock:
                for shard in range(self.shards):
                    self._send(shard)
                sent, self.sent = self.sent, []
            self.producer.flush()
            for future in sent:
                if future.failed():
                    raise RouterWriteError(f"the group's topic {self.topic} refused a message ({future.exception}); "
                                           f"nothing after it is stored as handed on, this instance stops and what "
                                           f"it read is read again") from future.exception

    def start(self) -> None:
        from kafka import KafkaProducer

        self.producer = KafkaProducer(**connection(self.kafka), acks="all", linger_ms=5,
                                      max_in_flight_requests_per_connection=1, retries=2_147_483_647,
                                      client_id=f"{self.kafka.client_id}-router-{self.member}",
                                      max_request_size=8 * 1024 * 1024)

    def stop(self) -> None:
        if self.producer is not None:
            self.producer.close()
            self.producer = None

    def status(self) -> tuple[int, int]:
        """Messages written, and the internal-topic records that carried them."""
        with self.lock:
            return self.written, self.records


def cdc_seq(tx: Transaction) -> tuple[str, int]:
    """A transaction's source and place on the internal topic: its GTID's domain and sequence number (the
    snapshot's chunks and replay notices carry none: applied as they come, which they bear)."""
    gtid = parse(tx.cdc.txid) if tx.cdc is not None else None
    return (f"{CDC_SOURCE}/{gtid[0]}", gtid[2]) if gtid is not None else (CDC_SOURCE, -1)


class ChangeRouter(GroupPart):
    """The change source, read by the lease holder: the CDC collector's transactions split over the shards, in a
    thread of its own with a store connection of its own (both made by `start`)."""

    name = "change-router"

    def __init__(self, cfg: Config, settings: Settings, output: Output, failed: Failed):
        assert cfg.group is not None and cfg.kafka is not None and cfg.cdc is not None
        super().__init__(failed)
        self.cfg, self.output = cfg, output
        self.store: Store | None = None
        self.collector: CdcCollector | None = None
        self.router = Router(settings, cfg.group.shards)
        self.newest = 0.0  # the change clock: the newest commit handed on, or the newest time heartbeats vouch for
        self.heartbeat: Heartbeat | None = None  # the last heartbeat taken
        self.unended_seconds = cfg.cdc.unended_transaction_seconds
        self.handed = 0
        self.stored: Transaction | None = None  # the last transaction whose position is in the store
        self.stale = 0  # positions refused: another router had stored the source further
        self.standing = Standing()  # the change clock

    def _open(self) -> None:
        assert self.cfg.kafka is not None and self.cfg.cdc is not None
        self.store = Store(self.cfg.store.target)
        stored = source_position(self.store, CDC_SOURCE) or {}
        self.collector = CdcCollector(self.cfg.mysql, self.cfg.kafka, self.cfg.cdc,
                                      positions=stored.get("positions"), start_gtid=stored.get("gtid", ""))
        self.collector.start()

    def stop(self) -> None:
        if self.collector is not None:
            self.collector.stop()  # its transactions() ends: the thread with it
        super().stop()

    def _close(self) -> None:
        if self.store is not None:
            self.store.close()

    def _run(self, stop: threading.Event) -> None:
        assert self.collector is not None
        every, last_mark, last = self.cfg.group.mark_seconds, time.monotonic(), None
        for tx in self.collector.transactions(idle=True):
            self.lap()
            if tx is not None:
                split = self.router.split(tx)
                source, seq = cdc_seq(tx)
                for shard, part in sorted(split.parts.items()):
                    self.output.send(shard, Part(seq, part, split.watch_start, source))
                self.newest, last = max(self.newest, tx.commit_time), tx
                self.handed += 1
            # taken after the transaction the collector yielded: it gives the heartbeats only once every transaction
            # of their poll was yielded, and so sent
            vouched, self.heartbeat = heartbeat_watermark(self.collector.take_heartbeats(), self.heartbeat,
                                                         self.unended_seconds)
            self.newest = max(self.newest, vouched or 0.0)
            if time.monotonic() - last_mark >= every:
                self._mark(last)
                last_mark = time.monotonic()
        self._mark(last)

    def _mark(self, last: Transaction | None) -> None:
        if (seconds := self.standing.stood(self.newest)) is not None:
            # the connector's heartbeats vouch for a quiet binlog, its transaction ENDs for how far it has read: a
            # backlog between two heartbeats, with no END in it, holds the clock
            beat = self.heartbeat
            log.warning("the change source's clock has stood still; the judges' verdicts wait for it", extra={
                "event": "group_change_clock_held", "clock": self.newest, "seconds": round(seconds, 1),
                "heartbeat_at": beat.at if beat else None, "records_between": beat.between if beat else None,
                "transaction_open": beat.open if beat else None, "newest_end": beat.ended if beat else None})
        self.output.mark(CDC_SOURCE, self.newest)
        self.output.flush()
        if last is not None and last.cdc is not None and last is not self.stored:
            assert self.store is not None
            with self.store.batch() as tx:
                moved = advance_source_position(tx, CDC_SOURCE, {"positions": last.cdc.offsets,
                                                                 "gtid": last.position.gtid})
            self.stored = last
            if not moved:
                self.stale += 1
                log.warning("another router stored the change source further than this one read it; its position "
                            "is not stored (this router lost the lease and is let go)", extra={
                                "event": "change_source_position_refused", "refused": self.stale})


def known_of(stored: dict[str, list[Any]]) -> BrokerKnown:
    """What the routers before this one knew of the broker's partitions, from each one's KNOWN: a router's settle
    time is its reader's, the same on each of its partitions."""
    return BrokerKnown(tuple(EndKnown(p, k[0], k[1], k[2] if len(k) > 2 else None) for p, k in sorted(stored.items())),
                       max((k[3] for k in stored.values() if len(k) > 3), default=0.0))


class EventRouter:
    """The event partitions this instance was assigned, read from their stored positions by a collector `start`
    makes; driven by the routers' thread (`poll`, `mark`), closed by `stop`."""

    def __init__(self, cfg: Config, settings: Settings, output: Output, store: Store, partitions: set[str],
                 counts: dict[str, int]):
        """`counts`: topic -> its partitions, which a judge's Kafka clock waits for every one of."""
        assert cfg.kafka is not None and cfg.group is not None
        self.cfg, self.output, self.store, self.partitions, self.counts = cfg, output, store, partitions, counts
        self.collector: KafkaEventCollector | None = None
        self.router = Router(settings, cfg.group.shards)
        self.newest_ms: dict[str, int] = {}
        self.quarantined: list[Any] = []
        self.stored: tuple[dict[str, int], BrokerKnown] | None = None  # positions, known
        self.standing: dict[str, Standing] = {}  # partition -> its mark

    def start(self) -> None:
        assert self.cfg.kafka is not None
        stored = {p: source_position(self.store, p) for p in self.partitions}
        known = {p: k for p in self.partitions if (k := source_position(self.store, KNOWN.format(p))) is not None}
        self.collector = KafkaEventCollector(self.cfg.kafka,
                                             {p: o for p, o in stored.items() if o is not None} or None,
                                             self.partitions, known_of(known))
        self.collector.start()

    def poll(self) -> None:
        assert self.collector is not None
        batch = self.collector.poll(timeout_ms=100, max_records=2000)
        for event in batch.events:
            key = f"{event.topic}/{event.partition}"
            shard = self.router.shard_of_event(event)
            if shard is not None:
                self.output.send(shard, Event(key, event.offset, event))
            self.newest_ms[key] = max(self.newest_ms.get(key, 0), event.timestamp_ms)
        self.quarantined += batch.quarantined

    def mark(self) -> None:
        assert self.collector is not None
        for p in self.collector.status().partitions:
            if p.position >= p.end:
                at = p.end_at
            elif p.key in self.newest_ms:
                at = self.newest_ms[p.key] / 1000
            else:
                at = None
            self._held(p, at)
            if at is not None:
                self.output.mark(p.key, at, self.counts.get(p.topic, 0))
        self.output.flush()
        positions, known = self.collector.positions(), self.collector.known()
        if (positions, known) == self.stored and not self.quarantined:
            return  # nothing read since the last: the store has it
        with self.store.batch() as tx:
            for key, offset in positions.items():
                save_source_position(tx, key, offset)
            for key, end, epoch, held in known.ends:
                save_source_position(tx, KNOWN.format(key), [end, epoch, held, known.settle_until])
            tx.add_quarantined(self.quarantined)
        self.quarantined, self.stored = [], (positions, known)

    def _held(self, p: PartitionStatus, at: float | None) -> None:
        """Said once when the partition's mark has stood for HELD_SECONDS: a clock every judge waits for."""
        standing = self.standing.setdefault(p.key, Standing())
        if (seconds := standing.stood(at)) is not None:
            log.warning("an event partition's Kafka clock has stood still; the judges' verdicts wait for it", extra={
                "event": "group_partition_clock_held", "partition": p.key, "position": p.position, "end": p.end,
                "end_at": p.end_at, "newest_ms": self.newest_ms.get(p.key), "mark": standing.value,
                "seconds": round(seconds, 1)})

    def stop(self) -> None:
        if self.collector is not None:
            self.collector.close()


class Routers(GroupPart):
    """This instance's share of the sources, as the routers' consumer group assigns it; `start` opens its store
    connection and its Output, and runs it in a thread of its own."""

    name = "routers"

    def __init__(self, cfg: Config, settings: Settings, member: str, failed: Failed):
        assert cfg.group is not None and cfg.kafka is not None
        super().__init__(failed)
        self.cfg, self.settings, self.member = cfg, settings, member
        self.store: Store | None = None
        self.output = Output(cfg, member)
        self.lease = group_name(cfg.group.name, LEASE)
        self.assignment: set[str] = set()
        self.changed = False
        self.events: EventRouter | None = None
        self.change: ChangeRouter | None = None
        self.change_error: BaseException | None = None  # what ended the change source's reader, raised by _route
        self.stale_positions = 0  # of the change routers let go: positions refused
        self.membership: Any = None  # the routers' group member (run)
        self.store_lost: StoreUnavailableError | None = None  # met inside a rebalance (_rebuild)
        self.rebalance = Rebalance(ROUTERS, member)

    def _assigned(self, assignment: set[str]) -> None:
        self.assignment, self.changed = assignment, True

    def _rebuild(self) -> None:
        """After a rebalance: the event partitions and the lease as they now are. A store gone away meanwhile is kept
        in `store_lost`, raised by `_route` after the poll: called inside Kafka's rebalance (a revocation), it would
        otherwise come out of the poll as kafka-python's own KafkaError, which stops the instance as a failure, not
        as an outage it waits out."""
        self.changed = False
        try:
            self._rebuild_parts()
        except StoreUnavailableError as exc:
            self.store_lost = self.store_lost or exc

    def _rebuild_parts(self) -> None:
        """Each part kept only once it has started: one whose start failed is never marked or stopped later."""
        holds_lease = f"{self.lease}/0" in self.assignment
        if not holds_lease and self.change is not None:
            self._stop_change()
        if holds_lease and self.change is None:
            change = ChangeRouter(self.cfg, self.settings, self.output, self._change_failed)
            change.start()
            self.change = change
            log.info("the change source is read here", extra={"event": "change_source_taken",
                                                                "member": self.member})
        partitions = {p for p in self.assignment if not p.startswith(self.lease + "/")}
        if self.events is not None and self.events.partitions != partitions:
            events, self.events = self.events, None
            try:
                events.mark()
            finally:
                events.stop()
        if self.events is None and partitions:
            assert self.store is not None
            counts = {t: len(self.membership.partitions_for_topic(t) or ()) for t in {p.rpartition("/")[0]
                                                                                      for p in partitions}}
            events = EventRouter(self.cfg, self.settings, self.output, self.store, partitions, counts)
            events.start()
            self.events = events
            log.info("event partitions read here", extra={"event": "event_partitions_taken",
                                                          "member": self.member, "partitions": sorted(partitions)})

    def _change_failed(self, _: str, exc: BaseException) -> None:
        self.change_error = exc  # the routers' thread raises it: the instance stops, loudly

    def _stop_change(self) -> None:
        assert self.change is not None
        self.change.stop()
        self.stale_positions += self.change.stale
        self.change = None
        log.info("the change source is let go", extra={"event": "change_source_released", "member": self.member})

    def status(self) -> RoutersStatus:
        change = self.change
        written, records = self.output.status()
        return RoutersStatus(self.running, tuple(sorted(self.assignment)), change is not None, written, records,
                             change.handed if change is not None else 0, self.rebalance.rejoins,
                             self.stale_positions + (change.stale if change is not None else 0))

    def _open(self) -> None:
        self.store = Store(self.cfg.store.target)
        self.output.start()

    def _close(self) -> None:
        self.output.stop()
        if self.store is not None:
            self.store.close()

    def _run(self, stop: threading.Event) -> None:
        """Until `stop` or a failure: a member of the routers' group, made again when it is left outside the group
        (membership); every part let go at the end."""
        while not self._route(stop):
            self.rebalance.remade()

    def _let_go(self) -> None:
        """The sources read here marked and let go, every part even when the last mark cannot be stored."""
        try:
            if self.events is not None:
                self.events.mark()
        finally:
            if self.events is not None:
                self.events.stop()
                self.events = None
            if self.change is not None:
                self._stop_change()

    def _route(self, stop: threading.Event) -> bool:
        """Read what this member is assigned until `stop` (True) or until its membership consumer is left outside
        the group (False: its sources are let go first)."""
        from kafka import ConsumerRebalanceListener

        routers = self
        kafka = self.cfg.kafka
        assert kafka is not None

        class Listener(ConsumerRebalanceListener):
            # cooperative: only the sources that move are revoked or assigned; the others are read on
            def on_partitions_revoked(self, revoked: Any) -> None:
                routers.rebalance.revoked()
                routers._assigned(routers.assignment - {tp_key(tp) for tp in revoked})
                routers._rebuild()

            def on_partitions_assigned(self, assigned: Any) -> None:
                membership.pause(*assigned)  # membership only: the collectors read, from the stored positions
                routers._assigned(routers.assignment | {tp_key(tp) for tp in assigned})

        topics = sorted({t.name for t in kafka.topics})
        membership = self.membership = join(kafka, group_name(self.cfg.group.name, ROUTERS),
                                            f"{kafka.client_id}-routers-{self.member}", [self.lease, *topics],
                                            Listener(), self.rebalance, auto_offset_reset="latest",
                                            metadata_max_age_ms=METADATA_MS)
        next_mark = time.monotonic()
        try:
            while not stop.is_set():
                self.lap()
                membership.poll(timeout_ms=self.rebalance.poll_ms(0 if self.events is not None else 100))
                if self.change_error is not None:
                    raise self.change_error  # the change source's reader failed: the instance stops, loudly
                if self.store_lost is not None:
                    raise self.store_lost
                if self.changed:
                    self._rebuild()
                if self.events is not None:
                    self.events.poll()
                    if time.monotonic() >= next_mark:
                        self.events.mark()
                        next_mark = time.monotonic() + self.cfg.group.mark_seconds
                if self.rebalance.outside():
                    return False
            return True
        finally:
            # let go before leaving: a member left in the routers' group, never polled, would hold its rebalance
            # up for max.poll.interval.ms
            try:
                self._let_go()
            finally:
                self.assignment = set()
                membership.close(autocommit=False)
