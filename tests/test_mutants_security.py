"""The web tools' defences (`acrb.web.security`), each layer called directly as ASGI.

tests/test_web_layer.py shows the stacked middleware refusing through a running tool; these
pin each layer's exact answer at its boundaries (a body of exactly the limit, a port that
differs, `Origin: null` with and without `Sec-Fetch-Site`), so a one-character change to a
rule fails a test (docs/mutation.md).
"""

from __future__ import annotations

import asyncio

import pytest
from starlette.middleware.trustedhost import TrustedHostMiddleware

from acrb.web.security import (
    CSP,
    LOCAL_HOSTS,
    MAX_BODY,
    SECURITY_HEADERS,
    BodyLimit,
    CrossSiteGuard,
    LoginThrottle,
    SecurityHeaders,
    local_hosts,
    same_origin,
    security_middleware,
)


class App:
    """An ASGI app that records what reached it, reads the whole body, then answers 200 with
    ``headers``; ``start_first`` sends the response start before reading."""

    def __init__(self, headers: list[tuple[bytes, bytes]] | None = None,
                 start_first: bool = False) -> None:
        self.headers = headers or []
        self.start_first = start_first
        self.calls: list[dict] = []
        self.body = b""

    async def __call__(self, scope, receive, send) -> None:
        self.calls.append(scope)
        if scope["type"] != "http":
            return
        if self.start_first:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        more = True
        while more:
            message = await receive()
            self.body += message.get("body", b"")
            more = message.get("more_body", False)
        if not self.start_first:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        await send({"type": "http.response.body", "body": b"ok"})


def call(layer, method: str = "POST", headers: dict[str, str] | None = None,
         chunks: tuple[bytes, ...] = (b"",), scheme: str | None = "http",
         scope_type: str = "http") -> tuple[int | None, list[tuple[bytes, bytes]], bytes]:
    """Run one request through ``layer``; return (status, raw headers, body) as sent."""
    scope = {"type": scope_type, "method": method, "path": "/", "query_string": b"",
             "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                         for k, v in (headers or {}).items()]}
    if scheme is not None:
        scope["scheme"] = scheme
    pending = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
               for i, chunk in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(layer(scope, receive, send))
    start = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    if not start:
        return None, [], body
    assert len(start) == 1
    return start[0]["status"], list(start[0].get("headers", [])), body


def values(headers: list[tuple[bytes, bytes]], name: str) -> list[bytes]:
    return [v for k, v in headers if k.decode("latin-1").lower() == name]


# ---- SecurityHeaders -----------------------------------------------------------------------

def test_every_security_header_is_added_once_in_lower_case() -> None:
    status, headers, body = call(SecurityHeaders(App()), "GET")
    assert (status, body) == (200, b"ok")
    for name, value in SECURITY_HEADERS.items():
        assert (name.lower().encode(), value.encode()) in headers
        assert values(headers, name.lower()) == [value.encode()]
    assert values(headers, "content-security-policy") == [CSP.encode()]
    assert values(headers, "cache-control") == [b"no-store"]
    assert (b"cache-control", b"no-store") in headers  # ASGI header names are lower case
    assert SECURITY_HEADERS == {
        "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}
    assert CSP == ("default-src 'none'; img-src 'self'; style-src 'self'; script-src 'self'; "
                   "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


@pytest.mark.parametrize("name", [b"Content-Security-Policy", b"content-security-policy",
                                  b"X-FRAME-OPTIONS"])
def test_a_security_header_the_app_set_is_replaced_whatever_its_case(name: bytes) -> None:
    app = App([(name, b"weak"), (b"x-other", b"kept")])
    _, headers, _ = call(SecurityHeaders(app), "GET")
    assert b"weak" not in [v for _, v in headers]
    assert values(headers, name.decode().lower()) == [
        SECURITY_HEADERS[{"content-security-policy": "Content-Security-Policy",
                          "x-frame-options": "X-Frame-Options"}[name.decode().lower()]].encode()]
    assert values(headers, "x-other") == [b"kept"]


def test_a_response_start_without_headers_gets_them() -> None:
    async def bare(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 204})
        await send({"type": "http.response.body", "body": b""})

    status, headers, _ = call(SecurityHeaders(bare), "GET")
    assert status == 204
    assert values(headers, "x-frame-options") == [b"DENY"]


@pytest.mark.parametrize("name", [b"Cache-Control", b"cache-control"])
def test_a_response_that_says_how_to_cache_keeps_it(name: bytes) -> None:
    _, headers, _ = call(SecurityHeaders(App([(name, b"max-age=60")])), "GET")
    assert values(headers, "cache-control") == [b"max-age=60"]


@pytest.mark.parametrize("layer", [SecurityHeaders, BodyLimit, CrossSiteGuard])
@pytest.mark.parametrize("scope_type", ["websocket", "lifespan"])
def test_other_scopes_pass_through_untouched_and_once(layer, scope_type: str) -> None:
    app = App()
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"x" * (MAX_BODY + 1)}

    async def send(message):
        sent.append(message)

    scope = {"type": scope_type, "method": "POST", "headers": [
        (b"content-length", b"nonsense"), (b"sec-fetch-site", b"cross-site")]}
    asyncio.run(layer(app)(scope, receive, send))
    assert app.calls == [scope] and sent == []


# ---- BodyLimit -----------------------------------------------------------------------------

def test_the_default_limit_is_64_kib() -> None:
    assert MAX_BODY == 65536 and BodyLimit(App()).limit == MAX_BODY


@pytest.mark.parametrize(("length", "status"), [
    ("2048", 200), (" 2048 ", 200), ("0", 200), ("2049", 413), ("99999999", 413),
    ("-1", 400), ("twelve", 400), ("", 400), ("1e3", 400), ("2 048", 400),
])
def test_content_length_is_checked_before_the_app_runs(length: str, status: int) -> None:
    app = App()
    body = b"x" * int(length) if length.strip().isdigit() and int(length) <= 2048 else b""
    got, _, text = call(BodyLimit(app, limit=2048), headers={"content-length": length},
                        chunks=(body,))
    assert got == status
    if status == 413:
        assert text == b"Request body larger than 2 KiB" and app.calls == []
    elif status == 400:
        assert text == b"Invalid Content-Length" and app.calls == []
    else:
        assert app.body == body


@pytest.mark.parametrize(("chunks", "status"), [
    ((b"x" * 1024, b"x" * 1024), 200),
    ((b"x" * 1024, b"x" * 1024, b"x"), 413),
    ((b"x" * 2049,), 413),
    ((b"",) * 3, 200),
])
def test_a_body_without_content_length_is_counted(chunks: tuple[bytes, ...], status: int) -> None:
    app = App()
    got, _, text = call(BodyLimit(app, limit=2048), chunks=chunks)
    assert got == status
    if status == 413:
        assert text == b"Request body larger than 2 KiB"
    else:
        assert (text, app.body) == (b"ok", b"".join(chunks))


def test_the_default_limit_message_names_64_kib() -> None:
    got, _, text = call(BodyLimit(App()), headers={"content-length": str(MAX_BODY + 1)})
    assert (got, text) == (413, b"Request body larger than 64 KiB")
    assert call(BodyLimit(App()), chunks=(b"x" * MAX_BODY,))[0] == 200


def test_a_body_over_the_limit_after_the_response_started_is_an_error() -> None:
    from acrb.web import security

    with pytest.raises(security._TooLarge):
        call(BodyLimit(App(start_first=True), limit=10), chunks=(b"x" * 11,))


# ---- CrossSiteGuard ------------------------------------------------------------------------

HOST = {"host": "127.0.0.1:8765"}


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
def test_safe_methods_pass_whatever_they_claim(method: str) -> None:
    app = App()
    got, _, _ = call(CrossSiteGuard(app), method,
                     {**HOST, "sec-fetch-site": "cross-site", "origin": "https://evil.test"})
    assert got == 200 and len(app.calls) == 1


@pytest.mark.parametrize(("headers", "status", "text"), [
    ({"sec-fetch-site": "cross-site"}, 403, b"Cross-site request refused"),
    ({"sec-fetch-site": "same-site"}, 403, b"Cross-site request refused"),
    ({"sec-fetch-site": "SAME-SITE"}, 403, b"Cross-site request refused"),
    ({"sec-fetch-site": "same-origin"}, 200, b"ok"),
    ({"sec-fetch-site": " Same-Origin "}, 200, b"ok"),
    ({"sec-fetch-site": "none"}, 200, b"ok"),
    ({"sec-fetch-site": "NONE"}, 200, b"ok"),
    ({}, 200, b"ok"),
    ({"origin": "http://127.0.0.1:8765"}, 200, b"ok"),
    ({"origin": " http://127.0.0.1:8765 "}, 200, b"ok"),
    ({"origin": "http://127.0.0.1:8766"}, 403, b"Cross-origin request refused"),
    ({"origin": "https://127.0.0.1:8765"}, 403, b"Cross-origin request refused"),
    ({"origin": "http://evil.test"}, 403, b"Cross-origin request refused"),
    ({"origin": "null"}, 403, b"Cross-origin request refused"),
    ({"origin": " null ", "sec-fetch-site": "none"}, 403, b"Cross-origin request refused"),
    ({"origin": "null", "sec-fetch-site": "same-origin"}, 200, b"ok"),
    ({"origin": " null ", "sec-fetch-site": "same-origin"}, 200, b"ok"),
    ({"origin": "http://127.0.0.1:8765", "sec-fetch-site": "cross-site"}, 403,
     b"Cross-site request refused"),
])
def test_writes_are_refused_when_the_browser_says_they_come_from_elsewhere(
        headers: dict[str, str], status: int, text: bytes) -> None:
    app = App()
    got, _, body = call(CrossSiteGuard(app), "POST", {**HOST, **headers})
    assert (got, body) == (status, text)
    assert len(app.calls) == (1 if status == 200 else 0)


def test_the_origin_is_compared_with_the_scheme_of_the_request() -> None:
    origin = {"host": "tool.example:443", "origin": "https://tool.example"}
    assert call(CrossSiteGuard(App()), "POST", origin, scheme="https")[0] == 200
    assert call(CrossSiteGuard(App()), "POST", origin, scheme="http")[0] == 403
    plain = {"host": "tool.example", "origin": "http://tool.example"}
    assert call(CrossSiteGuard(App()), "POST", plain, scheme=None)[0] == 200
    assert call(CrossSiteGuard(App()), "POST", {"origin": "http://tool.example"})[0] == 403


@pytest.mark.parametrize("origin", ["http://none", "http://xxxx", "http://", "http://localhost"])
def test_a_write_without_a_host_header_matches_no_origin(origin: str) -> None:
    assert call(CrossSiteGuard(App()), "POST", {"origin": origin})[0] == 403


@pytest.mark.parametrize(("origin", "scheme", "host", "same"), [
    ("http://127.0.0.1:8765", "http", "127.0.0.1:8765", True),
    ("http://LOCALHOST:8765", "http", "localhost:8765", True),
    ("http://localhost:8765", "http", "LocalHost:8765", True),
    ("http://127.0.0.1", "http", "127.0.0.1:80", True),
    ("http://127.0.0.1:80", "http", "127.0.0.1", True),
    ("https://tool.example", "https", "tool.example:443", True),
    ("https://tool.example:443", "https", "tool.example", True),
    ("http://tool.example:443", "https", "tool.example", False),
    ("https://tool.example", "https", "tool.example:80", False),
    ("http://127.0.0.1:8765", "http", "127.0.0.1:8766", False),
    ("http://127.0.0.2:8765", "http", "127.0.0.1:8765", False),
    ("http://127.0.0.1:8765/", "http", "127.0.0.1:8765", False),
    ("http://127.0.0.1:8765?x=1", "http", "127.0.0.1:8765", False),
    ("http://127.0.0.1:8765#x", "http", "127.0.0.1:8765", False),
    ("http://me@127.0.0.1:8765", "http", "127.0.0.1:8765", False),
    ("http://:pw@127.0.0.1:8765", "http", "127.0.0.1:8765", False),  # empty user name
    ("http://127.0.0.1:99999", "http", "127.0.0.1:8765", False),
    ("http://127.0.0.1:port", "http", "127.0.0.1:8765", False),
    ("ftp://127.0.0.1:8765", "ftp", "127.0.0.1:8765", False),
    ("http://", "http", "", False),
    ("null", "http", "127.0.0.1", False),
    ("", "http", "127.0.0.1", False),
    ("  http://127.0.0.1:8765  ", "http", "127.0.0.1:8765", True),
])
def test_same_origin(origin: str, scheme: str, host: str, same: bool) -> None:
    assert same_origin(origin, scheme, host) is same


# ---- Hosts and the stack -------------------------------------------------------------------

@pytest.mark.parametrize(("host", "names"), [
    ("127.0.0.1", ["127.0.0.1", "localhost", "[::1]"]),
    ("::1", ["[::1]", "127.0.0.1", "localhost"]),
    ("[::1]", ["[::1]", "127.0.0.1", "localhost"]),
    ("0.0.0.0", ["0.0.0.0", "127.0.0.1", "localhost", "[::1]"]),
    ("fe80::2", ["[fe80::2]", "127.0.0.1", "localhost", "[::1]"]),
    ("tool.lan", ["tool.lan", "127.0.0.1", "localhost", "[::1]"]),
])
def test_local_hosts(host: str, names: list[str]) -> None:
    assert local_hosts(host) == names
    assert LOCAL_HOSTS == ("127.0.0.1", "localhost", "[::1]")


def test_the_stack_is_headers_then_hosts_then_body_limit_then_cross_site_guard() -> None:
    stack = security_middleware()
    assert [m.cls for m in stack] == [SecurityHeaders, TrustedHostMiddleware, BodyLimit,
                                      CrossSiteGuard]
    assert [(m.args, m.kwargs) for m in stack] == [
        ((), {}),
        ((), {"allowed_hosts": list(LOCAL_HOSTS), "www_redirect": False}),
        ((), {"limit": MAX_BODY}),
        ((), {}),
    ]
    mine = security_middleware(["tool.lan"], body_limit=10)
    assert mine[1].kwargs == {"allowed_hosts": ["tool.lan"], "www_redirect": False}
    assert mine[2].kwargs == {"limit": 10}


def test_the_stack_refuses_with_the_security_headers_on() -> None:
    app: object = App()
    for middleware in reversed(security_middleware(["tool.lan"], body_limit=4)):
        app = middleware.cls(app, *middleware.args, **middleware.kwargs)
    for headers, chunks, status in [({"host": "evil.test"}, (b"",), 400),
                                    ({"host": "tool.lan"}, (b"12345",), 413),
                                    ({"host": "tool.lan", "sec-fetch-site": "cross-site"},
                                     (b"",), 403),
                                    ({"host": "tool.lan"}, (b"1234",), 200)]:
        got, sent, _ = call(app, "POST", headers, chunks)
        assert got == status
        assert values(sent, "content-security-policy") == [CSP.encode()]


# ---- LoginThrottle -------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_defaults_are_ten_failures_a_minute() -> None:
    throttle = LoginThrottle()
    assert (throttle.max_failures, throttle.window_seconds, throttle.max_clients) == (
        10, 60.0, 10_000)


@pytest.mark.parametrize(("failures", "window"), [(0, 60), (-1, 60), (1, 0), (1, -5)])
def test_a_throttle_that_could_never_allow_or_never_forget_is_refused(failures, window) -> None:
    with pytest.raises(ValueError, match=r"^max_failures must be 1 or more and window_seconds "
                                         r"positive$"):
        LoginThrottle(failures, window)


def test_the_smallest_throttle_is_allowed() -> None:
    clock = Clock()
    throttle = LoginThrottle(1, 0.5, clock=clock)
    assert throttle.retry_after("a") == 0.0
    throttle.failed("a")
    assert throttle.retry_after("a") == 0.5


def test_failures_are_counted_in_a_sliding_window() -> None:
    clock = Clock()
    throttle = LoginThrottle(3, 60, clock=clock)
    for _ in range(2):
        throttle.failed("a")
        clock.now += 10
    assert throttle.retry_after("a") == 0.0  # two failures: still allowed
    throttle.failed("a")  # at 1020
    assert throttle.retry_after("a") == 40.0  # the oldest (1000) leaves at 1060
    clock.now = 1059.5
    assert throttle.retry_after("a") == 0.5
    clock.now = 1060.0  # a failure exactly one window old has left it
    assert throttle.retry_after("a") == 0.0
    throttle.failed("a")  # 1010, 1020, 1060
    assert throttle.retry_after("a") == 10.0


def test_the_wait_is_counted_from_the_failure_that_filled_the_budget() -> None:
    clock = Clock()
    throttle = LoginThrottle(2, 60, clock=clock)
    for at in (1000.0, 1010.0, 1020.0):
        clock.now = at
        throttle.failed("a")
    clock.now = 1030.0
    assert throttle.retry_after("a") == 40.0  # the two most recent: 1010 + 60 - 1030


def test_a_success_clears_only_its_own_client() -> None:
    clock = Clock()
    throttle = LoginThrottle(1, 60, clock=clock)
    throttle.failed("a")
    throttle.failed("b")
    throttle.succeeded("a")
    throttle.succeeded("never failed")
    assert (throttle.retry_after("a"), throttle.retry_after("b")) == (0.0, 60.0)


def test_the_least_recently_failing_client_is_forgotten_first() -> None:
    clock = Clock()
    throttle = LoginThrottle(1, 60, max_clients=2, clock=clock)
    throttle.failed("a")
    throttle.failed("b")
    throttle.failed("a")  # a failed most recently: b is the oldest now
    throttle.failed("c")
    assert [throttle.retry_after(c) > 0 for c in ("a", "b", "c")] == [True, False, True]
    throttle2 = LoginThrottle(1, 60, max_clients=2, clock=clock)
    for client in ("a", "b"):
        throttle2.failed(client)
    assert [throttle2.retry_after(c) > 0 for c in ("a", "b")] == [True, True]
