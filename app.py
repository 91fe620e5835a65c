"""Streamlit entry of the oncewatch atomicity dashboard: the login guard, then the pages.

Run it with `python -m dashboards.launch` (headless, bound to 127.0.0.1), pointing it at the
monitor's store with ONCEWATCH_CONFIG=config.toml or ONCEWATCH_STORE=oncewatch.db. The pages
only read the store; they never talk to MySQL or Kafka.
"""

import streamlit as st

from dashboards import auth

st.set_page_config(page_title="oncewatch", page_icon=":material/verified:", layout="wide")

if auth.guard():
    st.navigation([
        st.Page("dashboards/pages/overview.py", title="Overview", icon=":material/monitor_heart:", default=True),
        st.Page("dashboards/pages/findings.py", title="Findings", icon=":material/report:"),
        st.Page("dashboards/pages/drilldown.py", title="Drill-down", icon=":material/timeline:"),
        st.Page("dashboards/pages/drift.py", title="Drift", icon=":material/stacked_line_chart:"),
        st.Page("dashboards/pages/reports.py", title="Reports", icon=":material/download:"),
    ]).run()
