"""The shared store's server for development and tests: Debian's PostgreSQL on loopback.

It comes from Debian's `postgresql` package (installed by the stack script with its system
cluster kept from starting) and runs as a plain process on a data dir of its own under
.devstack/postgres, as the `postgres` user the package makes (PostgreSQL refuses to run as
root). Password logins only (scram-sha-256), on 127.0.0.1 and a socket in that dir:

- the superuser `postgres`, password in .devstack/secrets/postgres_password (set-up only);
- STORE_USER, the monitor's login, password in .devstack/secrets/postgres_store_password,
  owner of the database STORE_DATABASE (the demo's and the tests' stores; each test takes a
  schema of its own in it).

Its port follows MariaDB's (MARIADB_PORT + 2000, 15306 by default), so a second stack moves it too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from devservices import tls
from devservices.base import (HOST, MARIADB_PORT, STATE, Service, StackError, already_up, log, secret_file, shown,
                              spawn, stop, wait_until)

PORT = MARIADB_PORT + 2000
STORE_USER = "oncewatch"
STORE_DATABASE = "oncewatch"
DIR = STATE / "postgres"
DATA = DIR / "data"
SUPERUSER_PASSWORD_FILE = STATE / "secrets" / "postgres_password"
STORE_PASSWORD_FILE = STATE / "secrets" / "postgres_store_password"
POSTGRES = Service("postgres", DIR / "postgres.pid", DIR / "postgres.log", str(DATA))
OS_USER = "postgres"


def url(database: str = STORE_DATABASE) -> str:
    """The store's URL, without its password (that is in STORE_PASSWORD_FILE)."""
    return f"postgresql://{STORE_USER}@{HOST}:{PORT}/{database}"


def binary(name: str) -> str:
    """A PostgreSQL server program: Debian keeps them in /usr/lib/postgresql/<version>/bin, off the PATH."""
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
    if found:
        return str(found[-1])
    path = shutil.which(name)
    if path is None:
        raise StackError(f"{name} not found; run `python -m devservices.stack up` as root to install postgresql")
    return path


def _as_postgres() -> list[str]:
    """The prefix that runs a program as the `postgres` user (exec'd in place, so its pid is the server's)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={OS_USER}", f"--regid={OS_USER}", "--init-groups", "--"]


def psql(sql: str, database: str = "postgres") -> str:
    """Run SQL as the superuser over loopback (set-up only)."""
    env = dict(os.environ, PGPASSWORD=secret_file(SUPERUSER_PASSWORD_FILE))
    out = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", HOST, "-p", str(PORT), "-U", "postgres",
                          "-d", database, "-At", "-c", sql], check=True, capture_output=True, text=True, env=env)
    return out.stdout


def _initialise() -> None:
    log("initialising PostgreSQL data dir")
    DIR.mkdir(parents=True, exist_ok=True)
    pwfile = DIR / "initdb.pw"
    pwfile.write_text(secret_file(SUPERUSER_PASSWORD_FILE) + "\n")
    try:
        if os.geteuid() == 0:
            shutil.chown(DIR, OS_USER, OS_USER)
            shutil.chown(pwfile, OS_USER, OS_USER)
        pwfile.chmod(0o600)
        subprocess.run([*_as_postgres(), binary("initdb"), "-D", str(DATA), "-U", "postgres", f"--pwfile={pwfile}",
                        "--auth=scram-sha-256", "-E", "UTF8", "--locale=C"], check=True, capture_output=True)
    finally:
        pwfile.unlink(missing_ok=True)


def _ensure_store_user() -> None:
    password = secret_file(STORE_PASSWORD_FILE).replace("'", "''")
    exists = psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{STORE_USER}'").strip()
    verb = "ALTER" if exists else "CREATE"
    psql(f"{verb} ROLE {STORE_USER} LOGIN PASSWORD '{password}'")
    if not psql(f"SELECT 1 FROM pg_database WHERE datname = '{STORE_DATABASE}'").strip():
        psql(f"CREATE DATABASE {STORE_DATABASE} OWNER {STORE_USER}")


def start() -> None:
    """The server on its data dir (initialised the first time), waited for until it answers."""
    if not (DATA / "PG_VERSION").exists():
        _initialise()
    proc = spawn(POSTGRES, [*_as_postgres(), binary("postgres"), "-D", str(DATA), "-p", str(PORT),
                            "-c", f"listen_addresses={HOST}", "-c", f"unix_socket_directories={DIR}",
                            "-c", "max_connections=200", "-c", "fsync=on"])
    wait_until("postgres", lambda: psql("SELECT 1").strip() == "1", proc, POSTGRES, 60)


def _ensure_ssl() -> None:
    """TLS with the stack's certificates (devservices.tls), switched on by a reload (no restart): the server reads
    its key only when the key belongs to it and no one else may read it, so both files are copied into its dir."""
    files = tls.ensure()
    for source, name in ((files.server_cert, "server.crt"), (files.server_key, "server.key")):
        copy = DATA / name
        shutil.copyfile(source, copy)
        copy.chmod(0o600)
        if os.geteuid() == 0:
            shutil.chown(copy, OS_USER, OS_USER)
    if psql("SHOW ssl").strip() != "on":
        psql("ALTER SYSTEM SET ssl = on")
        psql("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while psql("SHOW ssl").strip() != "on":  # the reload is the server's to do, a moment later
            if time.monotonic() > deadline:
                raise StackError(f"postgres did not switch TLS on; see {POSTGRES.logfile}")
            time.sleep(0.2)


def up() -> None:
    if not already_up(POSTGRES, PORT):
        start()
    _ensure_ssl()
    _ensure_store_user()
    log(f"postgres listening on {HOST}:{PORT} (store {url()}, password file "
        f"{shown(STORE_PASSWORD_FILE)})")


@contextmanager
def new_schema() -> Iterator[PostgresTarget]:
    """A new, empty schema in the store database, as a store target (tests, benchmarks); dropped at the end."""
    import psycopg

    from oncewatch.core.config import PostgresTarget
    from oncewatch.core.sections import Secret

    name = f"t_{uuid.uuid4().hex[:12]}"
    password = secret_file(STORE_PASSWORD_FILE)
    with psycopg.connect(url(), password=password, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield PostgresTarget(f"{url()}?options=-csearch_path%3D{name}", Secret(file=str(STORE_PASSWORD_FILE)))
    finally:
        with psycopg.connect(url(), password=password, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f"DROP SCHEMA {name} CASCADE")


def stop_server(sig: int = signal.SIGINT) -> bool:
    """Stopped (SIGINT: PostgreSQL's fast shutdown, which ends its sessions; SIGTERM would wait for them)."""
    return stop(POSTGRES, sig=sig)


def down() -> list[tuple[str, bool]]:
    return [(POSTGRES.name, stop_server())]


SERVICES = ((POSTGRES, PORT),)

if TYPE_CHECKING:
    from oncewatch.core.config import PostgresTarget
