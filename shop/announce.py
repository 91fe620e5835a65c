"""How the service tells Kafka what it committed, in the three styles, and the send faults.

- `after_commit`: events are sent right after the commit (a non-atomic dual write: a send
  that fails after the commit loses the event, F7);
- `in_transaction`: events are sent while the transaction is open (a rollback after the
  send leaves a phantom event, F8);
- `outbox`: events are rows of `outbox` written in the transaction; a relay thread sends
  committed rows and then marks them sent (a crash between the two resends, F9).

A fault directive (`EventFault`) on one event of an order makes it lost, sent twice, sent
late or rolled back after the send; whoever applies it records it as ground truth, with
the event's keys, at that moment.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from decimal import Decimal
from typing import Any, Protocol

from kafka import KafkaProducer

from oncewatch.shop.layout import iso_ms
from oncewatch.shop.truth import Fault, Recorder

log = logging.getLogger(__name__)

ORDER_PAID = "order.paid"
ORDER_REFUNDED = "order.refunded"
SHIPMENT_CREATED = "shipment.created"
POINTS_GRANTED = "points.granted"
# The events one successful payment produces, in the order the service writes their rows.
SUCCESS_EVENTS = (SHIPMENT_CREATED, POINTS_GRANTED, ORDER_PAID)
# How long the outbox relay waits for the broker to acknowledge a batch before it gives up (and the run fails): a
# broker SIGKILLed on a loaded two-core machine took 70 s to serve again, past the 30 s this used to be.
RELAY_ACK_SECONDS = 180.0


class InjectedFailure(Exception):
    """A failure the shop injects on purpose; the channel's retry is part of the plan."""


class InjectedRollback(InjectedFailure):
    """The transaction fails right after an event was sent from inside it (F8)."""


class Kind(enum.StrEnum):
    LOST = "lost"
    DUPLICATE = "duplicate"
    SLOW = "slow"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class EventFault:
    """What goes wrong with the first event of `event_type` that an order announces."""

    mode: str
    rule: str
    kind: Kind
    event_type: str


@dataclass(frozen=True)
class Event:
    """One announcement; `payload()` is the JSON contract of examples/shop.toml, or with `envelope` that of
    examples/mall.toml: the business data under "data" (the amount in cents), in an envelope with the event's
    own id, time and a trace id."""

    event_id: str
    type: str
    order_no: str
    trade_no: str
    entity_id: str  # the announced row's key: order_no for order.*, shipment_id / grant_id for effects
    amount: str
    status: str
    occurred_at: int  # ms, the row's own timestamp column
    table: str  # schema.table of the announced row (the pattern of its shards); ground truth only, not in the payload
    envelope: bool = False

    def payload(self) -> dict[str, Any]:
        if self.envelope:
            return {"eventId": self.event_id, "eventType": self.type, "occurredAt": iso_ms(self.occurred_at),
                    "traceId": uuid.uuid4().hex, "source": "mall-payment",
                    "data": {"orderNo": self.order_no, "tradeNo": self.trade_no, "entityId": self.entity_id,
                             "amountFen": int(Decimal(self.amount) * 100), "status": self.status}}
        d = asdict(self)
        del d["table"], d["envelope"]
        return d

    def resent(self) -> Event:
        """The event as the service sends it again after a lost acknowledgement: the same record, or an
        envelope of its own (a new id and time around the same business data)."""
        return replace(self, event_id=uuid.uuid4().hex, occurred_at=now_ms()) if self.envelope else self

    def encode(self) -> bytes:
        return json.dumps(self.payload(), separators=(",", ":")).encode()

    def keys(self) -> dict[str, str]:
        keys = {"event_type": self.type, "entity_id": self.entity_id, "order_no": self.order_no,
                "trade_no": self.trade_no}
        return {**keys, "table": self.table} if self.table else keys

    @classmethod
    def of_payload(cls, payload: bytes) -> Event:
        """An event back from its payload (an outbox row's): everything but the table, which is not in it."""
        return cls(**json.loads(payload), table="")


def now_ms() -> int:
    return int(time.time() * 1000)


class Publisher:
    """The one Kafka producer of a run; every record is keyed by order_no, stamped at send time."""

    def __init__(self, producer: KafkaProducer, topic: str, recorder: Recorder):
        self._producer = producer
        self._topic = topic
        self._recorder = recorder
        self._lock = threading.Lock()
        self.sent = 0

    def send(self, event: Event, value: bytes | None = None) -> None:
        """`event` (or `value`, its payload as an outbox row holds it), stamped now: the ground truth keeps
        the send if it comes late after the row's time (shop.truth.LATE_SECONDS), as the monitor sees it."""
        stamp = now_ms()
        future = self._producer.send(self._topic, key=event.order_no.encode(), value=value or event.encode(),
                                     timestamp_ms=stamp)
        # A send nobody planned to fail would be an F7 without a fault behind it.
        future.add_errback(lambda exc: self._recorder.incident(f"send failed: {type(exc).__name__}"))
        self._recorder.sent(event.keys(), (stamp - event.occurred_at) / 1000)
        with self._lock:
            self.sent += 1

    def flush(self, timeout: float) -> None:
        self._producer.flush(timeout=timeout)

    def flush_at_end(self, timeout: float) -> None:
        """Everything sent acknowledged, or an incident of the run: kafka-python 3.0 can keep a batch that was in
        flight when the broker was SIGKILLed unfinished for good, and the run's end is no place to fail on it (its
        records may be lost, which the ground truth then says)."""
        from kafka.errors import KafkaTimeoutError

        try:
            self._producer.flush(timeout=timeout)
        except KafkaTimeoutError:
            self._recorder.incident(f"sends not acknowledged {timeout:.0f} s into the run's end")
            log.error("the shop's sends were not all acknowledged at the end of the run; its ground truth says so",
                      extra={"event": "shop_sends_unacknowledged", "timeout_seconds": timeout})


def record(recorder: Recorder, fault: EventFault, event: Event, **detail: Any) -> None:
    recorder.fault(Fault(fault.mode, fault.rule, event.keys(),
                         detail={"kind": str(fault.kind), "event_id": event.event_id, **detail}))
    log.info("fault injected", extra={"mode": fault.mode, "rule": fault.rule, "event_type": event.type})


class Announcer(Protocol):
    def in_tx(self, cursor: Any, event: Event, fault: EventFault | None) -> None:
        """Called for each event while its transaction is open."""

    def after_commit(self, event: Event, fault: EventFault | None) -> None:
        """Called for each event of a transaction once it has committed."""

    def drain(self, timeout: float) -> None:
        """Wait until every announced event has reached Kafka."""

    def close(self) -> None: ...


class KafkaAnnouncer:
    """Direct sends: after the commit, or from inside the transaction."""

    def __init__(self, publisher: Publisher, recorder: Recorder, *, inside_tx: bool, slow_seconds: float):
        self._publisher = publisher
        self._recorder = recorder
        self._inside_tx = inside_tx
        self._slow = slow_seconds
        self._timers: list[threading.Timer] = []
        self._timers_lock = threading.Lock()

    def in_tx(self, cursor: Any, event: Event, fault: EventFault | None) -> None:
        if self._inside_tx:
            self._send(event, fault)

    def after_commit(self, event: Event, fault: EventFault | None) -> None:
        if not self._inside_tx:
            self._send(event, fault)

    def _send(self, event: Event, fault: EventFault | None) -> None:
        if fault is None:
            self._publisher.send(event)
            return
        record(self._recorder, fault, event, **({"delay_seconds": self._slow} if fault.kind is Kind.SLOW else {}))
        if fault.kind is Kind.LOST:
            return
        if fault.kind is Kind.SLOW:
            # The producer blocked (full buffer, metadata wait) long after the commit.
            timer = threading.Timer(self._slow, self._publisher.send, args=(event,))
            timer.daemon = True
            with self._timers_lock:
                self._timers = [t for t in self._timers if t.is_alive()] + [timer]
            timer.start()
            return
        self._publisher.send(event)
        if fault.kind is Kind.DUPLICATE:
            self._publisher.send(event.resent())  # the acknowledgement was lost and the send retried
        elif fault.kind is Kind.ROLLBACK:
            raise InjectedRollback(f"statement after the {event.type} send failed")

    def drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._timers_lock:
            timers = list(self._timers)
        for timer in timers:
            timer.join(max(0.0, deadline - time.monotonic()))
        self._publisher.flush_at_end(max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        with self._timers_lock:
            for timer in self._timers:
                timer.cancel()


class OutboxAnnouncer:
    """Transactional outbox: the event is a row of the same transaction; a relay sends it."""

    INSERT = ("INSERT INTO outbox (event_id, topic, msg_key, payload, created_at) "
              "VALUES (%s, %s, %s, %s, NOW(3))")

    def __init__(self, publisher: Publisher, recorder: Recorder, topic: str,
                 connect: Callable[[], Any], slow_seconds: float):
        self._topic = topic
        self._relay = OutboxRelay(publisher, recorder, connect, slow_seconds)
        self._relay.start()

    def in_tx(self, cursor: Any, event: Event, fault: EventFault | None) -> None:
        cursor.execute(self.INSERT, (event.event_id, self._topic, event.order_no, event.encode()))
        if fault is not None:
            self._relay.expect(event, fault)

    def after_commit(self, event: Event, fault: EventFault | None) -> None:
        """Nothing to do: the relay finds the committed row."""

    def drain(self, timeout: float) -> None:
        self._relay.drain(timeout)

    def close(self) -> None:
        self._relay.stop()


class OutboxRelay(threading.Thread):
    """Polls committed, unsent outbox rows, sends them, waits for the acks, marks them sent."""

    POLL_SECONDS = 0.05
    BATCH = 500

    def __init__(self, publisher: Publisher, recorder: Recorder, connect: Callable[[], Any],
                 slow_seconds: float):
        super().__init__(name="outbox-relay", daemon=True)
        self._publisher = publisher
        self._recorder = recorder
        self._connect = connect
        self._slow = slow_seconds
        self._lock = threading.Condition()
        self._faults: dict[str, tuple[Event, EventFault]] = {}
        self._not_before: dict[str, float] = {}
        self._resend: set[str] = set()
        self._stopping = False
        self._empty_polls = 0  # polls that found no unsent row: drain() waits for a fresh one
        self.error: BaseException | None = None

    def expect(self, event: Event, fault: EventFault) -> None:
        with self._lock:
            self._faults[event.event_id] = (event, fault)

    def run(self) -> None:
        try:
            conn = self._connect()
            try:
                while not self._stopping:
                    waiting, sent = self._poll(conn)
                    if not waiting:
                        with self._lock:
                            self._empty_polls += 1
                            self._lock.notify_all()
                    if not sent:
                        time.sleep(self.POLL_SECONDS)
            finally:
                conn.close()
        except Exception as exc:  # noqa: BLE001 - handed to the runner, which stops the run
            self.error = exc
            with self._lock:
                self._lock.notify_all()

    def _poll(self, conn: Any) -> tuple[int, int]:
        """One batch: how many unsent rows were waiting, how many were marked sent."""
        with conn.cursor() as cur:
            cur.execute("SELECT id, event_id, payload FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT %s",
                        (self.BATCH,))
            rows = cur.fetchall()
            done = [row_id for row_id, event_id, payload in rows if self._relay(event_id, payload)]
            if done:
                # Mark only what the broker acknowledged: a crash before this line resends.
                self._publisher.flush(timeout=RELAY_ACK_SECONDS)
                cur.execute("UPDATE outbox SET sent_at = NOW(3) WHERE id IN %s", (done,))
        return len(rows), len(done)

    def _relay(self, event_id: str, payload: bytes) -> bool:
        """Send one row unless its fault holds it back; True when it may be marked sent."""
        with self._lock:
            planned = self._faults.get(event_id)
        if planned is None:
            self._publisher.send(Event.of_payload(payload), payload)
            return True
        event, fault = planned
        if fault.kind is Kind.SLOW:
            # The first send attempt failed; the relay's backoff retries it much later.
            if event_id not in self._not_before:
                self._not_before[event_id] = time.monotonic() + self._slow
                record(self._recorder, fault, event, delay_seconds=self._slow)
            if time.monotonic() < self._not_before[event_id]:
                return False
        elif event_id not in self._resend:
            # The relay dies after the send and before marking the row; its restart sends it again.
            self._publisher.send(event, payload)
            self._resend.add(event_id)
            record(self._recorder, fault, event)
            return False
        self._publisher.send(event, payload)
        self._forget(event_id)
        return True

    def _forget(self, event_id: str) -> None:
        with self._lock:
            self._faults.pop(event_id, None)
        self._resend.discard(event_id)
        self._not_before.pop(event_id, None)

    def drain(self, timeout: float) -> None:
        """Wait for a poll that starts after this call and finds nothing left to send."""
        deadline = time.monotonic() + timeout
        with self._lock:
            target = self._empty_polls + 2
            while self._empty_polls < target and self.error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"outbox relay still has unsent rows after {timeout:.0f} s")
                self._lock.wait(remaining)
        if self.error is not None:
            raise self.error
        self._publisher.flush_at_end(max(0.1, deadline - time.monotonic()))

    def stop(self) -> None:
        self._stopping = True
        self.join(timeout=5)
