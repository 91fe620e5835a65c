"""The CDC topics read from Kafka (`CdcCollector`): a running part (oncewatch.core.protocol.Part) that hands on the
transactions its format's assembler makes (Debezium's, collectors.cdc.assemble; Canal's, collectors.canal), with the
offsets to resume from beside each, and the connector's heartbeats behind them."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from oncewatch.collectors.binlog import StreamState
from oncewatch.collectors.canal import CanalAssembler
from oncewatch.collectors.cdc.assemble import Assembler
from oncewatch.collectors.heartbeats import HeartbeatReader
from oncewatch.collectors.kafka_client import connection
from oncewatch.core.config import CdcConfig, KafkaConfig, MySQLConfig
from oncewatch.core.gtids import gtid_text
from oncewatch.core.protocol import CdcStatus
from oncewatch.core.records import BinlogPosition, CdcCopy, CdcDelivery, Heartbeat, Heartbeats, Transaction

log = logging.getLogger("oncewatch.collectors.cdc")

NO_HEARTBEATS = ("no heartbeat of the CDC connector is read: the change clock (F3, F8, F9) moves only with the "
                 "commits it delivers, and waits for the next one while the tables are quiet; give the connector "
                 "heartbeat.interval.ms and name its topic in cdc.heartbeat_topic (README, [cdc])")
TOPICS_EVERY_SECONDS = 1.0


class CdcCollector:
    """Reads a CDC pipeline's topics for the watched tables and yields committed Transactions, each with how it
    was delivered (`cdc`: the offsets to store beside it, its END's count, replays read since the one before).

    `positions` is what the caller stored with the last transaction ({} on a first start: the topics'
    beginnings, the connector's snapshot first), `start_gtid` the GTID set handed on by then. The format's
    assembler (`ASSEMBLERS`: Debezium's here, Canal's in collectors.canal) makes transactions of the records.
    `status()` says what the pages and /metrics show (CdcStatus: the binlog collector's fields, with this
    source's counts in `cdc`). Call `stop()` from another thread to end `transactions()`.

    With `cdc.heartbeat_topic` the connector's heartbeats are read too (collectors.heartbeats): those read by the
    time every topic is read to its end (the end the broker gives after they were read) and every transaction of
    the poll handed on wait in `take_heartbeats()`."""

    def __init__(self, cfg: MySQLConfig, kafka: KafkaConfig, cdc: CdcConfig, *,
                 positions: dict[str, int] | None = None, start_gtid: str = "", copies: bool = False):
        """`copies`: `items` hands on each transaction as a `CdcCopy` (check mode: checked against the binlog's,
        whose clock the server's binlog end gives) and no heartbeats."""
        self.cfg = cfg
        self.copies = copies
        self.kafka = kafka
        self.format = cdc.format
        self.from_latest = cdc.start_from == "latest" and not positions  # a first start, at the topics' ends
        self.assembler: Assembler | CanalAssembler = (
            CanalAssembler(cfg, cdc.topics, cdc.transaction_grace_seconds, cdc.time_zone) if cdc.format == "canal"
            else Assembler(cfg, start_gtid, cdc.transaction_grace_seconds, cdc.topic_prefix,
                           cdc.heartbeat_topic if cdc.format == "debezium" else ""))
        self.next: dict[str, int] = dict(positions or {})  # per "topic/partition": the next offset to read
        self.assembler.offsets = self.positions
        self.state = StreamState(last_position=BinlogPosition(gtid=start_gtid) if start_gtid else None)
        self.caught_up = False  # every partition read to its end and no transaction waiting for records
        self.heartbeats = HeartbeatReader(cdc.heartbeat_topic) if cdc.heartbeat_topic and cdc.format == "debezium" \
            else None
        if self.heartbeats is None:
            log.warning(NO_HEARTBEATS, extra={"event": "cdc_without_heartbeats", "format": cdc.format})
        self._heartbeats_seen = False  # the heartbeat topic exists (until it does, a warning at each start)
        self._beats: list[Heartbeat] = []  # placed, not yet taken by the caller
        self._stop = threading.Event()

    def start(self) -> None:
        """Nothing to connect ahead: `items` makes its consumer, and closes it as it ends."""

    def items(self, stop: threading.Event) -> Iterator[Transaction | CdcCopy | Heartbeats]:
        """In source mode the transactions with the connector's heartbeats behind those handed on before them (the
        change clock); in check mode (`copies`) the transactions as CdcCopys. Ends once `stop()` is called."""
        for tx in self.transactions(idle=True):
            if tx is not None:
                yield CdcCopy(tx) if self.copies else tx
            beats = self.take_heartbeats()
            if beats and not self.copies:
                yield Heartbeats(tuple(beats))

    def alive_at(self) -> float | None:
        return self.state.last_alive

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """The consumer is closed when `transactions()` ends."""

    def topics(self) -> list[str]:
        return self.assembler.topics()

    def take_heartbeats(self) -> list[Heartbeat]:
        """The heartbeats placed since the last call: every transaction the connector wrote before them is handed
        on already (they come once `transactions()` has yielded the last of its poll)."""
        beats, self._beats = self._beats, []
        return beats

    def positions(self) -> dict[str, int]:
        """Per partition, where a restart reads from: the first record of a transaction not handed on yet."""
        return {**self.next, **self.assembler.first_pending()}

    def status(self) -> CdcStatus:
        hb = self.heartbeats
        return CdcStatus(**vars(self.state), source=self.format, topics=tuple(self.topics()),
                         cdc=self.assembler.counts(), heartbeat_topic=hb.topic if hb else None,
                         heartbeats_read=hb.read if hb else 0, heartbeats_unreadable=hb.unreadable if hb else 0,
                         caught_up=self.caught_up)

    def transactions(self, poll_ms: int = 200, idle: bool = False) -> Iterator[Transaction | None]:
        """`idle`: also None after every poll that handed nothing on (a caller that marks its clock while the
        topics are quiet, in the same thread as what it hands on)."""
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        consumer = KafkaConsumer(**connection(self.kafka), enable_auto_commit=False,
                                 group_id=None, auto_offset_reset="earliest", client_id=f"{self.kafka.client_id}-cdc",
                                 request_timeout_ms=int(self.kafka.request_timeout_seconds * 1000) + 1000)
        a = self.assembler
        hb = self.heartbeats
        try:
            assigned: set[Any] = set()
            checked = 0.0
            if not self.next:  # a first start: its position is stored at once, so the next start goes on from here
                assigned, checked = self._assign(consumer, assigned), time.monotonic()
                yield self._handed_on(Transaction(rows=(), position=BinlogPosition(gtid=gtid_text(a.done)),
                                                  commit_time=0.0), time.time())
            while not self._stop.is_set():
                try:
                    if time.monotonic() - checked >= TOPICS_EVERY_SECONDS:  # a table's topic: at its first change
                        assigned, checked = self._assign(consumer, assigned), time.monotonic()
                    batches = consumer.poll(timeout_ms=poll_ms)
                except KafkaError as exc:
                    self._disconnected(exc)
                    self._stop.wait(1.0)
                    continue
                now = self.state.last_alive = time.time()
                if not self.state.connected:
                    self.state.connected, self.state.disconnected_since, self.state.last_error = True, None, None
                handed: list[Transaction] = []
                for tp, records in batches.items():
                    key, topic, partition, feed = f"{tp.topic}/{tp.partition}", tp.topic, tp.partition, a.feed
                    self.state.events_read += len(records)
                    for rec in records:
                        self.next[key] = rec.offset + 1  # before feed: what it hands on is stored with it
                        if hb is not None and topic == hb.topic:
                            hb.on_heartbeat(rec)
                            feed(topic, partition, rec, now, key)  # the connector writes: a grace runs on
                            continue
                        out = feed(topic, partition, rec, now, key)
                        if out:
                            handed += out
                        if hb is not None:
                            self._place(hb, topic, rec.timestamp)
                # a partition's high watermark is known once a fetch of it has come back: before that (just
                # started, or just assigned) nothing says it is read to its end
                read_to_end = all((end := consumer.highwater(tp)) is not None and consumer.position(tp) >= end
                                  for tp in assigned)
                handed += a.ready(now, behind=not read_to_end)
                notice = None if handed else a.replay_notice()
                handed += [notice] if notice is not None else []
                # caught up once every transaction of this poll is handed on, not while the first is: a caller that
                # marks its clock at caught_up (a group's change router) would vouch for the rest not yet handed
                caught_up = not a.waiting and read_to_end
                if handed:
                    self.caught_up = False
                for tx in handed:
                    yield self._handed_on(tx, now)
                self.caught_up = caught_up
                if caught_up and hb is not None and hb.waiting and self._at_ends(consumer, assigned):
                    self._beats += hb.take()
                if idle and not handed:
                    yield None
        finally:
            consumer.close()

    def _handed_on(self, tx: Transaction, now: float) -> Transaction:
        s = self.state
        s.last_position, s.last_event_time = tx.position, tx.commit_time or s.last_event_time
        s.seconds_behind = max(0.0, now - tx.commit_time) if tx.commit_time else s.seconds_behind
        s.rows_read += len(tx.rows)
        s.transactions_read += tx.complete
        return tx if tx.cdc is not None else dataclasses.replace(tx, cdc=CdcDelivery(self.positions()))

    def _place(self, hb: HeartbeatReader, topic: str, timestamp: int) -> None:
        """A record of `topic`, just fed, among the heartbeats: a marker with whether a transaction of the connector
        is open after it and the newest END's binlog time."""
        a = self.assembler
        if isinstance(a, Assembler) and topic == a.transaction_topic:
            hb.on_record(timestamp, a.begun is not None, a.newest_end)
        else:
            hb.on_record(timestamp)

    def _at_ends(self, consumer: Any, assigned: set[Any]) -> bool:
        """Every partition read to the end the broker gives now, asked after the heartbeats waiting were read.
        A fetch's high watermark is as old as the fetch's answer, and one partition's answer can be older than
        another's: kafka-python leaves a partition out of the next fetch while it holds records of it not yet
        read, so a heartbeat can come in a fetch answered after a record the connector wrote before it, to a
        partition whose last answer came before that record. Placed then, the heartbeat would count that record
        out of its gap and could make a busy gap look quiet (checks.clocks.heartbeat_watermark). The broker's ends,
        asked now, cover every record written before the heartbeats; a failed ask leaves them waiting for the next
        poll and is counted as a disconnect."""
        from kafka.errors import KafkaError

        try:
            ends = consumer.end_offsets(list(assigned))
        except KafkaError as exc:
            self._disconnected(exc)
            return False
        return all(consumer.position(tp) >= end for tp, end in ends.items())

    def _disconnected(self, exc: BaseException) -> None:
        self.state.last_alive = time.time()  # a reconnect attempt: the reader is not stuck (monitor.remote)
        if self.state.connected or self.state.disconnected_since is None:
            self.state.disconnected_since = time.time()
        self.state.connected = False
        self.state.last_error = f"{type(exc).__name__}: {exc}"
        self.state.reconnects += 1
        log.warning("CDC topics cannot be read", extra={"event": "cdc_disconnected", "error": self.state.last_error})

    def _assign(self, consumer: Any, assigned: set[Any]) -> set[Any]:
        """Every partition of the topics that exist now, each read on from where it was (or from the start)."""
        from kafka import TopicPartition

        latest, self.from_latest = self.from_latest, False  # only what is there at the first look
        consumer.topics()  # refreshes the client's metadata: topics made since
        parts = {TopicPartition(t, p) for t in self.topics() for p in consumer.partitions_for_topic(t) or ()}
        hb = self.heartbeats
        if hb is not None and not self._heartbeats_seen:
            self._heartbeats_seen = any(tp.topic == hb.topic for tp in parts)
            if not self._heartbeats_seen and not assigned:  # once a start, not at every look
                log.warning(NO_HEARTBEATS, extra={"event": "cdc_without_heartbeats", "topic": hb.topic})
        if parts == assigned:
            return assigned
        consumer.assign(sorted(parts))
        for tp in parts:
            key = f"{tp.topic}/{tp.partition}"
            at = self.next.get(key)
            if at is not None:
                consumer.seek(tp, at)
            elif latest:  # the topics there at a first start from "latest"
                consumer.seek_to_end(tp)
                self.next[key] = consumer.position(tp)
            else:  # the topics there at a first start from "earliest", and any made since
                consumer.seek_to_beginning(tp)
                self.next[key] = consumer.position(tp)
        return parts
