"""The dev stack's MariaDB: binlog on (ROW, FULL images, GTID), TLS, the monitor's account with the grants it needs,
in its own data dir on loopback."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

from devservices import tls
from devservices.base import (HOST, MARIADB_PORT, STATE, Service, StackError, already_up, log, port_open,
                              secret_file, shown, spawn, stop, stop_if_config_changed, wait_until)

ADMIN_USER = "dev_admin"
ADMIN_PASSWORD = "dev_admin"
MONITOR_USER = "oncewatch"
# Schemas the monitor may SELECT from: the simulated shop and the test schemas.
MONITORED_SCHEMAS = ("shop", "owtest", "mall_0", "mall_1", "owmall_0", "owmall_1", "owcdc")

MARIADB = Service("mariadb", STATE / "mariadb" / "mariadbd.pid", STATE / "mariadb" / "mariadbd.log",
                  str(STATE / "mariadb" / "my.cnf"))

MONITOR_PASSWORD_FILE = STATE / "secrets" / "mysql_monitor_password"


def mariadb_dir() -> Path:
    return STATE / "mariadb"


def mariadb_socket() -> Path:
    return mariadb_dir() / "mysqld.sock"


def mariadb_config() -> str:
    """The server's my.cnf: binlog as the monitor needs it, and TLS with the stack's certificates (devservices.tls)."""
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

def monitor_password() -> str:
    return secret_file(MONITOR_PASSWORD_FILE)


def mariadb_up() -> None:
    svc = MARIADB
    stop_if_config_changed(svc, mariadb_dir() / "my.cnf", mariadb_config(), mariadb_down)
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
