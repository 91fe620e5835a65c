"""F8 on a new store, with the real binlog monitor (issue 42, observation 6): an orphan event read after the
monitor's start is judged whether or not a change was announced before it, while the events of changes
committed before the monitor's start (its bootstrap's snapshot) are not orphans.

Before: the watch began at the first announced change the monitor read, and the orphans produced before it
were only counted in an info line (`events_before_watch`), never judged.
"""

from __future__ import annotations

from devservices.shop_monitor import findings, new_topic, run_until_idle, shop_config, shop_settings
from oncewatch import shop

from .by_hand import announce, effect_event, execute
from .shop_monitor import FIRST_IDLE, IDLE

ORDER_PAID = {"type": "order.paid", "trade_no": "T-PRE", "amount": "10.00", "status": "paid"}


def test_orphans_before_any_announced_change_are_f8_and_changes_before_the_start_explain_theirs(tmp_path):
    topic = new_topic()
    shop.run(shop_settings(topic, orders=0, reset=True))
    # Committed before the monitor's first start: in its bootstrap's snapshot, not in the binlog it tails.
    execute("INSERT INTO shipments VALUES (4601, 'T-4601', 'O-4601', 'PRE601', NOW(3))",
            "INSERT INTO orders VALUES ('O-PRE', 7, 10.00, 'paid', NOW(3), NOW(3))")
    config = shop_config(tmp_path, topic=topic)
    run_until_idle(config, idle=FIRST_IDLE)  # a new store: the bootstrap, Kafka from its end

    # After the start: the events of those two changes, three orphans, then the first announced change.
    announce(topic, effect_event("shipment.created", 4601), {**ORDER_PAID, "order_no": "O-PRE"},
             effect_event("shipment.created", 4691), effect_event("points.granted", 4692),
             {**ORDER_PAID, "order_no": "O-GHOST"})
    execute("INSERT INTO shipments VALUES (4602, 'T-4602', 'O-4602', 'NEW602', NOW(3))")
    announce(topic, effect_event("shipment.created", 4602))
    run_until_idle(config, idle=IDLE)  # the orphans wait out their 4 s grace

    found = sorted((f.rule, f.keys["event_type"], f.keys["key"], f.status) for f in findings(config))
    assert found == [("F8", "order.paid", "O-GHOST", "open"), ("F8", "points.granted", "4692", "open"),
                     ("F8", "shipment.created", "4691", "open")]
