"""Login tokens and the secrets derived from them.

A person who may use a web tool holds a token, issued once (:func:`issue_token`) and shown once;
the tool's database keeps only its sha256 (:class:`TokenHolders`), so a copy of the database
lets no one log in. The same token authenticates scripts as ``Authorization: Bearer <token>``
(:func:`bearer_token`). Secrets a client sends back (CSRF tokens) are compared in constant time
(:func:`secret_matches`, :func:`hmac.compare_digest`), so the comparison's duration does not
reveal how many leading characters were right.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sqlite3
from collections.abc import Mapping

TOKEN_PREFIX = "acrb_"
#: Longest token or session id looked up; longer ones are refused before hashing.
MAX_TOKEN = 128
#: Longest CSRF token compared.
MAX_SECRET = 128
MAX_USER_NAME = 40
#: A user name: letters, digits, ``.``, ``_``, ``-``, starting with a letter or digit.
# \Z, not $: $ also matches before a final newline, so "rA\n" would pass as a name.
USER_NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_USER_NAME - 1}}}\Z")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*\Z")


def issue_secret() -> str:
    """A fresh random secret (256 bits, URL-safe base64) for a session id or CSRF token."""
    return secrets.token_urlsafe(32)


def issue_token() -> str:
    """A fresh login token: ``acrb_`` and 256 random bits; the prefix lets secret scanners
    and people recognise one."""
    return TOKEN_PREFIX + issue_secret()


def secret_digest(secret: str) -> str:
    """The sha256 (hex) of a token or session id: what a database keeps instead of it."""
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(given: str | None, expected: str | None) -> bool:
    """Whether ``given`` equals ``expected``, compared in constant time; empty, missing or
    over-long (> :data:`MAX_SECRET`) values never match."""
    if not given or not expected or len(given) > MAX_SECRET:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive),
    in a request's headers (Starlette's ``request.headers``, looked up case-insensitively);
    None for another scheme, no header, or a token empty or over :data:`MAX_TOKEN`."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token if 0 < len(token) <= MAX_TOKEN else None


def sql_identifier(name: str) -> str:
    """``name`` if it is a plain lower-case SQL identifier; table and column names are put
    into SQL text, so anything else is refused (a programming error, not a user's)."""
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r} is not a plain SQL identifier")
    return name


class TokenHolders:
    """The people who hold a login token, in a table of a tool's database.

    The table (``name``, ``token_sha256``, ``created_at``) is named per tool (``curators``,
    ``raters``) and created by the tool with :attr:`schema`. Methods take the caller's
    connection, so adding a holder and logging it to the audit trail is one transaction.
    """

    def __init__(self, table: str) -> None:
        self.table = sql_identifier(table)
        self.schema = (f"CREATE TABLE IF NOT EXISTS {self.table} (name TEXT PRIMARY KEY, "
                       "token_sha256 TEXT NOT NULL UNIQUE, created_at TEXT NOT NULL);")

    def exists(self, con: sqlite3.Connection, name: str) -> bool:
        """Whether ``name`` holds a token."""
        return con.execute(f"SELECT 1 FROM {self.table} WHERE name = ?",
                           (name,)).fetchone() is not None

    def add(self, con: sqlite3.Connection, name: str, created_at: str) -> str:
        """Add ``name`` (the caller has checked it is new) and return their token."""
        token = issue_token()
        con.execute(f"INSERT INTO {self.table} VALUES (?, ?, ?)",
                    (name, secret_digest(token), created_at))
        return token

    def replace(self, con: sqlite3.Connection, name: str) -> str:
        """Issue ``name`` a new token (the old one stops working) and return it."""
        token = issue_token()
        con.execute(f"UPDATE {self.table} SET token_sha256 = ? WHERE name = ?",
                    (secret_digest(token), name))
        return token

    def names(self, con: sqlite3.Connection) -> list[str]:
        """Every holder's name, sorted."""
        return [str(r[0]) for r in con.execute(f"SELECT name FROM {self.table} ORDER BY name")]

    def holder(self, con: sqlite3.Connection, token: str | None) -> str | None:
        """The name of whoever holds ``token``, or None (also for an empty or over-long one)."""
        if not token or len(token) > MAX_TOKEN:
            return None
        row = con.execute(f"SELECT name FROM {self.table} WHERE token_sha256 = ?",
                          (secret_digest(token),)).fetchone()
        return str(row[0]) if row else None
