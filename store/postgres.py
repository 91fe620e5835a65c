"""The store in a PostgreSQL database (`[store] url`): the connection, its mark and the monitor's lock.

The store box is written against the sqlite3 API (`execute` with `?` parameters, cursors read
by iteration or `fetchone`, `executemany`, `executescript`, `in_transaction`). `PgConnection`
gives that API over a psycopg connection, so the schema and the queries stay one text for both
engines; what differs (the column types, a rowid, JSON functions, how a transaction begins) is
in store.dialect.

A lost connection (the server restarted, the network went) is StoreUnavailableError, which the
monitor meets by starting again from its checkpoint once the server answers (monitor.supervise).

The database's tables carry the mark a SQLite store keeps in its header: one row in
`oncewatch_store`, so a database holding another program's tables is refused before anything is
written into it. One monitor writes a store: it holds a session-level advisory lock (the kernel's
flock on a file for SQLite), keyed by the schema the store is in; PostgreSQL drops it with the
session, however the monitor ends.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg import pq

from oncewatch.core.config import PostgresTarget
from oncewatch.store.errors import NotAStoreError, StoreError, StoreLockedError, StoreUnavailableError
from oncewatch.store import engine_state, entities, journal
from oncewatch.store.dialect import POSTGRES
from oncewatch.store.moves import move_older
from oncewatch.store.schema import PACKED_COLUMNS, add_columns, set_older_aside

APPLICATION_ID = 0x6F6E6377  # "oncw", as SQLite's application_id; also the advisory lock's key
MARK_TABLE = "oncewatch_store"
CONNECT_TIMEOUT_SECONDS = 10


class PgConnection:
    """A psycopg connection in autocommit (transactions are begun and ended by the store, as with SQLite)
    behind the sqlite3 calls the store makes."""

    def __init__(self, conn: psycopg.Connection, where: str):
        self.raw = conn
        self.where = where
        self._sql: dict[str, str] = {}

    def _translate(self, sql: str) -> str:
        done = self._sql.get(sql)
        if done is None:
            done = self._sql[sql] = sql.replace("%", "%%").replace("?", "%s")
        return done

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor:
        try:
            return self.raw.execute(self._translate(sql), params)
        except psycopg.OperationalError as exc:
            raise _unavailable(self.where, exc) from exc

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        try:
            with self.raw.cursor() as cur:
                cur.executemany(self._translate(sql), rows)
        except psycopg.OperationalError as exc:
            raise _unavailable(self.where, exc) from exc

    def executescript(self, script: str) -> None:
        try:
            self.raw.execute(script)  # no parameters: several statements are one simple query
        except psycopg.OperationalError as exc:
            raise _unavailable(self.where, exc) from exc

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)

    def close(self) -> None:
        self.raw.close()


def _unavailable(where: str, exc: Exception) -> StoreUnavailableError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StoreUnavailableError(f"the PostgreSQL store {where} cannot be reached ({first}): the monitor starts "
                                 f"again from its checkpoint once the server answers; check the server and "
                                 f"store.url")


def connect(target: PostgresTarget, *, readonly: bool, role: str) -> PgConnection:
    """A connection to the database of `target` (StoreUnavailableError when the server does not answer,
    StoreError for a refused login). `role` names the program in pg_stat_activity (the lock's holder)."""
    password = target.password.value() if (target.password.env or target.password.file) else None
    try:
        conn = psycopg.connect(target.url, password=password, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                               application_name=f"oncewatch {role} pid {os.getpid()} on {socket.gethostname()}"[:63],
                               **dict(target.tls))
    except psycopg.OperationalError as exc:
        text = str(exc)
        if "certificate" in text or "SSL" in text:
            raise StoreError(f"TLS to the PostgreSQL store {target} failed ({text.strip().splitlines()[0]}): check "
                             f"store.sslmode, store.sslrootcert and the host name in store.url (verify-full: the "
                             f"server's certificate must name it)") from exc
        if "password authentication failed" in text or "does not exist" in text or "permission denied" in text:
            raise StoreError(f"the PostgreSQL store {target} refused the login ({text.strip().splitlines()[0]}): "
                             f"check store.url and the password (store.password_env or password_file)") from exc
        raise _unavailable(str(target), exc) from exc
    if readonly:
        conn.execute("SET default_transaction_read_only = on")
    return PgConnection(conn, str(target))


def schema_mark(conn: PgConnection) -> str | None:
    """The digest of the schema a marked store was made or last brought up to, "" for a database with no
    tables in its schema (a new store is made there), NotAStoreError for one holding another program's
    tables (left as it is)."""
    tables = {name for (name,) in conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}
    if MARK_TABLE in tables:
        row = conn.execute(f"SELECT application_id, schema_sha256 FROM {MARK_TABLE}").fetchone()
        if row is not None and row[0] == APPLICATION_ID:
            return row[1]
    if not tables:
        return ""
    raise NotAStoreError(f"the PostgreSQL database {conn.where} holds tables that are not an oncewatch store "
                         f"({', '.join(sorted(tables)[:8])}); it is left as it is: point store.url at an empty "
                         f"database (or schema) of its own")


def digest(schema: str) -> str:
    return hashlib.sha256(schema.encode()).hexdigest()


def create(conn: PgConnection, schema: str) -> None:
    """The schema and the mark, made (or brought up to a newer version's tables) once however many
    processes start together: a transaction-level advisory lock around it, as CREATE TABLE IF NOT EXISTS
    races with itself in PostgreSQL. A store already at `schema` is left alone, so a person's review
    never waits for the monitor's locks."""
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(?)", (APPLICATION_ID + 1,))
        if schema_mark(conn) != digest(schema):
            set_older_aside(conn, POSTGRES.tables)
            conn.executescript(schema)
            add_columns(conn)
            _bytea_packed(conn)
            def insert_rows(head: str, row: str, _: int, rows: list[tuple[Any, ...]], tail: str = "") -> None:
                conn.executemany(head + row + tail, rows)

            move_older(conn, POSTGRES, entities.EntityIds(), engine_state.Spaces(), journal.row_sources(),
                       journal.event_sources(), insert_rows)
            # once more: an index of a table set aside kept its name, so the schema's made none for the new table
            # (events_rowid), and it went with the older one
            conn.executescript(schema)
            conn.execute(f"CREATE TABLE IF NOT EXISTS {MARK_TABLE} (application_id BIGINT NOT NULL, "
                         f"schema_sha256 TEXT NOT NULL)")
            conn.execute(f"DELETE FROM {MARK_TABLE}")
            conn.execute(f"INSERT INTO {MARK_TABLE} (application_id, schema_sha256) VALUES (?, ?)",
                         (APPLICATION_ID, digest(schema)))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _bytea_packed(conn: PgConnection) -> None:
    """An older store's packed columns, text there, become bytea holding the same text's bytes, which
    store.packing reads as the text it was."""
    for table, column in PACKED_COLUMNS:
        (kind,), = conn.execute("SELECT data_type FROM information_schema.columns WHERE table_schema = current_schema() "
                                "AND table_name = ? AND column_name = ?", (table, column))
        if kind == "text":
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE bytea USING convert_to({column}, 'UTF8')")


def lock(conn: PgConnection) -> None:
    """The store's monitor lock on this session, or StoreLockedError naming who holds it."""
    (got,), = conn.execute("SELECT pg_try_advisory_lock(?, hashtext(current_schema()))", (APPLICATION_ID,))
    if got:
        return
    holder = conn.execute(
        "SELECT a.application_name, a.client_addr FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid = ? "
        "AND l.objid::bigint = (hashtext(current_schema())::bigint & 4294967295) AND l.granted "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (APPLICATION_ID,)).fetchone()
    who = f" ({holder[0]}{f' from {holder[1]}' if holder[1] else ''})" if holder else ""
    raise StoreLockedError(f"another oncewatch monitor{who} is running on the store {conn.where}: stop it first, or "
                           f"give this monitor a store of its own. The dashboard, `findings`, `export`, `ack` and "
                           f"`close` work beside it")
