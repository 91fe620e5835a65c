"""[domain], [[announce]], [rules]: parsed into Config, errors naming the dotted key, cross references."""

import copy
import tomllib

import pytest

from devservices.samples import EXAMPLE_CONFIG, Shop, feed, order, shipment
from oncewatch.checks.engine import Engine
from oncewatch.checks.settings import Settings
from oncewatch.core.config import ConfigError, describe, parse

EXAMPLE = tomllib.loads(EXAMPLE_CONFIG.read_text())


def config(edit=None):
    data = copy.deepcopy(EXAMPLE)
    if edit:
        edit(data)
    return parse(data)


def error(edit) -> str:
    with pytest.raises(ConfigError) as exc:
        config(edit)
    return str(exc.value)


def test_example_config_gives_typed_settings():
    cfg = config()
    assert cfg.domain.orders.pending_statuses == ("pending",)
    assert cfg.domain.payments.callback_status_whitelist == ("success", "failed")
    assert cfg.domain.state_machine["paid"] == ("shipped", "refunded")
    assert [e.table for e in cfg.domain.effects] == ["shop.shipments", "shop.points_grants"]
    assert [(a.event_type, a.on, a.becomes) for a in cfg.announce][:3] == [
        ("order.paid", None, "paid"), ("order.refunded", None, "refunded"), ("shipment.created", "insert", None)]
    assert cfg.rules.missing_event_grace_seconds == 30 and cfg.rules.horizon_max_entries == 1_000_000
    assert describe(cfg)["rules"]["partition_skew_threshold"] == 3.0


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["announce"][2].update(table="shop.nope"), "announce[2].table: not one of mysql.tables"),
    (lambda d: d["announce"][0].update(topic="other"), "announce[0].topic: not one of kafka.topics"),
    (lambda d: d["announce"][0].update(event_key="customer"), "announce[0].event_key: 'customer' has no entry"),
    (lambda d: d["announce"][0].update(becomes="payed"), "announce[0].becomes: 'payed' is not a status"),
    (lambda d: d["announce"][0].update(on="upsert"), "announce[0].on: must be one of insert, update, delete"),
    (lambda d: d["announce"][2].pop("on"), "announce[2].on: give on ="),
    (lambda d: d["announce"][1].update(event_type="order.paid"), "announce[1].event_type: 'order.paid' on"),
    (lambda d: d["announce"][0].update(colour="red"), "announce[0].colour: unknown key"),
    (lambda d: d["domain"]["orders"].update(table="shop.order"), "domain.orders.table: not one of mysql.tables"),
    (lambda d: d["domain"]["orders"].pop("status_column"), "domain.orders.status_column: missing"),
    (lambda d: d["domain"]["orders"].update(pending_statuses=["waiting"]),
     "domain.orders.pending_statuses: 'waiting' is not a status of domain.state_machine"),
    (lambda d: d["domain"]["state_machine"].update(paid=["shipped", "lost"]),
     "domain.state_machine.paid: 'lost' is not a status"),
    (lambda d: d["domain"]["payments"].pop("callback_status_whitelist"),
     "domain.payments.callback_status_whitelist: missing"),
    (lambda d: d["domain"]["effects"][1].update(table="shop.shipments"),
     "domain.effects[1].table: 'shop.shipments' is listed twice"),
    (lambda d: d["rules"].update(event_delay_seconds="fast"), "rules.event_delay_seconds: expected a number"),
    (lambda d: d["rules"].update(horizon_seconds=60), "rules.horizon_seconds: must be longer than every grace"),
    (lambda d: d["rules"].update(stuck_seconds=1), "rules.stuck_seconds: unknown key"),
    (lambda d: d.pop("kafka"), "announce[0].topic: not one of kafka.topics"),
])
def test_errors_name_the_dotted_key(edit, message):
    assert message in error(edit)


def test_without_domain_and_announce_the_engine_runs_with_those_rules_off():
    def strip(d):
        d.pop("domain")
        d.pop("announce")
        d.pop("rules")
    cfg = config(strip)
    engine = Engine(Settings.from_config(cfg))
    shop = Shop()
    found = feed(engine, shop.tx(1, shipment("S1", "T1"), shipment("S2", "T1")), shop.tx(2, order("O1", "paid")))
    engine.tick(now=5000, binlog_time=5000, kafka_time=5000)
    assert found + engine.drain() == []
    assert engine.stats()["backlog_by_table"] == {}
