"""The fault modes the shop can inject, one seed story each, and the `--faults` mix syntax.

A mix gives each mode a rate: the share of orders that get that fault (one fault per order
at most, drawn from the order's own seeded random stream, so a seed fixes which orders get
which faults). The two consumer modes are not per order: any rate above 0 switches them on.
Modes about announcements exist only in the styles that can produce them: an outbox cannot
lose an event after the commit, and only a send inside the transaction can be rolled back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from oncewatch.shop.settings import STYLE_AFTER_COMMIT, STYLE_IN_TRANSACTION, STYLE_OUTBOX, STYLES

DEFAULT_RATE = 0.02


class FaultSpecError(ValueError):
    """A `--faults` spec names an unknown mode, a bad rate, or a mode the style cannot produce."""


@dataclass(frozen=True)
class Mode:
    name: str
    rule: str
    story: str
    styles: tuple[str, ...] = STYLES
    per_order: bool = True
    # Rules whose findings on the fault's keys are real effects of it too (see shop.truth).
    also: tuple[str, ...] = ()


MODES: tuple[Mode, ...] = (
    Mode("retry_no_idempotency", "F1", "the channel retries a callback and the handler has no "
         "idempotency check: one shipment and one points grant per delivery"),
    Mode("ship_before_idempotency", "F1", "the handler ships, then fails writing the idempotency "
         "record; the channel's retry ships again"),
    Mode("compensation_and_callback", "F1", "the compensation query and the late callback take "
         "separate paths with separate idempotency keys and both ship"),
    Mode("second_channel_success", "F2", "the customer pays again on another channel and both "
         "payments succeed"),
    Mode("idempotency_on_order", "F3", "idempotency keyed on the order: the first channel's failure "
         "takes the key, the second channel's success is dropped as a duplicate"),
    Mode("callback_lost", "F3", "the success callback never comes and nothing queries the channel"),
    Mode("refunded_then_paid", "F4", "a callback redelivered after the refund marks the order paid "
         "again: the handler sets the status before any check"),
    Mode("amount_mismatch", "F5", "the callback amount differs from the order and is booked as the "
         "payment amount"),
    Mode("status_not_whitelisted", "F6", "'SUCCESS' or 'pending' from the channel is taken as success"),
    Mode("send_lost", "F7", "the Kafka send fails after the commit and is not retried",
         styles=(STYLE_AFTER_COMMIT, STYLE_IN_TRANSACTION)),
    Mode("send_then_rollback", "F8", "the event is sent inside the transaction, then the "
         "transaction rolls back", styles=(STYLE_IN_TRANSACTION,)),
    Mode("send_retried", "F9", "the send is retried after a lost acknowledgement: the same event twice"),
    Mode("send_slow", "F10", "the event reaches Kafka well after the commit",
         styles=(STYLE_AFTER_COMMIT, STYLE_OUTBOX)),
    # Keys hash unevenly across partitions, so a stalled group's lags differ as well; and a
    # stalled partition's lag grows without bound, so over a long run its group drifts too.
    Mode("consumer_stall", "F11", "the shipping-service consumer group stops consuming early in "
         "the run", per_order=False, also=("F12",)),
    Mode("consumer_skew", "F12", "the points-service consumer group stops consuming one partition "
         "early in the run", per_order=False, also=("F11",)),
)
BY_NAME = {m.name: m for m in MODES}


@dataclass(frozen=True)
class FaultMix:
    """Rate per mode name; modes not listed are off."""

    rates: tuple[tuple[str, float], ...] = ()
    counts: tuple[tuple[str, int], ...] = ()  # `mode*N`: exactly N orders with that mode
    exact: tuple[tuple[int, str], ...] = ()  # (order index, mode) once the counts are placed in a run

    def rate(self, name: str) -> float:
        return dict(self.rates).get(name, 0.0)

    def on(self, name: str) -> bool:
        return self.rate(name) > 0

    def placed(self, seed: int, orders: int) -> FaultMix:
        """The counted modes given their orders: indexes drawn from the seed, spread over the run."""
        wanted = [name for name, n in self.counts for _ in range(n)]
        if len(wanted) > orders:
            raise FaultSpecError(f"--faults asks for {len(wanted)} counted faults but the run has {orders} orders")
        indexes = random.Random(f"{seed}:counted").sample(range(orders), len(wanted))
        return replace(self, exact=tuple(sorted(zip(indexes, wanted))))

    def mode_for(self, index: int, u: float) -> Mode | None:
        """This order's mode: a counted one placed on it, else what the rates give for u."""
        for placed_index, name in self.exact:
            if placed_index == index:
                return BY_NAME[name]
        return None if self.counts else self.pick(u)

    def pick(self, u: float) -> Mode | None:
        """The per-order mode whose slice of [0, 1) holds u, or None for a clean order."""
        edge = 0.0
        for name, rate in self.rates:
            mode = BY_NAME[name]
            if not mode.per_order:
                continue
            edge += rate
            if u < edge:
                return mode
        return None

    @classmethod
    def parse(cls, spec: str, style: str) -> FaultMix:
        """`all`, `none`, or comma-separated `mode[=rate]` / `F<n>[=rate]` (every mode of a rule).

        Items apply left to right, so `all,send_slow=0.1` is every mode at the default rate
        but slow sends at 10%. `all` leaves out what the style cannot produce; naming such a
        mode explicitly is an error.
        """
        rates: dict[str, float] = {}
        counts: dict[str, int] = {}
        for item in (part.strip() for part in spec.split(",")):
            if item in ("", "none"):
                continue
            if "*" in item:
                name, _, raw = item.partition("*")
                mode = BY_NAME.get(name)
                if mode is None or not mode.per_order or style not in mode.styles or not raw.isdigit():
                    raise FaultSpecError(f"--faults {item!r}: `mode*N` needs a per-order mode this style can "
                                         f"produce and a whole number")
                counts[name] = int(raw)
                continue
            name, _, raw = item.partition("=")
            rate = _rate(item, raw) if raw else DEFAULT_RATE
            if name == "all":
                rates.update({m.name: rate for m in MODES if style in m.styles})
                continue
            modes = [m for m in MODES if name in (m.name, m.rule)]
            if not modes:
                raise FaultSpecError(f"--faults {item!r}: unknown mode; known: {', '.join(BY_NAME)}, "
                                     f"or a rule F1..F12")
            for mode in modes:
                if style not in mode.styles:
                    raise FaultSpecError(f"--faults {item!r}: {mode.name} cannot happen with style {style}; "
                                         f"it needs {' or '.join(mode.styles)}")
                rates[mode.name] = rate
        total = sum(r for n, r in rates.items() if BY_NAME[n].per_order)
        if total > 1:
            raise FaultSpecError(f"--faults {spec!r}: per-order rates add up to {total:.2f}; at most 1")
        if counts and any(BY_NAME[n].per_order for n in rates):
            raise FaultSpecError(f"--faults {spec!r}: counted per-order modes (`mode*N`) do not mix with rates")
        return cls(tuple((m.name, rates[m.name]) for m in MODES if rates.get(m.name, 0) > 0),
                   tuple((m.name, counts[m.name]) for m in MODES if counts.get(m.name, 0) > 0))


def _rate(item: str, raw: str) -> float:
    try:
        rate = float(raw)
    except ValueError:
        raise FaultSpecError(f"--faults {item!r}: the rate must be a number between 0 and 1") from None
    if not 0 <= rate <= 1:
        raise FaultSpecError(f"--faults {item!r}: the rate must be between 0 and 1")
    return rate


__all__ = ["DEFAULT_RATE", "MODES", "BY_NAME", "Mode", "FaultMix", "FaultSpecError"]
