"""Streamlit entry of the oncewatch atomicity dashboard, for a source checkout.

`streamlit run app.py` with ONCEWATCH_CONFIG=config.toml (or ONCEWATCH_STORE=oncewatch.db) in the
environment; `oncewatch dashboard --config config.toml` does the same from an installed package.
"""

from oncewatch.dashboards.app import main

main()
