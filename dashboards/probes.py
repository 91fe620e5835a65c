"""/healthz and /readyz beside /metrics: the answers a Kubernetes probe or a load balancer asks for.

- /healthz: the process that serves them is alive (always 200 while it answers);
- /readyz: the monitor reads its sources and writes its store, read from what the store holds: the monitor's
  health row (a group member's: its own row) was written within STALE_SECONDS, so the store takes writes, and
  its verdict is not failing or stopped, so every source is read. 503 otherwise, with the reasons in JSON.

Readiness is judged from the store, as /metrics is, so any process that serves /metrics for the store answers the
same; a store that cannot be opened is itself a reason.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from oncewatch.core import names
from oncewatch.core.config import PostgresTarget
from oncewatch.core.protocol import MonitorHealth
from oncewatch.dashboards import views
from oncewatch.store import StoreError

HEALTHZ, READYZ = "/healthz", "/readyz"
NOT_READY = (names.FAILING, names.STOPPED)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reasons: tuple[str, ...]

    def body(self) -> bytes:
        return json.dumps({"ready": self.ready, "reasons": list(self.reasons)}).encode()


def judge(comps: dict[str, views.Component], member: str | None = None) -> Readiness:
    """From the store's health rows (views.components): the lone monitor's row, or member `member`'s of a group."""
    name = names.MONITOR if member is None else f"{views.GROUP_HEALTH}{member}"
    who = "the monitor" if member is None else f"group member {member}"
    row = comps.get(name)
    if row is None:
        return Readiness(False, (f"{who} has written no health to the store yet (starting, or it cannot write it)",))
    if row.stale:
        return Readiness(False, (f"{who} last wrote its health {row.age_seconds:.0f} s ago (more than "
                                 f"{views.STALE_SECONDS:.0f} s): it is stuck or cannot write its store",))
    if isinstance(row.health, MonitorHealth) and row.health.verdict in NOT_READY:
        return Readiness(False, (f"verdict {row.health.verdict}", *row.health.reasons))
    return Readiness(True, ())


def readiness(target: str | PostgresTarget, member: str | None = None, now: float | None = None) -> Readiness:
    """`judge` over the store at `target`, read through a fresh read-only connection."""
    try:
        with closing(views.open_store(target)) as store:
            comps = views.components(store, time.time() if now is None else now)
    except (StoreError, sqlite3.Error) as exc:
        return Readiness(False, (f"the store cannot be read: {exc}",))
    return judge(comps, member)


def with_probes(app: Callable[..., Iterable[bytes]], target: str | PostgresTarget,
                member: str | None = None) -> Callable[..., Iterable[bytes]]:
    """The WSGI `app` (/metrics) with /healthz and /readyz answered before it."""

    def probed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == HEALTHZ:
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n"]
        if path == READYZ:
            answer = readiness(target, member)
            start_response("200 OK" if answer.ready else "503 Service Unavailable",
                           [("Content-Type", "application/json")])
            return [answer.body()]
        return app(environ, start_response)
    return probed
