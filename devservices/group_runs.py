"""A group of `oncewatch run` instances ([group]) on the dev services, for the tests and the benchmarks.

`group_config` writes a group's config (the shop's, in CDC mode, its store in PostgreSQL); `Member` runs one
instance as a user does (`oncewatch run --config`), SIGKILLs or stops it; the rest read the group's store: its
first start, its shards' clocks, which member reads the change source, and findings as two groups compare them.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

import tomli_w

from devservices.shop_monitor import ROOT, shop_config
from oncewatch.core.config import PostgresTarget, load
from oncewatch.core.protocol import GroupMemberHealth
from oncewatch.core.records import Finding
from oncewatch.store import Store, StoreError
from oncewatch.store.group import shard_checkpoints, source_position

READINGS = ("F11", "F12")  # their evidence is the latest reading: when it was taken differs from run to run


class JudgedTooLate(AssertionError):
    """The shards' clocks did not pass the time asked within the time allowed."""


class GroupDidNotStart(RuntimeError):
    """A group's first member did not store the change source's first position; its log says why."""


def group_config(folder: Path, topic: str, store: PostgresTarget, shards: int, rules: dict[str, Any],
                 commit_seconds: float = 0.3) -> Path:
    """The shop's config in CDC mode, read live (its change clock the dev connector's heartbeats), as a group of
    `shards` (committed every `commit_seconds`: a test's verdicts are in the store sooner than by default)."""
    folder.mkdir()
    path = shop_config(folder, topic=topic, rules=rules, cdc=True, postgres=store)
    data = tomllib.loads(path.read_text())
    # one replica: the dev stack has one broker
    data["group"] = {"name": f"owtest-{uuid.uuid4().hex[:8]}", "shards": shards, "commit_seconds": commit_seconds,
                     "mark_seconds": 0.2, "replication_factor": 1}
    path.write_text(tomli_w.dumps(data))
    return path


def pinned(command: list[str], cpu: int | None) -> list[str]:
    """`command` run on core `cpu` alone (taskset), or as it is with None."""
    return command if cpu is None else ["taskset", "--cpu-list", str(cpu), *command]


class Member:
    """One `oncewatch run` of a group, its output in `<config's folder>/<name>.log`; on core `cpu` alone if given."""

    def __init__(self, config: Path, name: str, cpu: int | None = None):
        self.log = config.parent / f"{name}.log"
        with open(self.log, "wb") as out:
            # taskset execs the command: the process's pid is the member's
            self.process = subprocess.Popen(pinned([sys.executable, "-m", "oncewatch.cli", "run", "--config",
                                                    str(config)], cpu), cwd=ROOT, stdout=out,
                                            stderr=subprocess.STDOUT)

    @property
    def name(self) -> str:
        """Its name in the group (the default: host-pid)."""
        return f"{socket.gethostname()}-{self.process.pid}"

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


def store_of(config: Path) -> Store:
    return Store(load(config).store.target, readonly=True)


def started(config: Path) -> bool:
    """The group's change source has stored its first position (a first start reads from the topics' ends)."""
    try:
        store = store_of(config)
    except StoreError:  # not made yet
        return False
    try:
        return source_position(store, "cdc") is not None
    finally:
        store.close()


def first_start(config: Path) -> None:
    """The group's first checkpoint, at the topics' ends (before the workload), by one member stopped after it."""
    member = Member(config, "first")
    deadline = time.monotonic() + 120
    while not started(config):
        if time.monotonic() > deadline:
            member.stop()
            raise GroupDidNotStart(f"the group did not start in 120 s: {member.tail()}")
        time.sleep(0.5)
    time.sleep(2.0)  # its event partitions' first positions too
    if (code := member.stop()) != 0:
        raise GroupDidNotStart(f"the group's first member exited {code}: {member.tail()}")


def shards_of(config: Path) -> dict[int, dict[str, Any]]:
    store = store_of(config)
    try:
        return shard_checkpoints(store)
    finally:
        store.close()


def wait_judged_past(config: Path, shards: int, until: float, timeout: float = 180) -> dict[int, dict[str, Any]]:
    """Every shard has committed with both its clocks past `until` (every verdict due by then is given); their
    checkpoints."""
    deadline = time.monotonic() + timeout
    while len(now := shards_of(config)) < shards or min(min(c["binlog_time"], c["kafka_time"])
                                                         for c in now.values()) < until:
        if time.monotonic() > deadline:
            raise JudgedTooLate(f"the shards' clocks did not pass {until:.3f} in {timeout:.0f} s: "
                                f"{ {s: (c['binlog_time'], c['kafka_time']) for s, c in now.items()} }"
                                + "".join(f"\n{line}" for line in clock_notes(config)))
        time.sleep(0.5)
    return now


# What the members' logs say of a clock that stands still (the routers' and the readers' own words for it).
CLOCK_EVENTS = ('"group_part_stuck"', '"group_partition_clock_held"', '"group_change_clock_held"', '"kafka_end_held"',
                '"kafka_settling"', '"cdc_disconnected"', '"kafka_disconnected"')
TS = re.compile(r'"ts": ([0-9.]+)')


def clock_notes(config: Path, most: int = 12) -> list[str]:
    """The last `most` lines of the group's members' logs (beside `config`) about a clock standing still, each
    after the member's name: for a JudgedTooLate to say which partition held the judges back, and why."""
    notes = sorted((float(m.group(1)) if (m := TS.search(line)) else 0.0, f"{log.stem}: {line[:1200]}")
                   for log in config.parent.glob("*.log")
                   for line in log.read_text(errors="replace").splitlines() if any(e in line for e in CLOCK_EVENTS))
    return [note for _, note in notes[-most:]]


def members_of(config: Path) -> dict[str, GroupMemberHealth]:
    """Every member's last health row, by name."""
    store = store_of(config)
    try:
        return {r.health.member: r.health for key, r in store.health().items()
                if key.startswith("group/") and isinstance(r.health, GroupMemberHealth)}
    finally:
        store.close()


def change_source_holder(config: Path, members: dict[str, Member], timeout: float = 30.0) -> str:
    """Of `members` (by label), the label of the one that reads the change source now (its health row says; while
    the group rebalances, none does for a moment)."""
    by_name = {m.name: label for label, m in members.items()}
    deadline = time.monotonic() + timeout
    while True:
        holders = [by_name[name] for name, r in members_of(config).items() if r.routers.change_source
                   and name in by_name and time.time() - r.at < 5]
        if len(holders) == 1:
            return holders[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"not one member reads the change source: {holders}")
        time.sleep(0.2)


def compared(found: list[Finding]) -> dict[str, tuple]:
    """Findings as two runs must agree on them: all of each, but the readings' evidence and times."""
    return {f.id: (f.rule, f.status) if f.rule in READINGS else
            (f.rule, f.status, f.severity, f.first_seen, f.resolved_at, f.keys, f.summary, f.evidence) for f in found}


def difference(one: dict[str, tuple], other: dict[str, tuple]) -> dict[str, list]:
    """What tells two `compared` apart, a few of each, for an assertion's message."""
    return {"only in the second": [other[i] for i in sorted(other.keys() - one.keys())][:5],
            "only in the first": [one[i] for i in sorted(one.keys() - other.keys())][:5],
            "differ": [(one[i], other[i]) for i in sorted(one.keys() & other.keys()) if one[i] != other[i]][:5]}


def source_position_of(config: Path, source: str) -> Any:
    """Where the group's router of `source` stored it handed on up to (None: never)."""
    store = store_of(config)
    try:
        return source_position(store, source)
    finally:
        store.close()
