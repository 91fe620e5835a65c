"""The chaos soak's plan and judgement (devservices/chaos.py), without servers: which kills, when, and what counts
as a disturbed monitor agreeing with its control."""

from __future__ import annotations

import random

from devservices.chaos import KINDS, Soak, _judge, plan
from oncewatch.core.records import Evidence, Finding


def finding(fid: str, rule: str, *coordinates: str, status: str = "open") -> Finding:
    return Finding(id=fid, rule=rule, name=rule, severity="critical", keys={}, summary="", first_seen=1.0,
                   last_seen=1.0, status=status,
                   evidence=tuple(Evidence(kind="row_change", coordinates=c, time=1.0, values={}) for c in coordinates))


def test_the_plan_is_the_seeds_every_kind_of_the_modes_so_many_times_within_the_traffic():
    soak = Soak(seconds=600, rate=10, kills=3, seed=5)
    kills = plan(soak, random.Random(soak.seed))
    assert kills == plan(soak, random.Random(soak.seed))
    assert sorted(k for _, k, _ in kills) == sorted(KINDS * 3)
    assert all(30 <= at <= 480 and soak.down[0] <= down <= soak.down[1] for at, _, down in kills)
    assert [at for at, _, _ in kills] == sorted(at for at, _, _ in kills)


def test_a_binlog_soak_kills_only_what_the_binlog_monitor_reads():
    assert Soak(seconds=60, rate=5, kills=2, modes=("binlog",)).kinds == ("broker", "mariadb")
    assert Soak(seconds=60, rate=5, kills=2, modes=("cdc-source",)).kinds == ("broker", "mariadb", "connect")


def test_only_a_replay_in_a_cdc_mode_may_be_added_to_the_controls_findings():
    control = [finding("a", "F1", "binlog.1:10#0-1-5/1")]
    replayed = [*control, finding("r", "F15", "cdc.owcdc.orders/0@7")]
    assert _judge("cdc-source", replayed, control, []).equal
    assert _judge("cdc-source", replayed, control, []).replayed == 1
    assert not _judge("binlog", replayed, control, []).equal
    assert not _judge("cdc-check", [*control, finding("x", "F13", "binlog.1:10#0-1-5/2")], control, []).equal


def test_missing_findings_other_evidence_and_unexpected_exits_are_differences():
    control = [finding("a", "F1", "binlog.1:10#0-1-5/1", "binlog.1:20#0-1-6/1")]
    assert not _judge("binlog", [], control, []).equal
    assert not _judge("binlog", [finding("a", "F1", "binlog.1:10#0-1-5/1")], control, []).equal
    assert not _judge("binlog", [finding("a", "F1", "binlog.1:10#0-1-5/1", "binlog.1:20#0-1-6/1",
                                         status="resolved")], control, []).equal
    assert not _judge("binlog", control, control, ["unexpected: exited 1 during the soak"]).equal
    assert _judge("group", control, control, ["member m0 SIGKILLed (exit -9, by the kill)"]).equal


def test_a_groups_offset_readings_agree_by_status_their_evidence_being_when_they_were_taken():
    control = [finding("s", "F11", "offsets@1000")]
    later = [finding("s", "F11", "offsets@1003")]
    assert _judge("group", later, control, []).equal
    assert not _judge("binlog", later, control, []).equal
