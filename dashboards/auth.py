"""The dashboard's login (issue 6 item 5): Streamlit OIDC, or a password from the environment.

- `[auth]` in Streamlit's secrets (`.streamlit/secrets.toml`): OIDC through `st.login`
  (needs `streamlit[auth]`, i.e. Authlib);
- else ONCEWATCH_DASHBOARD_PASSWORD, or ONCEWATCH_DASHBOARD_PASSWORD_FILE naming a file that
  holds it: a password form, remembered for the browser session, its tries limited (issue 12
  item 5) per client address and in all by the server-wide limiter of `login_limits` (5 per
  address and 30 in all per minute; 5 wrong in a row lock the address out for 30 s, doubling up
  to 15 min). Every wrong password is logged (`login_failed`: the client address, the failures in
  a row, until when it is locked out; never the password), and so are refused tries
  (`login_refused`);
- else no login, and the pages are only shown while the server listens on loopback.
`guard()` runs in app.py before the navigation, so it covers every page. `exposures()` says what the
dashboard exposes (a listener off loopback, a password file others may read): logged by
`oncewatch dashboard` at its start and shown in the sidebar after the login.
"""

from __future__ import annotations

import datetime as dt
import hmac
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path

import streamlit as st

from oncewatch.core import exposure
from oncewatch.dashboards import login_limits

PASSWORD_ENV = "ONCEWATCH_DASHBOARD_PASSWORD"
PASSWORD_FILE_ENV = "ONCEWATCH_DASHBOARD_PASSWORD_FILE"
SESSION_KEY = "oncewatch_logged_in"
# Said where a listener off loopback is reported, on the page and in the log.
LISTENER_FIX = ("start it with --host 127.0.0.1 and reach it through an SSH tunnel, or put it behind a "
                "TLS proxy: the login crosses the network in the clear otherwise")

log = logging.getLogger("oncewatch.dashboards.auth")


class AuthConfigError(RuntimeError):
    """The login is configured but cannot be used; the message says what to fix."""


def configured_password(environ: Mapping[str, str] = os.environ) -> str | None:
    if environ.get(PASSWORD_ENV):
        return environ[PASSWORD_ENV]
    path = environ.get(PASSWORD_FILE_ENV)
    if not path:
        return None
    try:
        password = Path(path).read_text().strip()
    except OSError as exc:
        raise AuthConfigError(f"{PASSWORD_FILE_ENV}={path}: cannot read it ({exc.strerror})") from exc
    if not password:
        raise AuthConfigError(f"{PASSWORD_FILE_ENV}={path}: the file is empty")
    return password


def exposures(address: str | None, environ: Mapping[str, str] = os.environ) -> list[exposure.Exposure]:
    """What a dashboard listening on `address` with this environment exposes."""
    path = environ.get(PASSWORD_FILE_ENV)
    found = [exposure.listener(address, "the dashboard", LISTENER_FIX),
             exposure.secret_file(path, PASSWORD_FILE_ENV) if path and not environ.get(PASSWORD_ENV) else None]
    return [e for e in found if e]


def oidc_configured() -> bool:
    try:
        return "auth" in st.secrets
    except FileNotFoundError:  # no secrets.toml at all (Streamlit's error subclasses it)
        return False


def _sidebar_warnings() -> None:
    for e in exposures(st.get_option("server.address")):
        st.sidebar.warning(e.message)


def _oidc() -> bool:
    if st.user.is_logged_in:
        st.sidebar.button("Log out", on_click=st.logout)
        _sidebar_warnings()
        return True
    st.title("oncewatch")
    st.button("Log in", type="primary", on_click=st.login)
    return False


def client_address() -> str:
    """The client's address as Streamlit saw it, or login_limits.UNKNOWN: Streamlit gives None for a
    loopback client and where a proxy hides it (and AppTest's stand-in runtime gives a mock)."""
    address = st.context.ip_address
    return address if isinstance(address, str) and address else login_limits.UNKNOWN


def _ends(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)


def _when(seconds: float) -> str:
    """The page's form of a wait: 'in 45 s (at 14:03:27 UTC)'."""
    wait = f"{math.ceil(seconds)} s" if seconds < 120 else f"{math.ceil(seconds / 60)} min"
    return f"in {wait} (at {_ends(seconds):%H:%M:%S} UTC)"


def _until(seconds: float) -> str | None:
    """The log's form of a wait: when it ends, ISO-8601 UTC, or None when there is none."""
    return _ends(seconds).isoformat(timespec="seconds") if seconds > 0 else None


def _refused(client: str, refusal: login_limits.Refusal) -> None:
    whose = "from your address" if refusal.reason == login_limits.ADDRESS else "on this dashboard"
    st.error(f"Too many login attempts {whose}. Try again {_when(refusal.retry_after)}.")
    # The first refused try of a run, then the 10th, 100th...: a flood of refused tries shows in the
    # log without filling the disk (each line carries the count so far).
    if str(refusal.refused).rstrip("0") == "1":
        log.warning("login refused", extra={"event": "login_refused", "client": client, "reason": refusal.reason,
                                            "refused": refusal.refused, "failures": refusal.failures,
                                            "locked_until": _until(refusal.retry_after)})


def _check(given: str, expected: str) -> bool:
    """One submitted password, through the server-wide limiter; True when it is right and was taken."""
    client = client_address()
    limiter = login_limits.LIMITER
    refusal = limiter.admit(client)
    if refusal is not None:  # refused before the password is looked at: the answer says nothing about it
        _refused(client, refusal)
        return False
    if hmac.compare_digest(given.encode(), expected.encode()):
        limiter.succeeded(client)
        log.info("login", extra={"event": "login_succeeded", "client": client})
        return True
    failure = limiter.failed(client)
    log.warning("wrong dashboard password", extra={"event": "login_failed", "client": client,
                                                   "failures": failure.failures,
                                                   "locked_until": _until(failure.retry_after)})
    st.error("Wrong password." + (f" Too many tries from your address: try again {_when(failure.retry_after)}."
                                  if failure.retry_after > 0 else ""))
    return False


def _password(expected: str) -> bool:
    if st.session_state.get(SESSION_KEY):
        st.sidebar.button("Log out", on_click=lambda: st.session_state.pop(SESSION_KEY, None))
        _sidebar_warnings()
        return True
    st.title("oncewatch")
    with st.form("login"):
        given = st.text_input("Password", type="password")
        if st.form_submit_button("Log in", type="primary") and _check(given, expected):
            st.session_state[SESSION_KEY] = True
            st.rerun()
    return False


def _loopback_only() -> bool:
    address = st.get_option("server.address")
    if not exposure.is_loopback(address):
        st.error(f"No login is configured and the server listens on {address or 'every interface'}. "
                 f"Start it bound to 127.0.0.1 (`--server.address 127.0.0.1`, as dashboards.launch does), "
                 f"or set {PASSWORD_ENV} or an [auth] OIDC section in .streamlit/secrets.toml.")
        return False
    st.sidebar.caption("No login configured: the dashboard is bound to 127.0.0.1 only.")
    return True


def who() -> str:
    """Who acts on a finding from the dashboard: the OIDC login's e-mail, else 'dashboard'."""
    if oidc_configured() and st.user.is_logged_in:
        return str(st.user.get("email") or st.user.get("name") or "dashboard")
    return "dashboard"


def guard() -> bool:
    """True when this visitor may see the pages; otherwise the login (or why not) is drawn."""
    if oidc_configured():
        return _oidc()
    try:
        password = configured_password()
    except AuthConfigError as exc:
        st.error(str(exc))
        return False
    return _loopback_only() if password is None else _password(password)
