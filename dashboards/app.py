"""The atomicity dashboard's Streamlit script: the login guard, then the pages.

`oncewatch dashboard --config F` runs this file (it ships in the package); from a source
checkout the top-level `app.py` calls the same `main()`. The pages only read the store; they
never talk to MySQL or Kafka.
"""

import logging
from pathlib import Path

import streamlit as st

from oncewatch.core import logs
from oncewatch.dashboards import auth

# Not "pages/": Streamlit would find a pages/ folder beside its main script and serve each file in it
# at its own URL on its own, before this script's navigation (and its login guard) ever ran.
PAGES = Path(__file__).resolve().parent / "screens"


def page(name: str) -> Path:
    """A page's script, by file name without .py (st.switch_page takes the same path)."""
    return PAGES / f"{name}.py"


def _logs() -> None:
    """The server process's own log lines (the login's) as JSON on stderr, from the first run of this
    script on: Streamlit configures only its 'streamlit' loggers, so the root logger has no handler
    until then; a test runner or a program that embeds the server has its own, left alone."""
    if not logging.getLogger().handlers:
        logs.setup()


def main() -> None:
    _logs()
    st.set_page_config(page_title="oncewatch", page_icon=":material/verified:", layout="wide")
    if auth.guard():
        st.navigation([
            st.Page(page("overview"), title="Overview", icon=":material/monitor_heart:", default=True),
            st.Page(page("findings"), title="Findings", icon=":material/report:"),
            st.Page(page("incidents"), title="Incidents", icon=":material/emergency:"),
            st.Page(page("drilldown"), title="Drill-down", icon=":material/timeline:"),
            st.Page(page("drift"), title="Drift", icon=":material/stacked_line_chart:"),
            st.Page(page("quarantine"), title="Quarantine", icon=":material/block:"),
            st.Page(page("reports"), title="Reports", icon=":material/download:"),
        ]).run()


if __name__ == "__main__":
    main()
