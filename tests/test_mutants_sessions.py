"""Browser sessions (``acrb.web.sessions``): expiry at its boundary, the default table and
lifetime, and the cookie attributes, called directly (the web-layer tests reach these through
a test client): tests that kill the mutants the other tests let survive (docs/mutation.md)."""

from __future__ import annotations

import sqlite3

import pytest
from starlette.requests import Request
from starlette.responses import Response

from acrb.web import sessions
from acrb.web.sessions import SESSION_SECONDS, SessionCookies, SessionTable

NOW = 1_000_000.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [NOW]
    monkeypatch.setattr(sessions.time, "time", lambda: now[0])
    return now


def _db(table: SessionTable) -> sqlite3.Connection:
    con = sqlite3.connect(":memory:")
    con.executescript(table.schema)
    return con


def test_defaults_name_the_table_and_last_twelve_hours(clock: list[float]) -> None:
    table = SessionTable()
    assert (table.table, table.user_column, table.lifetime) == ("sessions", "user", 12 * 3600)
    assert SESSION_SECONDS == 43_200
    con = _db(table)
    sid, session = table.open(con, "ana")
    row = con.execute("SELECT user, csrf, expires FROM sessions").fetchone()
    assert row == ("ana", session.csrf, NOW + 43_200)
    assert sid != session.csrf and len(sid) >= 32


def test_a_session_lives_until_its_expiry_and_not_after(clock: list[float]) -> None:
    table = SessionTable("curator_sessions", "curator", lifetime=100.0)
    con = _db(table)
    sid, session = table.open(con, "ana")
    clock[0] = NOW + 100.0  # the expiry instant itself: still live
    assert table.find(con, sid) == session
    clock[0] = NOW + 100.001
    assert table.find(con, sid) is None


def test_expired_sessions_are_removed_at_the_next_login(clock: list[float]) -> None:
    table = SessionTable(lifetime=10.0)
    con = _db(table)
    table.open(con, "ana")
    clock[0] = NOW + 10.0  # at its expiry: kept
    table.open(con, "bo")
    assert con.execute("SELECT count(*) FROM sessions").fetchone()[0] == 2
    clock[0] = NOW + 10.5  # ana's has passed, bo's (NOW + 20) has not
    table.open(con, "cy")
    users = sorted(r[0] for r in con.execute("SELECT user FROM sessions"))
    assert users == ["bo", "cy"]


@pytest.mark.parametrize("sid", [None, "", "x" * 129])
def test_no_session_for_empty_or_over_long_ids(clock: list[float], sid: str | None) -> None:
    table = SessionTable()
    con = _db(table)
    table.open(con, "ana")
    assert table.find(con, sid) is None


def test_an_id_of_the_longest_length_is_looked_up(clock: list[float]) -> None:
    table = SessionTable()
    con = _db(table)
    sid = "y" * 128
    con.execute("INSERT INTO sessions VALUES (?, 'ana', 'c', ?)",
                (sessions.secret_digest(sid), NOW + 5))
    assert table.find(con, sid) == sessions.Session("ana", "c")


def _request(scheme: str, cookie: str = "") -> Request:
    headers = [(b"cookie", cookie.encode())] if cookie else []
    return Request({"type": "http", "method": "GET", "scheme": scheme, "path": "/",
                    "query_string": b"", "headers": headers,
                    "server": ("localhost", 8000)})


@pytest.mark.parametrize(("scheme", "secure"), [("https", True), ("http", False)])
def test_cookies_are_http_only_strict_and_secure_over_https(scheme: str, secure: bool) -> None:
    cookies = SessionCookies("cur")
    assert (cookies.session, cookies.login_csrf) == ("cur_session", "cur_login_csrf")
    response = Response()
    cookies.set_session(_request(scheme), response, "sid-1")
    cookies.set_login_csrf(_request(scheme), response, "tok-1")
    session_cookie, csrf_cookie = response.headers.getlist("set-cookie")
    for header, value in ((session_cookie, "cur_session=sid-1"),
                          (csrf_cookie, "cur_login_csrf=tok-1")):
        parts = [p.strip() for p in header.split(";")]
        assert parts[0] == value
        assert "HttpOnly" in parts and "Path=/" in parts and "SameSite=strict" in parts
        assert ("Secure" in parts) is secure


def test_cookies_are_read_and_cleared_by_their_prefixed_names() -> None:
    cookies = SessionCookies("rev")
    request = _request("http", "rev_session=s; rev_login_csrf=t; other_session=x")
    assert cookies.session_id(request) == "s"
    assert cookies.login_csrf_cookie(request) == "t"
    response = Response()
    cookies.clear_session(response)
    cookies.clear_login_csrf(response)
    cleared = response.headers.getlist("set-cookie")
    assert [c.split(";")[0] for c in cleared] == ['rev_session=""', 'rev_login_csrf=""']
    for header in cleared:
        parts = [p.strip() for p in header.split(";")]
        assert "HttpOnly" in parts and "Path=/" in parts and "SameSite=strict" in parts
        assert "Max-Age=0" in parts


@pytest.mark.parametrize("prefix", ["Cur", "1cur", "cur-x", ""])
def test_a_bad_cookie_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="is not lower-case letters, digits, '_'"):
        SessionCookies(prefix)
