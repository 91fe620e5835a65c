"""/healthz and /readyz beside /metrics (dashboards.probes): what a probe is told, over HTTP, for a store whose
monitor is up, failing, stopped, silent, or not there."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest

from devservices import scenario
from oncewatch.core.protocol import GroupMemberHealth
from oncewatch.dashboards import metrics, probes, views
from oncewatch.store import Store


def get(server, path: str) -> tuple[int, bytes]:
    host, port = server.server_address[:2]
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    return str(tmp_path / "s.db")


@pytest.fixture
def served(store_path: str) -> Iterator[object]:
    server, thread = metrics.serve(store_path, port=0)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def write_monitor(store_path: str, **changes: object) -> None:
    """The scenario's health rows (a degraded monitor: reading, late), with the monitor row's `changes`."""
    with closing(Store(store_path)) as store:
        scenario.write_health(store, time.time())
        store.set_health("monitor", replace(store.health()["monitor"].health, **changes))


def test_healthz_answers_whatever_the_store_says(served) -> None:
    assert get(served, "/healthz") == (200, b"ok\n")


def test_not_ready_without_a_store_and_the_reason_says_so(served) -> None:
    status, body = get(served, "/readyz")
    assert status == 503
    answer = json.loads(body)
    assert answer["ready"] is False
    assert answer["reasons"][0].startswith("the store cannot be read")


def test_ready_while_the_monitor_reads_and_writes_even_degraded(served, store_path: str) -> None:
    write_monitor(store_path)
    assert get(served, "/readyz") == (200, b'{"ready": true, "reasons": []}')
    status, text = get(served, "/metrics")  # still served beside them
    assert status == 200 and b"oncewatch_store_up 1.0" in text


def test_failing_monitor_is_not_ready_with_its_reasons(served, store_path: str) -> None:
    write_monitor(store_path, verdict="failing",
                  reasons=("binlog disconnected ((2003, \"Can't connect to MySQL server\"))",))
    status, body = get(served, "/readyz")
    assert status == 503
    assert json.loads(body) == {"ready": False, "reasons": [
        "verdict failing", "binlog disconnected ((2003, \"Can't connect to MySQL server\"))"]}


def test_stopped_monitor_is_not_ready(served, store_path: str) -> None:
    write_monitor(store_path, verdict="stopped", reasons=("stopped: nothing is read until `oncewatch run` starts",))
    status, body = get(served, "/readyz")
    assert status == 503 and json.loads(body)["reasons"][0] == "verdict stopped"


def test_a_monitor_that_stopped_writing_its_store_is_not_ready(store_path: str) -> None:
    write_monitor(store_path)
    later = time.time() + views.STALE_SECONDS + 5
    answer = probes.readiness(store_path, now=later)
    assert not answer.ready
    assert "cannot write its store" in answer.reasons[0]


def test_a_store_without_the_monitor_row_is_not_ready(store_path: str) -> None:
    Store(store_path).close()
    assert probes.readiness(store_path).reasons == (
        "the monitor has written no health to the store yet (starting, or it cannot write it)",)


def test_a_group_member_is_judged_by_its_own_row() -> None:
    fresh = views.Component("group/m1", GroupMemberHealth(at=1.0, member="m1"), 1.0, 1.0)
    assert probes.judge({"group/m1": fresh}, member="m1") == probes.Readiness(True, ())
    assert not probes.judge({"group/m1": fresh}, member="m2").ready
    old = views.Component("group/m1", GroupMemberHealth(at=1.0, member="m1"), 1.0, views.STALE_SECONDS + 1)
    assert "group member m1 last wrote" in probes.judge({"group/m1": old}, member="m1").reasons[0]
