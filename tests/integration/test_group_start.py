"""A group instance started while the Kafka broker is away (issue 42): it waits for the broker, says so in its log,
and joins its group once the broker is back, instead of exiting 1 on its first call to it."""

from __future__ import annotations

import time

from devservices import postgres, stack
from devservices.group_runs import Member, first_start, group_config, members_of
from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import SHORT_RULES, new_topic, shop_settings
from oncewatch import shop

from .conftest import wait_for

AWAY_SECONDS = 8.0  # a client made meanwhile fails its bootstrap ~30 s after it began: after the broker is back


def test_a_member_started_while_the_broker_is_down_waits_for_it_and_joins_its_group(cdc_connector, tmp_path):
    """Before: `oncewatch run` of a group member exited 1 ("internal error: KafkaTimeoutError: Unable to bootstrap"),
    its admin client's first call to the broker failing, so a machine rebooted during a broker restart left the
    group one short. Now it waits, logs `group_kafka_unavailable` once and counts the wait on its health row."""
    topic = new_topic()
    shop.run(shop_settings(topic, schema=CDC_SCHEMA, orders=0, reset=True))
    with postgres.new_schema() as store:
        config = group_config(tmp_path / "group", topic, store, 2, SHORT_RULES)
        first_start(config)
        stack.kafka_down()
        try:
            member = Member(config, "late")
            time.sleep(AWAY_SECONDS)
            assert member.process.poll() is None, member.tail()
        finally:
            stack.kafka_up()
        try:
            assert "group_kafka_unavailable" in member.log.read_text(), member.tail()
            wait_for("the member's first health row", lambda: member.name in members_of(config), timeout=120)
            assert member.process.poll() is None, member.tail()
            row = members_of(config)[member.name]
            assert row["kafka_outages"] == 1 and row["kafka_outage_seconds"] >= AWAY_SECONDS, row
        finally:
            assert member.stop() == 0, member.tail()
