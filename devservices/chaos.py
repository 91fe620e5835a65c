"""The chaos soak (issue 42): the shop's traffic with every fault on while the broker, MariaDB, the Kafka Connect
worker and a member of a group are SIGKILLed and started again at random instants, and every mode's disturbed monitor
judged against an undisturbed control that reads the same traffic afterwards, from the same starting store.

One shop, in the schema the dev connector captures, is read live by one monitor per mode:
- `binlog`: the binlog monitor;
- `cdc-source`: CDC mode, the connector's topics the change source;
- `cdc-check`: the binlog, its rows checked against the connector's topics (`[cdc] mode = "check"`);
- `group`: a group of two members in CDC mode, its store in PostgreSQL.
Each control took its first checkpoint where its disturbed monitor did (a copy of its store; the group's: a second
PostgreSQL store started at the same instant) and is run after the traffic, untouched by any kill. A disturbed monitor
must end with its control's findings (ids, rules, statuses, evidence), but F15 where the connector replayed.

Shared by bench/chaos.py (the soak of 10 minutes and more) and tests/integration/test_chaos.py (the short version,
in `make test`'s lane of its own).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devservices import base, broker, kafka_connect, mariadb, postgres
from devservices.group_runs import READINGS, Member, first_start, group_config, wait_judged_past
from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import (SHORT_RULES, comparable, edit_config, findings, new_topic, oncewatch,
                                      shop_config, shop_settings)
from oncewatch import shop
from oncewatch.core.records import Finding
from oncewatch.shop import GroundTruth

MODES = ("binlog", "cdc-source", "cdc-check", "group")
CDC_MODES = ("cdc-source", "cdc-check", "group")
KINDS = ("broker", "mariadb", "connect", "member")
# The kinds of kill that touch a mode's sources: a soak of some modes only kills what they read.
KILLS_FOR = {"broker": MODES, "mariadb": MODES, "connect": CDC_MODES, "member": ("group",)}
REPLAYED = "F15"  # the one rule a disturbed CDC monitor may add: the connector delivered a record again

# The shop's thresholds for runs of minutes; F10 above the clean sends of a busy machine, F11 past the stalled
# group's lag, F12 past the skew of a busy machine's consumers (on a fresh clone's three lanes, shipping-service
# lagged 44/8/34 on its partitions for over 2 s, a standard deviation of 15: a true reading, which a control reading
# the same topics after the traffic cannot take) and far below the points-service partition the shop stalls (a
# deviation near 200 at the soak's end; the control, which runs some 10 s, must hold it for partition_skew_seconds),
# a binlog row lost by the connector after 10 s of later commits.
RULES = {**SHORT_RULES, "event_delay_seconds": 1.5, "offset_drift_threshold": 2000, "partition_skew_threshold": 50,
         "cdc_lost_grace_seconds": 10}
VERDICTS_DUE = max(RULES["stuck_pending_seconds"], RULES["missing_event_grace_seconds"],
                   RULES["cdc_lost_grace_seconds"]) + 2
IDLE = 2.0  # --until-idle quiet time (tests/integration/shop_monitor.IDLE)
# How long the verdicts after the traffic may take, a monitor's and its control's: a minute or two when right; a
# monitor that never gets there is a finding of the soak, not a reason to wait on.
TAIL_SECONDS = 300.0


@dataclass(frozen=True)
class Soak:
    """One soak: `seconds` of traffic at `rate` orders/s, `kills` of each kind at instants drawn from `seed`, each
    service down for a time drawn from `down` (seconds) before it is started again."""

    seconds: float
    rate: float
    kills: int
    modes: tuple[str, ...] = MODES
    seed: int = 42
    down: tuple[float, float] = (1.0, 6.0)
    shards: int = 4

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if set(KILLS_FOR[k]) & set(self.modes))


@dataclass(frozen=True)
class Kill:
    """One kill as it happened; times in seconds since the traffic started."""

    kind: str
    planned: float
    at: float
    down: float
    back: float  # when the service was ready again
    was_running: bool
    note: str = ""


@dataclass
class ModeResult:
    mode: str
    disturbed: dict[str, int]  # findings per rule
    control: dict[str, int]
    replayed: int  # F15 findings only the disturbed monitor has
    difference: dict[str, list] = field(default_factory=dict)  # empty when the disturbed monitor is right
    exits: list[str] = field(default_factory=list)  # every monitor exit, and why
    # A CDC mode's control against the binlog control by id, rule and status (a CDC row's coordinates are its rows
    # event's, the binlog collector's its transaction's end), the pipeline's own rules (F13-F15) left out: the
    # control reads the connector's replays too, so it is undisturbed only in its own run. Reported, not judged.
    against_binlog: dict[str, list] | None = None

    @property
    def equal(self) -> bool:
        return not any(self.difference.values()) and not any("unexpected" in e for e in self.exits)


@dataclass
class Report:
    soak: Soak
    kills: list[Kill]
    modes: list[ModeResult]
    truth: GroundTruth | None
    traffic_seconds: float
    seconds: float  # the whole soak's

    def kills_per_kind(self) -> dict[str, int]:
        """Kills of a running process during the traffic, per kind."""
        return dict(Counter(k.kind for k in self.kills if k.was_running and k.at < self.traffic_seconds))

    def ok(self) -> bool:
        return all(m.equal for m in self.modes) and all(
            self.kills_per_kind().get(k, 0) >= self.soak.kills for k in self.soak.kinds)

    def lines(self) -> list[str]:
        out = [f"soak: {self.soak}", f"traffic {self.traffic_seconds:.0f} s, whole soak {self.seconds:.0f} s",
               "kills per kind during the traffic: " + ", ".join(f"{k} {n}" for k, n in
                                                                 sorted(self.kills_per_kind().items()))]
        out += [f"  {k.kind:<8} planned {k.planned:7.1f} s  killed {k.at:7.1f} s  down {k.down:4.1f} s  "
                f"back {k.back:7.1f} s{'' if k.was_running else '  (was not running)'}"
                f"{'  (after the traffic)' if k.at >= self.traffic_seconds else ''}{'  ' + k.note if k.note else ''}"
                for k in self.kills]
        if self.truth is not None:
            out.append(f"shop: {self.truth.orders} orders, {len(self.truth.faults)} faults injected, "
                       f"incidents {len(self.truth.incidents)}")
        for m in self.modes:
            rules = sorted(m.disturbed.keys() | m.control.keys())
            out.append(f"mode {m.mode}: {'EQUAL' if m.equal else 'DIFFERENT'} to its control"
                       + (f" (+{m.replayed} F15 replays)" if m.replayed else ""))
            out.append("  rule      " + " ".join(f"{r:>5}" for r in rules))
            out.append("  disturbed " + " ".join(f"{m.disturbed.get(r, 0):>5}" for r in rules))
            out.append("  control   " + " ".join(f"{m.control.get(r, 0):>5}" for r in rules))
            for what, items in m.difference.items():
                if items:
                    out.append(f"  {what}: {len(items)}: {items[:5]}")
            out.append("  monitor exits: " + ("; ".join(m.exits) if m.exits else "none"))
            if m.against_binlog is not None:
                named = {what.replace("the disturbed monitor", "its control").replace("the control",
                                                                                      "the binlog control"): items
                         for what, items in m.against_binlog.items()}
                out.append("  its control against the binlog control (by id, rule, status; F13-F15 left out): "
                           + ", ".join(f"{what} {len(items)}" for what, items in named.items()))
                out += [f"    {what}: {items[:3]}" for what, items in named.items() if items]
        return out


def plan(soak: Soak, rng: random.Random) -> list[tuple[float, str, float]]:
    """(instant, kind, seconds down) of every kill, in time order: instants drawn between 5 % and 80 % of the
    traffic, so the last service is back before it ends."""
    kills = [(rng.uniform(0.05, 0.8) * soak.seconds, kind, rng.uniform(*soak.down))
             for kind in soak.kinds for _ in range(soak.kills)]
    return sorted(kills)


# ---------------------------------------------------------------- the monitors of each mode

def _check_mode(data: dict[str, Any]) -> None:
    data["cdc"]["mode"] = "check"
    del data["cdc"]["start_from"]  # it reads the topics from the earliest offset, always


def _counts(found: list[Finding]) -> dict[str, int]:
    return dict(sorted(Counter(f.rule for f in found).items()))


def _judge(mode: str, disturbed: list[Finding], control: list[Finding], exits: list[str],
           coarse: tuple[str, ...] | None = None) -> ModeResult:
    """`coarse`: the rules compared by id, rule and status only; by default a group's F11/F12, whose evidence is
    its latest reading (when it was taken differs from run to run)."""
    coarse = (READINGS if mode == "group" else ()) if coarse is None else coarse

    def key(found: list[Finding]) -> dict[str, tuple]:
        return {i: v[:2] if v[0] in coarse else v for i, v in comparable(found).items()}

    got, want = key(disturbed), key(control)
    added = sorted(got.keys() - want.keys())
    replays = [i for i in added if got[i][0] == REPLAYED and mode in CDC_MODES]
    diff = {"only in the disturbed monitor": [got[i] for i in added if i not in replays],
            "only in the control": [want[i] for i in sorted(want.keys() - got.keys())],
            "differ (disturbed, control)": [(got[i], want[i]) for i in sorted(got.keys() & want.keys())
                                            if got[i] != want[i]]}
    return ModeResult(mode, _counts(disturbed), _counts(control), len(replays), diff, exits)


def _without_pipeline(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f.rule not in ("F13", "F14", REPLAYED)]


class Single:
    """One monitor process of a mode (binlog, cdc-source, cdc-check) and its control."""

    def __init__(self, mode: str, folder: Path, topic: str):
        self.mode = mode
        live, control = folder / mode, folder / f"{mode}-control"
        live.mkdir()
        control.mkdir()
        cdc = mode != "binlog"

        def config(at: Path) -> Path:
            path = shop_config(at, topic=topic, rules=RULES, cdc=cdc, schema=None if cdc else CDC_SCHEMA)
            return edit_config(path, _check_mode) if mode == "cdc-check" else path

        self.config, self.control = config(live), config(control)
        self.member: Member | None = None
        self.exits: list[str] = []

    def first_start(self) -> None:
        oncewatch("run", "--config", str(self.config), "--until-idle", "0.5")
        shutil.copy(self.config.parent / "store.db", self.control.parent / "store.db")

    def start(self) -> None:
        self.member = Member(self.config, "monitor")

    def alive(self) -> bool:
        return self.member is not None and self.member.process.poll() is None

    def stop_all(self) -> None:
        if self.alive():
            assert self.member is not None
            self.member.stop()

    def finish(self, end: float) -> None:
        """Stopped after the traffic, then run until idle on its own store for the verdicts still due then."""
        assert self.member is not None
        code = self.member.process.poll()
        if code is not None:
            self.exits.append(f"unexpected: exited {code} during the soak: {self.member.tail()[-600:]}")
        elif (code := self.member.stop()) != 0:
            self.exits.append(f"unexpected: exited {code} when stopped: {self.member.tail()[-600:]}")
        self._until_idle(self.config, "its run until idle")

    def run_control(self, end: float) -> None:
        self._until_idle(self.control, "the control")

    def _until_idle(self, config: Path, what: str) -> None:
        try:
            result = oncewatch("run", "--config", str(config), "--until-idle", str(IDLE), timeout=TAIL_SECONDS,
                               check=False)
        except subprocess.TimeoutExpired as exc:
            self.exits.append(f"unexpected: {what} was not idle in {TAIL_SECONDS:.0f} s: {exc}")
            return
        (config.parent / "until-idle.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            self.exits.append(f"unexpected: {what} exited {result.returncode}: {result.stderr[-600:]}")

    def result(self) -> ModeResult:
        return _judge(self.mode, findings(self.config), findings(self.control), self.exits)


class Group:
    """A group of two members in CDC mode on PostgreSQL, one of them killed now and then, and its control group."""

    def __init__(self, folder: Path, topic: str, shards: int, stores: contextlib.ExitStack):
        self.mode = "group"
        self.shards = shards
        self.config = group_config(folder / "group", topic, stores.enter_context(postgres.new_schema()), shards, RULES)
        self.control = group_config(folder / "group-control", topic, stores.enter_context(postgres.new_schema()),
                                    shards, RULES)
        self.members: dict[str, Member] = {}
        self.killed: list[Member] = []
        self.exits: list[str] = []
        self._lock = threading.Lock()
        self._started = 0

    def first_start(self) -> None:
        first_start(self.config)
        first_start(self.control)

    def start(self) -> None:
        for _ in range(2):
            self._add()

    def _add(self) -> None:
        name = f"m{self._started}"
        self._started += 1
        self.members[name] = Member(self.config, name)

    def kill_one(self, rng: random.Random) -> bool:
        with self._lock:
            name = rng.choice(sorted(self.members))
            member = self.members.pop(name)
        was_running = member.process.poll() is None
        if was_running:
            member.kill()
        self.killed.append(member)
        return was_running

    def replace(self) -> None:
        with self._lock:
            self._add()

    def stop_all(self) -> None:
        for m in self.members.values():
            if m.process.poll() is None:
                m.stop()

    def finish(self, end: float) -> None:
        self._judged(self.config, end, "the disturbed group")
        for name, member in self.members.items():
            code = member.process.poll()
            if code is not None:
                self.exits.append(f"unexpected: member {name} exited {code} during the soak: {member.tail()[-600:]}")
            elif (code := member.stop()) != 0:
                self.exits.append(f"unexpected: member {name} exited {code} when stopped: {member.tail()[-600:]}")
        self.exits += [f"member {m.log.stem} SIGKILLed (exit {m.process.returncode}, by the kill)" for m in self.killed]

    def run_control(self, end: float) -> None:
        members = [Member(self.control, f"c{i}") for i in range(2)]
        try:
            self._judged(self.control, end, "the control group")
        finally:
            for m in members:
                if (code := m.stop()) != 0:
                    self.exits.append(f"unexpected: control member exited {code}: {m.tail()[-600:]}")

    def _judged(self, config: Path, end: float, what: str) -> None:
        try:
            wait_judged_past(config, self.shards, end + VERDICTS_DUE, timeout=TAIL_SECONDS)
            time.sleep(3.0)  # the last commit of each shard after its clocks passed
        except AssertionError as exc:
            self.exits.append(f"unexpected: {what} was not judged past the traffic: {exc}")

    def result(self) -> ModeResult:
        return _judge(self.mode, findings(self.config), findings(self.control), self.exits)


# ---------------------------------------------------------------- the kills

# Two lanes of kills, each carried out in time order, a kill's service back before the lane's next kill: the slow
# restarts (the broker's and the worker's JVMs, some 30 s each on a busy 2-core machine) in one, MariaDB's and the
# members' in the other, so those land during the slow ones' outages too. The worker never starts while MariaDB is
# away (its task would fail on the start, for good) nor while the broker is: the first lane keeps them apart, and
# EXCLUSIVE keeps a Connect restart and a MariaDB kill apart.
LANES = (("broker", "connect"), ("mariadb", "member"))
EXCLUSIVE = ("connect", "mariadb")


class Killer:
    """Carries out the planned kills in their lanes, logging each."""

    def __init__(self, soak: Soak, rng: random.Random, group: Group | None, t0: float, say: Callable[[str], None]):
        kills = plan(soak, rng)
        self._lanes = [[k for k in kills if k[1] in lane] for lane in LANES]
        self._rng = random.Random(rng.random())  # the members' choice, in its own lane's order
        self._group = group
        self._cdc = bool(set(soak.modes) & set(CDC_MODES))
        self._t0 = t0
        self._say = say
        self._exclusive = threading.Lock()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(lane,), name=f"chaos-lane-{i}", daemon=True)
                         for i, lane in enumerate(self._lanes)]
        self.kills: list[Kill] = []
        self.error: BaseException | None = None

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        for t in self._threads:
            t.join()
        self.kills.sort(key=lambda k: k.at)

    def _run(self, lane: list[tuple[float, str, float]]) -> None:
        try:
            for planned, kind, down in lane:
                time.sleep(max(0.0, self._t0 + planned - time.monotonic()))
                with self._exclusive if kind in EXCLUSIVE else contextlib.nullcontext():
                    k = self._kill(planned, kind, down)
                with self._lock:
                    self.kills.append(k)
                self._say(f"kill {kind} at {k.at:.1f} s (planned {planned:.1f}), down {down:.1f} s, back at "
                          f"{k.back:.1f} s{' ' + k.note if k.note else ''}")
        except BaseException as exc:  # noqa: BLE001 - kept for the soak, which reports it
            self.error = self.error or exc

    def _kill(self, planned: float, kind: str, down: float) -> Kill:
        at = time.monotonic() - self._t0
        note = ""
        if kind == "broker":
            was = broker.kafka_kill()
            _gone(base.KAFKA_PORT, down)
            broker.kafka_up()
        elif kind == "mariadb":
            was = mariadb.mariadb_kill()
            _gone(base.MARIADB_PORT, down)
            mariadb.mariadb_up()
        elif kind == "connect":
            was = kafka_connect.kill()
            _gone(kafka_connect.CONNECT_PORT, down)
            note = _connect_up()
        else:
            if self._group is None:
                raise ValueError("a member kill needs the group mode")
            was = self._group.kill_one(self._rng)
            time.sleep(down)
            self._group.replace()
        if self._cdc and kind != "member":
            note = " ".join(filter(None, (note, _task_restarted())))
        return Kill(kind, round(planned, 1), round(at, 1), round(down, 1), round(time.monotonic() - self._t0, 1),
                    was, note)


def _gone(port: int, down: float) -> None:
    """`down` seconds, and at least until the killed process let go of its port (a JVM takes a moment to end)."""
    until = time.monotonic() + down
    deadline = until + 60
    while base.port_open(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(max(0.0, until - time.monotonic()))


# ---------------------------------------------------------------- the soak

def run(soak: Soak, folder: Path, say: Callable[[str], None] = print) -> Report:
    """One soak in `folder` on the dev stack; every service is up again at the end."""
    began = time.monotonic()
    rng = random.Random(soak.seed)
    topic = new_topic()
    settings = dict(schema=CDC_SCHEMA, commit_marks=True)
    shop.run(shop_settings(topic, orders=0, reset=True, **settings))
    if set(soak.modes) & set(CDC_MODES):
        kafka_connect.captured(quiet=2.0)  # the reset's rows off the connector before the first checkpoints
    with contextlib.ExitStack() as stores:
        monitors: list[Single | Group] = [Single(m, folder, topic) for m in soak.modes if m != "group"]
        group = Group(folder, topic, soak.shards, stores) if "group" in soak.modes else None
        if group is not None:
            monitors.append(group)
        for m in monitors:
            stores.callback(m.stop_all)  # on the way out, whatever happened: no monitor left running
            m.first_start()
            m.start()
        say(f"monitors started: {', '.join(m.mode for m in monitors)}; traffic {soak.seconds:.0f} s at "
            f"{soak.rate:g} orders/s, {soak.kills} kills of each of {', '.join(soak.kinds)}")
        time.sleep(3.0)  # their first reads done
        outcome: dict[str, Any] = {}

        def traffic() -> None:
            try:
                outcome["truth"] = shop.run(shop_settings(topic, seed=soak.seed, duration=soak.seconds, rate=soak.rate,
                                                          faults="all", **settings))
            except BaseException as exc:  # noqa: BLE001 - reported
                outcome["error"] = exc
            outcome["done"] = time.monotonic() - t0

        t0 = time.monotonic()
        shop_run = threading.Thread(target=traffic, name="chaos-shop")
        killer = Killer(soak, rng, group, t0, say)
        shop_run.start()
        killer.start()
        try:
            killer.join()
            shop_run.join()
        finally:
            _all_up(soak)
        traffic_seconds, end = outcome["done"], time.time()
        say(f"traffic done in {traffic_seconds:.0f} s" + (f"; the shop failed: {outcome['error']!r}"
                                                         if "error" in outcome else ""))
        if killer.error is not None:
            raise killer.error
        if set(soak.modes) & set(CDC_MODES):
            kafka_connect.captured()
        # the disturbed monitors' last verdicts, and the controls, undisturbed, each from its own starting point
        threads = [threading.Thread(target=work, args=(end,)) for m in monitors for work in (m.finish, m.run_control)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = [m.result() for m in monitors]
        if "binlog" in soak.modes:
            binlog_control = findings(monitors[0].control)
            for m, r in zip(monitors, results):
                if m.mode in CDC_MODES:
                    r.against_binlog = _judge(m.mode, _without_pipeline(findings(m.control)), binlog_control, [],
                                              coarse=tuple(f"F{n}" for n in range(1, 17))).difference
    if "error" in outcome:
        raise outcome["error"]
    return Report(soak, killer.kills, results, outcome.get("truth"), traffic_seconds, time.monotonic() - began)


def _all_up(soak: Soak) -> None:
    """Every service the soak kills running again (a kill interrupted by an error may have left one down)."""
    mariadb.mariadb_up()
    broker.kafka_up()
    if set(soak.modes) & set(CDC_MODES):
        _connect_up()
        kafka_connect.restart_failed_task()


def _connect_up() -> str:
    """The worker started (if down) and the connector running; what had to be done beyond that, for the report."""
    try:
        kafka_connect.up()
        return ""
    except base.StackError as exc:  # its task failed on the start
        return f"the connector's task failed when it started ({exc})"


def _task_restarted(settle: float = 3.0) -> str:
    """The connector's task restarted if it failed within `settle` s (as an operator restarts it: from its offsets);
    what was done, for the report."""
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline:
        if kafka_connect.restart_failed_task():
            return "the connector's task had failed and was restarted (from its offsets)"
        time.sleep(0.5)
    return ""


@contextlib.contextmanager
def folder_of(path: Path | None) -> Iterator[Path]:
    """`path` (made), or a temporary folder removed afterwards."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="oncewatch-chaos-") as tmp:
        yield Path(tmp)
