"""One shop run: prepare the tables and topic, play every order's plan on time, drain, write the truth.

Orders start at `rate` per second; each order's steps run one after the other with their
planned delays, on a pool of worker threads that each hold a database connection (orders
run in parallel, one order's steps never do). When every order has played out, the run
waits until the announcements reached Kafka and the healthy consumer groups caught up,
then measures the consumer lags and returns the `GroundTruth` (also written as JSON when
`truth_path` is set).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack

from kafka import KafkaAdminClient, KafkaProducer
from kafka.errors import KafkaTimeoutError

from oncewatch.shop import plan as plans
from oncewatch.shop.announce import Announcer, KafkaAnnouncer, OutboxAnnouncer, Publisher
from oncewatch.shop.consumers import Downstream, end_offsets, lag, wait_drained
from oncewatch.shop.faults import BY_NAME, FaultMix
from oncewatch.shop.layout import SHAPE_SHOP, Layout
from oncewatch.shop.scheduler import Scheduler
from oncewatch.shop.schema import binlog_position, connect, prepare_tables, prepare_topic
from oncewatch.shop.service import OrderRun, PaymentService
from oncewatch.shop.settings import STYLE_IN_TRANSACTION, STYLE_OUTBOX, ShopSettings
from oncewatch.shop.truth import Fault, GroundTruth, Recorder

log = logging.getLogger(__name__)

DRAIN_SECONDS = 60.0
# What the shop's producer keeps a record it cannot send (the broker away) before it gives up on it, a lost send;
# its monitors' `kafka.producer_delivery_seconds` (devservices.shop_monitor).
DELIVERY_SECONDS = 30.0
TAG_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


class ShopError(RuntimeError):
    """The run could not finish: a service worker failed (the cause says how)."""


class _Traffic:
    """Starts orders on time, plays their steps, counts the finished ones."""

    def __init__(self, settings: ShopSettings, mix: FaultMix, tag: str, scheduler: Scheduler, recorder: Recorder,
                 triggers: dict[int, list[Callable[[], None]]]):
        self._settings = settings
        self._triggers = triggers  # run when the order of that index starts
        self._mix = mix
        self._tag = tag
        self._scheduler = scheduler
        self._recorder = recorder
        self._lock = threading.Lock()
        self.runs: list[OrderRun] = []
        self.finished = 0
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = time.monotonic()
        if self._settings.order_count:
            self._scheduler.at(self.t0, lambda service: self._start_order(service, 0))

    def _start_order(self, service: PaymentService, index: int) -> None:
        count = self._settings.order_count
        if index + 1 < count:
            # Chained, so the heap holds one pending start and a long run does not plan ahead.
            self._scheduler.at(self.t0 + (index + 1) / self._settings.rate,
                               lambda s: self._start_order(s, index + 1))
        for trigger in self._triggers.get(index, ()):
            trigger()
        plan = plans.build(self._settings.seed, index, self._tag, self._mix)
        if plan.mode is not None and plan.fault_keys:
            self._recorder.fault(Fault(plan.mode.name, plan.mode.rule, plan.fault_keys, also=plan.mode.also))
        run = OrderRun(plan)
        with self._lock:
            self.runs.append(run)
        self._step(service, run)

    def _step(self, service: PaymentService, run: OrderRun) -> None:
        steps = run.plan.steps
        service.execute(run, steps[run.next_step])
        run.next_step += 1
        if run.next_step < len(steps):
            self._scheduler.at(time.monotonic() + steps[run.next_step].delay, lambda s: self._step(s, run))
        else:
            with self._lock:
                self.finished += 1

    def wait(self, scheduler: Scheduler, downstream: Downstream) -> float:
        """Block until every order finished; the seconds it took since the first order."""
        count = self._settings.order_count
        while True:
            if scheduler.error is not None:
                raise ShopError(f"a service worker failed: {scheduler.error!r}") from scheduler.error
            downstream.check()
            with self._lock:
                if self.finished >= count:
                    return time.monotonic() - self.t0
            time.sleep(0.05)


def _announcer(settings: ShopSettings, publisher: Publisher, recorder: Recorder) -> Announcer:
    if settings.style == STYLE_OUTBOX:
        return OutboxAnnouncer(publisher, recorder, settings.kafka.topic,
                               lambda: connect(settings.mysql, autocommit=True), settings.slow_send_seconds)
    return KafkaAnnouncer(publisher, recorder, inside_tx=settings.style == STYLE_IN_TRANSACTION,
                          slow_seconds=settings.slow_send_seconds)


def _pending_seconds(runs: list[OrderRun], recorder: Recorder) -> float:
    """The longest a clean order stayed pending, each long one kept in the ground truth; a clean order still pending
    is an incident."""
    longest = 0.0
    for run in runs:
        if run.plan.mode is not None and run.plan.mode.rule == "F3":
            continue
        if run.left_pending_at is None or run.created_at is None:
            recorder.incident(f"order {run.plan.order_no} left pending without a fault")
            continue
        pending = run.left_pending_at - run.created_at
        recorder.left_pending(run.plan.order_no, pending)
        longest = max(longest, pending)
    return round(longest, 3)


def _stall_at(settings: ShopSettings) -> int:
    """The order that switches F11/F12 on: after a tenth of the run, or 30 s into a long one."""
    return min(settings.order_count // 10, int(settings.rate * 30))


def _stall_triggers(settings: ShopSettings, mix: FaultMix, downstream: Downstream) -> dict[int, list[Callable[[], None]]]:
    k, at = settings.kafka, _stall_at(settings)
    shipping, points = k.groups
    triggers: list[Callable[[], None]] = []
    if mix.on("consumer_stall"):
        triggers.append(lambda: downstream.stall(shipping, frozenset(range(k.partitions))))
    if mix.on("consumer_skew"):
        triggers.append(lambda: downstream.stall(points, frozenset({settings.seed % k.partitions})))
    return {at: triggers}


def _consumer_faults(settings: ShopSettings, admin: KafkaAdminClient, downstream: Downstream,
                     recorder: Recorder) -> dict[str, dict[str, object]]:
    """Each group's lag after the drain; a stalled group's is its fault's evidence."""
    k = settings.kafka
    consumers = {g: lag(admin, g, k.topic, k.partitions).to_dict() for g in k.groups}
    for group, name in zip(k.groups, ("consumer_stall", "consumer_skew")):
        if downstream.stalled[group]:
            mode = BY_NAME[name]
            recorder.fault(Fault(mode.name, mode.rule, {"group": group, "topic": k.topic}, also=mode.also,
                                 detail={"stalled_partitions": sorted(downstream.stalled[group]),
                                         "stalled_at_order": _stall_at(settings), **consumers[group]}))
    return consumers


def close_producer(producer: KafkaProducer) -> None:
    """Close the shop's producer within DELIVERY_SECONDS. kafka-python 3.0 can leave a batch that was in flight when
    the broker died unfinished for good, and its close() then waits for it forever."""
    try:
        producer.close(timeout=DELIVERY_SECONDS)
    except KafkaTimeoutError:
        log.warning("the shop's producer did not finish its last sends within %.0f s; closed without them",
                    DELIVERY_SECONDS)


def run(settings: ShopSettings) -> GroundTruth:
    """Play one shop run against the configured MariaDB and Kafka and return its ground truth."""
    mix = FaultMix.parse(settings.faults, settings.style).placed(settings.seed, settings.order_count)
    tag = settings.run_tag or _new_tag()
    k = settings.kafka
    recorder = Recorder()
    layout = Layout(settings.shape, settings.mysql.database)
    prepare_tables(settings.mysql, reset=settings.reset, shape=settings.shape, commit_marks=settings.commit_marks)
    with ExitStack() as stack:
        admin = KafkaAdminClient(bootstrap_servers=k.bootstrap_servers, client_id="oncewatch-shop")
        stack.callback(admin.close)
        prepare_topic(admin, k, reset=settings.reset)
        start = {"binlog_gtid": binlog_position(settings.mysql),
                 "kafka_end_offsets": {str(p): o for p, o in end_offsets(admin, k.topic, k.partitions).items()}}

        downstream = Downstream(k.groups, k.topic, k.bootstrap_servers)
        stack.callback(downstream.stop)
        downstream.start(timeout=60)
        producer = KafkaProducer(bootstrap_servers=k.bootstrap_servers, client_id="oncewatch-shop",
                                 acks="all", linger_ms=5, delivery_timeout_ms=int(DELIVERY_SECONDS * 1000),
                                 request_timeout_ms=int(DELIVERY_SECONDS * 1000) // 3)
        stack.callback(close_producer, producer)
        publisher = Publisher(producer, k.topic, recorder)
        announcer = _announcer(settings, publisher, recorder)
        stack.callback(announcer.close)
        scheduler = Scheduler(settings.workers, lambda: PaymentService(
            lambda: connect(settings.mysql, database=layout.shape == SHAPE_SHOP), announcer, layout,
            layout.commit_marks if settings.commit_marks else None))
        stack.callback(scheduler.stop)
        traffic = _Traffic(settings, mix, tag, scheduler, recorder, _stall_triggers(settings, mix, downstream))

        log.info("shop run starts", extra={"seed": settings.seed, "style": settings.style, "shape": settings.shape,
                                            "orders":
                                            settings.order_count, "rate": settings.rate, "run_tag": tag})
        started_at = time.time()
        scheduler.start()
        traffic.start()
        traffic_seconds = traffic.wait(scheduler, downstream)
        announcer.drain(DRAIN_SECONDS)
        wait_drained(admin, downstream, k.topic, k.partitions, DRAIN_SECONDS)
        consumers = _consumer_faults(settings, admin, downstream, recorder)
        stats = {"traffic_seconds": round(traffic_seconds, 3),
                 "orders_per_second": round(settings.order_count / traffic_seconds, 1) if traffic_seconds else 0.0,
                 "events_sent": publisher.sent, "late_sends": len(recorder.late_sends()),
                 "max_schedule_late_seconds": round(scheduler.max_late, 3),
                 "max_clean_pending_seconds": _pending_seconds(traffic.runs, recorder),
                 "slow_pendings": len(recorder.slow_pendings()),
                 "started_at": round(started_at, 3), "finished_at": round(time.time(), 3)}
    truth = GroundTruth(seed=settings.seed, style=settings.style, run_tag=tag, orders=settings.order_count,
                        mix=dict(mix.rates), faults=recorder.faults(), start=start, consumers=consumers,
                        stats=stats, incidents=recorder.incidents(), late_sends=recorder.late_sends(),
                        slow_pendings=recorder.slow_pendings())
    if settings.truth_path:
        truth.write(settings.truth_path)
    log.info("shop run done", extra={"orders": truth.orders, "faults": len(truth.faults), **stats})
    return truth


def _new_tag() -> str:
    """Base-36 of the current time in 1/100 s (its last 6 digits: a new value every run, for 250 days) and 4
    random digits: two shops started in the same instant, as the demo starts its two, still get tags of their
    own (with the time alone they once shared one, and the second died on the first's order numbers).
    10 characters, short enough for an order number and a trade_no."""
    n, out = int(time.time() * 100), ""
    while n:
        n, r = divmod(n, 36)
        out = TAG_DIGITS[r] + out
    return out[-6:] + "".join(secrets.choice(TAG_DIGITS) for _ in range(4))
