"""Reads the configured Kafka topics and hands on their records as `EmittedEvent`s.

The collector never joins or commits into a consumer group (docs/architecture.md §8): it assigns itself every
partition of the configured topics (`group_id=None`, no auto-commit) and seeks to positions the
caller checkpointed. Each `poll()` returns an `EventBatch` whose `positions` ("topic/partition" ->
next offset to read, for every assigned partition) the caller writes with the batch's events and
quarantined records in ONE store transaction and passes back on restart; resuming is then exact.

Partitions with no checkpoint start at `kafka.start_from` on the very first run; partitions that
appear later (a topic created after start, partitions added) start at their earliest offset, since
everything in them is new. A configured topic that does not exist yet is reported as waiting.

Broker restarts are ridden out by kafka-python's own reconnects; any other client error rebuilds
the consumer from the positions already handed on. Records deleted by retention before they were
read are a loud, counted `gap` in the status, never a silent skip. Discovery, end offsets and
`caught_up()` go through an admin client (bounded by the request timeout, safe from another
thread); only the polling thread touches the consumer, which is not thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka import errors as kerrors
from kafka.admin import OffsetSpec

from oncewatch.collectors.kafka_client import connection
from oncewatch.collectors.kafka_formats import TopicParser
from oncewatch.collectors.kafka_raw import UnreadableBatchError, failed_batch, unpack
from oncewatch.core.config import KafkaConfig
from oncewatch.core.names import UNPARSEABLE, partition_key, split_partition_key
from oncewatch.core.protocol import BrokerKnown, EndKnown, EventBatch, Gap, KafkaEventsStatus
from oncewatch.core.records import EmittedEvent, Packed, PartitionStatus, QuarantinedRecord

log = logging.getLogger("oncewatch.collectors.kafka_events")

ACCESS_ERRORS = (kerrors.AuthorizationError, kerrors.SaslAuthenticationFailedError)
# What kafka-python raises from poll() for a record batch it cannot decode, at the same offset every time.
UNDECODABLE = (UnicodeDecodeError, kerrors.CorruptRecordError)
MAX_GAPS_KEPT = 100


class KafkaEventsError(RuntimeError):
    """Base class of the events collector's errors."""


class KafkaAccessError(KafkaEventsError):
    """The broker refuses the monitor's principal; fixing it needs a person."""


def tp_key(tp: TopicPartition) -> str:
    return partition_key(tp.topic, tp.partition)


def parse_tp_key(key: str) -> TopicPartition:
    return TopicPartition(*split_partition_key(key))


def client_settings(cfg: KafkaConfig) -> dict[str, Any]:
    """Settings shared by the consumer and admin clients of the monitor."""
    timeout_ms = int(cfg.request_timeout_seconds * 1000)
    return {**connection(cfg), "client_id": cfg.client_id, "request_timeout_ms": timeout_ms,
            "bootstrap_timeout_ms": timeout_ms, "reconnect_backoff_max_ms": min(timeout_ms, 5000)}


def admin_client(cfg: KafkaConfig) -> KafkaAdminClient:
    return KafkaAdminClient(**client_settings(cfg))


def existing_partitions(admin: KafkaAdminClient, topics: Iterable[str]) -> tuple[set[TopicPartition], list[str]]:
    """The partitions of those topics that exist, and the topics that do not exist (or are not
    ready: being created, no leader yet) and so cannot be read yet."""
    found, missing = leader_epochs(admin, topics)
    return set(found), missing


def leader_epochs(admin: KafkaAdminClient, topics: Iterable[str]) -> tuple[dict[TopicPartition, int], list[str]]:
    """`existing_partitions`, each partition with its leader's epoch (-1 when the broker does not say): a
    new epoch is a new leader, or the same broker started again."""
    found: dict[TopicPartition, int] = {}
    missing: list[str] = []
    for t in admin.describe_topics(list(topics)):
        code = t.get("error_code", 0)
        if code and kerrors.for_code(code).retriable:
            missing.append(t["name"])
        elif code:
            raise kerrors.for_code(code)(f"describing topic {t['name']!r}")
        else:
            found.update((TopicPartition(t["name"], p["partition_index"]), p.get("leader_epoch", -1))
                         for p in t["partitions"])
    return found, sorted(missing)


def list_offsets(admin: KafkaAdminClient, tps: Iterable[TopicPartition], spec: OffsetSpec,
                 timeout_ms: int) -> dict[TopicPartition, int]:
    tps = list(tps)
    if not tps:
        return {}
    return {tp: o.offset for tp, o in admin.list_partition_offsets({tp: spec for tp in tps},
                                                                    timeout_ms=timeout_ms).items()}


@dataclass
class _State:
    """Mutable state shared between the polling thread and status readers; guarded by a lock."""

    positions: dict[TopicPartition, int]
    ends: dict[TopicPartition, tuple[int, float]] = field(default_factory=dict)  # end offset, when it vouches from
    answered: dict[TopicPartition, float] = field(default_factory=dict)  # when the known end's answer came in
    epochs: dict[TopicPartition, int] = field(default_factory=dict)  # each partition's leader epoch as last seen
    held: dict[TopicPartition, int] = field(default_factory=dict)  # ends not vouched for (KafkaEventCollector._learn)
    settle_until: float = 0.0  # no end vouches before this time: the broker was away (KafkaEventCollector._learn)
    waiting_for: tuple[str, ...] = ()
    connected: bool = False
    ever_connected: bool = False
    last_error: str | None = None
    disconnected_since: float | None = None
    reconnects: int = 0
    records_read: int = 0
    events_read: int = 0
    gaps: list[Gap] = field(default_factory=list)


def _state(s: _State, held: tuple[str, ...]) -> str:
    """What the collector does, in words, as of now."""
    if not s.connected:
        return f"disconnected: {s.last_error}" if s.last_error else "connecting"
    if s.waiting_for:
        return "waiting for topic " + ", ".join(s.waiting_for) + " (does not exist yet)"
    if held:
        return "reading; ends not vouched for since the broker restarted: " + ", ".join(held)
    if s.settle_until > time.time():
        return "reading; the broker was away: its producers may still send what they kept, no end vouches yet"
    return "reading"


class KafkaEventCollector:
    """Polls the configured topics from checkpointed positions; see the module docstring.

    `positions` is what the caller stored from the last `EventBatch.positions`, or None on the
    very first run. Call `poll()` from one thread; `status()`, `caught_up()` and `positions()` may be
    called from any thread.
    """

    POLL_MS, POLL_RECORDS = 500, 2000  # of each poll `items` makes

    def __init__(self, cfg: KafkaConfig, positions: dict[str, int] | None = None,
                 partitions: Collection[str] | None = None, known: BrokerKnown | None = None,
                 hold: Callable[[], Collection[str]] = frozenset):
        """`partitions` ("topic/partition"): read only those (a group's router reads what the group assigned it).
        `hold`: the partitions `items` leaves unread at each poll (read far past the binlog).
        `known`: what a reader before this one knew of the broker (`known()`): the ends and leader epochs it
        learned, the ends it held, how long they settle. A broker restarted since, which reports an end gone back
        or a new epoch, or one that was away and is not settled yet, is then seen as the reader before would have
        seen it: the same reader's process started again, the monitor's next run, a group's partition moved."""
        self.cfg = cfg
        self._only = None if partitions is None else frozenset(partitions)
        self._parsers = {t.name: TopicParser(t, cfg.max_record_bytes) for t in cfg.topics}
        start = {parse_tp_key(k): int(v) for k, v in (positions or {}).items()}
        self._s = _State(positions={tp: o for tp, o in start.items() if tp.topic in self._parsers})
        known = known or BrokerKnown()
        for key, end, epoch, held in known.ends:
            tp = parse_tp_key(key)
            self._s.ends[tp] = (end, 0.0)  # learned by another: it vouches for nothing here
            if epoch is not None:
                self._s.epochs[tp] = epoch
            if held is not None:
                self._s.held[tp] = held
        self._s.settle_until = known.settle_until
        self._first_run = not positions
        self._lock = threading.Lock()
        self._timeout_ms = int(cfg.request_timeout_seconds * 1000)
        self._consumer: KafkaConsumer | None = None
        self._admin: KafkaAdminClient | None = None
        self._assigned: set[TopicPartition] = set()
        self._next_refresh = 0.0
        self._last_positions: dict[str, int] = {}
        self._highwater: dict[TopicPartition, int] = {}  # the last highwater taken from a fetch, per partition
        self._answers_after = 0.0  # the fetch answers the consumer holds unread came in after this time (poll)
        self._ahead = hold
        self._alive: float | None = None

    # -------------------------------------------------------------- lifecycle (oncewatch.core.protocol.Part)

    def start(self) -> None:
        """Nothing to connect ahead: the first poll finds the topics and connects (and again after an outage)."""

    def items(self, stop: threading.Event) -> Iterator[EventBatch]:
        """A batch per poll that read something or moved a position, leaving unread the partitions `hold` names."""
        while not stop.is_set():
            self._alive = time.time()
            batch = self.poll(timeout_ms=self.POLL_MS, max_records=self.POLL_RECORDS, hold=self._ahead())
            if batch.events or batch.quarantined or batch.positions_changed:
                yield batch

    def alive_at(self) -> float | None:
        return self._alive

    def stop(self) -> None:
        """`items` ends at the stop event it was given, within a poll."""

    # -------------------------------------------------------------- public

    def poll(self, timeout_ms: int = 1000, max_records: int = 500, hold: Collection[str] = ()) -> EventBatch:
        """Read what is there (waiting up to `timeout_ms`); never raises for transport errors. The
        partitions `hold` names ('topic/partition') are left unread this time, the others read."""
        if time.monotonic() >= self._next_refresh:
            self._refresh()
        held = {tp for tp in self._assigned if tp_key(tp) in hold}
        if self._consumer is None or not self._assigned or held == self._assigned:
            time.sleep(timeout_ms / 1000)  # nothing to read now: keep the caller's loop from spinning
            return self._batch([], [])
        answered_after = self._answers_after
        try:
            records = self._consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
            self._note_unread_answers()
            # A held partition's records are not handed on: it is sought back to the first of them and they
            # are fetched again once it is let go. Not KafkaConsumer.pause(): kafka-python 3.0 can leave a
            # resumed partition's fetched records parked for good (its fetcher restores them only while
            # no spent record set sits in line), and that partition is then never read again.
            for tp in held & records.keys():
                self._consumer.seek(tp, records.pop(tp)[0].offset)
            return self._handle(records, answered_after)
        except UNDECODABLE as exc:
            self._note_unread_answers()
            return self._step_over_undecodable(exc, answered_after)
        except kerrors.OffsetOutOfRangeError as exc:
            self._gaps(exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {})
        except ACCESS_ERRORS as exc:
            raise self._access_error(exc) from exc
        except kerrors.KafkaError as exc:
            # Anything else leaves the consumer in an unknown state: rebuild it from the positions
            # already handed on, which is exact by construction.
            self._disconnected(exc)
            self._drop_consumer()
        return self._batch([], [])

    def status(self) -> KafkaEventsStatus:
        with self._lock:
            s = self._s
            parts = tuple(PartitionStatus(tp.topic, tp.partition, s.positions[tp],
                                          *s.ends.get(tp, (s.positions[tp], 0.0)))
                          for tp in sorted(self._assigned) if tp in s.positions)
            held = tuple(tp_key(tp) for tp in sorted(s.held))
            return KafkaEventsStatus(
                connected=s.connected, state=_state(s, held), last_error=s.last_error,
                disconnected_since=s.disconnected_since, reconnects=s.reconnects, records_read=s.records_read,
                events_read=s.events_read, waiting_for=s.waiting_for, partitions=parts, gaps=tuple(s.gaps),
                known=self._known())

    def positions(self) -> dict[str, int]:
        with self._lock:
            return {tp_key(tp): o for tp, o in sorted(self._s.positions.items())}

    def known(self) -> BrokerKnown:
        """What this reader knows of the broker, for the reader after it (`known`)."""
        with self._lock:
            return self._known()

    def _known(self) -> BrokerKnown:
        s = self._s
        return BrokerKnown(tuple(EndKnown(tp_key(tp), end, s.epochs.get(tp), s.held.get(tp))
                                 for tp, (end, _) in sorted(s.ends.items())), s.settle_until)

    def caught_up(self, timeout_ms: int | None = None) -> bool:
        """True when, as of now, every partition of the configured topics has been read to its end.

        Asks the broker (bounded by `timeout_ms`), so a record produced just before the call is
        counted. A topic that does not exist has nothing to read. A broker that cannot be asked
        means False: absence rules must not be judged on a stream we cannot see. So does a partition
        that exists and is not assigned yet, even an empty one: it has no position to resume from,
        and a monitor that ended (--until-idle) before it had one would start the next run at the
        partition's end, past what came meanwhile.
        """
        admin = self._admin
        if admin is None:
            return False
        timeout_ms = self._timeout_ms if timeout_ms is None else timeout_ms
        try:
            asked_at = time.time()
            epochs, _ = leader_epochs(admin, self._parsers)
            ends = list_offsets(admin, epochs, OffsetSpec.LATEST, timeout_ms)
        except kerrors.KafkaError:
            return False
        answered = time.time()
        with self._lock:
            self._learn({tp: e for tp, e in ends.items() if tp in self._assigned}, asked_at, answered, epochs)
            # A partition read before and missing from the answer (a broker starting again reports its topics
            # not ready for a while) is not caught up with: nothing is known of what it holds now.
            unanswered = self._assigned - ends.keys()
            return not unanswered and not self._s.held and asked_at >= self._s.settle_until and all(
                tp in self._assigned and self._s.positions.get(tp, 0) >= end for tp, end in ends.items())

    def close(self) -> None:
        self._drop_consumer()
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    # -------------------------------------------------------------- polling

    def _note_unread_answers(self) -> None:
        """After a poll: when the consumer holds no fetch answer it has not read through, the highwaters the
        next polls take in were all answered after now. kafka-python takes a partition's highwater from an answer
        when it starts reading the answer's records, not when the answer came in, and hands the records on over
        as many polls as they take."""
        now = time.time()
        # The fetcher's answers come in and not read yet, and the one being read: not public. In a kafka-python
        # oncewatch does not know they are not there, and no fetch's highwater vouches (the broker's answers do).
        fetcher = getattr(self._consumer, "_fetcher", None)
        unread = getattr(fetcher, "_completed_fetches", None)
        if unread is not None and not unread and not getattr(fetcher, "_next_partition_records", True):
            self._answers_after = now

    def _handle(self, records: dict[TopicPartition, list[Any]], answered_after: float) -> EventBatch:
        events: list[EmittedEvent] = []
        quarantined: list[QuarantinedRecord] = []
        for tp, recs in records.items():
            parse = self._parsers[tp.topic].parse
            for rec in recs:
                out = parse(rec)
                if isinstance(out, EmittedEvent):
                    events.append(out)
                else:
                    quarantined.append(out)
        return self._handed_on(events, quarantined, records.keys(), answered_after)

    def _handed_on(self, events: list[EmittedEvent], quarantined: list[QuarantinedRecord],
                   fetched: Collection[TopicPartition], answered_after: float) -> EventBatch:
        """The batch of what was read, with the consumer's positions and what it learned of the ends;
        `fetched`: the partitions whose records a fetch has just brought; `answered_after`: a time before the
        broker answered the fetches whose highwaters the poll took in."""
        consumer = self._consumer
        assert consumer is not None
        # The consumer's position, not last offset + 1: it also steps over transaction markers,
        # which occupy offsets but are no records, so "read to the end" can become true.
        moved = {tp: consumer.position(tp, timeout_ms=0) for tp in self._assigned}
        # Every assigned partition's, not only those with records: a fetch that brought nothing
        # also tells that nothing more was there, and the engine's Kafka clock needs to know it.
        # But only a highwater that a fetch has just brought vouches: kafka-python keeps the last one it
        # had while the broker is away, and taken as fresh it would run the clock on through the outage
        # and judge every event not yet read lost. An unchanged one of a partition with no records leaves
        # the end as last learned (the broker's answer, `caught_up`, renews it each second). And it vouches
        # from before the broker answered, not from now: an answer that came in while the reader was held
        # up (a slow judge, a full pipe) is read seconds later, and taken as of then its end let the clock
        # vouch for the records produced meanwhile, above it and unread (test_kafka_events.py).
        highwater = {tp: h for tp in self._assigned
                     if (h := consumer.highwater(tp)) is not None and (tp in fetched or h != self._highwater.get(tp))}
        self._highwater.update(highwater)
        seen_at = time.time()
        with self._lock:
            s = self._s
            s.positions.update((tp, o) for tp, o in moved.items() if o is not None)
            self._learn(highwater, answered_after, seen_at, fetched=True)
            s.records_read += len(events) + len(quarantined)
            s.events_read += len(events)
        for q in quarantined:
            log.warning("kafka record quarantined", extra={
                "event": "kafka_record_quarantined", "topic": q.topic, "partition": q.partition,
                "offset": q.offset, "reason": q.reason, "size": q.size})
        return self._batch(events, quarantined)

    def _step_over_undecodable(self, exc: Exception, answered_after: float) -> EventBatch:
        """kafka-python could not decode a record at a partition's position (a header key that is not
        UTF-8, a failed CRC): it raises there on every poll and after every rebuild, and once its
        record iterator has died on it, polls that partition in an endless loop. The batch it failed
        on is read here instead, byte for byte (collectors.kafka_raw): each record kafka-python cannot
        decode is quarantined with every byte it had, the others of the batch are parsed as usual, and
        the partition is sought past the batch; the seek also makes the fetcher drop its dead iterator.
        A batch that cannot be read so (a failed CRC) has only its offset quarantined, one poll each."""
        consumer = self._consumer
        assert consumer is not None
        # kafka-python does not say which partition raised; the record set it was reading does.
        part = getattr(getattr(consumer, "_fetcher", None), "_next_partition_records", None)
        tp = getattr(part, "topic_partition", None)
        if tp not in self._assigned:
            raise KafkaEventsError(
                f"kafka-python could not decode a record ({type(exc).__name__}: {exc}) and did not say on which "
                "partition; this kafka-python version is not one oncewatch knows: report it with the log") from exc
        offset = consumer.position(tp, timeout_ms=self._timeout_ms)
        batch = failed_batch(exc)
        try:
            records = [] if batch is None else [r for r in unpack(batch, tp.topic, tp.partition) if r.offset >= offset]
        except UnreadableBatchError as unreadable:
            log.error("kafka batch kafka-python failed on cannot be read byte for byte", exc_info=unreadable,
                      extra={"event": "kafka_batch_unreadable", "topic": tp.topic, "partition": tp.partition,
                             "offset": offset})
            records = []
        if not records:
            return self._skip_offset(tp, offset, exc)
        consumer.seek(tp, batch.next_offset)
        parser = self._parsers[tp.topic]
        outs = [parser.quarantined(r, UNPARSEABLE, f"kafka-python cannot decode this record: {r.undecodable}; "
                                   "kept as it came") if r.undecodable else parser.parse(r) for r in records]
        log.error("kafka batch kafka-python cannot decode; read byte for byte", extra={
            "event": "kafka_batch_undecodable", "topic": tp.topic, "partition": tp.partition,
            "from_offset": offset, "to_offset": batch.next_offset - 1,
            "undecodable": [r.offset for r in records if r.undecodable]})
        # Not fetched just now as far as the clock knows: the batch may have come with an earlier poll's fetch.
        return self._handed_on([o for o in outs if isinstance(o, EmittedEvent)],
                               [o for o in outs if isinstance(o, QuarantinedRecord)], (), answered_after)

    def _skip_offset(self, tp: TopicPartition, offset: int, exc: Exception) -> EventBatch:
        """Quarantine one offset whose record cannot be read (its bytes stay on the broker) and seek past it."""
        consumer = self._consumer
        assert consumer is not None
        consumer.seek(tp, offset + 1)
        q = QuarantinedRecord(topic=tp.topic, partition=tp.partition, offset=offset, timestamp_ms=-1,
                              reason=UNPARSEABLE, detail=f"kafka-python cannot decode this record or the batch it is "
                              f"in ({type(exc).__name__}: {str(exc)[:160]}); its bytes stay on the broker",
                              size=0, preview="")
        with self._lock:
            self._s.positions[tp] = offset + 1
            self._s.records_read += 1
        log.error("kafka record cannot be decoded by kafka-python; quarantined", extra={
            "event": "kafka_record_quarantined", "topic": q.topic, "partition": q.partition, "offset": q.offset,
            "reason": q.reason, "size": 0})
        return self._batch([], [q])

    def _batch(self, events: list[EmittedEvent], quarantined: list[QuarantinedRecord]) -> EventBatch:
        positions = self.positions()
        changed = positions != self._last_positions
        self._last_positions = positions
        return EventBatch(Packed(events), tuple(quarantined), positions, changed)

    def _gaps(self, out_of_range: dict[TopicPartition, int]) -> None:
        """Offsets no longer on the broker: record the gap loudly and go on from what is there."""
        consumer, admin = self._consumer, self._admin
        if consumer is None or admin is None:
            return
        try:
            earliest = list_offsets(admin, out_of_range, OffsetSpec.EARLIEST, self._timeout_ms)
            ends = list_offsets(admin, out_of_range, OffsetSpec.LATEST, self._timeout_ms)
        except kerrors.KafkaError as exc:
            self._disconnected(exc)
            return
        for tp, offset in out_of_range.items():
            kind, resume = ("deleted", earliest[tp]) if offset < earliest[tp] else ("truncated", ends[tp])
            gap = Gap(tp.topic, tp.partition, min(offset, resume), max(offset, resume), kind, time.time())
            consumer.seek(tp, resume)
            with self._lock:
                self._s.positions[tp] = resume
                self._s.gaps = (self._s.gaps + [gap])[-MAX_GAPS_KEPT:]
            log.error("kafka offsets gone before the monitor read them", extra={
                "event": "kafka_gap", "topic": tp.topic, "partition": tp.partition, "kind": kind,
                "from_offset": gap.from_offset, "to_offset": gap.to_offset,
                "hint": "raise the topic's retention above the monitor's longest downtime"})

    # -------------------------------------------------------------- assignment

    def _refresh(self) -> None:
        """Find the configured topics' partitions, their end offsets, and (re)assign the consumer."""
        self._next_refresh = time.monotonic() + self.cfg.metadata_refresh_seconds
        try:
            if self._admin is None:
                self._admin = admin_client(self.cfg)
            asked_at = time.time()
            epochs, missing = leader_epochs(self._admin, self._parsers)
            current = set(epochs) if self._only is None else {tp for tp in epochs if tp_key(tp) in self._only}
            if unready := sorted({tp.topic for tp in self._assigned} & set(missing)):
                # A broker starting again reports its topics not ready for a while: their partitions keep
                # their positions and assignment (dropped, they would be read again from the earliest offset).
                raise kerrors.LeaderNotAvailableError(f"topics read before are not ready on the broker: {unready}")
            ends = list_offsets(self._admin, current, OffsetSpec.LATEST, self._timeout_ms)
            answered = time.time()
            starts = self._start_offsets(current - self._assigned)
            if self._consumer is None:
                self._answers_after = time.time()
                self._consumer = KafkaConsumer(**client_settings(self.cfg), group_id=None, enable_auto_commit=False,
                                               auto_offset_reset="none")
                self._assigned = set()
        except ACCESS_ERRORS as exc:
            raise self._access_error(exc) from exc
        except kerrors.KafkaError as exc:
            self._disconnected(exc)
            return
        self._assign(current, starts, ends, missing, (asked_at, answered), epochs)
        self._first_run = False
        self._connected()

    def _start_offsets(self, new: set[TopicPartition]) -> dict[TopicPartition, int]:
        with self._lock:
            known = {tp: self._s.positions[tp] for tp in new if tp in self._s.positions}
        unknown = new - set(known)
        spec = OffsetSpec.LATEST if self._first_run and self.cfg.start_from == "latest" else OffsetSpec.EARLIEST
        return {**known, **list_offsets(self._admin, unknown, spec, self._timeout_ms)}  # type: ignore[arg-type]

    def _assign(self, current: set[TopicPartition], starts: dict[TopicPartition, int], ends: dict[TopicPartition, int],
                missing: list[str], asked: tuple[float, float], epochs: dict[TopicPartition, int]) -> None:
        """`asked`: when the broker was asked for `ends`, and when its answer came in."""
        consumer = self._consumer
        assert consumer is not None
        gone = self._assigned - current
        if current != self._assigned:
            if current:
                consumer.assign(sorted(current))
            else:
                consumer.unsubscribe()
            for tp, offset in starts.items():
                consumer.seek(tp, offset)
        with self._lock:
            s = self._s
            for tp in gone:
                for known in (s.positions, s.ends, s.answered, s.epochs, s.held):
                    known.pop(tp, None)
            s.positions.update(starts)
            self._learn(ends, *asked, epochs)
            if tuple(missing) != s.waiting_for and missing:
                log.warning("waiting for kafka topics that do not exist yet",
                            extra={"event": "kafka_topic_waiting", "topics": missing})
            s.waiting_for = tuple(missing)
        self._assigned = set(current)
        if starts or gone:
            log.info("kafka partitions assigned", extra={
                "event": "kafka_assigned", "new": {tp_key(tp): o for tp, o in sorted(starts.items())},
                "gone": sorted(tp_key(tp) for tp in gone), "partitions": len(current)})

    def _learn(self, ends: dict[TopicPartition, int], asked: float, answered: float,
               epochs: dict[TopicPartition, int] | None = None, fetched: bool = False) -> None:
        """Take partitions' end offsets as the broker answered them: asked at `asked` (with their leader epochs when
        the broker was asked for them), the answer in by `answered`. `fetched`: highwaters fetches brought, `asked`
        a time before the broker answered them (kafka-python does not say when it asked). Call with the lock held.

        An end vouches that every record produced before it was asked is below it (and all an end below it vouched
        for), unless the partition's leader is new (another epoch) or its end went back (the broker restarted, or a
        new leader): such a partition's end is held, and the broker taken for away, its clock standing where it was.

        After the broker was away (a reconnect, a restart seen so), no end vouches for `producer_delivery_seconds`:
        the shop's producers keep what they could not send meanwhile and append it once the broker is back, stamped
        (CreateTime) as when it was sent, so an end learned just after the outage does not cover what was stamped
        before it. Once that time is up a held end vouches again, moved or not. It used to wait for an end past it,
        for a broker restarted after SIGKILL was said to report the high watermark it last saved, with acknowledged
        records above it unreadable until the next write; a Kafka 4 broker killed a second after acknowledging
        3,000 records reported every end whole at once, and a partition nobody wrote to after the restart held the
        Kafka clock, and an audit run's end, for good."""
        s = self._s
        if ends and s.ever_connected and not s.connected:
            # The broker answers while the reader still takes it for away: it is back, and its producers are
            # appending what they kept. The consumer reconnects on its own, so its fetches can come in before the
            # next refresh finds the broker back (`_connected`, which settles from then): the chaos soak's cdc-check
            # monitor took such highwaters for fresh ends, and 55 events on time for lost.
            self._settle()
        for tp, epoch in (epochs or {}).items():
            if tp in ends and s.epochs.get(tp, epoch) != epoch:
                self._hold(tp, ends[tp], f"new leader epoch {epoch}")
            s.epochs[tp] = epoch
        for tp, end in ends.items():
            known = s.ends.get(tp)
            if known is not None and end < known[0]:
                if fetched or asked < s.answered.get(tp, 0.0):
                    # Only an end asked after the larger one's answer came in says the broker went back. Two threads
                    # ask the broker (`caught_up`, the poll's refresh), and a fetch's highwater is taken in only once
                    # the poll reads its answer, so a smaller end in flight meanwhile may be the older: taken for a
                    # broker gone back, it held the clock for the settle time in bench/load.py's 10 minutes with no
                    # broker restarted (F7's detection p99 9 to 12 s). The broker's next answer, asked each second,
                    # tells.
                    continue
                self._hold(tp, end, f"end went back from {known[0]} to {end}")
            # The earliest answer of the end known: any end asked after it that is smaller went back.
            s.answered[tp] = answered if known is None or end != known[0] else min(answered, s.answered.get(tp, 0.0))
            if asked < s.settle_until:
                s.ends[tp] = (end, known[1] if known is not None else 0.0)
                continue
            if (held := s.held.pop(tp, None)) is not None:
                log.info("kafka partition's end vouched for again", extra={
                    "event": "kafka_end_released", "partition": tp_key(tp), "end": end, "held_at": held})
            s.ends[tp] = (end, max(asked, known[1]) if known is not None and end >= known[0] else asked)

    def _hold(self, tp: TopicPartition, end: int, why: str) -> None:
        self._settle()
        if tp not in self._s.held:
            log.warning("kafka partition's end not vouched for until the producers may have sent what they kept: "
                        "the broker restarted, or a new leader", extra={
                            "event": "kafka_end_held", "partition": tp_key(tp), "end": end, "why": why})
        self._s.held[tp] = max(end, self._s.held.get(tp, end))

    def _settle(self) -> None:
        """The broker was away: no end vouches until its producers may have appended what they kept meanwhile."""
        now = time.time()
        until = now + self.cfg.producer_delivery_seconds
        if now >= self._s.settle_until:  # once an outage, not at each partition found held
            log.info("kafka's ends vouch for nothing new until the producers may have sent what they kept while "
                     "the broker was away", extra={"event": "kafka_settling",
                                                   "seconds": self.cfg.producer_delivery_seconds})
        self._s.settle_until = until

    def _drop_consumer(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close(autocommit=False)
            except kerrors.KafkaError:
                pass  # a consumer of a dead connection may fail to close; nothing is lost
            self._consumer = None
            self._assigned = set()
            self._highwater.clear()

    # -------------------------------------------------------------- health

    def _connected(self) -> None:
        with self._lock:
            s = self._s
            if s.connected:
                return
            if s.ever_connected:
                s.reconnects += 1
                self._settle()
            s.connected = s.ever_connected = True
            s.last_error = None
            s.disconnected_since = None
        log.info("kafka connected", extra={"event": "kafka_connected", "servers": list(self.cfg.bootstrap_servers)})

    def _disconnected(self, exc: BaseException) -> None:
        with self._lock:
            s = self._s
            first = s.connected or s.last_error is None  # log once per outage, not once per retry
            s.connected = False
            s.last_error = f"{type(exc).__name__}: {exc}"
            if s.disconnected_since is None:
                s.disconnected_since = time.time()
        if first:
            log.warning("kafka unavailable", extra={"event": "kafka_disconnected", "error": s.last_error})

    def _access_error(self, exc: BaseException) -> KafkaAccessError:
        return KafkaAccessError(
            f"Kafka at {', '.join(self.cfg.bootstrap_servers)} refused the monitor ({exc}); grant its principal "
            f"Describe and Read on the topics {', '.join(self._parsers)} (it needs no group and no write ACL)")


__all__ = ["KafkaEventCollector", "EventBatch",
           "KafkaEventsError", "KafkaAccessError", "tp_key", "parse_tp_key", "admin_client", "client_settings",
           "existing_partitions", "list_offsets"]
