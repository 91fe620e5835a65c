"""The monitor scored against the simulated shop's ground truth (issue 5's acceptance).

A seeded run with every fault mode on, then `oncewatch run --until-idle`: every injected fault
found (recall 100% per mode) and every finding explained by a fault (precision 100%). The
same with each announcement style (each style brings the faults it can produce), and runs
with no faults give no findings at all.
"""

from __future__ import annotations

import pytest

from devservices.shop_monitor import SHORT_RULES, findings, run_until_idle, shop_config, shop_settings
from oncewatch import shop
from oncewatch.shop.settings import STYLE_AFTER_COMMIT, STYLE_IN_TRANSACTION, STYLE_OUTBOX

from .shop_monitor import IDLE, prepared, score


# F10 at 1.5 s here, between the shop's slow sends (2 s late, the send_slow fault) and the delays its
# clean sends really have on a busy CI machine (up to 1.24 s seen once, in a full suite run): the
# monitor was right about those, they are no fault of the shop's to score. F10 at its 0.5 s default is
# tested by its unit tests and by the all-faults runs of test_shop and test_under_fire.
# F11 at 2,000 records: a group stalled from the start passes it within 1,000 orders (some 4,000 events), so
# the runs need not be twice as long to reach the default 5,000 (which the rule's unit tests judge at).
SCORING_RULES = {**SHORT_RULES, "event_delay_seconds": 1.5, "offset_drift_threshold": 2000}


def scored_run(tmp_path, **settings):
    _, topic = prepared(tmp_path)
    config = shop_config(tmp_path, topic=topic, rules=SCORING_RULES)
    truth = shop.run(shop_settings(topic, **settings))
    assert not truth.incidents, truth.incidents
    run_until_idle(config, idle=IDLE)
    result = score(truth, findings(config))
    print(f"\n{settings}\n{result.table()}")
    return truth, result


def test_every_fault_mode_found_and_nothing_else(tmp_path):
    truth, result = scored_run(tmp_path, seed=11, orders=1000, rate=100, faults="all")
    assert len(result.injected) == 14  # every mode the default style can produce
    assert result.found == result.injected, result.table()
    assert result.unexplained == [], [(f.rule, f.keys, f.summary) for f in result.unexplained[:10]]


@pytest.mark.parametrize("style, only_there", [(STYLE_IN_TRANSACTION, "send_then_rollback"),
                                               (STYLE_OUTBOX, None)])
def test_each_announcement_style_its_faults_found(tmp_path, style, only_there):
    # Long enough for the stalled group to pass F11's 2000 records: a stall of the whole group is not F12.
    truth, result = scored_run(tmp_path, seed=13, orders=1000, rate=100, faults="all", style=style)
    if only_there:
        assert only_there in result.injected
    assert "send_lost" not in result.injected or style != STYLE_OUTBOX  # the outbox cannot lose a send
    assert result.found == result.injected, result.table()
    assert result.unexplained == [], [(f.rule, f.keys, f.summary) for f in result.unexplained[:10]]


@pytest.mark.parametrize("style", [STYLE_AFTER_COMMIT, STYLE_OUTBOX])
def test_clean_run_gives_zero_findings(tmp_path, style):
    truth, result = scored_run(tmp_path, seed=12, orders=500, rate=100, faults="none", style=style)
    assert list(truth.faults) == []
    assert result.unexplained == []
