"""Starting again through store outages (oncewatch.monitor.supervise.through_outages), the loop both `oncewatch run`
and a group instance stand on: the PostgreSQL restarts themselves are in tests/integration/test_under_fire.py and
tests/integration/test_group.py."""

from __future__ import annotations

import threading
import time

import pytest

from oncewatch.monitor import supervise
from oncewatch.monitor.health import Outages
from oncewatch.monitor.saver import SaverDiedError
from oncewatch.monitor.supervise import through_outages
from oncewatch.store import StoreUnavailableError


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervise, "RETRY_SECONDS", (0.001,))


def test_builds_and_runs_that_lose_the_store_start_again_and_one_outage_counts_once(caplog) -> None:
    outages, events, built = Outages(), [], []
    failures = iter(["build", "build", "run", None])  # two failed builds, a run that loses the store, a clean run

    def build() -> int:
        step = next(failures)
        if step == "build":
            events.append("build failed")
            raise StoreUnavailableError("connection refused")
        built.append(step)
        return len(built)

    def run(made: int) -> None:
        events.append(f"run {made}")
        if built[-1] == "run":
            raise StoreUnavailableError("server closed the connection")

    through_outages(threading.Event(), outages, build, run, lambda made: events.append(f"close {made}"), "it starts")
    assert events == ["build failed", "build failed", "run 1", "close 1", "run 2", "close 2"]
    assert outages.count == 2 and outages.down_since is None and outages.seconds > 0
    logged = [r.event for r in caplog.records]
    assert logged == ["store_unavailable", "store_back", "store_unavailable", "store_back"]


def test_an_outage_counts_from_when_the_store_was_found_away_not_from_when_the_monitor_had_stopped() -> None:
    outages, runs = Outages(), []

    def run(made: str) -> None:
        runs.append(made)
        if len(runs) == 1:
            error = StoreUnavailableError("the store is away")
            time.sleep(0.3)  # the monitor stopping its readers before the error reaches the loop
            raise error

    through_outages(threading.Event(), outages, lambda: "monitor", run, lambda made: None, "it starts")
    assert runs == ["monitor", "monitor"] and outages.count == 1 and outages.seconds >= 0.3


def test_the_store_writer_process_dying_starts_the_monitor_again_and_each_death_counts_apart(caplog) -> None:
    outages, runs, closed = Outages(), [], []

    def run(made: int) -> None:
        runs.append(made)
        if len(runs) <= 2:
            raise SaverDiedError("the store's writer process ended without a word (killed by signal 9)")

    built = iter(range(1, 10))
    through_outages(threading.Event(), outages, lambda: next(built), run, closed.append, "it starts")
    assert runs == [1, 2, 3] and closed == [1, 2, 3]
    assert outages.writer_deaths == 2 and outages.count == 0
    assert [r.event for r in caplog.records] == ["store_writer_died", "store_writer_died"]


def test_a_stop_while_building_runs_nothing_and_closes_what_was_built() -> None:
    stop, events = threading.Event(), []

    def build() -> str:
        stop.set()
        return "monitor"

    through_outages(stop, Outages(), build, lambda m: events.append("run"), lambda m: events.append("close"),
                    "it starts")
    assert events == ["close"]


def test_any_other_error_ends_the_loop_with_what_was_built_closed() -> None:
    closed = []

    def run(made: str) -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        through_outages(threading.Event(), Outages(), lambda: "monitor", run, closed.append, "it starts")
    assert closed == ["monitor"]


def test_a_group_part_that_lost_the_broker_is_an_outage_and_any_other_error_is_not():
    """What a group instance waits out and starts again after (its parts stopped), rather than exit on."""
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError, UnknownTopicOrPartitionError

    from oncewatch.monitor.group.run import broker_away

    assert broker_away(KafkaConnectionError("111 ECONNREFUSED"))
    assert broker_away(KafkaTimeoutError("Unable to bootstrap from ['127.0.0.1:19092']"))
    assert not broker_away(UnknownTopicOrPartitionError())
    assert not broker_away(ValueError("a bug"))
