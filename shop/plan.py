"""What happens to one order, fixed by the seed: its steps, how its handler is written, its fault.

`build(seed, index, tag, mix)` draws everything from the order's own random stream
(`Random(f"{seed}:{index}")`), so a seed fixes which orders get which faults whatever the
count, rate or timing. Each step waits `delay` seconds after the previous one finished.

Clean orders resolve within a few seconds: paid (maybe picked up, maybe refunded) or, after
failed attempts, closed; a lost callback is found by the compensation query. Faulted orders
follow their seed story (shop.faults) and nothing else, so each fault shows one pattern.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal

from oncewatch.shop.announce import SHIPMENT_CREATED, SUCCESS_EVENTS, EventFault, Kind
from oncewatch.shop.faults import FaultMix, Mode

CHANNELS = ("alipay", "wechat", "card")
_TRADE_PREFIX = {"alipay": "AP", "wechat": "WX", "card": "CD"}
VIA_CALLBACK = "callback"
VIA_QUERY = "query"
COMPENSATE_AFTER = 1.0  # the compensation job queries payments still pending after this long


@dataclass(frozen=True)
class HandlerPolicy:
    """How the callback handler is written for this order; the defaults are the correct handler."""

    idempotency: str = "trade"  # key on the channel's trade_no; "order" (wrong key) or "none"
    query_own_key: bool = False  # the compensation query uses its own key, not the callback's
    ship_first: bool = False  # ships in its own transaction before writing the idempotency record
    state_machine: bool = True  # status changes checked against the allowed transitions
    verify_amount: bool = True  # the callback amount must equal the order amount
    whitelist: bool = True  # only 'success' and 'failed' are channel statuses


@dataclass(frozen=True)
class Step:
    delay: float


@dataclass(frozen=True)
class CreateOrder(Step):
    pass


@dataclass(frozen=True)
class StartPayment(Step):
    trade_no: str
    channel: str


@dataclass(frozen=True)
class Notify(Step):
    """A channel notification: a callback delivery, or the answer to a compensation query."""

    trade_no: str
    status: str
    amount: Decimal
    via: str = VIA_CALLBACK
    idempotency_write_fails: bool = False  # the handler fails there, the channel retries


@dataclass(frozen=True)
class Refund(Step):
    trade_no: str


@dataclass(frozen=True)
class PickUp(Step):
    pass


@dataclass(frozen=True)
class Close(Step):
    pass


@dataclass(frozen=True)
class OrderPlan:
    index: int
    order_no: str
    user_id: int
    amount: Decimal
    steps: tuple[Step, ...]
    policy: HandlerPolicy
    mode: Mode | None
    fault_keys: dict[str, str]  # what a per-order fault concerns (ground truth keys)
    event_fault: EventFault | None


class _Script:
    """Builds one order's steps from its random stream."""

    def __init__(self, rng: random.Random, index: int, tag: str):
        self.rng = rng
        self.index = index
        self.tag = tag
        self.order_no = f"O{tag}{index:07d}"
        self.user_id = rng.randrange(1, 1_000_000)
        self.amount = Decimal(rng.randrange(100, 100_000)) / 100
        self.channels = rng.sample(CHANNELS, len(CHANNELS))
        self.steps: list[Step] = [CreateOrder(0.0)]
        self.event_fault: EventFault | None = None

    def wait(self, low: float, high: float) -> float:
        return round(self.rng.uniform(low, high), 3)

    def pay(self, attempt: int) -> str:
        channel = self.channels[attempt]
        trade_no = f"{_TRADE_PREFIX[channel]}{self.tag}{self.index:07d}{attempt}"
        self.steps.append(StartPayment(self.wait(0.02, 0.1), trade_no, channel))
        return trade_no

    def notify(self, trade_no: str, status: str = "success", *, amount: Decimal | None = None,
               via: str = VIA_CALLBACK, fail_idempotency: bool = False, delay: float | None = None) -> None:
        self.steps.append(Notify(self.wait(0.05, 0.3) if delay is None else delay, trade_no, status,
                                 self.amount if amount is None else amount, via, fail_idempotency))

    def deliver(self, trade_no: str, status: str) -> None:
        """At-least-once delivery: the channel retries while our acknowledgement gets lost."""
        u = self.rng.random()
        for _ in range(1 + (u > 0.8) + (u > 0.95)):
            self.notify(trade_no, status, delay=self.wait(0.05, 0.4))


def _clean(s: _Script) -> HandlerPolicy:
    u = s.rng.random()
    outcomes = (["success"] if u < 0.88 else ["failed", "success"] if u < 0.96
                else ["failed"] if u < 0.98 else ["failed", "failed"])
    for attempt, status in enumerate(outcomes):
        trade_no = s.pay(attempt)
        if status == "success" and s.rng.random() < 0.04:
            s.notify(trade_no, via=VIA_QUERY, delay=COMPENSATE_AFTER)  # the callback never came
        else:
            s.deliver(trade_no, status)
    if outcomes[-1] == "success":
        if s.rng.random() < 0.25:
            s.steps.append(PickUp(s.wait(0.1, 0.5)))
        if s.rng.random() < 0.1:
            s.steps.append(Refund(s.wait(0.1, 0.5), trade_no))
    else:
        s.steps.append(Close(s.wait(0.2, 0.5)))
    return HandlerPolicy()


# Each story returns the handler it runs against and the keys its fault concerns besides the
# order: the payment for payment-level rules; findings about orders carry the order only.
Keys = dict[str, str]


def _retry_no_idempotency(s: _Script) -> tuple[HandlerPolicy, Keys]:
    trade_no = s.pay(0)
    for _ in range(s.rng.choice((2, 3))):
        s.notify(trade_no, delay=s.wait(0.05, 0.4))
    return HandlerPolicy(idempotency="none"), {"trade_no": trade_no}


def _ship_before_idempotency(s: _Script) -> tuple[HandlerPolicy, Keys]:
    trade_no = s.pay(0)
    s.notify(trade_no, fail_idempotency=True)
    s.notify(trade_no, delay=s.wait(0.2, 0.4))
    return HandlerPolicy(ship_first=True), {"trade_no": trade_no}


def _compensation_and_callback(s: _Script) -> tuple[HandlerPolicy, Keys]:
    trade_no = s.pay(0)
    s.notify(trade_no, via=VIA_QUERY, delay=s.wait(0.3, 0.6))
    s.notify(trade_no, delay=s.wait(0.2, 0.5))  # the late callback
    return HandlerPolicy(query_own_key=True), {"trade_no": trade_no}


def _second_channel_success(s: _Script) -> tuple[HandlerPolicy, Keys]:
    first, second = s.pay(0), s.pay(1)
    s.notify(first)
    s.notify(second)
    return HandlerPolicy(), {}


def _idempotency_on_order(s: _Script) -> tuple[HandlerPolicy, Keys]:
    s.notify(s.pay(0), "failed")
    s.deliver(s.pay(1), "success")
    return HandlerPolicy(idempotency="order"), {}


def _callback_lost(s: _Script) -> tuple[HandlerPolicy, Keys]:
    s.pay(0)
    return HandlerPolicy(), {}


def _refunded_then_paid(s: _Script) -> tuple[HandlerPolicy, Keys]:
    trade_no = s.pay(0)
    s.notify(trade_no)
    s.steps.append(Refund(s.wait(0.1, 0.3), trade_no))
    # A redelivery the channel still had queued: the order becomes paid a second time, and that
    # second change is announced by a second order.paid (a change of its own, no duplicate).
    s.notify(trade_no, delay=s.wait(0.2, 0.4))
    return HandlerPolicy(state_machine=False), {}


def _amount_mismatch(s: _Script) -> tuple[HandlerPolicy, Keys]:
    trade_no = s.pay(0)
    off = s.rng.choice((Decimal("0.01"), (s.amount / 10).quantize(Decimal("0.01"))))
    s.notify(trade_no, amount=s.amount - off)
    return HandlerPolicy(verify_amount=False), {"trade_no": trade_no}


def _status_not_whitelisted(s: _Script) -> tuple[HandlerPolicy, Keys]:
    trade_no = s.pay(0)
    raw = s.rng.choice(("SUCCESS", "pending"))
    s.notify(trade_no, raw)
    if raw == "pending":
        s.notify(trade_no, delay=s.wait(0.2, 0.5))  # the real success comes later and is a duplicate
    return HandlerPolicy(whitelist=False), {"trade_no": trade_no}


_PER_ORDER = {
    "retry_no_idempotency": _retry_no_idempotency,
    "ship_before_idempotency": _ship_before_idempotency,
    "compensation_and_callback": _compensation_and_callback,
    "second_channel_success": _second_channel_success,
    "idempotency_on_order": _idempotency_on_order,
    "callback_lost": _callback_lost,
    "refunded_then_paid": _refunded_then_paid,
    "amount_mismatch": _amount_mismatch,
    "status_not_whitelisted": _status_not_whitelisted,
}
_SEND_KINDS = {"send_lost": Kind.LOST, "send_then_rollback": Kind.ROLLBACK,
               "send_retried": Kind.DUPLICATE, "send_slow": Kind.SLOW}


def _send_fault(s: _Script, mode: Mode) -> HandlerPolicy:
    trade_no = s.pay(0)
    kind = _SEND_KINDS[mode.name]
    s.notify(trade_no)
    if kind is Kind.ROLLBACK:
        # Shipments are written first, so only shipment.created has been sent at the failure;
        # the channel then retries and the second attempt commits with a new shipment_id.
        s.notify(trade_no, delay=s.wait(0.2, 0.4))
    event_type = SHIPMENT_CREATED if kind is Kind.ROLLBACK else s.rng.choice(SUCCESS_EVENTS)
    s.event_fault = EventFault(mode.name, mode.rule, kind, event_type)
    return HandlerPolicy()


def build(seed: int, index: int, tag: str, mix: FaultMix) -> OrderPlan:
    rng = random.Random(f"{seed}:{index}")
    mode = mix.mode_for(index, rng.random())
    s = _Script(rng, index, tag)
    keys: Keys = {}
    if mode is None:
        policy = _clean(s)
    elif mode.name in _SEND_KINDS:
        policy = _send_fault(s, mode)  # its keys are the event's, known when it is sent
    else:
        policy, extra = _PER_ORDER[mode.name](s)
        keys = {"order_no": s.order_no, **extra}
    return OrderPlan(index=index, order_no=s.order_no, user_id=s.user_id, amount=s.amount,
                     steps=tuple(s.steps), policy=policy, mode=mode, fault_keys=keys,
                     event_fault=s.event_fault)
