"""The curation web app: login, the decision forms, the bearer API, and its defences.

Most tests drive the app in process (Starlette's TestClient); the concurrency tests run it
with uvicorn on a free port (:class:`LiveServer`) and hit it from many threads at once.
"""

from __future__ import annotations

import json
import random
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from acrb.curation.store import CRITERIA, MAX_RATIONALE, CurationStore, design_cells
from acrb.curation.web import create_app
from acrb.web.security import CSP, same_origin
from tests.curation_fixtures import make_candidates
from tests.live_server import LiveServer, csrf_of

CELL = "Black_Female_20s"
NEXT_CELL = "Black_Female_30s"
ALL_TICKED = {name: "1" for name in CRITERIA}
CELLS = [cell for cell, *_ in design_cells()]


@pytest.fixture(scope="module")
def candidates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """84 cells x 2 pre-screened portraits, built once for the module."""
    return make_candidates(tmp_path_factory.mktemp("candidates"))


def new_store(root: Path, candidates: Path,
              curators: tuple[str, ...] = ("alice",)) -> tuple[CurationStore, dict[str, str]]:
    store = CurationStore(root / "curation", create=True)
    store.load_candidates(candidates)
    return store, {name: store.add_curator(name) for name in curators}


@pytest.fixture
def setup(tmp_path: Path, candidates: Path) -> tuple[CurationStore, dict[str, str]]:
    return new_store(tmp_path, candidates, ("alice", "bob"))


@pytest.fixture
def client(setup: tuple[CurationStore, dict[str, str]]) -> Iterator[TestClient]:
    store, _ = setup
    with TestClient(create_app(store, allowed_hosts=["testserver"]),
                    follow_redirects=False) as test_client:
        yield test_client




def log_in(client: TestClient | httpx.Client, token: str) -> None:
    page = client.get("/login")
    assert page.status_code == 200
    response = client.post("/login", data={"token": token, "csrf": csrf_of(page.text)})
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/"


def cell_csrf(client: TestClient | httpx.Client, cell: str = CELL) -> str:
    page = client.get(f"/cell/{cell}")
    assert page.status_code == 200
    return csrf_of(page.text)


def audit_lines(store: CurationStore) -> int:
    return len(store.log.read_text(encoding="utf-8").splitlines())


# ----------------------------------------------------------------------------- login


def test_login_logout_and_pages_need_a_session(
        client: TestClient, setup: tuple[CurationStore, dict[str, str]]) -> None:
    store, tokens = setup
    for path in ("/", f"/cell/{CELL}", "/log"):
        response = client.get(path)
        assert response.status_code == 303 and response.headers["location"] == "/login"
    assert client.get(f"/image/{CELL}_c1").status_code == 401
    assert client.get("/api/progress").status_code == 401

    page = client.get("/login")
    assert 'type="password"' in page.text and 'maxlength="128"' in page.text
    assert "acrb_login_csrf" in page.headers["set-cookie"]
    wrong = client.post("/login", data={"token": "acrb_not-a-token", "csrf": csrf_of(page.text)})
    assert wrong.status_code == 401
    assert "token not recognised" in wrong.text
    assert "acrb_session" not in client.cookies

    # The login form's own CSRF token must match its cookie.
    forged = client.post("/login", data={"token": tokens["alice"], "csrf": "x" * 43})
    assert forged.status_code == 403
    assert "acrb_session" not in client.cookies

    log_in(client, tokens["alice"])
    cookie = client.cookies.jar
    assert any(c.name == "acrb_session" for c in cookie)
    response = client.get("/")
    assert response.status_code == 200
    assert "alice" in response.text and "Log out" in response.text
    assert client.get("/api/progress").json()["total"] == 84

    seen = audit_lines(store)
    assert client.post("/logout", data={"csrf": "wrong"}).status_code == 403
    assert audit_lines(store) == seen
    out = client.post("/logout", data={"csrf": csrf_of(response.text)})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert client.get("/").status_code == 303
    assert audit_lines(store) == seen + 1  # the logout


def test_session_cookie_attributes(client: TestClient,
                                   setup: tuple[CurationStore, dict[str, str]]) -> None:
    _, tokens = setup
    page = client.get("/login")
    response = client.post("/login", data={"token": tokens["bob"], "csrf": csrf_of(page.text)})
    cookie = next(v for v in response.headers.get_list("set-cookie")
                  if v.startswith("acrb_session="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie


# ----------------------------------------------------------------------------- the flow


def test_select_via_form_moves_on_and_is_logged(
        client: TestClient, setup: tuple[CurationStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["alice"])
    page = client.get(f"/cell/{CELL}")
    assert page.status_code == 200
    for number, candidate in enumerate((f"{CELL}_c1", f"{CELL}_c2"), start=1):
        assert f'data-candidate="{candidate}"' in page.text
        assert f'src="/image/{candidate}"' in page.text
        assert f'<span class="num">{number}</span>' in page.text
    for text in CRITERIA.values():
        assert text in page.text
    assert f'maxlength="{MAX_RATIONALE}"' in page.text
    # Pre-screen measurements and flags are all on the page.
    found = store.candidate(f"{CELL}_c2")
    assert found is not None
    screen = found["prescreen"]
    for flag in filter(None, screen["flags"].split(";")):
        assert flag in page.text
    assert "Sharpness" in page.text and "Near duplicate of" in page.text

    response = client.post(f"/cell/{CELL}/decide", data={
        "csrf": csrf_of(page.text), "candidate_id": f"{CELL}_c1", "action": "select",
        "rationale": "clear, frontal, well lit", **ALL_TICKED})
    assert response.status_code == 303
    assert response.headers["location"] == f"/cell/{NEXT_CELL}"

    grid = client.get("/")
    assert "1 / 84 cells have a selection" in grid.text
    assert 'data-selected="1"' in grid.text and 'data-total="84"' in grid.text
    assert f"/image/{CELL}_c1" in grid.text and "by alice" in grid.text
    chosen = store.selections()[CELL]
    assert chosen["candidate_id"] == f"{CELL}_c1" and chosen["curator"] == "alice"
    assert chosen["source"] == "web" and all(chosen["criteria"].values())
    assert store.verify().ok
    assert client.get("/api/progress").json()["cells"][CELL] == f"{CELL}_c1"

    cell_page = client.get(f"/cell/{CELL}")
    assert "Selected by alice" in cell_page.text
    assert "clear, frontal, well lit" in cell_page.text
    log_page = client.get("/log")
    assert "chain intact" in log_page.text and "clear, frontal, well lit" in log_page.text

    # Reject and clear come back to the cell.
    csrf = csrf_of(cell_page.text)
    reject = client.post(f"/cell/{CELL}/decide", data={
        "csrf": csrf, "candidate_id": f"{CELL}_c2", "action": "reject", "rationale": "no face"})
    assert reject.status_code == 303 and reject.headers["location"] == f"/cell/{CELL}"
    assert "Rejected by alice" in client.get(f"/cell/{CELL}").text
    clear = client.post(f"/cell/{CELL}/decide", data={"csrf": csrf, "action": "deselect"})
    assert clear.status_code == 303 and clear.headers["location"] == f"/cell/{CELL}"
    assert CELL not in store.selections()
    assert [d["action"] for d in store.decisions(CELL)] == ["select", "reject", "deselect"]


def test_select_in_the_last_open_cell_goes_to_the_grid(
        tmp_path: Path, candidates: Path) -> None:
    store, tokens = new_store(tmp_path, candidates)
    for cell in CELLS[:-1]:
        store.decide("alice", cell, "select", candidate_id=f"{cell}_c1", rationale="ok")
    last = CELLS[-1]
    with TestClient(create_app(store, allowed_hosts=["testserver"]),
                    follow_redirects=False) as client:
        log_in(client, tokens["alice"])
        response = client.post(f"/cell/{last}/decide", data={
            "csrf": cell_csrf(client, last), "candidate_id": f"{last}_c2", "action": "select",
            **ALL_TICKED})
        assert response.status_code == 303 and response.headers["location"] == "/"
        assert "84 / 84 cells have a selection" in client.get("/").text


def test_unknown_cell_is_404(client: TestClient,
                             setup: tuple[CurationStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["alice"])
    csrf = cell_csrf(client)
    assert client.get("/cell/Martian_Female_20s").status_code == 404
    seen = audit_lines(store)
    response = client.post("/cell/Martian_Female_20s/decide", data={
        "csrf": csrf, "candidate_id": f"{CELL}_c1", "action": "select", **ALL_TICKED})
    assert response.status_code == 404
    # A candidate of another cell is refused by the store, shown as a 400.
    other = client.post(f"/cell/{NEXT_CELL}/decide", data={
        "csrf": csrf, "candidate_id": f"{CELL}_c1", "action": "select", **ALL_TICKED})
    assert other.status_code == 400 and "is not a candidate of cell" in other.text
    assert audit_lines(store) == seen


# ----------------------------------------------------------------------------- credentials


def test_writes_without_credentials_are_refused_and_not_logged(
        client: TestClient, setup: tuple[CurationStore, dict[str, str]]) -> None:
    store, tokens = setup
    seen = audit_lines(store)
    form = {"candidate_id": f"{CELL}_c1", "action": "select", "rationale": "x", **ALL_TICKED}
    assert client.post(f"/cell/{CELL}/decide", data=form).status_code == 403
    assert client.post(f"/cell/{CELL}/decide",
                       data={**form, "csrf": "guess"}).status_code == 403
    body = {"cell": CELL, "action": "select", "candidate_id": f"{CELL}_c1",
            "criteria": dict.fromkeys(CRITERIA, True), "rationale": ""}
    assert client.post("/api/decisions", json=body).status_code == 401
    wrong = client.post("/api/decisions", json=body,
                        headers={"Authorization": "Bearer acrb_wrong"})
    assert wrong.status_code == 401
    assert client.post("/api/decisions", json=body,
                       headers={"Authorization": f"Basic {tokens['alice']}"}).status_code == 401

    # A logged-in browser's cookie is no credential for the API.
    log_in(client, tokens["alice"])
    seen = audit_lines(store)
    assert client.post("/api/decisions", json=body).status_code == 401
    assert audit_lines(store) == seen
    assert store.decisions() == []


def test_api_decisions_with_bearer(client: TestClient,
                                   setup: tuple[CurationStore, dict[str, str]]) -> None:
    store, tokens = setup
    auth = {"Authorization": f"Bearer {tokens['bob']}"}
    body = {"cell": CELL, "action": "select", "candidate_id": f"{CELL}_c2",
            "criteria": dict.fromkeys(CRITERIA, True), "rationale": ""}
    response = client.post("/api/decisions", json=body, headers=auth)
    assert response.status_code == 201, response.text
    entry = response.json()
    assert entry["seq"] == store.head()[0] and entry["hash"] == store.head()[1]
    assert store.selections()[CELL]["curator"] == "bob"
    assert store.selections()[CELL]["source"] == "api"
    progress = client.get("/api/progress", headers=auth).json()
    assert progress["selected"] == 1 and progress["cells"][CELL] == f"{CELL}_c2"

    seen = audit_lines(store)
    not_json = client.post("/api/decisions", content=json.dumps(body),
                           headers={**auth, "Content-Type": "text/plain"})
    assert not_json.status_code == 415
    form = client.post("/api/decisions", data={"cell": CELL}, headers=auth)
    assert form.status_code == 415
    bad = [
        {**body, "action": "approve"},
        {**body, "candidate_id": None},
        {**body, "criteria": {"smiling": True}},
        {**body, "criteria": {"frontal_face": "yes"}},
        {**body, "criteria": {}, "rationale": "  "},
        {**body, "rationale": "r" * (MAX_RATIONALE + 1)},
        {**body, "cell": "Nowhere"},
        {**body, "extra": 1},
        [body],
    ]
    for case in bad:
        answer = client.post("/api/decisions", json=case, headers=auth)
        assert answer.status_code == 400, (case, answer.text)
        assert "error" in answer.json()
    broken = client.post("/api/decisions", content=b"{not json",
                         headers={**auth, "Content-Type": "application/json"})
    assert broken.status_code == 400
    assert audit_lines(store) == seen


# ----------------------------------------------------------------------------- cross-site


def test_cross_site_posts_are_refused(client: TestClient,
                                      setup: tuple[CurationStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["alice"])
    csrf = cell_csrf(client)
    form = {"csrf": csrf, "candidate_id": f"{CELL}_c1", "action": "select", **ALL_TICKED}
    seen = audit_lines(store)
    for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                    {"Origin": "http://testserver:8080"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
                    {"Origin": "http://testserver", "Sec-Fetch-Site": "cross-site"}):
        response = client.post(f"/cell/{CELL}/decide", data=form, headers=headers)
        assert response.status_code == 403, headers
    assert client.post(f"/cell/{CELL}/decide",
                       data={**form, "csrf": csrf[:-2] + "xx"}).status_code == 403
    without = {k: v for k, v in form.items() if k != "csrf"}
    assert client.post(f"/cell/{CELL}/decide", data=without).status_code == 403
    assert client.post(f"/cell/{CELL}/decide",
                       data={**form, "csrf": [csrf, csrf]}).status_code == 403
    evil_api = client.post("/api/decisions", headers={
        "Origin": "https://evil.example", "Authorization": f"Bearer {tokens['alice']}"},
        json={"cell": CELL, "action": "reject", "candidate_id": f"{CELL}_c1"})
    assert evil_api.status_code == 403
    assert audit_lines(store) == seen and store.decisions() == []

    # The same post from this origin goes through: as Chromium sends it with the app's
    # `Referrer-Policy: no-referrer` (Origin: null), with a full Origin, and from a script.
    for headers in ({"Origin": "null", "Sec-Fetch-Site": "same-origin"},
                    {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}, {}):
        same = client.post(f"/cell/{CELL}/decide", data=form, headers=headers)
        assert same.status_code == 303, headers
    assert audit_lines(store) == seen + 3


def test_same_origin() -> None:
    assert same_origin("http://127.0.0.1:8765", "http", "127.0.0.1:8765")
    assert same_origin("http://localhost", "http", "localhost:80")
    assert not same_origin("http://127.0.0.1:8766", "http", "127.0.0.1:8765")
    assert not same_origin("https://127.0.0.1:8765", "http", "127.0.0.1:8765")
    assert not same_origin("http://127.0.0.1:8765.evil.example", "http", "127.0.0.1:8765")
    assert not same_origin("null", "http", "127.0.0.1:8765")
    assert not same_origin("http://user@127.0.0.1:8765", "http", "127.0.0.1:8765")


# ----------------------------------------------------------------------------- images


def test_images_only_for_known_candidates(client: TestClient,
                                          setup: tuple[CurationStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["alice"])
    secret = store.workdir / "curation.sqlite"
    assert secret.exists()
    attempts = [
        "/image/..%2F..%2Fetc%2Fpasswd",
        "/image/../../etc/passwd",
        "/image/%2e%2e/%2e%2e/curation.sqlite",
        "/image/%2e%2e%2f%2e%2e%2fcuration%2fcuration.sqlite",
        f"/image/images%2F{CELL}_c1.png",
        f"/image/{CELL}_c1.png",
        "/image/%2Fetc%2Fpasswd",
        "/image/%00",
        f"/image/{CELL}_c9",
        "/image/" + "a" * 300,
    ]
    for path in attempts:
        response = client.get(path)
        assert response.status_code == 404, path
        assert b"root:" not in response.content and b"SQLite format" not in response.content
    path = store.image_path(f"{CELL}_c1")
    assert path is not None
    response = client.get(f"/image/{CELL}_c1")
    assert response.status_code == 200
    assert response.content == path.read_bytes()
    assert response.headers["content-type"] == "image/png"
    assert response.headers["cache-control"] == "private, max-age=3600"
    assert response.headers["x-content-type-options"] == "nosniff"


def test_raw_traversal_paths_over_http(tmp_path: Path, candidates: Path) -> None:
    """Paths sent byte for byte, without a client normalising the dots first."""
    store, tokens = new_store(tmp_path, candidates)
    session = store.login(tokens["alice"])
    assert session is not None
    sid = session[0]
    with LiveServer(create_app(store)) as server:
        for target in ("/image/../../etc/passwd", "/image/..%2f..%2fcuration.sqlite",
                       "/image/%2e%2e/%2e%2e/curation/curation.sqlite",
                       f"/image/images/{CELL}_c1.png", "/image/.%2e/.%2e/etc/passwd",
                       "/image/..", "/image/%2e%2e"):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                             f"Cookie: acrb_session={sid}\r\nConnection: close\r\n\r\n"
                             .encode())
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
            assert reply.startswith(b"HTTP/1.1 404"), (target, reply[:80])


# ----------------------------------------------------------------------------- input bounds


def test_input_bounds(client: TestClient, setup: tuple[CurationStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["alice"])
    csrf = cell_csrf(client)
    seen = audit_lines(store)
    base = {"csrf": csrf, "candidate_id": f"{CELL}_c1", "action": "select", **ALL_TICKED}

    too_long = client.post(f"/cell/{CELL}/decide",
                           data={**base, "rationale": "r" * (MAX_RATIONALE + 1)})
    assert too_long.status_code == 400
    assert "at most" in too_long.text

    # CRLF line breaks count once, as the browser's maxlength counted them.
    crlf = "a\r\n" * (MAX_RATIONALE // 2)
    within = client.post(f"/cell/{CELL}/decide", data={**base, "rationale": crlf})
    assert within.status_code == 303
    assert store.decisions(CELL)[-1]["rationale"] == crlf.replace("\r\n", "\n").strip()
    seen += 1

    huge = client.post(f"/cell/{CELL}/decide", data={**base, "rationale": "r" * 70_000})
    assert huge.status_code == 413
    huge_api = client.post("/api/decisions", content=b" " * 70_000, headers={
        "Authorization": f"Bearer {tokens['alice']}", "Content-Type": "application/json"})
    assert huge_api.status_code == 413

    unticked = {k: v for k, v in base.items() if k != "frontal_face"}
    missing = client.post(f"/cell/{CELL}/decide", data={**unticked, "rationale": " "})
    assert missing.status_code == 400
    assert "needs a rationale" in missing.text and "frontal_face" in missing.text
    # The page comes back with what was entered, ready to fix.
    assert re.search(rf'value="{CELL}_c1" checked', missing.text)

    for data in ({**base, "smiling": "1"}, {**base, "action": "approve"},
                 {**base, "candidate_id": ""}, {**base, "candidate_id": "c" * 201}):
        assert client.post(f"/cell/{CELL}/decide", data=data).status_code == 400, data
    assert audit_lines(store) == seen

    # With a rationale, an unticked criterion is accepted and recorded as unticked.
    explained = client.post(f"/cell/{CELL}/decide",
                            data={**unticked, "rationale": "only three-quarter views"})
    assert explained.status_code == 303
    assert store.selections()[CELL]["criteria"]["frontal_face"] is False
    long_token = client.post("/login", data={"token": "t" * 129, "csrf": "x"})
    assert long_token.status_code == 400  # the field bound, before the CSRF check


def test_body_without_content_length_is_capped(
        tmp_path: Path, candidates: Path) -> None:
    store, tokens = new_store(tmp_path, candidates)

    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 4096

    with LiveServer(create_app(store)) as server, httpx.Client(base_url=server.url) as http:
        response = http.post("/api/decisions", content=chunks(), headers={
            "Authorization": f"Bearer {tokens['alice']}", "Content-Type": "application/json"})
        assert response.status_code == 413
    assert store.decisions() == []


# ----------------------------------------------------------------------------- hosts, headers


def test_bad_host_header_is_refused(setup: tuple[CurationStore, dict[str, str]]) -> None:
    store, tokens = setup
    with TestClient(create_app(store), base_url="http://127.0.0.1:8765",
                    follow_redirects=False) as client:
        assert client.get("/login").status_code == 200
        response = client.get("/login", headers={"Host": "rebind.evil.example"})
        assert response.status_code == 400
        assert response.headers["content-security-policy"] == CSP
        api = client.post("/api/decisions", headers={
            "Host": "rebind.evil.example:8765", "Authorization": f"Bearer {tokens['alice']}"},
            json={"cell": CELL, "action": "reject", "candidate_id": f"{CELL}_c1"})
        assert api.status_code == 400
    assert store.decisions() == []


def test_security_headers(client: TestClient,
                          setup: tuple[CurationStore, dict[str, str]]) -> None:
    _, tokens = setup
    log_in(client, tokens["alice"])
    for path in ("/", f"/cell/{CELL}", "/log", "/login", "/app.js", "/app.css", "/nowhere"):
        response = client.get(path)
        assert response.headers["content-security-policy"] == CSP, path
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["x-frame-options"] == "DENY"
    for path in ("/", f"/cell/{CELL}", "/log"):
        page = client.get(path)
        assert page.headers["cache-control"] == "no-store"
        # The policy forbids inline script and style, so the pages must not have any.
        assert "<style" not in page.text and " style=" not in page.text
        assert re.search(r"<script(?![^>]*\bsrc=)", page.text) is None
        assert re.search(r"\son[a-z]+=", page.text) is None
    assert client.get("/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/app.css").headers["content-type"].startswith("text/css")


def test_pages_escape_what_curators_write(
        client: TestClient, setup: tuple[CurationStore, dict[str, str]]) -> None:
    _, tokens = setup
    log_in(client, tokens["alice"])
    payload = '<script>alert("x")</script>'
    response = client.post(f"/cell/{CELL}/decide", data={
        "csrf": cell_csrf(client), "candidate_id": f"{CELL}_c1", "action": "reject",
        "rationale": payload})
    assert response.status_code == 303
    for path in (f"/cell/{CELL}", "/log"):
        text = client.get(path).text
        assert payload not in text and "&lt;script&gt;" in text


# ----------------------------------------------------------------------------- concurrency


def _plan(curator_index: int, count: int = 50) -> list[dict[str, object]]:
    """A deterministic mix of selects and rejects over many cells for one curator."""
    rng = random.Random(curator_index)
    plan: list[dict[str, object]] = []
    for _ in range(count):
        cell = CELLS[rng.randrange(24)]  # a few cells, so curators collide
        action = "select" if rng.random() < 0.6 else "reject"
        ticks = dict.fromkeys(CRITERIA, True)
        rationale = ""
        if rng.random() < 0.2:
            ticks["neutral_expression"] = False
            rationale = f"curator {curator_index}: smiling, but the best of the two"
        plan.append({"cell": cell, "action": action,
                     "candidate_id": f"{cell}_c{rng.randint(1, 2)}", "criteria": ticks,
                     "rationale": rationale})
    return plan


def _replay(decisions: list[dict[str, object]]) -> dict[str, str]:
    """The selection per cell that the decisions, in seq order, leave behind."""
    chosen: dict[str, str] = {}
    for d in sorted(decisions, key=lambda d: d["seq"]):  # type: ignore[arg-type,return-value]
        cell, candidate = str(d["cell"]), d["candidate_id"]
        if d["action"] == "select":
            chosen[cell] = str(candidate)
        elif d["action"] == "reject" and chosen.get(cell) == candidate:
            del chosen[cell]
        elif d["action"] == "deselect":
            chosen.pop(cell, None)
    return chosen


def test_concurrent_api_writes(tmp_path: Path, candidates: Path) -> None:
    curators = tuple(f"curator{i}" for i in range(10))
    store, tokens = new_store(tmp_path, candidates, curators)
    before = audit_lines(store)
    barrier = threading.Barrier(len(curators))
    results: dict[str, list[tuple[int, dict[str, object]]]] = {}
    failures: list[BaseException] = []

    def work(index: int, name: str, url: str) -> None:
        try:
            plan = _plan(index)
            answers = []
            with httpx.Client(base_url=url, timeout=60,
                              headers={"Authorization": f"Bearer {tokens[name]}"}) as http:
                barrier.wait(timeout=30)
                for body in plan:
                    response = http.post("/api/decisions", json=body)
                    answers.append((response.status_code, response.json()))
            results[name] = answers
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    with LiveServer(create_app(store)) as server:
        threads = [threading.Thread(target=work, args=(i, name, server.url))
                   for i, name in enumerate(curators)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        log_page_ok = _log_page_says_intact(server.url, tokens["curator0"])
    assert not failures, failures
    assert all(status == 201 for answers in results.values() for status, _ in answers)

    decisions = store.decisions()
    assert len(decisions) == 500
    for index, name in enumerate(curators):
        mine = [d for d in decisions if d["curator"] == name]
        assert len(mine) == 50
        # Each curator's decisions are theirs, in the order they were sent.
        assert [(d["cell"], d["action"], d["candidate_id"]) for d in mine] == \
            [(p["cell"], p["action"], p["candidate_id"]) for p in _plan(index)]
        assert [d["seq"] for d in mine] == [body["seq"] for _, body in results[name]]
    assert len({d["seq"] for d in decisions}) == 500

    verification = store.verify()
    assert verification.ok, verification.message()
    # 500 decisions and the login of the curator who read /log at the end.
    assert audit_lines(store) == before + 500 + 1 == verification.entries
    sealed = {json.loads(line)["seq"]: json.loads(line)["hash"]
              for line in store.log.read_text(encoding="utf-8").splitlines()}
    for answers in results.values():
        for _, body in answers:
            assert sealed[body["seq"]] == body["hash"]

    expected = _replay(decisions)
    actual = {cell: d["candidate_id"] for cell, d in store.selections().items()}
    assert actual == expected
    last_select = {}
    for d in decisions:
        if d["action"] == "select":
            last_select[d["cell"]] = d
    for cell, chosen in store.selections().items():
        assert chosen["seq"] == last_select[cell]["seq"]
    assert log_page_ok


def _log_page_says_intact(url: str, token: str) -> bool:
    with httpx.Client(base_url=url) as http:
        log_in(http, token)
        return "chain intact" in http.get("/log").text


def test_concurrent_browser_sessions(tmp_path: Path, candidates: Path) -> None:
    """Ten curators in browsers, each logged in, posting forms while /log is read."""
    curators = tuple(f"web{i}" for i in range(10))
    store, tokens = new_store(tmp_path, candidates, curators)
    barrier = threading.Barrier(len(curators) + 1)
    statuses: list[int] = []
    log_pages: list[str] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def curate(index: int, name: str, url: str) -> None:
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                log_in(http, tokens[name])
                csrf = cell_csrf(http)
                barrier.wait(timeout=30)
                for step in range(10):
                    cell = CELLS[(index + step) % 12]
                    response = http.post(f"/cell/{cell}/decide", data={
                        "csrf": csrf, "candidate_id": f"{cell}_c{1 + step % 2}",
                        "action": "select", "rationale": f"{name} step {step}", **ALL_TICKED})
                    statuses.append(response.status_code)
        except BaseException as exc:
            failures.append(exc)

    def read_log(url: str) -> None:
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                log_in(http, tokens[curators[0]])
                barrier.wait(timeout=30)
                while not done.is_set():
                    log_pages.append(http.get("/log").text)
        except BaseException as exc:
            failures.append(exc)

    with LiveServer(create_app(store)) as server:
        threads = [threading.Thread(target=curate, args=(i, name, server.url))
                   for i, name in enumerate(curators)]
        reader = threading.Thread(target=read_log, args=(server.url,))
        for thread in [*threads, reader]:
            thread.start()
        for thread in threads:
            thread.join(120)
        done.set()
        reader.join(60)
    assert not failures, failures
    assert statuses == [303] * 100
    assert len(store.decisions()) == 100
    assert store.verify().ok
    assert log_pages and all("chain intact" in page for page in log_pages)
    assert {cell: d["candidate_id"] for cell, d in store.selections().items()} == \
        _replay(store.decisions())
