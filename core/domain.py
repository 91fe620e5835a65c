"""The shop's shape and the rules' thresholds: the [domain], [[announce]] and [rules] sections.

Parsed into frozen objects by `oncewatch.core.config.parse` (which calls the `parse_*` functions
here); the engine takes them as one `oncewatch.checks.settings.Settings`. Every error names the dotted key, and cross
references are checked: tables must be in `mysql.tables`, topics in `kafka.topics`, statuses
in the state machine. A part of [domain] that is left out switches off the rules that need it
(no [domain.orders]: no F3/F4/F5; no [domain.payments]: no F2/F5/F6; no effects: no F1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from oncewatch.core.exact_json import decimal_shift
from oncewatch.core.sections import ConfigError, Section

if TYPE_CHECKING:
    from oncewatch.core.config import KafkaConfig, MySQLConfig

OPS = ("insert", "update", "delete")


def in_unit(amount: Decimal, scale: Decimal) -> Decimal:
    """An amount divided by its `amount_scale`, a power of ten: the exponent is shifted, which is exact and keeps
    the digits (82360 cents are 823.60)."""
    return amount if scale == 1 else decimal_shift(amount, -scale.adjusted())


@dataclass(frozen=True)
class Orders:
    table: str
    key_columns: tuple[str, ...]  # one column, or the columns of a composite key (order_no + tenant)
    status_column: str
    amount_column: str | None
    pending_statuses: tuple[str, ...]
    # a status as the table holds it -> its name in the state machine ("PAID" and "Paid" -> "paid")
    status_aliases: dict[str, str] = field(default_factory=dict, hash=False)
    amount_scale: Decimal = Decimal(1)

    def status(self, row: dict[str, Any]) -> Any:
        """The row's status by its state-machine name."""
        value = row.get(self.status_column)
        return self.status_aliases.get(value, value) if self.status_aliases else value


@dataclass(frozen=True)
class Payments:
    table: str
    trade_no_column: str
    order_columns: tuple[str, ...]  # the order's key, as many columns as domain.orders.key_column
    status_column: str
    amount_column: str | None
    success_statuses: tuple[str, ...]
    callback_status_column: str | None
    callback_status_whitelist: tuple[str, ...]
    amount_scale: Decimal = Decimal(1)


@dataclass(frozen=True)
class Callbacks:
    """A log of the notifications a channel sent, one row each, linked to its payment by trade_no: F6 and F5
    are judged on what the channel sent, where the payments table holds only the service's own result."""

    table: str
    trade_no_column: str
    status_column: str
    status_whitelist: tuple[str, ...]
    amount_column: str | None
    success_statuses: tuple[str, ...]  # the statuses that say "paid": F5 compares their amount with the order's
    amount_scale: Decimal = Decimal(1)


@dataclass(frozen=True)
class Effect:
    """A table whose rows are side effects of one payment (shipments, pick-up codes, ...)."""

    table: str
    trade_no_column: str


@dataclass(frozen=True)
class Domain:
    orders: Orders | None = None
    payments: Payments | None = None
    callbacks: Callbacks | None = None
    state_machine: dict[str, tuple[str, ...]] | None = None
    effects: tuple[Effect, ...] = ()


@dataclass(frozen=True)
class Announce:
    """A committed change that must appear on Kafka as `event_type` keyed by `row[key_column]`.

    The change is selected by `on` (an op) and/or `when_column` becoming `becomes`.
    """

    table: str
    on: str | None
    when_column: str | None
    becomes: str | None
    topic: str
    event_type: str
    key_columns: tuple[str, ...]
    event_key: str
    # when_column is the orders' status column: its values are read through the orders' aliases
    aliases: dict[str, str] = field(default_factory=dict, hash=False)
    # the topic's compare / ignore paths (what F9 compares of two events announcing one key)
    compare: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns the evidence of a change shows."""
        return self.key_columns if self.when_column is None else (*self.key_columns, self.when_column)

    def left(self, row: dict[str, Any]) -> bool:
        """A row as a snapshot shows it may be what this entry's change left (an inserted row, an order in the
        status it `becomes`); a delete leaves none."""
        return self.on != "delete" and self.selects(self.on or "insert", None, row)

    def selects(self, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> bool:
        if self.on is not None and op != self.on:
            return False
        if self.when_column is None:
            return True
        if after is None:
            return False
        # runs for every change of an announced table: the aliases are looked up inline
        column, aliases = self.when_column, self.aliases
        now = after.get(column)
        if str(aliases.get(now, now) if aliases else now) != self.becomes:
            return False
        if before is None:
            return True
        was = before.get(column)
        return str(aliases.get(was, was) if aliases else was) != self.becomes


@dataclass(frozen=True)
class Rules:
    stuck_pending_seconds: float = 900.0
    missing_event_grace_seconds: float = 30.0
    orphan_event_grace_seconds: float = 30.0
    event_delay_seconds: float = 0.5
    offset_drift_threshold: int = 5000
    partition_skew_threshold: float = 3.0
    partition_skew_relative: float = 0.5  # and the deviation over the mean lag: a uniform stall is not skew
    partition_skew_seconds: float = 60.0  # for this long: a stall's first seconds look uneven too
    # a group's lag read again after a reading of it failed (the broker away) is not judged (F11, F12) for this
    # long: its consumers catching up after a broker's restart are maintenance
    lag_settle_seconds: float = 30.0
    horizon_seconds: float = 86400.0
    horizon_max_entries: int = 1_000_000
    ack_timeout_seconds: float = 14400.0  # an acknowledgement of a still open finding lapses then: it pages again
    caught_up_seconds: float = 5.0  # both streams read to within this: the monitor is caught up (its verdict)
    # CDC check mode (checks.pipeline): a binlog row is lost by the pipeline once the CDC topics have delivered
    # transactions committed this long after it without it; a CDC record is a phantom once the binlog has
    cdc_lost_grace_seconds: float = 60.0
    # bytes of binlog between the oldest transaction the CDC topics have not delivered and the binlog's newest
    # (the seed's "binlog-Kafka position difference"): above it, the pipeline is far behind (an alert)
    cdc_position_gap_threshold: int = 5000


# ---------------------------------------------------------------- parsing

def _table(s: Section, name: str, mysql: MySQLConfig) -> str:
    table = s.str(name, required=True)
    if table not in mysql.tables:
        raise ConfigError(f"{s.key(name)}: not one of mysql.tables ({table!r})")
    return table


def _orders(s: Section, mysql: MySQLConfig) -> Orders:
    orders = Orders(table=_table(s, "table", mysql), key_columns=s.names("key_column", required=True),
                    status_column=s.str("status_column", required=True),
                    amount_column=s.opt_str("amount_column"),
                    pending_statuses=s.str_list("pending_statuses", required=True, nonempty=True),
                    status_aliases=s.str_map("status_aliases"), amount_scale=Decimal(s.scale()))
    s.done()
    return orders


def _payments(s: Section, mysql: MySQLConfig, orders: Orders | None) -> Payments:
    callback_column = s.opt_str("callback_status_column")
    payments = Payments(table=_table(s, "table", mysql), trade_no_column=s.str("trade_no_column", required=True),
                        order_columns=s.names("order_column", required=True),
                        status_column=s.str("status_column", required=True),
                        amount_column=s.opt_str("amount_column"),
                        success_statuses=s.str_list("success_statuses", required=True, nonempty=True),
                        callback_status_column=callback_column,
                        callback_status_whitelist=s.str_list("callback_status_whitelist",
                                                             required=callback_column is not None),
                        amount_scale=Decimal(s.scale()))
    if orders is not None and len(payments.order_columns) != len(orders.key_columns):
        raise ConfigError(f"{s.key('order_column')}: {len(payments.order_columns)} column(s) for an order key of "
                          f"{len(orders.key_columns)} (domain.orders.key_column); list them in the same order")
    s.done()
    return payments


def _callbacks(s: Section, mysql: MySQLConfig, payments: Payments | None) -> Callbacks:
    if payments is None:
        raise ConfigError(f"{s.key('table')}: a callback log is linked to its order through the payments "
                          f"table by trade_no; configure [domain.payments] too")
    if payments.callback_status_column is not None:
        raise ConfigError(f"{s.key('table')}: callback statuses are read from the log table or from "
                          f"domain.payments.callback_status_column, not both")
    amount_column = s.opt_str("amount_column")
    callbacks = Callbacks(table=_table(s, "table", mysql), trade_no_column=s.str("trade_no_column", required=True),
                          status_column=s.str("status_column", required=True),
                          status_whitelist=s.str_list("status_whitelist", required=True, nonempty=True),
                          amount_column=amount_column,
                          success_statuses=s.str_list("success_statuses", required=amount_column is not None,
                                                      nonempty=amount_column is not None),
                          amount_scale=Decimal(s.scale()))
    if callbacks.table == payments.table:
        raise ConfigError(f"{s.key('table')}: the callback log must be a table of its own, not the payments table")
    s.done()
    return callbacks


def _state_machine(s: Section) -> dict[str, tuple[str, ...]]:
    machine = {status: s.str_list(status, required=True) for status in s.data}
    for status, targets in machine.items():
        for target in targets:
            if target not in machine:
                raise ConfigError(f"{s.key(status)}: {target!r} is not a status of the state machine "
                                  f"(add a line {target} = [...])")
    s.done()
    return machine


def _effect(s: Section, mysql: MySQLConfig) -> Effect:
    effect = Effect(table=_table(s, "table", mysql), trade_no_column=s.str("trade_no_column", required=True))
    s.done()
    return effect


def parse_domain(s: Section, mysql: MySQLConfig) -> Domain:
    orders_s, payments_s, machine_s = s.section("orders"), s.section("payments"), s.section("state_machine")
    callbacks_s = s.section("callbacks")
    orders = _orders(orders_s, mysql) if orders_s.data else None
    payments = _payments(payments_s, mysql, orders) if payments_s.data else None
    callbacks = _callbacks(callbacks_s, mysql, payments) if callbacks_s.data else None
    machine = _state_machine(machine_s) if machine_s.data else None
    effects = tuple(_effect(e, mysql) for e in s.sections("effects"))
    s.done()
    if machine is not None and orders is not None:
        for status in orders.pending_statuses:
            if status not in machine:
                raise ConfigError(f"{orders_s.key('pending_statuses')}: {status!r} is not a status of "
                                  f"{machine_s.path}")
        for alias, status in orders.status_aliases.items():
            if status not in machine:
                raise ConfigError(f"{orders_s.key('status_aliases')}.{alias}: {status!r} is not a status of "
                                  f"{machine_s.path}")
    tables = [e.table for e in effects]
    for i, table in enumerate(tables):
        if table in tables[:i]:
            raise ConfigError(f"{s.key('effects')}[{i}].table: {table!r} is listed twice")
    return Domain(orders=orders, payments=payments, callbacks=callbacks, state_machine=machine, effects=effects)


def _announce(s: Section, mysql: MySQLConfig, kafka: KafkaConfig | None, domain: Domain) -> Announce:
    table = _table(s, "table", mysql)
    on = s.opt_str("on")
    if on is not None and on not in OPS:
        raise ConfigError(f"{s.key('on')}: must be one of {', '.join(OPS)}, got {on!r}")
    when_column = s.opt_str("when_column")
    becomes = s.str("becomes", required=True) if when_column is not None else None
    if on is None and when_column is None:
        raise ConfigError(f"{s.key('on')}: give on = \"insert\"|\"update\"|\"delete\" or when_column + becomes")
    orders = domain.orders
    if (becomes is not None and orders is not None and domain.state_machine is not None
            and table == orders.table and when_column == orders.status_column
            and becomes not in domain.state_machine):
        raise ConfigError(f"{s.key('becomes')}: {becomes!r} is not a status of domain.state_machine")
    topic = s.str("topic", required=True)
    topics = {t.name: (i, t) for i, t in enumerate(kafka.topics)} if kafka else {}
    if topic not in topics:
        raise ConfigError(f"{s.key('topic')}: not one of kafka.topics ({topic!r})")
    index, topic_cfg = topics[topic]
    if topic_cfg.format != "json":
        raise ConfigError(f"{s.key('topic')}: {topic!r} has format {topic_cfg.format}; announcements are matched "
                          f"on json topics only")
    event_key = s.str("event_key", required=True)
    for path_key in ("event_type", event_key):
        if path_key not in topic_cfg.paths:
            raise ConfigError(f"{s.key('event_key') if path_key == event_key else s.key('topic')}: "
                              f"{path_key!r} has no entry in kafka.topics[{index}].paths")
    key_columns = s.names("key_column", required=True)
    path = topic_cfg.paths[event_key]
    parts = 1 if isinstance(path, str) else len(path)
    if parts != len(key_columns):
        raise ConfigError(f"{s.key('key_column')}: {len(key_columns)} column(s) for kafka.topics[{index}].paths."
                          f"{event_key}, which has {parts} path(s); a composite key needs as many of each, in "
                          f"the same order")
    aliases = orders.status_aliases if (orders is not None and table == orders.table
                                        and when_column == orders.status_column) else {}
    announce = Announce(table=table, on=on, when_column=when_column, becomes=becomes, topic=topic,
                        event_type=s.str("event_type", required=True), key_columns=key_columns,
                        event_key=event_key, aliases=aliases, compare=topic_cfg.compare, ignore=topic_cfg.ignore)
    s.done()
    return announce


def parse_announce(sections: list[Section], mysql: MySQLConfig, kafka: KafkaConfig | None,
                   domain: Domain) -> tuple[Announce, ...]:
    out: list[Announce] = []
    for s in sections:
        a = _announce(s, mysql, kafka, domain)
        for j, other in enumerate(out):
            if (other.topic, other.event_type) == (a.topic, a.event_type):
                raise ConfigError(f"{s.key('event_type')}: {a.event_type!r} on {a.topic!r} is already announced "
                                  f"by announce[{j}]; an event must map to one kind of change")
        out.append(a)
    return tuple(out)


def parse_rules(s: Section) -> Rules:
    d = Rules()
    rules = Rules(
        stuck_pending_seconds=s.float("stuck_pending_seconds", d.stuck_pending_seconds),
        missing_event_grace_seconds=s.float("missing_event_grace_seconds", d.missing_event_grace_seconds),
        orphan_event_grace_seconds=s.float("orphan_event_grace_seconds", d.orphan_event_grace_seconds),
        event_delay_seconds=s.float("event_delay_seconds", d.event_delay_seconds),
        offset_drift_threshold=s.int("offset_drift_threshold", d.offset_drift_threshold, minimum=0),
        partition_skew_threshold=s.float("partition_skew_threshold", d.partition_skew_threshold),
        partition_skew_relative=s.float("partition_skew_relative", d.partition_skew_relative),
        partition_skew_seconds=s.float("partition_skew_seconds", d.partition_skew_seconds),
        lag_settle_seconds=s.float("lag_settle_seconds", d.lag_settle_seconds, minimum=0.0),
        horizon_seconds=s.float("horizon_seconds", d.horizon_seconds, minimum=1.0),
        horizon_max_entries=s.int("horizon_max_entries", d.horizon_max_entries, minimum=1),
        ack_timeout_seconds=s.float("ack_timeout_seconds", d.ack_timeout_seconds, minimum=1.0),
        caught_up_seconds=s.float("caught_up_seconds", d.caught_up_seconds, minimum=0.1),
        cdc_lost_grace_seconds=s.float("cdc_lost_grace_seconds", d.cdc_lost_grace_seconds, minimum=0.0),
        cdc_position_gap_threshold=s.int("cdc_position_gap_threshold", d.cdc_position_gap_threshold, minimum=0),
    )
    s.done()
    if rules.horizon_seconds <= max(rules.stuck_pending_seconds, rules.missing_event_grace_seconds,
                                    rules.orphan_event_grace_seconds, rules.cdc_lost_grace_seconds):
        raise ConfigError(f"{s.key('horizon_seconds')}: must be longer than every grace period and "
                          f"stuck_pending_seconds, got {rules.horizon_seconds:g}")
    return rules
