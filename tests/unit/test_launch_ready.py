"""launch.wait_ready takes the dashboard as up only when the process it started answers. Another Streamlit holding
the port answers its health check just as well, and the one started then exits ("Port ... is not available"): the
demo would say its dashboard is up while its browser tests find nothing there once the other stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from devservices.shop_monitor import free_port
from oncewatch.dashboards import launch

# A server that answers /_stcore/health as Streamlit does, standing in for a dashboard on `port`.
HEALTH = """
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *_): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"""


@pytest.fixture
def answering() -> Iterator[tuple[subprocess.Popen, int]]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", HEALTH, str(port)])
    try:
        yield server, port
    finally:
        server.kill()
        server.wait()


def test_the_process_that_answers_is_ready(answering: tuple[subprocess.Popen, int]) -> None:
    server, port = answering
    launch.wait_ready(server, launch.url(port=port), timeout=20)
    assert launch.listens(server.pid, port) is True


def test_another_process_answering_on_the_port_is_refused(answering: tuple[subprocess.Popen, int]) -> None:
    server, port = answering
    launch.wait_ready(server, launch.url(port=port), timeout=20)
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = time.monotonic()
        with pytest.raises(launch.LaunchError, match="another process answers"):
            launch.wait_ready(ours, launch.url(port=port), timeout=20)
        assert time.monotonic() - started < 10
        assert launch.listens(ours.pid, port) is False
    finally:
        ours.kill()
        ours.wait()


def test_a_dashboard_run_by_a_child_of_the_process_started_is_ready() -> None:
    """`oncewatch dashboard` runs Streamlit as its child: the port is held in the family of the process started."""
    port = free_port()
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                                                     f"{HEALTH!r}, '{port}'])"], start_new_session=True)
    try:
        launch.wait_ready(parent, launch.url(port=port), timeout=20)
        assert launch.listens(parent.pid, port) is True
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
