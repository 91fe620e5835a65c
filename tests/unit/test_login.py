"""The dashboard's password login under the server-wide limiter, run by AppTest: several sessions
share one limiter, a lockout says when to try again and refuses even the right password, the right
password resets the address, every wrong one is a log line without the password; and the warnings
for what the dashboard exposes (a password file others may read, a listener off loopback)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from oncewatch.core import exposure
from oncewatch.dashboards import auth, launch, login_limits
from tests.conftest import SQLITE_ONLY
from tests.unit.test_login_limits import Clock
from tests.unit.test_metrics import scenario_store  # noqa: F401 - the scenario store fixture
from tests.unit.test_pages import APP, env, reset_address, set_address  # noqa: F401 - fixtures

pytestmark = SQLITE_ONLY  # the login reads no store

PASSWORD = "right-Pw-5e1f-never-logged"
GUESS = "guess-Pw-77c0-never-logged"
TRY_AGAIN = re.compile(r"Try again in \d+ s \(at \d\d:\d\d:\d\d UTC\)\.$")
STREAMLIT_ADDRESS = auth.client_address


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, env: Path) -> Iterator[Clock]:  # noqa: F811 - the fixture
    """A fresh server-wide limiter on the test's clock; the password from the environment."""
    now = Clock()
    monkeypatch.setattr(login_limits, "LIMITER", login_limits.LoginLimiter(clock=now))
    monkeypatch.setenv(auth.PASSWORD_ENV, PASSWORD)
    yield now


def session(monkeypatch: pytest.MonkeyPatch, address: str | None = None) -> AppTest:
    """A new browser session from `address` (None: the one AppTest's stand-in gives, i.e. unknown)."""
    monkeypatch.setattr(auth, "client_address", (lambda: address) if address else STREAMLIT_ADDRESS)
    return AppTest.from_file(APP, default_timeout=30).run()


def log_in(at: AppTest, password: str) -> str:
    """Submit the form; the page's error, or '' when the pages are shown."""
    at.text_input[0].input(password)
    at.button[0].click().run()
    assert not at.exception, at.exception
    return at.error[0].value if at.error and at.text_input else ""


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def test_sessions_share_the_limit_and_a_lockout_says_when(clock: Clock, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="oncewatch")
    for _ in range(4):  # a new session for every guess: the old per-session delay's way around
        assert log_in(session(monkeypatch), GUESS) == "Wrong password."
    fifth = log_in(session(monkeypatch), GUESS)
    assert fifth.startswith("Wrong password. Too many tries from your address: try again in 60 s")
    refused = log_in(session(monkeypatch), PASSWORD)  # the right one, but not looked at
    assert refused.startswith("Too many login attempts from your address.") and TRY_AGAIN.search(refused)
    assert log_in(session(monkeypatch, "10.0.0.8"), GUESS) == "Wrong password."  # another address may try

    failed = events(caplog, "login_failed")
    assert [(r.levelname, r.client, r.failures) for r in failed] == (
        [("WARNING", login_limits.UNKNOWN, n) for n in range(1, 6)] + [("WARNING", "10.0.0.8", 1)])
    assert [r.locked_until is None for r in failed] == [True] * 4 + [False, True]
    assert [(r.client, r.reason, r.refused) for r in events(caplog, "login_refused")] == [
        (login_limits.UNKNOWN, login_limits.ADDRESS, 1)]
    logged = " ".join(f"{r.getMessage()} {vars(r)}" for r in caplog.records)
    assert PASSWORD not in logged and GUESS not in logged

    clock.now += 60
    assert log_in(session(monkeypatch), PASSWORD) == ""
    assert [r.client for r in events(caplog, "login_succeeded")] == [login_limits.UNKNOWN]


def test_the_limit_on_all_addresses(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(login_limits.Limits().overall):
        assert log_in(session(monkeypatch, f"10.0.1.{i}"), GUESS) == "Wrong password."
    refused = log_in(session(monkeypatch, "10.0.2.1"), PASSWORD)
    assert refused.startswith("Too many login attempts on this dashboard.") and TRY_AGAIN.search(refused)


def test_the_right_password_resets_the_address(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(4):
        log_in(session(monkeypatch), GUESS)
    assert log_in(session(monkeypatch), PASSWORD) == ""
    for _ in range(4):  # four wrong ones again before a lockout, and the window is empty
        assert log_in(session(monkeypatch), GUESS) == "Wrong password."


def test_a_password_file_others_may_read_is_warned_about(clock: Clock, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    secret = tmp_path / "dashboard-password"
    secret.write_text(PASSWORD + "\n")
    monkeypatch.delenv(auth.PASSWORD_ENV)
    monkeypatch.setenv(auth.PASSWORD_FILE_ENV, str(secret))
    secret.chmod(0o600)
    assert auth.exposures("127.0.0.1") == []
    secret.chmod(0o640)
    [warning] = auth.exposures("127.0.0.1")
    assert warning.event == exposure.SECRET_FILE_OPEN and f"chmod 600 {secret}" in warning.message
    at = session(monkeypatch)
    assert not at.sidebar.warning, "nothing about the setup before the login"
    log_in(at, PASSWORD)
    assert [w.value for w in at.sidebar.warning] == [warning.message]


def test_a_dashboard_off_loopback_is_warned_about(clock: Clock, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    set_address("0.0.0.0")
    at = session(monkeypatch)
    log_in(at, PASSWORD)
    [warning] = at.sidebar.warning
    assert "the dashboard listens on 0.0.0.0, so other machines can reach it" in warning.value
    assert "SSH tunnel" in warning.value

    # `oncewatch dashboard` says it in its log at the start, before the server answers
    monkeypatch.setattr(launch, "launch", lambda **_: FailedStart())
    with caplog.at_level(logging.WARNING), pytest.raises(launch.LaunchError):
        launch.serve(config="unused.toml", host="0.0.0.0", port=1)
    [line] = events(caplog, exposure.LISTENER_NOT_LOOPBACK)
    assert (line.listener, line.host) == ("the dashboard", "0.0.0.0")


class FailedStart:
    """A server process that has exited already."""

    returncode = 1

    def poll(self) -> int:
        return self.returncode
