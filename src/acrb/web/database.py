"""A web tool's SQLite database, shared by the server's threads and by other processes.

Each thread gets its own connection (a ``sqlite3.Connection`` must not be used by two threads
at once). The database runs in WAL mode with a 30 s busy timeout and ``synchronous = FULL``,
and every write is one ``BEGIN IMMEDIATE`` transaction (:meth:`Database.write`): writers from
many threads and processes are serialised by SQLite's lock rather than failing with "database
is locked", and a crash leaves either the whole transaction or none of it.

The ``meta`` table holds a tool's small named values (the audit chain's head among them).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

META_SCHEMA = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
BUSY_TIMEOUT_SECONDS = 30.0


class Database:
    """One SQLite file with ``schema`` (and the ``meta`` table) created if missing.

    Safe to share between threads: :meth:`connection` returns the calling thread's own.
    """

    def __init__(self, path: Path, schema: str) -> None:
        self.path = Path(path)
        self._local = threading.local()
        with self.connection() as con:
            con.execute("PRAGMA journal_mode=WAL")
            con.executescript(META_SCHEMA + "\n" + schema)

    def connection(self) -> sqlite3.Connection:
        """The calling thread's connection (autocommit; rows as :class:`sqlite3.Row`)."""
        con: sqlite3.Connection | None = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS,
                                  isolation_level=None, check_same_thread=False)
            con.row_factory = sqlite3.Row
            con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
            con.execute("PRAGMA synchronous = FULL")
            con.execute("PRAGMA foreign_keys = ON")
            self._local.con = con
        return con

    def close(self) -> None:
        """Close the calling thread's connection (others close with their threads)."""
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: ``BEGIN IMMEDIATE`` takes the write lock up front, so a
        read-then-write inside it sees no other writer's changes; any exception (in the
        block or in the commit) rolls back and then runs the :meth:`on_rollback` undos."""
        con = self.connection()
        con.execute("BEGIN IMMEDIATE")
        self._local.undo = []
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            for undo in reversed(self._local.undo):
                undo()
            raise
        finally:
            self._local.undo = []

    def on_rollback(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` if the calling thread's current write transaction rolls back: for
        effects outside the database (a line appended to a file) that must not outlive it."""
        self._local.undo.append(undo)


def read_meta(con: sqlite3.Connection, key: str, default: str = "") -> str:
    """The ``meta`` value named ``key``, or ``default`` if none was written."""
    row = con.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return str(row["value"]) if row else default


def write_meta(con: sqlite3.Connection, key: str, value: str) -> None:
    """Set the ``meta`` value named ``key`` (inside the caller's transaction)."""
    con.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                "SET value = excluded.value", (key, value))
