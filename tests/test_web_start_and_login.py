"""The web tools' start and login: `acrb curate serve` and `acrb review serve` refuse to start,
naming the install command, when a package of their extra is missing; failed logins are
limited per client address (429 with Retry-After); a session past its expiry is refused."""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.testclient import TestClient
from typer.testing import CliRunner

from acrb.cli import app
from acrb.curation import web as curation_web
from acrb.curation.store import CurationStore
from acrb.review import web as review_web
from acrb.review.store import ReviewStore
from acrb.web import serving
from acrb.web.accounts import AccountStore
from acrb.web.security import LoginThrottle
from acrb.web.serving import WEB_PACKAGES, require_web_extra
from tests.live_server import csrf_of

EXTRAS = {"curate": "fairface", "review": "review"}


# ------------------------------------------------------------------------ missing extra


@pytest.mark.parametrize("package", [package for package, _ in WEB_PACKAGES])
@pytest.mark.parametrize("tool", EXTRAS)
def test_serve_refuses_to_start_without_its_extra(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path, tool: str,
                                                  package: str) -> None:
    for module in dict(WEB_PACKAGES)[package]:
        monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    result = CliRunner().invoke(app, [tool, "serve", "--workdir", str(tmp_path / "work")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == (f"error: `acrb {tool} serve` needs {package} (the `{EXTRAS[tool]}` "
                        "extra), which is not installed")
    assert lines[1] == f'  fix: pip install -e ".[{EXTRAS[tool]}]"'
    assert "Traceback" not in result.output


def test_the_check_passes_when_the_extra_is_installed() -> None:
    require_web_extra("acrb curate serve", "fairface")  # raises if anything is missing


# ----------------------------------------------------------------------------- login

Tool = tuple[AccountStore, str, Callable[..., Starlette]]


def _tool(name: str, folder: Path) -> Tool:
    if name == "curate":
        curation = CurationStore(folder, create=True)
        return curation, curation.add_curator("alice"), curation_web.create_app
    review = ReviewStore(folder, create=True)
    return review, review.add_rater("r01"), review_web.create_app


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _attempt(client: TestClient, token: str) -> int:
    """One login from a logged-out browser: the login page, then the form post."""
    client.cookies.clear()
    page = client.get("/login")
    return client.post("/login", data={"token": token, "csrf": csrf_of(page.text)}).status_code


@pytest.mark.parametrize("tool", EXTRAS)
def test_failed_logins_are_limited_per_client(tmp_path: Path, tool: str) -> None:
    store, token, create_app = _tool(tool, tmp_path / "work")
    clock = Clock()
    throttle = LoginThrottle(max_failures=3, window_seconds=60, clock=clock)
    asgi = create_app(store, allowed_hosts=["testserver"], login_throttle=throttle)
    with TestClient(asgi, follow_redirects=False, client=("10.0.0.1", 1)) as attacker, \
            TestClient(asgi, follow_redirects=False, client=("10.0.0.2", 1)) as colleague:
        assert [_attempt(attacker, "acrb_wrong") for _ in range(3)] == [401, 401, 401]
        page = attacker.get("/login")
        refused = attacker.post("/login", data={"token": token, "csrf": csrf_of(page.text)})
        assert refused.status_code == 429  # even the right token: it is not looked at
        assert refused.headers["retry-after"] == "60"
        assert "too many failed logins" in refused.text
        assert "content-security-policy" in refused.headers
        assert "set-cookie" not in refused.headers or "session" not in \
            refused.headers["set-cookie"]

        assert _attempt(colleague, token) == 303  # another client is unaffected

        clock.now += 30
        assert _attempt(attacker, token) == 429
        assert attacker.post("/login", data={}).headers["retry-after"] == "30"
        clock.now += 30  # the oldest failures have left the window
        assert _attempt(attacker, token) == 303


@pytest.mark.parametrize("tool", EXTRAS)
def test_successful_logins_are_not_limited_and_clear_failures(tmp_path: Path,
                                                               tool: str) -> None:
    store, token, create_app = _tool(tool, tmp_path / "work")
    throttle = LoginThrottle(max_failures=2, window_seconds=60, clock=Clock())
    asgi = create_app(store, allowed_hosts=["testserver"], login_throttle=throttle)
    with TestClient(asgi, follow_redirects=False) as client:
        assert [_attempt(client, token) for _ in range(5)] == [303] * 5
        assert _attempt(client, "acrb_typo") == 401
        assert _attempt(client, token) == 303  # clears the one failure
        assert _attempt(client, "acrb_typo") == 401
        assert _attempt(client, token) == 303


def test_the_default_limit_applies_without_configuration(tmp_path: Path) -> None:
    store, token, create_app = _tool("curate", tmp_path / "work")
    with TestClient(create_app(store, allowed_hosts=["testserver"]),
                    follow_redirects=False) as client:
        limit = LoginThrottle().max_failures
        assert {_attempt(client, "acrb_wrong") for _ in range(limit)} == {401}
        assert _attempt(client, token) == 429


@pytest.mark.parametrize("tool", EXTRAS)
def test_a_client_rotating_x_forwarded_for_is_still_throttled(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tool: str) -> None:
    """Through a tunnel every client arrives from 127.0.0.1, the peer uvicorn trusts proxy
    headers from by default: the app is driven as the server `serve` starts would run it."""
    store, token, create_app = _tool(tool, tmp_path / "work")
    throttle = LoginThrottle(max_failures=3, window_seconds=60, clock=Clock())
    asgi = create_app(store, allowed_hosts=["testserver"], login_throttle=throttle)
    started: dict[str, object] = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **options: started.update(options))
    serving.serve(asgi)
    assert started["proxy_headers"] is False and started["forwarded_allow_ips"] == []
    config = uvicorn.Config(asgi, **started)  # type: ignore[arg-type]
    config.load()
    with TestClient(config.loaded_app, follow_redirects=False,
                    client=("127.0.0.1", 50000)) as client:
        codes = []
        for n in range(6):
            client.headers["X-Forwarded-For"] = f"203.0.113.{n}"
            codes.append(_attempt(client, "acrb_wrong" if n < 5 else token))
    assert codes == [401, 401, 401, 429, 429, 429]


@pytest.mark.parametrize("tool", EXTRAS)
def test_serve_reads_proxy_headers_only_from_a_trusted_proxy_named(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tool: str) -> None:
    if tool == "curate":
        from tests.curation_fixtures import make_store

        make_store(tmp_path, k=1, cells=["Black_Female_20s"])
        folder = ["--workdir", str(tmp_path / "curation"), "--candidates",
                  str(tmp_path / "candidates")]
    else:
        from tests.review_fixtures import make_review_store

        make_review_store(tmp_path, ("r01",), items=1, k=1)
        folder = ["--workdir", str(tmp_path / "review-work")]
    started: list[dict[str, object]] = []
    monkeypatch.setattr("uvicorn.run", lambda app, **options: started.append(options))
    for extra in ([], ["--trusted-proxy", "10.0.0.5", "--trusted-proxy", "10.0.0.6"]):
        result = CliRunner().invoke(app, [tool, "serve", *folder, *extra])
        assert result.exit_code == 0, result.output
    assert [(s["proxy_headers"], s["forwarded_allow_ips"]) for s in started] == [
        (False, []), (True, ["10.0.0.5", "10.0.0.6"])]


def test_proxy_headers_are_read_only_from_the_proxies_named(tmp_path: Path) -> None:
    store, token, create_app = _tool("review", tmp_path / "work")
    throttle = LoginThrottle(max_failures=1, window_seconds=60, clock=Clock())
    asgi = create_app(store, allowed_hosts=["testserver"], login_throttle=throttle)
    config = serving.server_config(asgi, trusted_proxies=["127.0.0.1", " "])
    assert config.proxy_headers and config.forwarded_allow_ips == ["127.0.0.1"]
    config.load()
    with TestClient(config.loaded_app, follow_redirects=False,
                    client=("127.0.0.1", 50000)) as client:
        client.headers["X-Forwarded-For"] = "203.0.113.1"
        assert [_attempt(client, "acrb_wrong") for _ in range(2)] == [401, 429]
        client.headers["X-Forwarded-For"] = "203.0.113.2"  # another client behind the proxy
        assert _attempt(client, token) == 303


def test_the_throttle_forgets_the_least_recent_client_beyond_its_cap() -> None:
    clock = Clock()
    throttle = LoginThrottle(max_failures=1, window_seconds=60, max_clients=2, clock=clock)
    for client in ("a", "b", "c"):
        throttle.failed(client)
    assert throttle.retry_after("a") == 0 and throttle.retry_after("c") == 60
    with pytest.raises(ValueError):
        LoginThrottle(max_failures=0)


# ----------------------------------------------------------------------------- expiry


def test_a_curator_session_past_its_expiry_is_refused(tmp_path: Path) -> None:
    store, token, create_app = _tool("curate", tmp_path / "work")
    with TestClient(create_app(store, allowed_hosts=["testserver"]),
                    follow_redirects=False) as client:
        assert _attempt(client, token) == 303
        assert client.get("/").status_code == 200
        page = client.get("/cell/Black_Female_20s")
        assert page.status_code == 200
        csrf = csrf_of(page.text)
        with sqlite3.connect(store.database) as con:  # the session's time runs out
            con.execute("UPDATE sessions SET expires = ?", (time.time() - 1,))
        con.close()
        response = client.get("/")
        assert response.status_code == 303 and response.headers["location"] == "/login"
        post = client.post("/cell/Black_Female_20s/decide",
                           data={"csrf": csrf, "action": "deselect"})
        assert post.status_code == 403 and "not logged in" in post.text
