"""The development services: a real MariaDB, a real Kafka broker, a Kafka Connect worker with Debezium's
MariaDB connector (devservices.kafka_connect), and the paging path (Debian's Prometheus and
Alertmanager, devservices.paging), all on loopback.

`python -m devservices.stack up|down|status` installs what is missing (Debian packages, the
Kafka, Connect and Debezium jars from Maven Central), initialises data dirs once under `.devstack/`, starts each
service in the background, waits until it really answers and prints where it listens.
`up` is a no-op for a service that already runs; `down` stops only processes this script
started (their pid files live in `.devstack/`). Tests import the start/stop functions to
restart a server mid-stream.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Overridable, with the ports below, so that a second stack runs beside the first (devservices.suite runs two).
STATE = ROOT / os.environ.get("ONCEWATCH_DEV_STATE", ".devstack")
KAFKA_POM_DIR = ROOT / "devservices" / "kafka"

# Overridable so that a second stack (or checkout) can run beside this one.
MARIADB_PORT = int(os.environ.get("ONCEWATCH_DEV_MARIADB_PORT", "13306"))
KAFKA_PORT = int(os.environ.get("ONCEWATCH_DEV_KAFKA_PORT", "19092"))
KAFKA_CONTROLLER_PORT = KAFKA_PORT + 1
HOST = "127.0.0.1"

ADMIN_USER = "dev_admin"
ADMIN_PASSWORD = "dev_admin"
MONITOR_USER = "oncewatch"
# Schemas the monitor may SELECT from: the simulated shop and the test schemas.
MONITORED_SCHEMAS = ("shop", "owtest", "mall_0", "mall_1", "owmall_0", "owmall_1", "owcdc")

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


MARIADB = Service("mariadb", STATE / "mariadb" / "mariadbd.pid", STATE / "mariadb" / "mariadbd.log",
                  str(STATE / "mariadb" / "my.cnf"))
KAFKA = Service("kafka", STATE / "kafka" / "kafka.pid", STATE / "kafka" / "kafka.log",
                str(STATE / "kafka" / "server.properties"))

MONITOR_PASSWORD_FILE = STATE / "secrets" / "mysql_monitor_password"


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


def ensure_kafka_jars() -> Path:
    lib = KAFKA_POM_DIR / "lib"
    if not any(lib.glob("kafka_2.13-*.jar")):
        log("fetching Apache Kafka jars from Maven Central")
        subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(KAFKA_POM_DIR / "pom.xml"),
                        "dependency:copy-dependencies"], check=True)
    return lib


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
        if read_pid(svc) is None:
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

def mariadb_dir() -> Path:
    return STATE / "mariadb"


def mariadb_socket() -> Path:
    return mariadb_dir() / "mysqld.sock"


def mariadb_config() -> str:
    """The server's my.cnf: binlog as the monitor needs it, and TLS with the stack's certificates (devservices.tls)."""
    from devservices import tls

    d = mariadb_dir()
    return f"""[mariadbd]
datadir={d / 'data'}
tmpdir={d / 'tmp'}
socket={mariadb_socket()}
pid-file={d / 'mariadbd.server.pid'}
port={MARIADB_PORT}
bind-address={HOST}
user=root
skip-name-resolve
log-error={d / 'error.log'}
server_id=1
log_bin={d / 'data' / 'binlog'}
binlog_format=ROW
binlog_row_image=FULL
binlog_row_metadata=FULL
gtid_domain_id=0
gtid_strict_mode=ON
log_slave_updates=ON
innodb_buffer_pool_size=128M
innodb_log_file_size=64M
max_connections=200
character-set-server=utf8mb4
collation-server=utf8mb4_unicode_ci
{tls.mariadb_properties()}"""


def write_mariadb_config() -> Path:
    cnf = mariadb_dir() / "my.cnf"
    cnf.write_text(mariadb_config())
    return cnf


def mariadb_admin_sql(sql: str) -> str:
    """Run SQL as the OS-root MariaDB account over the unix socket (set-up only)."""
    out = subprocess.run(["mariadb", f"--socket={mariadb_socket()}", "-uroot", "-N", "-B", "-e", sql],
                         check=True, capture_output=True, text=True)
    return out.stdout


def secret_file(path: Path) -> str:
    """The password kept in `path`, made (random, 0600) the first time."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(18) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def monitor_password() -> str:
    return secret_file(MONITOR_PASSWORD_FILE)


def already_up(svc: Service, port: int) -> bool:
    """True when this script's own process of the service runs; a port held by anything else is an error."""
    if read_pid(svc) is not None:
        log(f"{svc.name} already running on {HOST}:{port}")
        return True
    if port_open(port):
        raise StackError(f"port {port} is taken by a process this script did not start")
    return False


def mariadb_up() -> None:
    svc = MARIADB
    cnf = mariadb_dir() / "my.cnf"
    if read_pid(svc) is not None and cnf.exists() and cnf.read_text() != mariadb_config():
        log("mariadb's config changed (a new version of this script): restarting it")
        mariadb_down()
    if already_up(svc, MARIADB_PORT):
        ensure_mariadb_users()  # a schema or grant added since it started
        return
    d = mariadb_dir()
    d.mkdir(parents=True, exist_ok=True)
    cnf = write_mariadb_config()
    # a tmpdir of the stack's own: the stacks of `make test` initialise side by side, and a bootstrap in the shared
    # /tmp once failed on "Error on delete of '/tmp/#sql-temptable-...'" (mariadb-install-db exit 1)
    (d / "tmp").mkdir(parents=True, exist_ok=True)
    fresh = not (d / "data" / "mysql").exists()
    if fresh:
        log("initialising MariaDB data dir")
        subprocess.run(["mariadb-install-db", f"--defaults-file={cnf}", "--auth-root-authentication-method=socket",
                        "--skip-test-db"], check=True, capture_output=True)
    proc = spawn(svc, [mariadbd_binary(), f"--defaults-file={cnf}"])
    wait_until("mariadb", lambda: mariadb_admin_sql("SELECT 1").strip() == "1", proc, svc, 120)
    ensure_mariadb_users()
    log(f"mariadb listening on {HOST}:{MARIADB_PORT} (binlog ROW/FULL, GTID; monitor user "
        f"'{MONITOR_USER}', password file {shown(MONITOR_PASSWORD_FILE)})")


def mariadbd_binary() -> str:
    for candidate in ("mariadbd", "/usr/sbin/mariadbd"):
        path = shutil.which(candidate) or (candidate if Path(candidate).exists() else None)
        if path:
            return path
    raise StackError("mariadbd not found; run `python -m devservices.stack up` as root to install it")


def ensure_mariadb_users() -> None:
    from devservices import tls

    pw = monitor_password().replace("'", "''")
    schema_grants = "".join(
        f"CREATE DATABASE IF NOT EXISTS `{s}`; GRANT SELECT ON `{s}`.* TO '{MONITOR_USER}'@'127.0.0.1';"
        for s in MONITORED_SCHEMAS)
    mariadb_admin_sql(
        f"CREATE USER IF NOT EXISTS '{ADMIN_USER}'@'127.0.0.1' IDENTIFIED BY '{ADMIN_PASSWORD}';"
        f"GRANT ALL PRIVILEGES ON *.* TO '{ADMIN_USER}'@'127.0.0.1' WITH GRANT OPTION;"
        f"CREATE USER IF NOT EXISTS '{MONITOR_USER}'@'127.0.0.1' IDENTIFIED BY '{pw}';"
        f"ALTER USER '{MONITOR_USER}'@'127.0.0.1' IDENTIFIED BY '{pw}';"
        f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{MONITOR_USER}'@'127.0.0.1';"
        f"{schema_grants}{tls.mariadb_users(MONITOR_USER, pw, MONITORED_SCHEMAS)} FLUSH PRIVILEGES;")


def mariadb_down() -> bool:
    return stop(MARIADB)


def mariadb_kill() -> bool:
    """MariaDB ended by SIGKILL, as a crash ends it (InnoDB recovers at the next start), and its port let go of (the
    process is gone a moment before its socket is), so `mariadb_up` may follow; True when it was running."""
    was = stop(MARIADB, sig=signal.SIGKILL)
    deadline = time.monotonic() + 30
    while port_open(MARIADB_PORT) and time.monotonic() < deadline:
        time.sleep(0.1)
    return was


# ---------------------------------------------------------------- Kafka

def kafka_dir() -> Path:
    return STATE / "kafka"


def kafka_config() -> str:
    """PLAINTEXT for the stack's own clients, and the secured listeners of devservices.tls beside it."""
    from devservices import tls

    d = kafka_dir()
    listeners, advertised, protocols = tls.listeners()
    return f"""process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers={HOST}:{KAFKA_CONTROLLER_PORT}
listeners=PLAINTEXT://{HOST}:{KAFKA_PORT},CONTROLLER://{HOST}:{KAFKA_CONTROLLER_PORT},{listeners}
advertised.listeners=PLAINTEXT://{HOST}:{KAFKA_PORT},{advertised}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,{protocols}
{tls.kafka_properties()}log.dirs={d / 'data'}
num.partitions=3
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=5000
auto.create.topics.enable=false
message.max.bytes=2097152
log.retention.hours=168
"""


def write_kafka_config() -> Path:
    props = kafka_dir() / "server.properties"
    props.write_text(kafka_config())
    return props


def java_argv(lib: Path, main: str, *args: str, heap: str = "512m") -> list[str]:
    """A dev JVM (the broker, its tools, a Connect worker). Only the client compiler and the serial collector: the
    stacks' JVMs are started again and again on two cores (three stacks side by side in `make test`, servers killed
    on purpose), where C2's compiling costs more than it gives back: a broker took 6.4 to 7.0 CPU-seconds to be ready
    with the defaults and G1, 3.9 with these (and 1.3 instead of 1.6 to 2.3 for its first idle minute)."""
    return ["java", f"-Xmx{heap}", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", f"{lib}/*", main, *args]


def kafka_ready() -> bool:
    from kafka import KafkaAdminClient  # the venv's kafka-python; imported late so `status` needs none

    if not port_open(KAFKA_PORT):
        return False
    # A probe that gives up soon and is tried again: a broker started again after SIGKILL is fenced until its old
    # session expires, and a bootstrap begun meanwhile could hold the probe for its whole 30 s default.
    admin = KafkaAdminClient(bootstrap_servers=f"{HOST}:{KAFKA_PORT}", request_timeout_ms=5000,
                             bootstrap_timeout_ms=5000, client_id="devstack-probe")
    try:
        admin.list_topics()
        return True
    finally:
        admin.close()


def kafka_up() -> None:
    svc = KAFKA
    props = kafka_dir() / "server.properties"
    if read_pid(svc) is not None and props.exists() and props.read_text() != kafka_config():
        log("kafka's config changed (a new version of this script): restarting it")
        kafka_down()
    if already_up(svc, KAFKA_PORT):
        return
    lib = ensure_kafka_jars()
    d = kafka_dir()
    d.mkdir(parents=True, exist_ok=True)
    props = write_kafka_config()
    if not (d / "data" / "meta.properties").exists():
        log("formatting Kafka KRaft storage")
        cluster_id = subprocess.run(java_argv(lib, "kafka.tools.StorageTool", "random-uuid", heap="256m"),
                                    check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        subprocess.run(java_argv(lib, "kafka.tools.StorageTool", "format", "-c", str(props),
                                 "-t", cluster_id or uuid.uuid4().hex, "--standalone", heap="256m"),
                       check=True, capture_output=True)
    proc = spawn(svc, java_argv(lib, "kafka.Kafka", str(props)))
    wait_until("kafka", kafka_ready, proc, svc, 120)
    from devservices import tls

    tls.ensure_scram_user()
    log(f"kafka listening on {HOST}:{KAFKA_PORT} (KRaft single node, controller on {KAFKA_CONTROLLER_PORT}; "
        f"SASL_SSL with SCRAM user {tls.SCRAM_USER} on {tls.KAFKA_SASL_SSL_PORT}, mutual TLS on {tls.KAFKA_SSL_PORT})")


def kafka_down() -> bool:
    return stop(KAFKA)


def kafka_kill() -> bool:
    """The broker ended by SIGKILL, as a crash ends it (no controlled shutdown); True when it was running."""
    return stop(KAFKA, sig=signal.SIGKILL)


# ---------------------------------------------------------------- commands

def up() -> None:
    from devservices import kafka_connect, paging, postgres

    ensure_debian_packages()
    mariadb_up()
    postgres.up()
    kafka_up()
    kafka_connect.up()
    paging.up()


def down() -> None:
    from devservices import kafka_connect, paging, postgres

    stopped = (paging.down() + kafka_connect.down() + postgres.down()
               + [("kafka", kafka_down()), ("mariadb", mariadb_down())])
    for name, was_running in stopped:
        log(f"{name} stopped" if was_running else f"{name} was not started by this script")


def status() -> int:
    from devservices import kafka_connect, paging, postgres

    rc = 0
    for svc, port in ((MARIADB, MARIADB_PORT), (KAFKA, KAFKA_PORT), *kafka_connect.SERVICES, *paging.SERVICES,
                      *postgres.SERVICES):
        pid = read_pid(svc)
        if pid is None:
            rc = 1
            log(f"{svc.name}: stopped")
        else:
            log(f"{svc.name}: running (pid {pid}) on {HOST}:{port}, "
                f"{'answering' if port_open(port) else 'NOT answering'}")
    return rc


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("up", "down", "status"):
        print("usage: python -m devservices.stack up|down|status", file=sys.stderr)
        return 2
    try:
        if argv[0] == "up":
            up()
        elif argv[0] == "down":
            down()
        else:
            return status()
    except (StackError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None)
        log(f"error: {exc}{(': ' + detail.decode(errors='replace').strip()) if isinstance(detail, bytes) else ''}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
