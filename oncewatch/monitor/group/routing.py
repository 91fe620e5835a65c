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
from oncewatch.core.records import Heartbeat, Transaction
from oncewatch.monitor.group.membership import Rebalance, join
from oncewatch.monitor.group.wire import (CDC_SOURCE, LEASE, RECORDS, ROUTERS, Batch, Event, Mark, Message, Part,
                                          encode, group_name)
from oncewatch.store import Store, StoreUnavailableError
from oncewatch.store.group import save_source_position, source_position

log = logging.getLogger("oncewatch.monitor.group.routing")


METADATA_MS = 5_000  # a topic made or grown is in the routers' assignment this soon
# A shard's batch is written once it holds this much (a broker takes records up to 1 MB by default).
BATCH_BYTES = 256 * 1024
# beside an event partition's position, the end and leader epoch its router last learned: the next router to read it
# (after a rebalance, or this instance started again) holds its end back if the broker restarted meanwhile
KNOWN = "{}#known"


class RouterWriteError(RuntimeError):
    """Kafka refused a batch for the group's topic: what the router read since its last stored position is read
    again by the next owner of its sources."""


class Output:
    """The internal topic, written in order per shard (one request in flight: a retry cannot reorder). What a router
    sends a shard waits in that shard's batch (wire.Batch) until the batch holds BATCH_BYTES or the router flushes
    at its marks: Kafka's cost is per record, and a record per message spent most of a router in the producer's send
    and wake-up. A mark that vouches for no more than the last one of its source is not written again. Shared by the
    routers' threads."""

    def __init__(self, cfg: Config, member: str):
        from kafka import KafkaProducer

        assert cfg.kafka is not None and cfg.group is not None
        self.topic, self.shards = group_name(cfg.group.name, RECORDS), cfg.group.shards
        self.producer = KafkaProducer(**connection(cfg.kafka), acks="all", linger_ms=5,
                                      max_in_flight_requests_per_connection=1, retries=2_147_483_647,
                                      client_id=f"{cfg.kafka.client_id}-router-{member}",
                                      max_request_size=8 * 1024 * 1024)
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

    def close(self) -> None:
        self.producer.close()


def cdc_seq(tx: Transaction) -> tuple[str, int]:
    """A transaction's source and place on the internal topic: its GTID's domain and sequence number (the
    snapshot's chunks and replay notices carry none: applied as they come, which they bear)."""
    gtid = parse(tx.cdc.txid) if tx.cdc is not None else None
    return (f"{CDC_SOURCE}/{gtid[0]}", gtid[2]) if gtid is not None else (CDC_SOURCE, -1)


class ChangeRouter:
    """The change source, read by the lease holder: the CDC collector's transactions split over the shards."""

    def __init__(self, cfg: Config, settings: Settings, output: Output, store: Store):
        assert cfg.group is not None and cfg.kafka is not None and cfg.cdc is not None
        self.cfg, self.output, self.store = cfg, output, store
        stored = source_position(store, CDC_SOURCE) or {}
        self.collector = CdcCollector(cfg.mysql, cfg.kafka, cfg.cdc, positions=stored.get("positions"),
                                      start_gtid=stored.get("gtid", ""))
        self.router = Router(settings, cfg.group.shards)
        self.newest = 0.0  # the change clock: the newest commit handed on, or the newest time heartbeats vouch for
        self.heartbeat: Heartbeat | None = None  # the last heartbeat taken
        self.unended_seconds = cfg.cdc.unended_transaction_seconds
        self.handed = 0
        self.stored: Transaction | None = None  # the last transaction whose position is in the store
        self.error: BaseException | None = None

    def stop(self) -> None:
        self.collector.stop()

    def run(self) -> None:
        """In a thread of its own; what ends it on an error is kept in `error`, which Routers.run raises."""
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - handed to the routers' thread, which stops the instance
            self.error = exc

    def _run(self) -> None:
        every, last_mark, last = self.cfg.group.mark_seconds, time.monotonic(), None
        for tx in self.collector.transactions(idle=True):
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
        self.output.mark(CDC_SOURCE, self.newest)
        self.output.flush()
        if last is not None and last.cdc is not None and last is not self.stored:
            with self.store.batch() as tx:
                save_source_position(tx, CDC_SOURCE, {"positions": last.cdc.offsets, "gtid": last.position.gtid})
            self.stored = last


class EventRouter:
    """The event partitions this instance was assigned, read from their stored positions."""

    def __init__(self, cfg: Config, settings: Settings, output: Output, store: Store, partitions: set[str],
                 counts: dict[str, int]):
        """`counts`: topic -> its partitions, which a judge's Kafka clock waits for every one of."""
        assert cfg.kafka is not None and cfg.group is not None
        self.cfg, self.output, self.store, self.partitions, self.counts = cfg, output, store, partitions, counts
        stored = {p: source_position(self.store, p) for p in partitions}
        known = {p: source_position(self.store, KNOWN.format(p)) for p in partitions}
        self.collector = KafkaEventCollector(cfg.kafka, {p: o for p, o in stored.items() if o is not None} or None,
                                             partitions, {p: (k[0], k[1]) for p, k in known.items() if k is not None})
        self.router = Router(settings, cfg.group.shards)
        self.newest_ms: dict[str, int] = {}
        self.quarantined: list[Any] = []
        self.stored: tuple[dict[str, int], dict[str, tuple[int, int | None]]] | None = None  # positions, known

    def poll(self) -> None:
        batch = self.collector.poll(timeout_ms=100, max_records=2000)
        for event in batch.events:
            key = f"{event.topic}/{event.partition}"
            shard = self.router.shard_of_event(event)
            if shard is not None:
                self.output.send(shard, Event(key, event.offset, event))
            self.newest_ms[key] = max(self.newest_ms.get(key, 0), event.timestamp_ms)
        self.quarantined += batch.quarantined

    def mark(self) -> None:
        for p in self.collector.status().partitions:
            if p.position >= p.end:
                at = p.end_at
            elif p.key in self.newest_ms:
                at = self.newest_ms[p.key] / 1000
            else:
                continue
            self.output.mark(p.key, at, self.counts.get(p.topic, 0))
        self.output.flush()
        positions, known = self.collector.positions(), self.collector.known()
        if (positions, known) == self.stored and not self.quarantined:
            return  # nothing read since the last: the store has it
        with self.store.batch() as tx:
            for key, offset in positions.items():
                save_source_position(tx, key, offset)
            for key, (end, epoch) in known.items():
                save_source_position(tx, KNOWN.format(key), [end, epoch])
            tx.add_quarantined(self.quarantined)
        self.quarantined, self.stored = [], (positions, known)

    def close(self) -> None:
        self.collector.close()


class Routers:
    """This instance's share of the sources, as the routers' consumer group assigns it."""

    def __init__(self, cfg: Config, settings: Settings, store: Store, member: str):
        assert cfg.group is not None and cfg.kafka is not None
        self.cfg, self.settings, self.store, self.member = cfg, settings, store, member
        self.output = Output(cfg, member)
        self.lease = group_name(cfg.group.name, LEASE)
        self.assignment: set[str] = set()
        self.changed = False
        self.events: EventRouter | None = None
        self.change: ChangeRouter | None = None
        self.change_thread: threading.Thread | None = None
        self.membership: Any = None  # the routers' group member (run)
        self.store_lost: StoreUnavailableError | None = None  # met inside a rebalance (_rebuild)
        self.rebalance = Rebalance(ROUTERS, member)

    def _assigned(self, assignment: set[str]) -> None:
        self.assignment, self.changed = assignment, True

    def _rebuild(self) -> None:
        """After a rebalance: the event partitions and the lease as they now are."""
        self.changed = False
        holds_lease = f"{self.lease}/0" in self.assignment
        if not holds_lease and self.change is not None:
            self._stop_change()
        if holds_lease and self.change is None:
            self.change = ChangeRouter(self.cfg, self.settings, self.output, Store(self.cfg.store.target))
            self.change_thread = threading.Thread(target=self.change.run, name="group-change-router", daemon=True)
            self.change_thread.start()
            log.info("the change source is read here", extra={"event": "change_source_taken",
                                                                "member": self.member})
        partitions = {p for p in self.assignment if not p.startswith(self.lease + "/")}
        if self.events is not None and self.events.partitions != partitions:
            try:
                self.events.mark()
            except StoreUnavailableError as exc:  # inside Kafka's rebalance: raised by run, after it
                self.store_lost = self.store_lost or exc
            self.events.close()
            self.events = None
        if self.events is None and partitions:
            counts = {t: len(self.membership.partitions_for_topic(t) or ()) for t in {p.rpartition("/")[0]
                                                                                      for p in partitions}}
            self.events = EventRouter(self.cfg, self.settings, self.output, self.store, partitions, counts)
            log.info("event partitions read here", extra={"event": "event_partitions_taken",
                                                          "member": self.member, "partitions": sorted(partitions)})

    def _stop_change(self) -> None:
        assert self.change is not None and self.change_thread is not None
        self.change.stop()
        self.change_thread.join()
        self.change.store.close()
        self.change, self.change_thread = None, None
        log.info("the change source is let go", extra={"event": "change_source_released", "member": self.member})

    def status(self) -> dict[str, Any]:
        return {"partitions": sorted(self.assignment), "change_source": self.change is not None,
                "written": self.output.written,
                "change_transactions": self.change.handed if self.change is not None else 0}

    def run(self, stop: threading.Event) -> None:
        """Until `stop` or a failure: a member of the routers' group, made again when it is left outside the group
        (membership); every part let go at the end."""
        try:
            while not self._route(stop):
                self.rebalance.remade()
        finally:
            self.output.close()

    def _let_go(self) -> None:
        """The sources read here marked and let go, every part even when the last mark cannot be stored."""
        try:
            if self.events is not None:
                self.events.mark()
        finally:
            if self.events is not None:
                self.events.close()
                self.events = None
            if self.change is not None:
                self._stop_change()

    def _route(self, stop: threading.Event) -> bool:
        """Read what this member is assigned until `stop` (True) or until its membership consumer is left outside
        the group (False: its sources are let go first)."""
        from kafka import ConsumerRebalanceListener
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

        routers = self
        kafka = self.cfg.kafka
        assert kafka is not None

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Any) -> None:
                routers.rebalance.revoked()
                routers._assigned(set())
                routers._rebuild()

            def on_partitions_assigned(self, assigned: Any) -> None:
                routers.rebalance.assigned()
                membership.pause(*assigned)  # membership only: the collectors read, from the stored positions
                routers._assigned({tp_key(tp) for tp in assigned})

        topics = sorted({t.name for t in kafka.topics})
        membership = self.membership = join(kafka, group_name(self.cfg.group.name, ROUTERS),
                                            f"{kafka.client_id}-routers-{self.member}", [self.lease, *topics],
                                            Listener(), auto_offset_reset="latest",
                                            partition_assignment_strategy=(RoundRobinPartitionAssignor,),
                                            metadata_max_age_ms=METADATA_MS)
        next_mark = time.monotonic()
        try:
            while not stop.is_set():
                membership.poll(timeout_ms=self.rebalance.poll_ms(0 if self.events is not None else 100))
                if self.change is not None and self.change.error is not None:
                    raise self.change.error  # the change source's reader failed: the instance stops, loudly
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
