"""A group instance and a Kafka broker that is away (issue 42): started while the broker is down, or running when it
is SIGKILLed and slow to come back, the instance waits for the broker, says so in its log, counts it, and (re)joins
its group once the broker is back, instead of exiting."""

from __future__ import annotations

import time

from devservices import broker, postgres
from devservices.group_runs import Member, first_start, group_config, members_of
from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import SHORT_RULES, new_topic, shop_settings
from oncewatch import shop

from .conftest import wait_for

# past the 30 s a client made meanwhile tries to bootstrap for: shorter, and a retry may find the broker back
AWAY_SECONDS = 35.0
# long enough for the instance's clients to fail (in the chaos soak a broker SIGKILLed took 35 s to serve again)
KILLED_SECONDS = 20.0


def test_a_member_waits_out_a_broker_away_at_its_start_and_while_it_runs(cdc_connector, tmp_path):
    """Before: `oncewatch run` of a group member exited 1 ("internal error: KafkaTimeoutError: Unable to bootstrap"),
    its admin client's first call to the broker failing, so a machine rebooted during a broker restart left the
    group one short; and in the chaos soak two running members whose broker was SIGKILLed and back 35 s later
    exited 3 ("KafkaConnectionError: 111 ECONNREFUSED", their judges rejoining meanwhile), and the group judged
    nothing more. Now it waits, logs `group_kafka_unavailable` and counts each outage on its health row."""
    topic = new_topic()
    shop.run(shop_settings(topic, schema=CDC_SCHEMA, orders=0, reset=True))
    with postgres.new_schema() as store:
        config = group_config(tmp_path / "group", topic, store, 2, SHORT_RULES)
        first_start(config)
        broker.kafka_down()
        try:
            member = Member(config, "late")
            time.sleep(AWAY_SECONDS)
            assert member.process.poll() is None, member.tail()
        finally:
            broker.kafka_up()
        try:
            assert "group_kafka_unavailable" in member.log.read_text(), member.tail()
            wait_for("the member's first health row", lambda: member.name in members_of(config), timeout=120)
            assert member.process.poll() is None, member.tail()
            row = members_of(config)[member.name]
            assert row.kafka_outages == 1 and row.kafka_outage_seconds >= AWAY_SECONDS, row
            broker.kafka_kill()
            try:
                time.sleep(KILLED_SECONDS)
            finally:
                broker.kafka_up()
            back = time.time()
            # its parts ride the outage out, or one fails (a rejoin's new client cannot bootstrap, as two members'
            # did in the soak) and the instance starts again once the broker answers: either way it goes on
            wait_for("the member's health row after the broker is back",
                     lambda: members_of(config)[member.name].at > back + 5, timeout=180)
            assert member.process.poll() is None, member.tail()
            assert members_of(config)[member.name].kafka_outages >= 1
        finally:
            assert member.stop() == 0, member.tail()
