"""The review web app: login, rating, resume, what the page never shows, and its defences.

Most tests drive the app in process (Starlette's TestClient); raw traversal paths, a body
without Content-Length and concurrent raters go over real HTTP (:class:`LiveServer`).
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from acrb.records import REVIEW_AXES
from acrb.review.store import RUBRIC, ReviewStore
from acrb.review.web import CANNOT_TELL, create_app
from acrb.web.security import CSP
from tests.live_server import LiveServer, csrf_of
from tests.review_fixtures import GROUPS, MODEL, make_review_store

_CLAIM = re.compile(r'name="claim" value="(\d+)"')


@pytest.fixture
def setup(tmp_path: Path) -> tuple[ReviewStore, dict[str, str]]:
    return make_review_store(tmp_path, ("r01", "r02"), items=6, k=2, paired_every=2)


@pytest.fixture
def client(setup: tuple[ReviewStore, dict[str, str]]) -> Iterator[TestClient]:
    store, _ = setup
    with TestClient(create_app(store, allowed_hosts=["testserver"]),
                    follow_redirects=False) as test_client:
        yield test_client




def claim_of(html: str) -> str:
    found = _CLAIM.search(html)
    assert found, "no claim field in the page"
    return found.group(1)


def log_in(client: TestClient | httpx.Client, token: str) -> None:
    page = client.get("/login")
    assert page.status_code == 200
    response = client.post("/login", data={"token": token, "csrf": csrf_of(page.text)})
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/"


def form_for(html: str, value: str = "3", axes: tuple[str, ...] = REVIEW_AXES
             ) -> dict[str, str]:
    """A complete answer to the page in ``html``: every axis of ``axes`` (default: the age
    change question's) of every output shown."""
    slots = sorted(set(re.findall(r'name="(\d)\.edit_success"', html)))
    assert slots in (["0"], ["0", "1"])
    return {"csrf": csrf_of(html), "claim": claim_of(html),
            **{f"{slot}.{axis}": value for slot in slots for axis in axes}}


def audit_lines(store: ReviewStore) -> int:
    return len(store.log.read_text(encoding="utf-8").splitlines())


# ----------------------------------------------------------------------------- login, flow


def test_login_logout_and_pages_need_a_session(
        client: TestClient, setup: tuple[ReviewStore, dict[str, str]]) -> None:
    store, tokens = setup
    response = client.get("/")
    assert response.status_code == 303 and response.headers["location"] == "/login"
    assert client.get("/image/1/source").status_code == 401
    page = client.get("/login")
    assert 'type="password"' in page.text and "acrb_review_login_csrf" in \
        page.headers["set-cookie"]
    wrong = client.post("/login", data={"token": "acrb_nope", "csrf": csrf_of(page.text)})
    assert wrong.status_code == 401 and "token not recognised" in wrong.text
    forged = client.post("/login", data={"token": tokens["r01"], "csrf": "x" * 43})
    assert forged.status_code == 403 and "acrb_review_session" not in client.cookies

    log_in(client, tokens["r01"])
    assert client.get("/login").status_code == 303  # logged in: on to the rating page
    rate_page = client.get("/")
    assert rate_page.status_code == 200 and "Rating as <strong>r01</strong>" in rate_page.text
    seen = audit_lines(store)
    assert client.post("/logout", data={"csrf": "wrong"}).status_code == 403
    assert audit_lines(store) == seen
    out = client.post("/logout", data={"csrf": csrf_of(rate_page.text)})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert client.get("/").status_code == 303
    assert audit_lines(store) == seen + 1


def test_rate_resume_and_finish(client: TestClient,
                                setup: tuple[ReviewStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["r01"])
    page = client.get("/")
    claim = claim_of(page.text)
    # Resume: a reload, and a new session (another browser), show the same item.
    assert claim_of(client.get("/").text) == claim
    with TestClient(create_app(store, allowed_hosts=["testserver"]),
                    follow_redirects=False) as other:
        log_in(other, tokens["r01"])
        assert claim_of(other.get("/").text) == claim
    open_claim = store.open_claim("r01")
    assert open_claim is not None and str(open_claim.claim_id) == claim

    # The images are the claim's, in the order drawn for this showing.
    root = Path(store.set_info()["project_root"])
    item = open_claim.item
    files = {"edited": item.output_path, "feature": item.paired_output_path}
    assert client.get(f"/image/{claim}/source").content == \
        (root / item.source_path).read_bytes()
    for slot, output in enumerate(open_claim.shown_order):
        image = client.get(f"/image/{claim}/{slot}")
        assert image.status_code == 200 and image.headers["content-type"] == "image/png"
        assert image.content == (root / str(files[output])).read_bytes()

    seen = audit_lines(store)
    form = form_for(page.text)
    form["0.skin_tone"] = "5"
    form["0.race_change"] = CANNOT_TELL
    form["duration_ms"] = "250"
    saved = client.post("/rate", data=form)
    assert saved.status_code == 303 and saved.headers["location"] == "/"
    assert audit_lines(store) == seen + 1
    ratings = {r.output: r for r in store.ratings()}
    first = ratings[open_claim.shown_order[0]]
    assert first.skin_tone == 5 and first.race_change is None and first.edit_success == 3
    assert first.rater == "r01" and first.duration_ms == 250
    if len(open_claim.shown_order) == 2:
        assert first.shown_first is True
        assert ratings[open_claim.shown_order[1]].shown_first is False
    # The same form again (Enter pressed twice) changes nothing and moves on.
    again = client.post("/rate", data=form)
    assert again.status_code == 303 and audit_lines(store) == seen + 1

    # Without the script (no duration field) the server's own time is used.
    following = client.get("/")
    assert claim_of(following.text) != claim
    plain = {k: v for k, v in form_for(following.text, "2").items()}
    assert client.post("/rate", data=plain).status_code == 303
    assert all(r.duration_ms is not None for r in store.ratings())

    while "Save and next" in (page := client.get("/")).text:
        assert client.post("/rate", data=form_for(page.text)).status_code == 303
    assert "nothing left for you to rate" in page.text
    assert store.rater_progress("r01").rated == 6
    assert store.verify().ok


def test_the_page_never_shows_labels_model_or_ids(
        client: TestClient, setup: tuple[ReviewStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["r01"])
    forbidden = {MODEL, *(label for group in GROUPS for label in group)}
    shown = 0
    while "Save and next" in (page := client.get("/")).text:
        claim = store.open_claim("r01")
        assert claim is not None
        item = claim.item
        assert item.instruction in page.text  # the instruction is shown ...
        for text in (*forbidden, item.item_id, item.source_id, item.source_path,
                     item.output_path, str(item.paired_output_path), item.prompt_id,
                     str(item.request_id), "repeat", "judge"):
            # ... and nothing that names the group, the model, the item or its files.
            assert re.search(rf"(?<![A-Za-z]){re.escape(text)}(?![A-Za-z])", page.text) \
                is None, text
        for axis in REVIEW_AXES:
            question, words = RUBRIC[axis]
            assert question in page.text and all(w in page.text for w in words)
        assert page.text.count("cannot tell") >= len(REVIEW_AXES)
        shown += 1
        assert client.post("/rate", data=form_for(page.text)).status_code == 303
    assert shown == 6


def test_a_wrong_answer_is_shown_back_and_not_saved(
        client: TestClient, setup: tuple[ReviewStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["r02"])
    page = client.get("/")
    form = form_for(page.text)
    seen = audit_lines(store)
    missing = {k: v for k, v in form.items() if k != "0.age_change"}
    answer = client.post("/rate", data={**missing, "0.skin_tone": "4"})
    assert answer.status_code == 400 and "no answer to" in answer.text
    assert "different age" in answer.text
    assert re.search(r'name="0.skin_tone" value="4" required checked', answer.text)
    for bad in ({**form, "0.skin_tone": "6"}, {**form, "0.skin_tone": "0"},
                {**form, "0.smile": "3"}, {**form, "2.skin_tone": "3"},
                {**form, "0.skin_tone": "3" * 20}):
        assert client.post("/rate", data=bad).status_code == 400, bad
    if "1.edit_success" not in form:
        assert client.post("/rate", data={**form, "1.skin_tone": "3"}).status_code == 400
    assert audit_lines(store) == seen and store.ratings() == []


# ----------------------------------------------------------------------------- refusals


def test_writes_without_session_or_csrf_or_cross_site_are_refused_and_not_logged(
        client: TestClient, setup: tuple[ReviewStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["r01"])
    form = form_for(client.get("/").text)
    seen = audit_lines(store)
    with TestClient(create_app(store, allowed_hosts=["testserver"]),
                    follow_redirects=False) as stranger:
        assert stranger.post("/rate", data=form).status_code == 403  # no session
    assert client.post("/rate", data={k: v for k, v in form.items()
                                      if k != "csrf"}).status_code == 403
    assert client.post("/rate", data={**form, "csrf": "guess"}).status_code == 403
    assert client.post("/rate", data={**form, "csrf": [form["csrf"]] * 2}).status_code == 403
    for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                    {"Origin": "http://testserver:8080"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "http://testserver", "Sec-Fetch-Site": "cross-site"}):
        assert client.post("/rate", data=form, headers=headers).status_code == 403, headers
    # A body over 64 KiB, announced or not.
    assert client.post("/rate", data={**form, "pad": "x" * 70_000}).status_code == 413
    assert audit_lines(store) == seen and store.ratings() == []
    # The same post from this origin goes through.
    same = client.post("/rate", data=form,
                       headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 303 and audit_lines(store) == seen + 1


def test_body_without_content_length_is_capped(
        setup: tuple[ReviewStore, dict[str, str]]) -> None:
    store, tokens = setup

    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b"a" * 4096

    with LiveServer(create_app(store)) as server, httpx.Client(base_url=server.url) as http:
        log_in(http, tokens["r01"])
        http.get("/")
        seen = audit_lines(store)
        response = http.post("/rate", content=chunks(),
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert response.status_code == 413
    assert audit_lines(store) == seen and store.ratings() == []


def test_images_only_from_the_raters_own_claims(
        client: TestClient, setup: tuple[ReviewStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["r01"])
    claim = claim_of(client.get("/").text)
    other = store.next_item("r02")
    assert other is not None
    seen = audit_lines(store)
    attempts = [
        "/image/..%2F..%2Fetc%2Fpasswd/source", "/image/../../etc/passwd",
        f"/image/{claim}/..%2F..%2Freview.sqlite", f"/image/{claim}/%2e%2e",
        f"/image/{claim}/edited", f"/image/{claim}/feature", f"/image/{claim}/2",
        f"/image/{claim}/source.png", "/image/%00/source", "/image/-1/source",
        f"/image/{other.claim_id}/source",  # another rater's item
        "/image/999999/source", "/image/" + "9" * 30 + "/source",
        f"/image/{claim}/{'%2e%2e%2f' * 5}etc%2fpasswd",
        # Digits str.isdigit() takes and int() refuses: a 404, never a 500.
        "/image/%C2%B2/source", "/image/%D9%A3/source",
    ]
    for path in attempts:
        response = client.get(path)
        assert response.status_code == 404, path
        assert b"root:" not in response.content and b"SQLite format" not in response.content
    assert client.get(f"/image/{claim}/source").status_code == 200
    assert audit_lines(store) == seen


def test_an_item_path_pointing_outside_the_root_is_not_served(
        tmp_path: Path) -> None:
    """A set row edited after loading to point outside the project root (or a file
    replaced by a link to one) is refused when served, not only when loaded."""
    store, tokens = make_review_store(tmp_path, ("r01",), items=1, paired_every=0)
    secret = tmp_path.parent / f"{tmp_path.name}-secret.png"
    secret.write_bytes(b"\x89PNG secret")
    item = store.items()[0]
    (tmp_path / item.output_path).unlink()
    (tmp_path / item.output_path).symlink_to(secret)
    with TestClient(create_app(store, allowed_hosts=["testserver"]),
                    follow_redirects=False) as client:
        log_in(client, tokens["r01"])
        claim = claim_of(client.get("/").text)
        assert client.get(f"/image/{claim}/0").status_code == 404
        assert client.get(f"/image/{claim}/source").status_code == 200


def test_raw_traversal_paths_over_http(setup: tuple[ReviewStore, dict[str, str]]) -> None:
    """Paths sent byte for byte, without a client normalising the dots first."""
    store, tokens = setup
    session = store.login(tokens["r01"])
    assert session is not None
    claim = store.next_item("r01")
    assert claim is not None
    with LiveServer(create_app(store)) as server:
        for target in ("/image/../../etc/passwd", f"/image/{claim.claim_id}/../../review.sqlite",
                       f"/image/{claim.claim_id}/..%2f..%2freview-work%2freview.sqlite",
                       "/image/.%2e/.%2e/etc/passwd", f"/image/{claim.claim_id}/..",
                       f"/image/{claim.claim_id}/%2e%2e"):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                             f"Cookie: acrb_review_session={session[0]}\r\n"
                             "Connection: close\r\n\r\n".encode())
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
            assert reply.startswith(b"HTTP/1.1 404"), (target, reply[:80])


def test_security_headers_and_no_inline_script(
        client: TestClient, setup: tuple[ReviewStore, dict[str, str]]) -> None:
    _, tokens = setup
    log_in(client, tokens["r01"])
    for path in ("/", "/login", "/app.js", "/app.css", "/nowhere"):
        response = client.get(path)
        assert response.headers["content-security-policy"] == CSP, path
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
    page = client.get("/")
    assert page.headers["cache-control"] == "no-store"
    assert "<style" not in page.text and " style=" not in page.text
    assert re.search(r"<script(?![^>]*\bsrc=)", page.text) is None
    assert re.search(r"\son[a-z]+=", page.text) is None
    assert client.get("/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/", headers={"Host": "rebind.evil.example"}).status_code == 400


# ----------------------------------------------------------------------------- concurrency


def test_concurrent_raters_over_http(tmp_path: Path) -> None:
    """Ten raters in browsers posting forms at once: every rating saved once, k kept.

    The set has room for more ratings than the 80 posted (60 items x k=2), so every rater
    always has an item to rate whatever order the server serves them in; with exactly 80
    places a rater's last page could be "nothing left" (the places remaining were on items
    they had already rated), which is right, but not what this test is about."""
    raters = tuple(f"w{i}" for i in range(10))
    store, tokens = make_review_store(tmp_path, raters, items=60, k=2, repeat_fraction=0.1)
    barrier = threading.Barrier(len(raters))
    statuses: list[int] = []
    failures: list[BaseException] = []

    def rate(name: str, url: str) -> None:
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                log_in(http, tokens[name])
                barrier.wait(timeout=30)
                for _ in range(8):
                    page = http.get("/")
                    statuses.append(http.post("/rate", data=form_for(page.text)).status_code)
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    with LiveServer(create_app(store)) as server:
        threads = [threading.Thread(target=rate, args=(n, server.url)) for n in raters]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not failures, failures[:3]
    assert statuses == [303] * 80
    progress = store.progress()
    assert progress["rated"] + progress["repeats"] == 80
    per_item: dict[str, set[str]] = {}
    for rating in store.ratings():
        if not rating.repeat:
            per_item.setdefault(rating.item_id, set()).add(rating.rater)
    assert max(len(r) for r in per_item.values()) <= 2
    assert store.verify().ok


@pytest.mark.parametrize("duration", ["\u00b2", "\u0663", "-5", "1e3"])
def test_a_duration_that_is_no_plain_number_is_the_servers_own_time(
        client: TestClient, setup: tuple[ReviewStore, dict[str, str]], duration: str) -> None:
    store, tokens = setup
    log_in(client, tokens["r01"])
    form = form_for(client.get("/").text)
    form["duration_ms"] = duration
    assert client.post("/rate", data=form).status_code == 303
    assert [r.duration_ms is not None for r in store.ratings()] == [True] * len(store.ratings())
    assert store.ratings()


def test_the_direction_age_question_is_asked_and_saved(tmp_path: Path) -> None:
    store, tokens = make_review_store(tmp_path, ("r01",), items=2, k=1, paired_every=2,
                                      age_question="direction")
    axes = store.asked_axes
    assert "age_direction" in axes and "age_change" not in axes
    with TestClient(create_app(store, allowed_hosts=["testserver"]),
                    follow_redirects=False) as client:
        log_in(client, tokens["r01"])
        page = client.get("/")
        claim = store.open_claim("r01")
        assert claim is not None and len(claim.shown_order) == 2  # item 0 is a pair
        question, anchors = RUBRIC["age_direction"]
        assert question in page.text and all(words in page.text for words in anchors)
        assert RUBRIC["age_change"][0] not in page.text
        for slot in ("0", "1"):
            assert f'name="{slot}.age_direction"' in page.text
            assert f'name="{slot}.age_change"' not in page.text
        seen = audit_lines(store)
        form = form_for(page.text, "2", axes)
        # The change question's field is not part of this form.
        wrong = client.post("/rate", data={**form, "0.age_change": "3"})
        assert wrong.status_code == 400 and "age_change" in wrong.text
        unanswered = client.post("/rate", data={k: v for k, v in form.items()
                                                if k != "1.age_direction"})
        assert unanswered.status_code == 400 and "younger or older" in unanswered.text
        assert audit_lines(store) == seen and store.ratings() == []

        form["0.age_direction"] = "1"
        form["1.age_direction"] = CANNOT_TELL
        saved = client.post("/rate", data=form)
        assert saved.status_code == 303 and audit_lines(store) == seen + 1
        ratings = {r.output: r for r in store.ratings()}
        first, second = (ratings[output] for output in claim.shown_order)
        assert (first.age_direction, first.age_change) == (1, 5)  # much younger: complete
        assert (second.age_direction, second.age_change) == (None, None)
        assert first.edit_success == 2 and second.skin_tone == 2

        # The next item (shown alone): somewhat older, read as noticeably different.
        following = client.get("/")
        form = form_for(following.text, "3", axes)
        assert "1.age_direction" not in form
        form["0.age_direction"] = "4"
        assert client.post("/rate", data=form).status_code == 303
        last = store.ratings()[-1]
        assert (last.age_direction, last.age_change) == (4, 3)
    assert store.verify().ok


def test_the_change_age_question_page_does_not_ask_for_a_direction(
        client: TestClient, setup: tuple[ReviewStore, dict[str, str]]) -> None:
    store, tokens = setup
    log_in(client, tokens["r01"])
    page = client.get("/")
    assert RUBRIC["age_change"][0] in page.text
    assert RUBRIC["age_direction"][0] not in page.text and "much younger" not in page.text
    form = form_for(page.text)
    assert client.post("/rate", data={**form, "0.age_direction": "3"}).status_code == 400
    assert client.post("/rate", data=form).status_code == 303
    assert all(r.age_direction is None for r in store.ratings())
