"""The simulated payment service: orders, payment attempts, notifications, refunds, pick-ups.

One `PaymentService` per worker thread, on its own connection; each step of an order's plan
is one call. A notification (callback delivery or compensation query answer) goes through
the handler its order's `HandlerPolicy` describes: verify the status and the amount, claim
the idempotency key, then in one transaction the payment update, the side effects
(shipment with a pick-up code, points grant) and the order status change, announced
through the run's `Announcer`. Row timestamps are set here, in UTC with milliseconds, so
each event's `occurred_at` is exactly its row's commit-time column.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from types import TracebackType
from typing import Any

import pymysql

from oncewatch.shop.announce import (ORDER_PAID, ORDER_REFUNDED, POINTS_GRANTED, SHIPMENT_CREATED, Announcer, Event,
                           EventFault, InjectedFailure)
from oncewatch.shop.layout import Layout
from oncewatch.shop.plan import (VIA_QUERY, Close, CreateOrder, Notify, OrderPlan, PickUp, Refund, StartPayment,
                       Step)

log = logging.getLogger(__name__)

# The shop's own state machine, the same as [domain.state_machine] in examples/shop.toml.
ALLOWED = {"pending": ("paid", "closed"), "paid": ("shipped", "refunded"), "shipped": ("refunded",)}
ANNOUNCED = {"paid": ORDER_PAID, "refunded": ORDER_REFUNDED}
ER_DUP_ENTRY = 1062
# The connection broke or cannot be made (MariaDB killed, restarting, shutting down): the transaction is retried on
# a new one. Any other error is the service's own and stops the run.
CONNECTION_LOST = {2003, 2006, 2013, 2014, 1053, 1927}
OUTAGE_SECONDS = 180.0  # how long a worker keeps reconnecting before the run gives up


class ShopOutage(RuntimeError):
    """MariaDB stayed unreachable past OUTAGE_SECONDS, or a commit's outcome cannot be known (no commit marks)."""


def connection_lost(exc: BaseException) -> bool:
    return isinstance(exc, pymysql.err.InterfaceError) or (
        isinstance(exc, pymysql.err.OperationalError) and bool(exc.args) and exc.args[0] in CONNECTION_LOST)


class OrderRun:
    """One order in flight: its plan, the next step, and how long it stayed pending."""

    def __init__(self, plan: OrderPlan):
        self.plan = plan
        self.next_step = 0
        self.created_at: float | None = None
        self.left_pending_at: float | None = None
        self._event_fault = plan.event_fault

    def take_event_fault(self, event_type: str) -> EventFault | None:
        """The order's event fault, once, for the first event of its type."""
        fault = self._event_fault
        if fault is None or fault.event_type != event_type:
            return None
        self._event_fault = None
        return fault

    def event_fault(self) -> EventFault | None:
        return self._event_fault

    def give_back(self, fault: EventFault | None) -> None:
        """A transaction that did not commit took the fault: its retry takes it again."""
        self._event_fault = fault


def utc_now() -> dt.datetime:
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)  # DATETIME(3) keeps milliseconds


def epoch_ms(at: dt.datetime) -> int:
    return round(at.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)


class Tx:
    """One transaction of the service and what it announces: sent, written or queued by style.

    With a `mark` (commit marks on), the transaction writes its id to the marks table last, so a commit whose answer
    never came (the server killed while it committed) can be looked up after the reconnect."""

    def __init__(self, conn: pymysql.connections.Connection, announcer: Announcer, run: OrderRun,
                 mark: tuple[str, str] | None = None):
        self._conn = conn
        self._announcer = announcer
        self._run = run
        self._announced: list[tuple[Event, EventFault | None]] = []
        self._on_commit: list[Callable[[], None]] = []
        self.mark = mark  # (the marks table, this transaction's id in it)
        self.committing = False  # COMMIT was sent: if its answer is lost, the outcome is in doubt
        self.cursor: Any = None

    def __enter__(self) -> Tx:
        self.cursor = self._conn.cursor()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.cursor.close()
            if exc is not None and not connection_lost(exc):  # a lost connection's server rolled it back
                self._conn.rollback()
            return
        if self.mark is not None:
            self.cursor.execute(f"INSERT INTO {self.mark[0]} (tx_id) VALUES (%s)", (self.mark[1],))
        self.cursor.close()
        self.committing = True
        self._conn.commit()
        self.committed()

    def committed(self) -> None:
        """What follows a commit: the order's bookkeeping and, by style, the announcements."""
        for action in self._on_commit:
            action()
        for event, fault in self._announced:
            self._announcer.after_commit(event, fault)

    def execute(self, sql: str, args: tuple[Any, ...]) -> int:
        return self.cursor.execute(sql, args)

    def one(self, sql: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        self.cursor.execute(sql, args)
        return self.cursor.fetchone()

    def announce(self, event: Event) -> None:
        fault = self._run.take_event_fault(event.type)
        self._announced.append((event, fault))
        self._announcer.in_tx(self.cursor, event, fault)

    def on_commit(self, action: Callable[[], None]) -> None:
        self._on_commit.append(action)


class PaymentService:
    """`connect` makes the worker's connection, again after MariaDB went away; `marks`: the commit marks table."""

    def __init__(self, connect: Callable[[], pymysql.connections.Connection], announcer: Announcer, layout: Layout,
                 marks: str | None = None):
        self._connect = connect
        self._conn = connect()
        self._announcer = announcer
        self._layout = layout
        self._sql = layout.sql
        self._marks = marks

    def close(self) -> None:
        self._conn.close()

    def execute(self, run: OrderRun, step: Step) -> None:
        match step:
            case CreateOrder():
                self._create_order(run)
            case StartPayment():
                self._start_payment(run, step)
            case Notify():
                self._notify(run, step)
            case Refund():
                self._refund(run, step)
            case PickUp():
                self._move_locked(run, "shipped")
            case Close():
                self._move_locked(run, "closed")
            case _:
                raise TypeError(f"unknown step {type(step).__name__}")

    def _transact(self, run: OrderRun, work: Callable[[Tx], object]) -> None:
        """`work` in one transaction, committed; retried on a new connection while MariaDB is away, as a service
        does. A commit whose answer was lost is looked up in the marks, never guessed: done once, or redone."""
        deadline = time.monotonic() + OUTAGE_SECONDS
        while True:
            fault = run.event_fault()
            tx = Tx(self._conn, self._announcer, run, (self._marks, uuid.uuid4().hex) if self._marks else None)
            try:
                with tx:
                    work(tx)
                return
            except pymysql.err.MySQLError as exc:
                if not connection_lost(exc):
                    raise
                lost = exc
            if time.monotonic() > deadline:
                raise ShopOutage(f"transactions kept losing their connection for {OUTAGE_SECONDS:.0f} s: "
                                 f"{lost!r}") from lost
            run.give_back(fault)
            self._reconnect(deadline, lost)
            if tx.committing and self._was_committed(tx, lost):
                tx.committed()
                return
            log.info("transaction retried on a new connection", extra={
                "event": "shop_tx_retried", "order_no": run.plan.order_no, "error": repr(lost)})

    def _reconnect(self, deadline: float, lost: BaseException) -> None:
        try:
            self._conn.close()
        except pymysql.err.Error:
            pass  # already broken
        while True:
            try:
                self._conn = self._connect()
                return
            except pymysql.err.MySQLError as exc:
                if not connection_lost(exc):
                    raise
                if time.monotonic() > deadline:
                    raise ShopOutage(f"MariaDB unreachable for {OUTAGE_SECONDS:.0f} s since {lost!r}: {exc!r}") from exc
            time.sleep(0.5)

    def _was_committed(self, tx: Tx, lost: BaseException) -> bool:
        if tx.mark is None:
            raise ShopOutage(f"a commit's answer was lost ({lost!r}) and its outcome cannot be known: run the shop "
                             "with commit marks (ShopSettings.commit_marks) where MariaDB may be killed") from lost
        with self._conn.cursor() as cur:
            cur.execute(f"SELECT 1 FROM {tx.mark[0]} WHERE tx_id = %s", (tx.mark[1],))
            found = cur.fetchone() is not None
        self._conn.rollback()  # the lookup's snapshot ends here
        log.info("commit in doubt looked up", extra={"event": "shop_commit_in_doubt", "committed": found})
        return found

    def _event(self, run: OrderRun, event_type: str, trade_no: str, entity_id: str, status: str,
               at: dt.datetime, role: str) -> Event:
        return Event(event_id=uuid.uuid4().hex, type=event_type, order_no=run.plan.order_no, trade_no=trade_no,
                     entity_id=entity_id, amount=str(run.plan.amount), status=status,
                     occurred_at=epoch_ms(at), table=self._layout.truth_table(role), envelope=self._layout.envelope)

    def _run_sql(self, tx: Tx, run: OrderRun, step: str, args: tuple[Any, ...]) -> int:
        """One statement of the layout, on the tables of this run's order."""
        return tx.execute(self._sql[step].format(**self._layout.of(run.plan.order_no)), args)

    # ------------------------------------------------------------ orders and payments

    def _create_order(self, run: OrderRun) -> None:
        def work(tx: Tx) -> None:
            plan, at = run.plan, utc_now()
            self._run_sql(tx, run, "create_order", (plan.order_no, plan.user_id, plan.amount,
                                                    self._layout.order_status("pending"), at, at))
        self._transact(run, work)
        run.created_at = time.monotonic()

    def _start_payment(self, run: OrderRun, step: StartPayment) -> None:
        def work(tx: Tx) -> None:
            at, layout = utc_now(), self._layout
            self._run_sql(tx, run, "start_payment", (step.trade_no, run.plan.order_no, step.channel,
                                                     layout.payment_amount(run.plan.amount),
                                                     layout.payment_status("pending"), at, at))
        self._transact(run, work)

    def _lock_order(self, tx: Tx, run: OrderRun) -> tuple[str, Decimal]:
        tables = self._layout.of(run.plan.order_no)
        status, amount = tx.one(self._sql["lock_order"].format(**tables), (run.plan.order_no,))
        return self._layout.status_of_order(status), amount

    def _move(self, tx: Tx, run: OrderRun, current: str, to: str, trade_no: str, *, guarded: bool = True) -> None:
        """Change the order's status; announce it when the contract says so."""
        if current == to or (guarded and to not in ALLOWED.get(current, ())):
            return
        at = utc_now()
        self._run_sql(tx, run, "move_order", (self._layout.order_status(to), at, run.plan.order_no))
        if current == "pending":
            tx.on_commit(lambda: setattr(run, "left_pending_at", time.monotonic()))
        if to in ANNOUNCED:
            tx.announce(self._event(run, ANNOUNCED[to], trade_no, run.plan.order_no, to, at, "orders"))

    def _move_locked(self, run: OrderRun, to: str) -> None:
        def work(tx: Tx) -> None:
            status, _ = self._lock_order(tx, run)
            self._move(tx, run, status, to, trade_no="")
        self._transact(run, work)

    def _refund(self, run: OrderRun, step: Refund) -> None:
        def work(tx: Tx) -> None:
            status, amount = self._lock_order(tx, run)
            if "refunded" not in ALLOWED.get(status, ()):
                return
            self._run_sql(tx, run, "refund", (run.plan.order_no, step.trade_no, amount, utc_now()))
            self._move(tx, run, status, "refunded", step.trade_no)
        self._transact(run, work)

    # ------------------------------------------------------------ the notification handler

    def _notify(self, run: OrderRun, step: Notify) -> None:
        policy = run.plan.policy
        if policy.whitelist:
            success = {"success": True, "failed": False}.get(step.status)
        else:
            success = step.status != "failed"  # the bug: anything but 'failed' counts as paid
        if success is None:
            log.warning("notification rejected: status outside the whitelist", extra={"trade_no": step.trade_no})
            return
        try:
            if success and policy.ship_first:
                self._transact(run, lambda tx: self._ship(tx, run, step.trade_no))
            self._transact(run, lambda tx: self._handle(tx, run, step, success))
        except InjectedFailure as exc:
            log.info("notification failed, the channel will retry",
                     extra={"trade_no": step.trade_no, "reason": str(exc)})

    def _handle(self, tx: Tx, run: OrderRun, step: Notify, success: bool) -> None:
        policy, layout = run.plan.policy, self._layout
        status, amount = self._lock_order(tx, run)
        if layout.logs_callbacks:
            # What the channel sent, as it sent it, whatever the handler then makes of it.
            self._run_sql(tx, run, "log_callback", (step.trade_no, layout.channel_status(step.status), step.amount,
                                                    utc_now()))
        if policy.verify_amount and step.amount != amount:
            log.warning("notification rejected: amount differs from the order", extra={"trade_no": step.trade_no})
            return
        if success and not policy.state_machine:
            # The handler's first version: mark the order paid before any check.
            self._move(tx, run, status, "paid", step.trade_no, guarded=False)
        if not self._claim(tx, run, step, success):
            return
        at = utc_now()
        # The flat shop keeps the channel's word on the payment row; the mall only in its callback log.
        said = () if layout.logs_callbacks else (step.status,)
        if not success:
            self._run_sql(tx, run, "payment_failed", (layout.payment_status("failed"), *said, at, step.trade_no))
            return
        # The amount booked is the notification's: equal to the order's unless verification is off.
        self._run_sql(tx, run, "payment_success", (layout.payment_status("success"), *said,
                                                   layout.payment_amount(step.amount), at, step.trade_no))
        if not policy.ship_first:
            self._ship(tx, run, step.trade_no)
        self._grant_points(tx, run, step.trade_no)
        if policy.state_machine:
            self._move(tx, run, status, "paid", step.trade_no)

    def _claim(self, tx: Tx, run: OrderRun, step: Notify, success: bool) -> bool:
        """Write the idempotency record; False when the notification was handled before."""
        if step.idempotency_write_fails:
            # Nothing of this transaction was announced yet: only the shipment before it stands.
            raise InjectedFailure("idempotency record write timed out")
        policy = run.plan.policy
        if policy.idempotency == "none":
            return True
        key = run.plan.order_no if policy.idempotency == "order" else step.trade_no
        if step.via == VIA_QUERY and policy.query_own_key:
            key = f"query:{key}"
        try:
            self._run_sql(tx, run, "claim", (key, step.trade_no, run.plan.order_no, "success" if success else "failed",
                                             utc_now()))
        except pymysql.err.IntegrityError as exc:
            if exc.args[0] != ER_DUP_ENTRY:
                raise
            log.debug("duplicate notification acknowledged", extra={"trade_no": step.trade_no})
            return False
        return True

    def _ship(self, tx: Tx, run: OrderRun, trade_no: str) -> None:
        self._effect(tx, run, "ship", SHIPMENT_CREATED, "shipments", "created",
                     (trade_no, run.plan.order_no, f"{secrets.randbelow(10 ** 6):06d}"))

    def _grant_points(self, tx: Tx, run: OrderRun, trade_no: str) -> None:
        self._effect(tx, run, "grant_points", POINTS_GRANTED, "points_grants", "granted",
                     (trade_no, run.plan.order_no, int(run.plan.amount)))

    def _effect(self, tx: Tx, run: OrderRun, step: str, event_type: str, role: str, status: str,
                args: tuple[Any, ...]) -> None:
        """One side effect row and its announcement; its id is the table's auto-increment, or the service's own."""
        at = utc_now()
        own_id = uuid.uuid4().hex[:24] if self._layout.numbers_effects else None
        self._run_sql(tx, run, step, (*((own_id,) if own_id else ()), *args, at))
        tx.announce(self._event(run, event_type, args[0], own_id or str(tx.cursor.lastrowid), status, at, role))
