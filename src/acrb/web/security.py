"""The defences every ACRB web tool runs behind, as ASGI middleware.

The tools are meant for a workstation or a small trusted network, reached through an SSH
tunnel; these layers keep a browser that visits another site from acting on them:

- :class:`SecurityHeaders`: a strict Content-Security-Policy (no inline script or style, no
  framing, forms post only to this origin), ``nosniff``, ``no-referrer``, and ``no-store``
  unless a response says how to cache it (pages show live state and CSRF tokens);
- Starlette's ``TrustedHostMiddleware``: the ``Host`` header must name this server, so a
  rebinding DNS name pointing at 127.0.0.1 cannot reach it (:func:`local_hosts`);
- :class:`BodyLimit`: 413 for bodies over the limit (64 KiB), announced or not;
- :class:`CrossSiteGuard`: 403 for any write a browser says comes from another site or origin,
  before any credential is looked at.

:class:`LoginThrottle` (used by the login page, not a middleware) answers 429 to a client
after too many failed logins in a window.

:func:`security_middleware` stacks them in that order, outermost first, so even a refusal
carries the security headers.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Request bodies larger than this (bytes) are answered 413.
MAX_BODY = 64 * 1024
#: The Host names of this machine's loopback interface, as browsers send them.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
CSP = ("default-src 'none'; img-src 'self'; style-src 'self'; script-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_LOWER_SECURITY = {k.lower() for k in SECURITY_HEADERS}
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")



def ascii_digits(text: str) -> bool:
    """True when ``text`` is one or more ASCII digits. ``str.isdigit`` also accepts digits of
    other scripts and superscripts (``"²"``), which ``int`` then refuses: a request carrying
    one must be a 400 or 404, never a 500."""
    return text.isascii() and text.isdigit()

class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response (replacing any the app set), and
    ``Cache-Control: no-store`` where the response does not say how to cache."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.decode("latin-1").lower() not in _LOWER_SECURITY]
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                if not any(k.lower() == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _TooLarge(Exception):
    pass


class BodyLimit:
    """413 for bodies over ``limit`` bytes: by Content-Length up front (400 for one that is
    not a number), and by counting for bodies sent without one (chunked)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None:
            if not ascii_digits(length.strip()):
                await PlainTextResponse("Invalid Content-Length", 400)(scope, receive, send)
                return
            if int(length) > self.limit:
                await _too_large(self.limit)(scope, receive, send)
                return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _TooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _TooLarge:
            if started:
                raise
            await _too_large(self.limit)(scope, receive, send)


def _too_large(limit: int) -> Response:
    return PlainTextResponse(f"Request body larger than {limit // 1024} KiB", 413)


class CrossSiteGuard:
    """403 for any write a browser says comes from another site or origin.

    ``Sec-Fetch-Site`` other than ``same-origin`` / ``none`` is refused (``same-site`` too:
    another app on the same host, on another port, is same-site but not same-origin). An
    ``Origin`` must name this server, except ``Origin: null``, which browsers send for the
    tool's own forms because of ``Referrer-Policy: no-referrer``: it passes only together with
    ``Sec-Fetch-Site: same-origin``, a header pages cannot set. Requests without either header
    (scripts, old browsers) pass on to the tool's own credential checks.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in _SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        fetch_site = headers.get("sec-fetch-site", "").strip().lower()
        if fetch_site and fetch_site not in ("same-origin", "none"):
            await PlainTextResponse("Cross-site request refused", 403)(scope, receive, send)
            return
        if origin is not None:
            if origin.strip() == "null":
                allowed = fetch_site == "same-origin"
            else:
                allowed = same_origin(origin, scope.get("scheme", "http"),
                                      headers.get("host", ""))
            if not allowed:
                await PlainTextResponse("Cross-origin request refused", 403)(scope, receive,
                                                                             send)
                return
        await self.app(scope, receive, send)


def same_origin(origin: str, scheme: str, host: str) -> bool:
    """Whether an ``Origin`` header names this server (``scheme://host``), default ports
    filled in. ``null`` and anything unparsable are not."""

    def key(url: str) -> tuple[str, str, int] | None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None
        if parts.path or parts.query or parts.fragment or parts.username is not None:
            return None
        return (parts.scheme, parts.hostname.lower(),
                port or (443 if parts.scheme == "https" else 80))

    mine = key(f"{scheme}://{host}")
    return mine is not None and key(origin.strip()) == mine


def local_hosts(host: str) -> list[str]:
    """The Host names a server listening on ``host`` answers to: ``host`` (an IPv6 address
    in brackets, as browsers send it) and the loopback names; the Host check ignores the
    port."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return list(dict.fromkeys([host, *LOCAL_HOSTS]))


def security_middleware(allowed_hosts: list[str] | None = None,
                        body_limit: int = MAX_BODY) -> list[Middleware]:
    """The middleware stack of a tool, outermost first: security headers, the Host check
    (``allowed_hosts``, default :data:`LOCAL_HOSTS`), the body limit (bytes), the cross-site
    guard. Pass it as ``Starlette(middleware=...)``."""
    return [
        Middleware(SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts or LOCAL_HOSTS),
                   www_redirect=False),
        Middleware(BodyLimit, limit=body_limit),
        Middleware(CrossSiteGuard),
    ]


class LoginThrottle:
    """Failed logins per client address in a sliding window: after ``max_failures`` failures
    within ``window_seconds``, that client's login attempts are refused (429 with
    ``Retry-After``) until its oldest failure leaves the window, without the token being
    looked at. A successful login does not count and clears its client's failures; other
    clients are unaffected.

    Tokens are 256-bit, so guessing one is hopeless anyway; the limit keeps a script from
    filling the audit log and the server with attempts. Behind an SSH tunnel every client
    arrives as 127.0.0.1 and so shares one budget. The address is the connection's peer:
    :func:`acrb.web.serving.serve` turns uvicorn's proxy headers off unless proxies are named,
    so a client cannot pick a fresh address per attempt with ``X-Forwarded-For``. At most
    ``max_clients`` addresses are tracked (the least recently failing is forgotten first).
    Thread-safe: logins are checked in the server's thread pool.
    """

    def __init__(self, max_failures: int = 10, window_seconds: float = 60.0, *,
                 max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_failures < 1 or window_seconds <= 0:
            raise ValueError("max_failures must be 1 or more and window_seconds positive")
        self.max_failures = max_failures
        self.window_seconds = window_seconds
        self.max_clients = max_clients
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> float:
        """Seconds until ``client`` may try again; 0 when it may try now."""
        with self._lock:
            failures = self._recent(client)
            if len(failures) < self.max_failures:
                return 0.0
            return max(failures[-self.max_failures] + self.window_seconds - self._clock(), 0.0)

    def failed(self, client: str) -> None:
        """Count one failed login of ``client``."""
        with self._lock:
            self._recent(client).append(self._clock())
            self._failures.move_to_end(client)
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        """Forget ``client``'s failures (it holds a valid token)."""
        with self._lock:
            self._failures.pop(client, None)

    def _recent(self, client: str) -> deque[float]:
        failures = self._failures.setdefault(client, deque())
        while failures and failures[0] <= self._clock() - self.window_seconds:
            failures.popleft()
        return failures
