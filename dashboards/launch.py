"""Start the Streamlit dashboard headless, bound to 127.0.0.1 unless told otherwise.

    launch(config="examples/shop.toml")            # or store="/path/oncewatch.db"
    oncewatch dashboard --config examples/shop.toml --port 8501

The server runs as a child process (Streamlit wants its own main thread); `wait_ready` polls its
health endpoint, `stop` ends it. `serve` warns at the start about what the dashboard exposes
(auth.exposures: a listener off loopback, a password file others may read).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from oncewatch.core import exposure, processes
from oncewatch.dashboards.views import ENV_CONFIG, ENV_STORE

logger = logging.getLogger("oncewatch.dashboards.launch")

# The packaged script, so that an installed oncewatch starts the same dashboard as a checkout.
APP = Path(__file__).resolve().parent / "app.py"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501


class LaunchError(RuntimeError):
    """The dashboard did not come up; the message carries the end of its output."""


def command(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
            "--server.address", host, "--server.port", str(port), "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--server.runOnSave", "false", "--client.toolbarMode", "viewer",
            # Streamlit's own chatter (its banner, "Uvicorn server started") is not for the terminal;
            # its errors and oncewatch's JSON log lines (the login's) are.
            "--logger.level", "error"]


def launch(*, config: str | None = None, store: str | None = None, host: str = DEFAULT_HOST,
           port: int = DEFAULT_PORT, env: dict[str, str] | None = None, log: Path | None = None) -> subprocess.Popen:
    """Start the dashboard for a config file or a store file; returns the server process.
    Its output goes to `log`; without one, its log lines (the login's, Streamlit's errors) go to this
    process's stderr and Streamlit's banner on stdout is dropped."""
    if not (config or store):
        raise ValueError("give config= (the monitor's config file) or store= (its store file)")
    child_env = {**os.environ, **(env or {})}
    if config:
        child_env[ENV_CONFIG] = str(Path(config).resolve())
    if store:
        child_env[ENV_STORE] = str(Path(store).resolve())
    with open(log, "ab") if log else contextlib.nullcontext() as out:  # the child keeps its own copy
        return subprocess.Popen(command(host, port), cwd=APP.parent, env=child_env,
                                stdout=out or subprocess.DEVNULL, stderr=subprocess.STDOUT if out else None)


def url(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def listens(pid: int, port: int) -> bool | None:
    """Whether process `pid` or one of its descendants holds the listening TCP socket on `port`; None where Linux's
    /proc cannot say."""
    inodes: set[str] = set()
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as rows:
                next(rows)
                for row in rows:
                    cols = row.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                        inodes.add(cols[9])
        family = {pid, *processes.descendants(pid)}
    except OSError:
        return None
    held: set[str] = set()
    for p in family:
        try:
            held.update(os.readlink(f"/proc/{p}/fd/{fd}") for fd in os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue  # ended meanwhile, or not ours to look into
    return any(f"socket:[{inode}]" in held for inode in inodes)


def wait_ready(proc: subprocess.Popen, base_url: str, timeout: float = 60.0) -> None:
    """Return once /_stcore/health answers ok from `proc`; LaunchError if the process dies, another process answers
    on its port, or time runs out. Its body must say "ok": another server holding the port (a monitor's /metrics
    answers any path) is not the dashboard. Nor is another Streamlit that holds it (ours then cannot bind it)."""
    port = urllib.parse.urlsplit(base_url).port or DEFAULT_PORT
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LaunchError(f"streamlit exited with {proc.returncode} before answering on {base_url}")
        try:
            with urllib.request.urlopen(f"{base_url}/_stcore/health", timeout=2) as resp:
                answered = resp.status == 200 and resp.read().strip() == b"ok"
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            answered = False
        if answered:
            if listens(proc.pid, port) is False:
                raise LaunchError(f"another process answers on {base_url}, not this dashboard: give it a free port")
            return
        time.sleep(0.2)
    raise LaunchError(f"the dashboard did not answer on {base_url} within {timeout:.0f} s")


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def serve(*, config: str | None = None, store: str | None = None, host: str = DEFAULT_HOST,
          port: int = DEFAULT_PORT) -> int:
    """`oncewatch dashboard`: start the dashboard, say where it is, and run until Ctrl-C or SIGTERM."""
    from oncewatch.dashboards.auth import exposures  # imports Streamlit, which launch() alone does not need

    exposure.log(logger, exposures(host))
    proc = launch(config=config, store=store, host=host, port=port)
    try:
        wait_ready(proc, url(host, port))
        print(f"oncewatch dashboard on {url(host, port)}", flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if proc.poll() is None:
            stop(proc)
