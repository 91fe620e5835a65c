"""Streamlit helpers the pages share: the read-only store of this run, time formats, the stale banner."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import streamlit as st

from oncewatch.core import names
from oncewatch.core.config import Config, ConfigError
from oncewatch.core.domain import Rules
from oncewatch.core.exact_json import plain
from oncewatch.dashboards import auth, views
from oncewatch.store import Store, StoreError, open_writer, reviews

# How often the Overview's live panel reruns; st.fragment(run_every=...) takes seconds.
REFRESH_SECONDS = float(os.environ.get("ONCEWATCH_REFRESH_SECONDS", "5"))
# The small charts show this much history.
CHART_WINDOW_SECONDS = 3600.0


@contextmanager
def store() -> Iterator[Store]:
    """The store opened read-only for this run (closed after it); a missing store stops the page
    with what to do instead of a traceback."""
    try:
        opened = views.open_store()
    except (views.StoreNotConfigured, StoreError, ConfigError) as exc:
        st.error(f"The oncewatch store cannot be read: {exc}. Start the monitor (`oncewatch run --config ...`) "
                 f"and point the dashboard at its store with {views.ENV_CONFIG} or {views.ENV_STORE}.")
        st.stop()
    try:
        yield opened
    finally:
        opened.close()


def config() -> Config | None:
    """The config ONCEWATCH_CONFIG names, if any; one that cannot be used stops the page saying why."""
    try:
        return views.config()
    except ConfigError as exc:
        st.error(f"The config in {views.ENV_CONFIG} cannot be used: {exc}")
        st.stop()


def when(t: float | None) -> str:
    """Epoch seconds as UTC with milliseconds, the precision the evidence has."""
    if t is None:
        return "–"
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def day_start(day: dt.date | None, plus_days: int = 0) -> dt.datetime | None:
    """Midnight UTC of a picked date (plus some days: an "until" date includes its whole day)."""
    if day is None:
        return None
    return dt.datetime.combine(day + dt.timedelta(days=plus_days), dt.time(), dt.timezone.utc)


def epoch(t: dt.datetime | None) -> float | None:
    return None if t is None else t.timestamp()


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def text(value: Any) -> str:
    """A row or payload value as people read it: exact decimals, no quotes around strings."""
    value = plain(value)
    return value if isinstance(value, str) else "NULL" if value is None else str(value)


def stale_banner(components: dict[str, views.Component]) -> None:
    """Say loudly when the monitor has stopped writing: every figure below is then old."""
    monitor = components.get(names.MONITOR)
    if monitor is None:
        st.warning("The monitor has not written its health yet: figures appear once `oncewatch run` is running.")
    elif monitor.stale:
        st.error(f"The monitor is stale: its last health report is {duration(monitor.age_seconds)} old "
                 f"(at {when(monitor.value['updated_at'])}). Figures below are as of then.")


def review(ids: list[str], action: str, *, reason: str, note: str, until_day: dt.date | None,
           duplicate_of: str | None) -> None:
    """Acknowledge or close findings from the dashboard, in the store the pages read (one short write)."""
    cfg = views.config()
    now = time.time()
    ack_for = cfg.rules.ack_timeout_seconds if cfg else Rules().ack_timeout_seconds
    with closing(open_writer(views.store_path())) as store:
        if action == "Acknowledge":
            reviews.acknowledge(store, ids, by=auth.who(), note=note, until=now + ack_for, now=now)
        else:
            until = epoch(day_start(until_day, plus_days=1)) if reason == "accepted_risk" and until_day else None
            reviews.close(store, ids, by=auth.who(), reason=reason, note=note, now=now, until=until,
                          duplicate_of=duplicate_of if reason == "duplicate" else None)
