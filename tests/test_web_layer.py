"""The shared web layer on its own: a second tool built from `acrb.web` and nothing of curation.

The tool here is a minimal rating app (a rater scores an item): its own database with its own
table names, its own cookie names, one form page and one form post that writes to its audit
trail. Every refusal the curation tool makes must hold for it too, because it comes from the
layer, not from the curation code.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from acrb.web import (
    CSP,
    AuditTrail,
    Database,
    InvalidRequest,
    SessionCookies,
    SessionTable,
    TokenHolders,
    bearer_token,
    canonical,
    csrf_field_matches,
    exposure_warning,
    form_fields,
    form_items,
    local_hosts,
    secret_matches,
    security_middleware,
    verify,
)
from acrb.web.audit import AUDIT_SCHEMA
from acrb.web.credentials import MAX_SECRET, secret_digest
from tests.live_server import LiveServer

BODY_LIMIT = 4 * 1024
RATERS = TokenHolders("raters")
SESSIONS = SessionTable("sessions", user_column="rater")
COOKIES = SessionCookies("acrb_rating")


class RatingStore:
    """What a second tool's store looks like on the layer: its tables, one audit trail."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.database_path = folder / "rating.sqlite"
        self.database = Database(self.database_path, "\n".join(
            (RATERS.schema, SESSIONS.schema, AUDIT_SCHEMA)))
        self.audit = AuditTrail(self.database, folder / "audit.jsonl")
        self.audit.set_aside_lines_past_head()

    def add_rater(self, name: str) -> str:
        with self.database.write() as con:
            token = RATERS.add(con, name, created_at="2025-01-01T00:00:00.000+00:00")
            self.audit.append(con, {"action": "add_rater", "rater": name})
        return token

    def login(self, token: str) -> str:
        with self.database.write() as con:
            rater = RATERS.holder(con, token)
            assert rater is not None
            sid, _ = SESSIONS.open(con, rater)
            self.audit.append(con, {"action": "login", "rater": rater})
        return sid

    def lines(self) -> list[str]:
        return self.audit.path.read_text(encoding="utf-8").splitlines()


def rating_app(store: RatingStore, allowed_hosts: list[str] | None = None) -> Starlette:
    """One form page (GET /rate) and its post (POST /rate), guarded only by the layer."""

    def page(request: Request) -> Response:
        session = SESSIONS.find(store.database.connection(), COOKIES.session_id(request))
        if session is None:
            return PlainTextResponse("not logged in", 401)
        return HTMLResponse(f'<form method="post" action="/rate">'
                            f'<input type="hidden" name="csrf" value="{session.csrf}">'
                            '<input name="item"><input name="score"></form>')

    def record(request: Request, items: list[tuple[str, Any]]) -> Response:
        session = SESSIONS.find(store.database.connection(), COOKIES.session_id(request))
        if session is None:
            return PlainTextResponse("not logged in", 403)
        if not csrf_field_matches(items, session):
            return PlainTextResponse("the form did not carry this session's token", 403)
        try:
            fields = form_fields(items, {"csrf": MAX_SECRET, "item": 40, "score": 1})
        except InvalidRequest as exc:
            return PlainTextResponse(exc.problem, 400)
        with store.database.write() as con:
            store.audit.append(con, {"action": "rate", "rater": session.user,
                                     "item": fields.get("item", ""),
                                     "score": fields.get("score", "")})
        return RedirectResponse("/rate", 303)

    async def rate(request: Request) -> Response:
        items = await form_items(request)
        return await run_in_threadpool(record, request, items)

    return Starlette(routes=[Route("/rate", page, methods=["GET"]),
                             Route("/rate", rate, methods=["POST"])],
                     middleware=security_middleware(allowed_hosts, body_limit=BODY_LIMIT))


@pytest.fixture
def store(tmp_path: Path) -> RatingStore:
    return RatingStore(tmp_path / "rating")


@pytest.fixture
def client(store: RatingStore) -> Iterator[TestClient]:
    with TestClient(rating_app(store, ["testserver"]), follow_redirects=False) as test_client:
        yield test_client


def logged_in(client: TestClient, store: RatingStore, name: str = "rita") -> str:
    """Log ``name`` in through the store, give the client the cookie; return the form's
    CSRF token as the page serves it."""
    client.cookies.set(COOKIES.session, store.login(store.add_rater(name)))
    page = client.get("/rate")
    assert page.status_code == 200
    return page.text.split('name="csrf" value="')[1].split('"')[0]


def assert_security_headers(response: Any) -> None:
    assert response.headers["content-security-policy"] == CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["x-frame-options"] == "DENY"


# ----------------------------------------------------------------------------- refusals


def test_a_post_without_a_session_is_refused(client: TestClient, store: RatingStore) -> None:
    store.add_rater("rita")
    seen = store.lines()
    response = client.post("/rate", data={"csrf": "x" * 43, "item": "a", "score": "3"})
    assert response.status_code == 403
    assert_security_headers(response)
    assert client.get("/rate").status_code == 401
    # The cookie of another tool on the same host is not this tool's session.
    sid = store.login(store.add_rater("other"))
    seen = store.lines()
    client.cookies.set("acrb_session", sid)
    assert client.post("/rate", data={"csrf": "x", "item": "a", "score": "3"}).status_code == 403
    assert store.lines() == seen


def test_a_wrong_or_missing_csrf_token_is_refused(client: TestClient,
                                                  store: RatingStore) -> None:
    csrf = logged_in(client, store)
    seen = store.lines()
    for data in ({"item": "a", "score": "3"}, {"csrf": csrf[:-2] + "xx", "item": "a"},
                 {"csrf": "", "item": "a"}, {"csrf": [csrf, csrf], "item": "a"},
                 {"csrf": "c" * (MAX_SECRET + 1), "item": "a"}):
        assert client.post("/rate", data=data).status_code == 403, data
    assert store.lines() == seen


def test_cross_site_posts_are_refused(client: TestClient, store: RatingStore) -> None:
    csrf = logged_in(client, store)
    form = {"csrf": csrf, "item": "a", "score": "3"}
    seen = store.lines()
    for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site"}, {"Origin": "null"},
                    {"Origin": "http://testserver:8080"},
                    {"Origin": "http://testserver", "Sec-Fetch-Site": "cross-site"}):
        response = client.post("/rate", data=form, headers=headers)
        assert response.status_code == 403, headers
        assert_security_headers(response)
    assert store.lines() == seen
    # The same form from this origin, as a browser sends it, goes through.
    same = client.post("/rate", data=form,
                       headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 303
    assert len(store.lines()) == len(seen) + 1


def test_an_unknown_host_is_refused(store: RatingStore) -> None:
    token = store.add_rater("rita")
    with TestClient(rating_app(store), base_url="http://127.0.0.1:8765",
                    follow_redirects=False) as client:
        client.cookies.set(COOKIES.session, store.login(token))
        assert client.get("/rate").status_code == 200
        response = client.get("/rate", headers={"Host": "rebind.evil.example"})
        assert response.status_code == 400
        assert_security_headers(response)
        seen = store.lines()
        post = client.post("/rate", data={"item": "a"},
                           headers={"Host": "rebind.evil.example:8765"})
        assert post.status_code == 400
    assert store.lines() == seen
    assert local_hosts("0.0.0.0") == ["0.0.0.0", "127.0.0.1", "localhost", "[::1]"]
    assert local_hosts("::1") == ["[::1]", "127.0.0.1", "localhost"]


def test_a_body_over_the_limit_is_413(client: TestClient, store: RatingStore) -> None:
    csrf = logged_in(client, store)
    seen = store.lines()
    over = client.post("/rate", data={"csrf": csrf, "item": "i" * BODY_LIMIT, "score": "3"})
    assert over.status_code == 413
    assert_security_headers(over)
    # A declared length over the limit is refused before any of the body is read.
    form = f"csrf={csrf}&item=a&score=3".encode()
    declared = client.post("/rate", content=form, headers={
        "Content-Type": "application/x-www-form-urlencoded",
        "Content-Length": str(BODY_LIMIT + 1)})
    assert declared.status_code == 413
    not_a_number = client.post("/rate", content=form, headers={
        "Content-Type": "application/x-www-form-urlencoded", "Content-Length": "12abc"})
    assert not_a_number.status_code == 400
    assert store.lines() == seen


def test_a_body_over_the_limit_without_content_length_is_413(store: RatingStore) -> None:
    """Sent chunked over real HTTP, so only counting the bytes can catch it."""
    token = store.add_rater("rita")
    sid = store.login(token)
    seen = store.lines()

    def chunks() -> Iterator[bytes]:
        for _ in range(8):
            yield b"item=" + b"i" * 1024 + b"&"

    with LiveServer(rating_app(store)) as server, httpx.Client(base_url=server.url) as http:
        http.cookies.set(COOKIES.session, sid)
        response = http.post("/rate", content=chunks(), headers={
            "Content-Type": "application/x-www-form-urlencoded"})
        assert "content-length" not in response.request.headers
        assert response.status_code == 413
    assert store.lines() == seen


def test_form_fields_are_bounded(client: TestClient, store: RatingStore) -> None:
    csrf = logged_in(client, store)
    seen = store.lines()
    for data in ({"csrf": csrf, "item": "a", "score": "10"},
                 {"csrf": csrf, "item": "a", "comment": "x"},
                 {"csrf": csrf, "item": ["a", "b"]}):
        assert client.post("/rate", data=data).status_code == 400, data
    upload = client.post("/rate", data={"csrf": csrf}, files={"item": ("a.txt", b"a")})
    assert upload.status_code == 400
    assert store.lines() == seen


# ----------------------------------------------------------------------------- accepted


def test_security_headers_on_every_response(client: TestClient, store: RatingStore) -> None:
    logged_in(client, store)
    for path in ("/rate", "/nowhere"):
        response = client.get(path)
        assert_security_headers(response)
        assert response.headers["cache-control"] == "no-store"


def test_a_valid_post_is_accepted_and_audited(client: TestClient, store: RatingStore) -> None:
    csrf = logged_in(client, store)
    response = client.post("/rate", data={"csrf": csrf, "item": "img-7", "score": "4"})
    assert response.status_code == 303
    assert_security_headers(response)
    entries = [json.loads(line) for line in store.lines()]
    assert [e["action"] for e in entries] == ["add_rater", "login", "rate"]
    assert entries[-1]["rater"] == "rita" and entries[-1]["item"] == "img-7"
    assert entries[-1]["score"] == "4" and entries[-1]["seq"] == 3
    seq, head = store.audit.head()
    assert (seq, head) == (3, entries[-1]["hash"])
    assert verify(store.audit.path, expected_head=head).ok
    assert store.audit.verify().ok


def test_an_edited_audit_line_is_caught(client: TestClient, store: RatingStore) -> None:
    csrf = logged_in(client, store)
    for score in "345":
        client.post("/rate", data={"csrf": csrf, "item": "img-7", "score": score})
    lines = store.lines()
    edited = json.loads(lines[3])
    edited["score"] = "1"
    lines[3] = canonical(edited)
    store.audit.path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    check = store.audit.verify()
    assert not check.ok and check.line == 4 and "edited" in check.problem
    assert not verify(store.audit.path, expected_head=store.audit.head()[1]).ok


def test_a_line_of_a_crashed_write_is_set_aside(store: RatingStore, tmp_path: Path) -> None:
    store.add_rater("rita")
    with open(store.audit.path, "a", encoding="utf-8") as handle:
        handle.write('{"seq": 2}\n')  # appended, then the process died before COMMIT
    reopened = RatingStore(tmp_path / "rating")
    aside = list(store.audit.path.parent.glob("audit.jsonl.past-head-*"))
    assert len(aside) == 1 and aside[0].read_text() == '{"seq": 2}\n'
    assert not reopened.audit.verify().ok  # until a person resolves it
    reopened.audit.resolve_set_aside()
    assert reopened.audit.verify().ok


# ----------------------------------------------------------------------------- pieces


def test_tokens_and_sessions_are_stored_only_as_digests(store: RatingStore) -> None:
    token = store.add_rater("rita")
    sid = store.login(token)
    store.database.close()
    with sqlite3.connect(store.database_path) as con:
        dump = "\n".join(con.iterdump())
    assert token not in dump and sid not in dump
    assert secret_digest(token) in dump and secret_digest(sid) in dump
    con = store.database.connection()
    assert RATERS.holder(con, token) == "rita"
    assert RATERS.holder(con, token + "x") is None and RATERS.holder(con, "") is None
    found = SESSIONS.find(con, sid)
    assert found is not None and found.user == "rita"
    with store.database.write() as write:
        new_token = RATERS.replace(write, "rita")
        SESSIONS.close_all(write, "rita")
    assert RATERS.holder(con, token) is None and RATERS.holder(con, new_token) == "rita"
    assert SESSIONS.find(con, sid) is None


def test_sessions_expire(store: RatingStore) -> None:
    expired = SessionTable("sessions", user_column="rater", lifetime=-1.0)
    with store.database.write() as con:
        sid, _ = expired.open(con, "rita")
    assert SESSIONS.find(store.database.connection(), sid) is None
    with store.database.write() as con:
        sid, _ = SESSIONS.open(con, "rita")  # opening a session clears the expired one
        rows = con.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    assert rows == 1 and SESSIONS.find(store.database.connection(), sid) is not None


def test_secrets_are_compared_within_bounds() -> None:
    assert secret_matches("s" * MAX_SECRET, "s" * MAX_SECRET)
    assert not secret_matches("s" * (MAX_SECRET + 1), "s" * (MAX_SECRET + 1))
    assert not secret_matches("", "") and not secret_matches(None, "s")
    assert not secret_matches("s", None) and not secret_matches("s", "t")


def test_bearer_token_parsing() -> None:
    assert bearer_token({"authorization": "Bearer acrb_abc"}) == "acrb_abc"
    assert bearer_token({"authorization": "bearer  acrb_abc "}) == "acrb_abc"
    assert bearer_token({"authorization": "Basic acrb_abc"}) is None
    assert bearer_token({"authorization": "Bearer "}) is None
    assert bearer_token({"authorization": "Bearer " + "t" * 129}) is None
    assert bearer_token({}) is None


def test_cookie_names_are_per_tool() -> None:
    assert (COOKIES.session, COOKIES.login_csrf) == ("acrb_rating_session",
                                                     "acrb_rating_login_csrf")
    assert SessionCookies("acrb").session != COOKIES.session
    with pytest.raises(ValueError):
        SessionCookies("acrb; Path=/")


def test_the_host_warning() -> None:
    for host in ("127.0.0.1", "localhost", "::1"):
        assert exposure_warning(host) is None
    warning = exposure_warning("0.0.0.0")
    assert warning is not None and "0.0.0.0" in warning and "no TLS" in warning
