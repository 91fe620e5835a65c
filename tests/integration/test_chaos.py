"""The short chaos soak (issue 42, Deliver 8): the shop's traffic with every fault on while the broker, MariaDB,
the Connect worker and a group member are each SIGKILLed and started again at a seeded random instant; every
mode's monitor (binlog, CDC source, CDC check, group) ends with the findings of an undisturbed control reading the
same traffic (ids, rules, statuses, evidence; F15 added where the connector replayed), and no monitor exits but the
killed members. It runs in a lane of its own, on a third stack (devservices.suite.CHAOS). bench/chaos.py is the same
soak for 10 minutes and more.
"""

from __future__ import annotations

from devservices.chaos import KINDS, MODES, Soak, run

# One kill of each kind (bench/chaos.py kills each kind 3 times and more, for 10 minutes): they are carried out one
# after the other, each service back before the next, within the traffic; on the 2-core test machine, with the other
# lanes of `make test` beside it, the broker and the Connect worker take up to 30 s each to start.
SHORT = Soak(seconds=120, rate=4, kills=1, down=(0.5, 2.0), seed=7)


def test_every_mode_disturbed_by_kills_of_every_kind_finds_what_its_control_finds(tmp_path, cdc_connector):
    report = run(SHORT, tmp_path, print)
    print("\n".join(report.lines()))
    kills = report.kills_per_kind()
    assert all(kills.get(kind, 0) >= SHORT.kills for kind in KINDS), kills
    assert [m.mode for m in report.modes] == list(MODES)
    different = {m.mode: (m.difference, m.exits) for m in report.modes if not m.equal}
    assert not different, "\n".join(report.lines())
