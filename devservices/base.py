"""What every dev service shares: where a stack keeps its state, its ports, and how a service's process is
installed, started, waited for and stopped.

The services themselves are modules of their own (devservices.mariadb, devservices.broker, devservices.postgres,
devservices.kafka_connect, devservices.paging), and `python -m devservices.stack up|down|status` is the command that
starts and stops them all; tests import a service's module to restart its server mid-stream.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Overridable, with the ports below, so that a second stack runs beside the first (devservices.suite runs three).
STATE = ROOT / os.environ.get("ONCEWATCH_DEV_STATE", ".devstack")

# Overridable so that a second stack (or checkout) can run beside this one; the other services' ports follow these.
MARIADB_PORT = int(os.environ.get("ONCEWATCH_DEV_MARIADB_PORT", "13306"))
KAFKA_PORT = int(os.environ.get("ONCEWATCH_DEV_KAFKA_PORT", "19092"))
KAFKA_CONTROLLER_PORT = KAFKA_PORT + 1
HOST = "127.0.0.1"

DEBIAN_PACKAGES = {
    "mariadbd": ["mariadb-server", "mariadb-client"],
    "chromium": ["chromium"],
    "ss": ["iproute2"],  # the security tests list listening sockets with it
    "prometheus": ["prometheus"],  # the server and promtool (devservices.paging)
    "prometheus-alertmanager": ["prometheus-alertmanager"],
    "/usr/lib/postgresql/*/bin/postgres": ["postgresql"],  # the shared store (devservices.postgres)
    "systemd-analyze": ["systemd"],  # checks deploy/oncewatch.service (tests/integration/test_service_unit.py)
    "openssl": ["openssl"],  # the stack's CA and server certificates for its TLS listeners
}


class StackError(RuntimeError):
    """A dev service could not be installed or started; the message says where to look."""


@dataclass(frozen=True)
class Service:
    name: str
    pidfile: Path
    logfile: Path
    marker: str  # a string that must appear in the pid's command line for it to be ours



def log(msg: str) -> None:
    print(f"[devstack] {msg}", flush=True)


def shown(path: Path) -> str:
    """A path for a log line: from the checkout when in it (a stack's folder may be elsewhere)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# ---------------------------------------------------------------- installs

def ensure_debian_packages() -> None:
    missing = [pkg for binary, pkgs in DEBIAN_PACKAGES.items() if not _installed(binary) for pkg in pkgs]
    if not missing:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log(f"installing Debian packages: {' '.join(missing)}")
    # Debian's postinst would start system-wide services; we run our own on other ports.
    policy = Path("/usr/sbin/policy-rc.d")
    created_policy = not policy.exists()
    if created_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                       check=True, env=env)
    finally:
        if created_policy:
            policy.unlink(missing_ok=True)


def _installed(binary: str) -> bool:
    if binary.startswith("/"):
        return any(Path("/").glob(binary[1:]))
    return shutil.which(binary) is not None or Path(f"/usr/sbin/{binary}").exists()

# ---------------------------------------------------------------- process helpers

def read_pid(svc: Service) -> int | None:
    try:
        pid = int(svc.pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return None
    return pid if svc.marker in cmdline else None


def spawn(svc: Service, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    svc.logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(svc.logfile, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    svc.pidfile.write_text(str(proc.pid))
    return proc


def stop(svc: Service, timeout: float = 60.0, sig: int = signal.SIGTERM) -> bool:
    """Stop a service this script started; True when it was running."""
    pid = read_pid(svc)
    if pid is None:
        return False
    os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if read_pid(svc) is None and exited(pid):
            break
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    svc.pidfile.unlink(missing_ok=True)
    return True


def exited(pid: int) -> bool:
    """The process is gone, or a zombie: its files, its listening ports among them, are closed. A process that is
    being killed loses its command line before its files (read_pid says None while its port still answers: a
    Connect worker SIGKILLed and started again at once found its own port taken)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state in ("Z", "X")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def wait_until(what: str, ready, proc: subprocess.Popen, svc: Service, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"{what} exited during start-up; see {svc.logfile}")
        try:
            if ready():
                return
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last_error = exc
        time.sleep(0.5)
    raise StackError(f"{what} did not answer within {timeout:.0f}s ({last_error}); see {svc.logfile}")


# ---------------------------------------------------------------- MariaDB
def secret_file(path: Path) -> str:
    """The password kept in `path`, made (random, 0600) the first time."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(18) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()

def stop_if_config_changed(svc: Service, config: Path, wanted: str, down: Callable[[], bool]) -> None:
    """`down()` a service this script started whose config file is not `wanted` (a new version of this script),
    so that starting it again writes the new config."""
    if read_pid(svc) is not None and config.exists() and config.read_text() != wanted:
        log(f"{svc.name}'s config changed (a new version of this script): restarting it")
        down()


def already_up(svc: Service, port: int) -> bool:
    """True when this script's own process of the service runs; a port held by anything else is an error."""
    if read_pid(svc) is not None:
        log(f"{svc.name} already running on {HOST}:{port}")
        return True
    if port_open(port):
        raise StackError(f"port {port} is taken by a process this script did not start")
    return False

def java_argv(lib: Path, main: str, *args: str, heap: str = "512m") -> list[str]:
    """A dev JVM (the broker, its tools, a Connect worker). Only the client compiler and the serial collector: the
    stacks' JVMs are started again and again on two cores (three stacks side by side in `make test`, servers killed
    on purpose), where C2's compiling costs more than it gives back: a broker took 6.4 to 7.0 CPU-seconds to be ready
    with the defaults and G1, 3.9 with these (and 1.3 instead of 1.6 to 2.3 for its first idle minute)."""
    return ["java", f"-Xmx{heap}", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", f"{lib}/*", main, *args]

