"""A finding's lifecycle in the store: acknowledged and closed by a person, kept through the engine's
updates, ended by the fact (resolved), by the same fact seen again (reopened, same id) or by time
(an acknowledgement lapses, an accepted risk expires); every change in the history; the page
(finding_paging, one series per open finding, and findings_by_status{status="open"}) follows it;
`oncewatch ack` and `close` from the command line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from oncewatch import cli
from oncewatch.core.records import Evidence, Finding
from oncewatch.dashboards import metrics
from oncewatch.store import Store, reviews
from tests.conftest import StoreTarget, store_section

T = 1_000.0


def finding(fid: str = "F1-x", *, last_seen: float = T, status: str = "open", evidence: int = 1) -> Finding:
    return Finding(id=fid, rule=fid.split("-")[0], name="duplicate_effect", severity="critical",
                   keys={"trade_no": "T1"}, summary="two shipments", first_seen=T, last_seen=last_seen,
                   evidence=tuple(Evidence("row_change", f"binlog.000001:{i}#0-1-{i}/0", T + i, {}) for i in range(evidence)),
                   status=status, resolved_at=last_seen if status == "resolved" else None,
                   resolution="paid" if status == "resolved" else None)


def engine_writes(store: Store, *found: Finding) -> None:
    with store.batch() as tx:
        tx.upsert_findings(found)


def status(store: Store, fid: str = "F1-x") -> str:
    return store.findings_by_id([fid])[0].status


def history(store: Store, fid: str = "F1-x") -> list[tuple[str, str, str | None]]:
    return [(h.status, h.by, h.reason) for h in reviews.history(store, [fid])[fid]]


@pytest.fixture
def store(store_target: StoreTarget) -> Store:
    s = Store(store_target)
    engine_writes(s, finding())
    return s


def test_an_acknowledgement_holds_through_the_engines_updates_and_lapses(store: Store) -> None:
    reviews.acknowledge(store, ["F1-x"], by="ana", note="on it", until=T + 3600, now=T + 10)
    assert status(store) == "acknowledged"
    engine_writes(store, finding(last_seen=T + 20, evidence=2))  # more evidence, same fact
    assert status(store) == "acknowledged"
    with store.batch() as tx:
        assert reviews.expire(tx, T + 3599) == 0
        assert reviews.expire(tx, T + 3600) == 1
    assert status(store) == "open"
    assert history(store) == [("acknowledged", "ana", None), ("open", "oncewatch", None)]
    assert reviews.history(store, ["F1-x"])["F1-x"][-1].note == "acknowledgement lapsed"


def test_a_closed_finding_reopens_with_the_same_id_when_the_fact_is_seen_again(store: Store) -> None:
    reviews.close(store, ["F1-x"], by="ana", reason="fixed", note="refunded", now=T + 10)
    engine_writes(store, finding(last_seen=T))  # the engine refreshing what it knew: no new fact
    assert status(store) == "closed"
    engine_writes(store, finding(last_seen=T + 30, evidence=3))  # a third shipment for the trade_no
    assert status(store) == "open" and store.finding_ids() == {"F1-x"}
    assert history(store) == [("closed", "ana", "fixed"), ("open", "oncewatch", None)]
    reviews.acknowledge(store, ["F1-x"], by="bo", note="again", until=T + 99, now=T + 40)  # no review left behind
    assert status(store) == "acknowledged"


def test_an_accepted_risk_expires_and_a_resolved_fact_ends_any_review(store: Store) -> None:
    engine_writes(store, finding("F7-y"))
    reviews.close(store, ["F1-x"], by="ana", reason="accepted_risk", note="known", now=T, until=T + 60)
    reviews.acknowledge(store, ["F7-y"], by="bo", note="looking", until=T + 600, now=T)
    engine_writes(store, finding("F7-y", last_seen=T + 5, status="resolved"))  # the late event came
    with store.batch() as tx:
        reviews.expire(tx, T + 60)
    assert status(store) == "open" and status(store, "F7-y") == "resolved"
    assert history(store, "F7-y") == [("acknowledged", "bo", None), ("resolved", "oncewatch", None)]
    with store.batch() as tx:
        assert reviews.expire(tx, T + 600) == 0  # the resolved finding's acknowledgement went with it


@pytest.mark.parametrize(("action", "message"), [
    (lambda s: reviews.acknowledge(s, ["nope"], by="a", note="n", until=T + 1, now=T), "nope: no such finding"),
    (lambda s: reviews.close(s, ["F1-x"], by="a", reason="accepted_risk", note="n", now=T), "needs an expiry"),
    (lambda s: reviews.close(s, ["F1-x"], by="a", reason="duplicate", note="n", now=T), "names the finding"),
    (lambda s: reviews.close(s, ["F1-x"], by="a", reason="fixed", note="n", now=T, until=T + 5), "only an accepted"),
    (lambda s: reviews.close(s, ["F1-x"], by="a", reason="typo", note="n", now=T), "reason 'typo'"),
])
def test_reviews_that_cannot_be_made_say_why(store: Store, action, message: str) -> None:
    with pytest.raises(reviews.ReviewError, match=message):
        action(store)
    assert status(store) == "open" and history(store) == []


def test_a_resolved_finding_cannot_be_acknowledged(store: Store) -> None:
    engine_writes(store, dataclasses.replace(finding(), status="resolved", resolved_at=T + 1, resolution="paid"))
    with pytest.raises(reviews.ReviewError, match="F1-x is resolved"):
        reviews.acknowledge(store, ["F1-x"], by="a", note="n", until=T + 1, now=T)


def test_the_page_follows_the_status(store: Store, store_target: StoreTarget) -> None:
    engine_writes(store, finding("F1-z"))

    def f1(name: str, label: str) -> dict[str, float]:
        text = generate_latest(metrics.registry(store_target)).decode()
        family = next(f for f in text_string_to_metric_families(text) if f.name == name)
        return {s.labels[label]: s.value for s in family.samples if s.labels["rule"] == "F1"}

    def by_status() -> dict[str, float]:
        return f1("oncewatch_findings_by_status", "status")

    assert by_status() == {"open": 2}
    reviews.acknowledge(store, ["F1-z"], by="ana", note="on it", until=T + 60, now=T)
    assert by_status() == {"open": 1, "acknowledged": 1}
    # the fact stands whoever looks at it; only its end takes it out of findings_open
    assert f1("oncewatch_findings_open", "severity") == {"critical": 2}
    engine_writes(store, dataclasses.replace(finding(), status="resolved", resolved_at=T + 1, resolution="shipped"))
    assert f1("oncewatch_findings_open", "severity") == {"critical": 1}


def paging(target: StoreTarget, paging_max: int = 100) -> tuple[dict[str, tuple[str, str]], float]:
    """{finding: (rule, entity)} of the series that page one by one, and the overflow beside them."""
    text = generate_latest(metrics.registry(target, paging_max=paging_max)).decode()
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    listed = {s.labels["finding"]: (s.labels["rule"], s.labels["entity"]) for s in fams["oncewatch_finding_paging"]}
    assert all(s.value == 1 for s in fams["oncewatch_finding_paging"])
    return listed, fams["oncewatch_findings_paging_overflow"][0].value


def test_a_finding_pages_until_it_is_acknowledged_closed_or_resolved(store: Store, store_target: StoreTarget) -> None:
    engine_writes(store, finding("F1-y"), finding("F1-z"))
    assert paging(store_target) == ({"F1-x": ("F1", "T1"), "F1-y": ("F1", "T1"), "F1-z": ("F1", "T1")}, 0)
    reviews.acknowledge(store, ["F1-x"], by="ana", note="on it", until=T + 60, now=T)
    reviews.close(store, ["F1-y"], by="ana", note="refunded", reason="fixed", now=T)
    assert paging(store_target) == ({"F1-z": ("F1", "T1")}, 0)
    engine_writes(store, dataclasses.replace(finding("F1-z"), status="resolved", resolved_at=T + 1, resolution="paid"))
    assert paging(store_target) == ({}, 0)
    with store.batch() as tx:  # the acknowledgement lapses: it pages again
        assert reviews.expire(tx, T + 60) == 1
    assert paging(store_target) == ({"F1-x": ("F1", "T1")}, 0)


def test_past_paging_max_findings_the_newest_are_counted(store: Store, store_target: StoreTarget) -> None:
    """The oldest page one by one, so a page once sent keeps its series while newer findings come; info
    findings and the drift rules' (paged on their readings) take no place."""
    engine_writes(store, *(dataclasses.replace(finding(f"F2-{i}"), first_seen=T + i) for i in range(1, 5)),
                  dataclasses.replace(finding("F9-info"), severity="info"),
                  dataclasses.replace(finding("F11-lag"), severity="warning", keys={"group": "g"}))
    assert paging(store_target, paging_max=3) == ({"F1-x": ("F1", "T1"), "F2-1": ("F2", "T1"),
                                                   "F2-2": ("F2", "T1")}, 2)
    reviews.acknowledge(store, ["F1-x", "F2-1"], by="ana", note="on it", until=T + 60, now=T)
    assert paging(store_target, paging_max=3) == ({"F2-2": ("F2", "T1"), "F2-3": ("F2", "T1"),
                                                   "F2-4": ("F2", "T1")}, 0)
    assert paging(store_target, paging_max=0) == ({}, 3)


def test_ack_and_close_from_the_command_line(store: Store, store_target: StoreTarget, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "oncewatch.toml"
    config.write_text(f'[mysql]\nuser = "u"\ntables = ["shop.orders"]\n\n{store_section(store_target)}')
    assert cli.main(["ack", "--config", str(config), "F1-x", "--note", "on it", "--by", "ana"]) == 0
    assert status(store) == "acknowledged"
    assert cli.main(["close", "--config", str(config), "F1-x", "--reason", "duplicate", "--note", "same"]) == 2
    assert "a duplicate names the finding it duplicates" in capsys.readouterr().err
    assert cli.main(["close", "--config", str(config), "F1-x", "--reason", "false_positive", "--note", "test order",
                     "--by", "ana"]) == 0
    assert status(store) == "closed"
    assert cli.main(["findings", "--config", str(config), "--status", "closed", "--format", "json"]) == 0
    assert '"id": "F1-x"' in capsys.readouterr().out
