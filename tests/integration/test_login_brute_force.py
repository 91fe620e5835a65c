"""A parallel password brute force against a real `oncewatch dashboard` (issue 12 item 5).

50 sessions guess at once for WINDOW_SECONDS, speaking Streamlit's own WebSocket protocol (what the
browser sends: a rerun with the form's widget states), 5 sessions from each of 10 client addresses
(127.0.0.1, which Streamlit reports as no address, and 127.0.0.2-10: the whole of 127/8 is loopback
on Linux, so a socket bound to one of them is a client of its own to the server). The server takes
what login_limits states: at most 5 tries per address and 30 from all of them per minute; every
other try is refused with when to try again, and every wrong password is one `login_failed` line of
its log, without the password. And `oncewatch dashboard` warns at its start about a password file
others may read. Needs only the dashboard, not MariaDB or Kafka.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState
from websockets.sync.client import ClientConnection, connect

from devservices import scenario
from devservices.shop_monitor import free_port
from oncewatch.dashboards import auth, launch, login_limits

PASSWORD = "right-Pw-5e1f-never-logged"
GUESS = "guess-Pw-77c0-never-logged"
SOURCES = ["127.0.0.1", *(f"127.0.0.{i}" for i in range(2, 11))]
SESSIONS_PER_SOURCE = 5
WINDOW_SECONDS = 20.0  # some hundred tries offered once the sessions are open (55 in 12 s on a loaded fresh clone)
LIMITS = login_limits.Limits()
# One address guesses this long before the others, so that it is locked out before all of them fill the limit
# on all addresses (started together, ten addresses share the 30 tries and none may reach its 5).
LEADER, LEAD_SECONDS = SOURCES[1], 1.0
WRONG, REFUSED, LOGGED_IN = "Wrong password.", "Too many login attempts", "(logged in)"


@pytest.fixture(scope="module", autouse=True)
def dev_services() -> None:
    """Overrides the package's check for MariaDB and Kafka: the dashboard reads only its store."""


class Session:
    """One browser session of the login page over /_stcore/stream (see `session`)."""

    def __init__(self, ws: ClientConnection):
        self.ws = ws
        elements = self.rerun([])
        self.password_id = next(e.text_input.id for e in elements if e.WhichOneof("type") == "text_input")
        self.submit_id = next(e.button.id for e in elements if e.WhichOneof("type") == "button")

    def rerun(self, widgets: list[WidgetState]) -> list:
        """The elements of the run these widget states start, and of the runs it reruns into."""
        msg = BackMsg()
        msg.rerun_script.widget_states.widgets.extend(widgets)
        self.ws.send(msg.SerializeToString())
        elements = []
        while True:
            fwd = ForwardMsg()
            fwd.ParseFromString(self.ws.recv(timeout=30))
            finished = fwd.WhichOneof("type") == "script_finished"
            if finished and fwd.script_finished != ForwardMsg.FINISHED_EARLY_FOR_RERUN:
                return elements
            if fwd.WhichOneof("type") == "delta" and fwd.delta.WhichOneof("type") == "new_element":
                elements.append(fwd.delta.new_element)

    def log_in(self, password: str) -> str:
        """Submit the form; the login's error text, or LOGGED_IN when the pages are shown instead."""
        elements = self.rerun([WidgetState(id=self.password_id, string_value=password),
                               WidgetState(id=self.submit_id, trigger_value=True)])
        if any(e.WhichOneof("type") == "button" and e.button.label == "Log out" for e in elements):
            return LOGGED_IN
        return " ".join(e.alert.body for e in elements if e.WhichOneof("type") == "alert")


@contextlib.contextmanager
def session(port: int, source: str) -> Iterator[Session]:
    """A session whose TCP connection comes from `source`, which the server takes as the client's address."""
    sock = socket.create_connection(("127.0.0.1", port), source_address=(source, 0), timeout=30)
    # 50 sessions open at once on a machine that runs the other lanes too: the server, busy with the scripts of the
    # sessions before, took more than the library's 10 s to answer some handshakes on a fresh clone
    with connect(f"ws://127.0.0.1:{port}/_stcore/stream", sock=sock, subprotocols=["streamlit"],
                 open_timeout=60) as ws:
        yield Session(ws)


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: list[tuple[float, str]] = field(default_factory=list)  # (when, source) of each wrong password taken
    refused: list[str] = field(default_factory=list)  # the refusals' texts
    other: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # why a session failed


@dataclass
class Start:
    """The guessing starts once every session is open (opening 50 takes seconds of the server's time)."""

    ready: threading.Barrier
    until: list[float] = field(default_factory=list)  # set by the test once all are ready


def guess(port: int, source: str, start: Start, tally: Tally) -> None:
    try:
        with session(port, source) as guesser:
            guess_in(guesser, source, start, tally)
    except threading.BrokenBarrierError:
        raise
    except Exception as exc:
        with tally.lock:
            tally.failed.append(repr(exc))
        start.ready.abort()  # the other sessions stop waiting for this one: the test fails at once, saying why
        raise


def guess_in(guesser: Session, source: str, start: Start, tally: Tally) -> None:
    start.ready.wait(timeout=120)
    start.ready.wait(timeout=120)  # the second time: `until` is set
    if source != LEADER:
        time.sleep(LEAD_SECONDS)
    while time.monotonic() < start.until[0]:
        text = guesser.log_in(GUESS)
        with tally.lock:
            if text == WRONG or text.startswith(WRONG + " Too many tries"):
                tally.accepted.append((time.monotonic(), source))
            elif text.startswith(REFUSED):
                tally.refused.append(text)
            else:
                tally.other.append(text)


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """`oncewatch dashboard` with a password file its group and others may read; its output in a file."""
    store = tmp_path / "scenario.db"
    scenario.seed(str(store)).close()
    config = tmp_path / "oncewatch.toml"
    config.write_text(f'[mysql]\nuser = "oncewatch"\ntables = ["shop.orders"]\n\n[store]\npath = "{store}"\n')
    secret = tmp_path / "dashboard-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if k != auth.PASSWORD_ENV}
    port = free_port()
    out = tmp_path / "dashboard.log"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "dashboard", "--config", str(config),
                                 "--port", str(port)], env={**env, auth.PASSWORD_FILE_ENV: str(secret)},
                                stdout=sink, stderr=subprocess.STDOUT)
    try:
        launch.wait_ready(proc, launch.url(port=port))
        yield port, out
    finally:
        launch.stop(proc)


def log_lines(path: Path, event: str) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def test_parallel_brute_force_is_held_to_the_stated_rate(dashboard: tuple[int, Path]) -> None:
    port, out = dashboard
    tally = Tally()
    sessions = len(SOURCES) * SESSIONS_PER_SOURCE
    go = Start(threading.Barrier(sessions + 1))
    threads = [threading.Thread(target=guess, args=(port, source, go, tally))
               for source in SOURCES for _ in range(SESSIONS_PER_SOURCE)]
    for t in threads:
        t.start()
    try:
        go.ready.wait(timeout=120)  # every session open
        start = time.monotonic()
        go.until.append(start + WINDOW_SECONDS)
        go.ready.wait(timeout=120)
    except threading.BrokenBarrierError:
        for t in threads:
            t.join()
        pytest.fail(f"the sessions did not all open: {tally.failed[:3] or 'not within 120 s'}")
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start

    tries = len(tally.accepted) + len(tally.refused)
    per_source = Counter(source for _, source in tally.accepted)
    # The limiter's minute slides: any 60 s hold at most its limit, so a run of `elapsed` seconds at most
    # ceil(elapsed / 60) times it (once, for a run under a minute).
    windows = math.ceil(elapsed / LIMITS.window_seconds)
    print(f"\n{len(threads)} sessions from {len(SOURCES)} addresses for {elapsed:.1f} s: {tries} tries "
          f"({tries / elapsed:.1f}/s), {len(tally.accepted)} taken (bound {LIMITS.overall * windows}), "
          f"{len(tally.refused)} refused; taken per address {sorted(per_source.values(), reverse=True)}")
    assert not tally.failed and not tally.other, (tally.failed + tally.other)[:3]
    assert tries > 2 * LIMITS.overall, "the guessers offered too few tries to test the limit"
    assert 0 < len(tally.accepted) <= LIMITS.overall * windows
    assert max(per_source.values()) <= LIMITS.per_address * windows
    assert all("Try again in " in text and " UTC)." in text for text in tally.refused)

    server_log = out.read_text()
    assert PASSWORD not in server_log and GUESS not in server_log
    failed = log_lines(out, "login_failed")
    assert len(failed) == len(tally.accepted), "one log line per wrong password"
    assert {e["client"] for e in failed} <= {login_limits.UNKNOWN, *SOURCES[1:]}
    assert all(e["level"] == "warning" and e["failures"] >= 1 and "locked_until" in e for e in failed)
    assert any(e["failures"] == LIMITS.lockout_after and e["locked_until"] for e in failed)
    assert log_lines(out, "login_refused"), "refused tries show in the log too"


def test_the_right_password_from_a_fresh_address_gets_in_and_resets_it(dashboard: tuple[int, Path]) -> None:
    port, out = dashboard
    with session(port, "127.0.0.12") as user:
        for _ in range(LIMITS.lockout_after - 1):
            assert user.log_in(GUESS) == WRONG
        assert user.log_in(PASSWORD) == LOGGED_IN
    with session(port, "127.0.0.12") as again:  # not locked out, nor one try short of it
        assert again.log_in(GUESS) == WRONG
    failures = [e["failures"] for e in log_lines(out, "login_failed") if e["client"] == "127.0.0.12"]
    assert failures == [1, 2, 3, 4, 1]
    assert [e["client"] for e in log_lines(out, "login_succeeded")] == ["127.0.0.12"]


def test_a_password_file_others_may_read_is_warned_about_at_the_start(dashboard: tuple[int, Path]) -> None:
    _, out = dashboard
    [line] = log_lines(out, "secret_file_open")
    assert (line["level"], line["mode"], line["path"].endswith("dashboard-password")) == ("warning", "644", True)
    assert "chmod 600" in line["msg"] and PASSWORD not in out.read_text()
