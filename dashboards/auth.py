"""The dashboard's login (issue 6 item 5): Streamlit OIDC, or a password from the environment.

- `[auth]` in Streamlit's secrets (`.streamlit/secrets.toml`): OIDC through `st.login`
  (needs `streamlit[auth]`, i.e. Authlib);
- else ONCEWATCH_DASHBOARD_PASSWORD, or ONCEWATCH_DASHBOARD_PASSWORD_FILE naming a file that
  holds it: a password form, remembered for the browser session;
- else no login, and the pages are only shown while the server listens on loopback.
`guard()` runs in app.py before the navigation, so it covers every page.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Mapping
from pathlib import Path

import streamlit as st

PASSWORD_ENV = "ONCEWATCH_DASHBOARD_PASSWORD"
PASSWORD_FILE_ENV = "ONCEWATCH_DASHBOARD_PASSWORD_FILE"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
SESSION_KEY = "oncewatch_logged_in"
# Slows password guessing down to a few tries a second per session.
FAILED_LOGIN_DELAY_SECONDS = 0.5


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


def oidc_configured() -> bool:
    try:
        return "auth" in st.secrets
    except FileNotFoundError:  # no secrets.toml at all (Streamlit's error subclasses it)
        return False


def _oidc() -> bool:
    if st.user.is_logged_in:
        st.sidebar.button("Log out", on_click=st.logout)
        return True
    st.title("oncewatch")
    st.button("Log in", type="primary", on_click=st.login)
    return False


def _password(expected: str) -> bool:
    if st.session_state.get(SESSION_KEY):
        st.sidebar.button("Log out", on_click=lambda: st.session_state.pop(SESSION_KEY, None))
        return True
    st.title("oncewatch")
    with st.form("login"):
        given = st.text_input("Password", type="password")
        if st.form_submit_button("Log in", type="primary"):
            if hmac.compare_digest(given.encode(), expected.encode()):
                st.session_state[SESSION_KEY] = True
                st.rerun()
            time.sleep(FAILED_LOGIN_DELAY_SECONDS)
            st.error("Wrong password.")
    return False


def _loopback_only() -> bool:
    address = st.get_option("server.address")
    if address not in LOOPBACK:
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
