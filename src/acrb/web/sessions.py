"""Browser sessions: a random session id in a cookie, its sha256 and a CSRF token in the database.

A login (the holder's token, checked by the tool) opens a session (:meth:`SessionTable.open`):
a fresh session id, set as an ``HttpOnly``, ``SameSite=Strict`` cookie, and a fresh CSRF token
that the tool puts in each form it serves; a form post is accepted only with both
(:func:`csrf_field_matches`). The database keeps the session id's sha256 only, so a copy of it
opens no session. Sessions expire after ``lifetime`` seconds (12 hours by default); expired
rows are removed at the next login.

Cookie names carry the tool's prefix (:class:`SessionCookies`): browsers share cookies between
all ports of a host, so two tools on one machine must not overwrite each other's session.

The SQL parts import nothing of Starlette, so a tool's store can use them without the web
extra installed.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from acrb.web.credentials import (
    MAX_TOKEN,
    issue_secret,
    secret_digest,
    secret_matches,
    sql_identifier,
)

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

SESSION_SECONDS = 12 * 3600
_COOKIE_PREFIX = re.compile(r"^[a-z][a-z0-9_]*\Z")


@dataclass(frozen=True)
class Session:
    """A logged-in user: who (``user``) and the CSRF token their forms must carry."""

    user: str
    csrf: str


class SessionTable:
    """The sessions of a tool's users, in a table of that tool's database.

    ``table`` and ``user_column`` name the table and the column holding the user's name
    (``sessions`` / ``curator`` for curation), so each tool's table reads in its own words;
    the columns and the logic are the same for all. Methods take the caller's connection, so
    opening a session and logging it to the audit trail is one transaction.
    """

    def __init__(self, table: str = "sessions", user_column: str = "user",
                 lifetime: float = SESSION_SECONDS) -> None:
        self.table = sql_identifier(table)
        self.user_column = sql_identifier(user_column)
        self.lifetime = lifetime
        self.schema = (f"CREATE TABLE IF NOT EXISTS {self.table} (sid_sha256 TEXT PRIMARY KEY, "
                       f"{self.user_column} TEXT NOT NULL, csrf TEXT NOT NULL, "
                       "expires REAL NOT NULL);")

    def open(self, con: sqlite3.Connection, user: str) -> tuple[str, Session]:
        """A new session for ``user`` (inside the caller's write transaction): ``(session id,
        Session)``. The id is returned once, for the cookie; expired sessions are removed."""
        sid, csrf = issue_secret(), issue_secret()
        now = time.time()
        con.execute(f"DELETE FROM {self.table} WHERE expires < ?", (now,))
        con.execute(f"INSERT INTO {self.table} (sid_sha256, {self.user_column}, csrf, expires) "
                    "VALUES (?, ?, ?, ?)", (secret_digest(sid), user, csrf, now + self.lifetime))
        return sid, Session(user, csrf)

    def find(self, con: sqlite3.Connection, sid: str | None) -> Session | None:
        """The live session with id ``sid``; None if unknown, expired, empty or over-long."""
        if not sid or len(sid) > MAX_TOKEN:
            return None
        row = con.execute(
            f"SELECT {self.user_column}, csrf, expires FROM {self.table} WHERE sid_sha256 = ?",
            (secret_digest(sid),)).fetchone()
        if row is None or row[2] < time.time():
            return None
        return Session(str(row[0]), str(row[1]))

    def close(self, con: sqlite3.Connection, sid: str) -> None:
        """End the session with id ``sid`` (a log-out)."""
        con.execute(f"DELETE FROM {self.table} WHERE sid_sha256 = ?", (secret_digest(sid),))

    def close_all(self, con: sqlite3.Connection, user: str) -> None:
        """End every session of ``user`` (their token was replaced)."""
        con.execute(f"DELETE FROM {self.table} WHERE {self.user_column} = ?", (user,))


def csrf_field_matches(items: Iterable[tuple[str, Any]], session: Session) -> bool:
    """Whether a form carries exactly one ``csrf`` field, a string equal to the session's
    token (compared in constant time). ``items`` are the form's ``(name, value)`` pairs."""
    given = [value for name, value in items if name == "csrf"]
    return len(given) == 1 and isinstance(given[0], str) \
        and secret_matches(given[0], session.csrf)


class SessionCookies:
    """The cookies of one tool: ``<prefix>_session`` (the session id) and
    ``<prefix>_login_csrf`` (the login form's CSRF token, before there is a session).

    Both are ``HttpOnly`` (scripts cannot read them), ``SameSite=Strict`` (browsers do not
    send them with requests from other sites), path ``/``, and ``Secure`` when the request
    came over https.
    """

    def __init__(self, prefix: str) -> None:
        if not _COOKIE_PREFIX.match(prefix):
            raise ValueError(f"cookie prefix {prefix!r} is not lower-case letters, digits, '_'")
        self.session = f"{prefix}_session"
        self.login_csrf = f"{prefix}_login_csrf"

    def session_id(self, request: Request) -> str | None:
        """The session id the request's cookie carries, if any."""
        return request.cookies.get(self.session)

    def set_session(self, request: Request, response: Response, sid: str) -> None:
        """Put the session id in the response's cookie."""
        _set_cookie(request, response, self.session, sid)

    def clear_session(self, response: Response) -> None:
        """Tell the browser to drop the session cookie."""
        response.delete_cookie(self.session, path="/", httponly=True, samesite="strict")

    def set_login_csrf(self, request: Request, response: Response, token: str) -> None:
        """Put the login form's CSRF token (from :func:`~acrb.web.credentials.issue_secret`,
        also in the form's ``csrf`` field) in the response's cookie; the login post must
        carry the same value in both (:func:`~acrb.web.credentials.secret_matches`)."""
        _set_cookie(request, response, self.login_csrf, token)

    def login_csrf_cookie(self, request: Request) -> str | None:
        """The login-form CSRF token of the request's cookie, if any."""
        return request.cookies.get(self.login_csrf)

    def clear_login_csrf(self, response: Response) -> None:
        """Tell the browser to drop the login-form CSRF cookie (once logged in)."""
        response.delete_cookie(self.login_csrf, path="/", httponly=True, samesite="strict")


def _set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    response.set_cookie(name, value, path="/", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
