"""A webhook receiver for the dev stack's Alertmanager: what `make demo` pages, and what the paging tests read.

Alertmanager posts one notification per group of alerts (devservices.paging groups by alertname, rule and
instance, so a rule's findings come together): its `status` (firing while any alert of the group fires) and
every alert of the group, firing or resolved, each with its labels (`finding` and `entity` for a finding's
alert) and annotations. The receiver keeps them in order and can print one line per notification.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from devservices.base import HOST

SHOWN = 3  # findings named on a printed line; the others are counted


@dataclass(frozen=True)
class Alert:
    status: str  # firing or resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    ends_at: str

    @property
    def name(self) -> str:
        return self.labels["alertname"]


@dataclass(frozen=True)
class Notification:
    status: str
    alerts: tuple[Alert, ...]

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Notification:
        return cls(body["status"], tuple(Alert(a["status"], a["labels"], a.get("annotations", {}), a["startsAt"],
                                               a["endsAt"]) for a in body["alerts"]))

    def line(self) -> str:
        """One line saying what was paged: the alert, its rule, and which findings fire or ended."""
        first = self.alerts[0].labels
        head = f"page {self.status.upper():8} {first['alertname']}"
        if first.get("rule"):
            head += f" {first['rule']}"
        parts = []
        for status in ("firing", "resolved"):
            alerts = [a for a in self.alerts if a.status == status]
            if not alerts:
                continue
            named = [a.labels.get("entity") or a.labels.get("finding") or a.labels.get("instance", "") for a in alerts]
            more = f" and {len(named) - SHOWN} more" if len(named) > SHOWN else ""
            parts.append(f"{len(alerts)} {status}: {', '.join(n for n in named[:SHOWN] if n) or '-'}{more}")
        return f"{head}: {'; '.join(parts)}"


class Receiver:
    """Listens on HOST:`port` (path /alerts) in a daemon thread; `on_notification` is called for each one."""

    def __init__(self, port: int, on_notification: Callable[[Notification], None] | None = None) -> None:
        self.notifications: list[Notification] = []
        lock = threading.Lock()
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                notification = Notification.from_json(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                with lock:
                    received.append(notification)
                if on_notification is not None:
                    on_notification(notification)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def alerts(self) -> list[Alert]:
        """Every alert of every notification, in the order they came."""
        return [a for n in list(self.notifications) for a in n.alerts]

    def saw(self, status: str, alertname: str, **labels: str) -> bool:
        return any(a.status == status and a.name == alertname and all(a.labels.get(k) == v for k, v in labels.items())
                   for a in self.alerts)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
