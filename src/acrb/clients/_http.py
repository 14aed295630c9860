"""Shared HTTP plumbing of the API clients: auth header, rate limit, retries, status codes.

429, 5xx, timeouts and dropped connections are retried with exponential backoff (tenacity),
honouring a numeric ``Retry-After``; 401/403/404 raise :class:`ConfigError` at once, since no
retry fixes a wrong key, model or URL; other failures become ``error`` replies. The key is
registered with :mod:`acrb.redaction` when it is read, and a body is redacted before it is cut
to length for a message, so neither a whole key nor the start of one can reach a message.
"""

from __future__ import annotations

import os
import time
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from acrb.clients._client import (
    AnswerSchema,
    ChatClient,
    ChatStatus,
    Conversation,
    RateLimiter,
    RequestOutcome,
    log,
    safe_url,
    short,
)
from acrb.errors import ConfigError
from acrb.redaction import redact, register_secret

if TYPE_CHECKING:
    from acrb.sections import ChatBackendParams

#: Transient HTTP statuses worth another try (rate limited, server overloaded or restarting).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class _Transient(Exception):
    """A failure worth retrying: a timeout, a dropped connection, 429 or a 5xx."""

    def __init__(self, what: str, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.retry_after = retry_after


class MalformedResponse(Exception):
    """A 2xx response whose body is not what the protocol promises."""


def _retry_after(response: httpx.Response) -> float | None:
    """The numeric Retry-After of a 429/503, or None (HTTP dates are not honoured)."""
    if response.status_code not in (429, 503):
        return None
    value = response.headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class HTTPChatClient(ChatClient):
    """Shared HTTP plumbing: auth header, rate limit, retries and status-code handling."""

    default_base_url = ""

    def __init__(self, name: str, params: ChatBackendParams, cache_dir: Path) -> None:
        super().__init__(name, params, cache_dir)
        self._base_url = (params.base_url or self.default_base_url).rstrip("/")
        self._key = self._read_key()
        self._limiter = RateLimiter(params.requests_per_minute)
        # Overridable so tests (or callers) can shorten or record the retry waits.
        self._sleep: Callable[[float], None] = time.sleep
        self._client = httpx.Client(
            timeout=httpx.Timeout(params.timeout_s),
            limits=httpx.Limits(max_connections=max(params.concurrency, 1)),
        )

    def _read_key(self) -> str | None:
        env = self.params.api_key_env
        if env is None:
            return None
        key = os.environ.get(env, "").strip()
        if not key:
            raise ConfigError(
                f"LLM backend {self.name!r} ({self.params.kind}, model {self.params.model!r}) "
                f"needs an API key in the environment variable {env}, which is not set",
                f"set the environment variable {env} (e.g. `export {env}=...`), or set "
                f"api_key_env: null for a local server that needs no key",
            )
        register_secret(env, key)
        return key

    @property
    def base_url(self) -> str:
        return self._base_url

    def _redact(self, text: str) -> str:
        # Some servers echo the presented key in their bodies; never pass it on. A key too short
        # for the shared mask (a local placeholder) is still kept out of this client's messages.
        text = redact(text)
        return text.replace(self._key, "***") if self._key else text

    @abstractmethod
    def _endpoint(self) -> str: ...

    @abstractmethod
    def _auth_headers(self) -> dict[str, str]: ...

    @abstractmethod
    def _payload(self, messages: Conversation, schema: AnswerSchema = None) -> dict[str, Any]:
        """The JSON body of one request (with :meth:`response_format`'s options, if any)."""

    @abstractmethod
    def _parse(self, data: Any) -> tuple[ChatStatus, str, str]:
        """(status, text, reason) from a decoded 2xx body; raises MalformedResponse."""

    def _wait(self, state: RetryCallState) -> float:
        p = self.params
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, _Transient) and error.retry_after is not None:
            return min(error.retry_after, p.backoff_max_s)
        return min(p.backoff_s * 2 ** (state.attempt_number - 1), p.backoff_max_s)

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("chat backend %r: %s (attempt %d/%d); retrying in %.2f s", self.name, error,
                    state.attempt_number, self.params.max_attempts, wait)

    def _request(self, messages: Conversation, schema: AnswerSchema = None) -> RequestOutcome:
        url = self._endpoint()
        payload = self._payload(messages, schema)
        headers = self._auth_headers()
        attempts = 0

        def send() -> httpx.Response:
            nonlocal attempts
            self._limiter.acquire()
            self._count_request()
            attempts += 1
            try:
                response = self._client.post(url, json=payload, headers=headers)
            except httpx.TimeoutException as exc:
                raise _Transient("timeout") from exc
            except httpx.UnsupportedProtocol as exc:
                raise ConfigError(
                    f"LLM backend {self.name!r}: base_url {safe_url(self._base_url)!r} is not "
                    "an http(s) URL",
                    "set base_url to the endpoint root, e.g. http://localhost:8000/v1",
                ) from exc
            except httpx.TransportError as exc:
                raise _Transient(f"connection error ({type(exc).__name__})") from exc
            if response.status_code in RETRY_STATUSES:
                raise _Transient(f"HTTP {response.status_code}", _retry_after(response))
            return response

        retrying = Retrying(
            stop=stop_after_attempt(self.params.max_attempts),
            wait=self._wait,
            retry=retry_if_exception_type(_Transient),
            sleep=self._sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            response = retrying(send)
        except _Transient as exc:
            noun = "attempt" if attempts == 1 else "attempts"
            return RequestOutcome("error", "", f"{exc.what} after {attempts} {noun}", attempts)
        return self._interpret(response, attempts)

    def _interpret(self, response: httpx.Response, attempts: int) -> RequestOutcome:
        code = response.status_code
        where = f"LLM backend {self.name!r} ({safe_url(self._base_url)})"
        if code in (401, 403):
            env = self.params.api_key_env
            fix = (f"set ${env} to a valid key with access to model {self.params.model!r}"
                   if env else "the endpoint wants a key: set api_key_env to the name of the "
                   "environment variable that holds it")
            raise ConfigError(f"{where} rejected the credentials (HTTP {code})", fix)
        if code == 404:
            raise ConfigError(
                f"{where} answered 404 Not Found for {safe_url(str(response.request.url))} "
                f"(model {self.params.model!r})",
                "check the model name and base_url (an OpenAI-compatible base_url usually ends "
                "in /v1)",
            )
        if code >= 400 or code < 200:
            body = short(self._redact(response.text))
            return RequestOutcome("error", "", f"HTTP {code}: {body}" if body else f"HTTP {code}",
                            attempts)
        try:
            data = response.json()
        except ValueError:
            detail = short(self._redact(response.text), 80) or "empty body"
            return RequestOutcome("error", "", f"malformed response: not JSON ({detail})", attempts)
        try:
            status, text, reason = self._parse(data)
        except MalformedResponse as exc:
            return RequestOutcome("error", "", self._redact(f"malformed response: {exc}"),
                                  attempts)
        return RequestOutcome(status, self._redact(text), self._redact(reason), attempts)

    def close(self) -> None:
        self._client.close()

