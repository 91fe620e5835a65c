"""A group's verdict on itself (oncewatch.dashboards.views.group_verdict), from its members' and shards' rows."""

from __future__ import annotations

from typing import Any

from oncewatch.core import names
from oncewatch.dashboards.views import SHARD_LIST, group_verdict


def member(name: str, shards: list[str], change: bool = False, state: str = "live") -> dict[str, Any]:
    return {"member": name, "state": state, SHARD_LIST: shards, "change source": "reads it" if change else ""}


def shard(n: int, ago: float = 1.0, lag: int = 0) -> dict[str, Any]:
    return {"shard": n, "committed_seconds_ago": ago, "lag (messages)": lag}


def test_every_shard_committed_and_the_change_source_read_is_healthy() -> None:
    v = group_verdict([member("a", ["0", "1"], change=True), member("b", ["2"])], [shard(0), shard(1), shard(2)])
    assert (v.verdict, v.reasons, v.live, v.shards) == (names.HEALTHY, (), 2, 3)


def test_work_not_done_is_failing_and_each_reason_is_said() -> None:
    v = group_verdict([member("a", ["0", "1"]), member("b", ["2"], change=True, state="gone")],
                      [shard(0), shard(1), shard(2, ago=120)])
    assert v.verdict == names.FAILING
    assert v.reasons == ("no live member reads the change source",
                         "shard(s) 2 not committed for over 30 s: no member judges them")
    assert group_verdict([member("a", [], state="gone")], [shard(0)]).reasons == ("no member is running",)


def test_work_done_late_or_unevenly_is_degraded() -> None:
    v = group_verdict([member("a", ["0", "1", "2"], change=True), member("b", []), member("c", [], state="gone")],
                      [shard(0), shard(1, lag=10_001), shard(2, lag=10_000)])
    assert v.verdict == names.DEGRADED
    assert v.reasons == ("shard(s) 1 more than 10,000 messages behind",
                         "b judge(s) no shard while another judges two or more")
    # more members than shards: one idle is expected, not a fault
    assert group_verdict([member("a", ["0"], change=True), member("b", [])], [shard(0)]).verdict == names.HEALTHY
