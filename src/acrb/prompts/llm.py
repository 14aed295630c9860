"""Pluggable LLM chat backends for prompt synthesis, with a reply cache, rate limit and retries.

Three kinds of backend share one interface (:class:`LLMBackend`):

* ``openai``: any OpenAI-compatible ``/chat/completions`` endpoint (OpenAI, vLLM, Ollama,
  llama.cpp server);
* ``gemini``: Google's Gemini ``generateContent`` REST API;
* ``transformers``: a local Hugging Face causal LM (torch and transformers are imported only
  when such a backend first generates, so importing this module stays cheap).

Every reply is keyed by :meth:`LLMBackend.call_id`, a content hash of everything that determines
it (model, messages, sampling settings), and ``ok``/``refused`` replies are cached on disk, so a
rerun of synthesis sends no request it has already had answered. Errors are never cached: a
rerun retries them. API keys are read from the environment variable named in the params and are
never written to the cache, logs, exceptions or :meth:`LLMBackend.describe`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt
from tqdm import tqdm

from acrb.errors import ConfigError
from acrb.storage import atomic_path, content_hash

if TYPE_CHECKING:
    from acrb.config import LLMBackendParams

log = logging.getLogger(__name__)

LLMStatus = Literal["ok", "refused", "error"]

OPENAI_BASE_URL = "https://api.openai.com/v1"
GEMINI_BASE_URL = "https://generativelanguage.googleapis.com"

#: Transient HTTP statuses worth another try (rate limited, server overloaded or restarting).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Gemini finish reasons that mean the answer was withheld for policy reasons.
GEMINI_REFUSAL_FINISH = frozenset({"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII",
                                   "RECITATION"})


@dataclass(frozen=True)
class LLMReply:
    """One answer to one (system, user) request.

    ``text`` is the stripped reply ("" when there is none); ``reason`` is "" when ``status`` is
    ``ok`` and otherwise says why (``finish_reason=content_filter``, ``looks like a refusal``,
    ``HTTP 500 after 5 attempts``, ``malformed response: ...``). ``attempts`` counts requests
    actually sent for this reply (0 when it came from the cache).
    """

    status: LLMStatus
    text: str
    reason: str
    call_id: str
    cached: bool
    attempts: int


# --------------------------------------------------------------------------------------------
# Refusal detection
# --------------------------------------------------------------------------------------------

# "I can't", "I cannot", "I won't", "I'm unable to", "I am not able to", ...
_I_NEG = (r"i(?:\s+(?:can't|cannot|can\s+not|won't|will\s+not|am\s+unable\s+to"
          r"|am\s+not\s+able\s+to)|'m\s+(?:unable|not\s+able)\s+to)")
_ACT = (r"(?:help|assist|create|provide|comply|generate|write|produce|fulfil|fulfill|do\s+that"
        r"|do\s+this|make|support|engage|continue|complete|draft|describe)")
# Only the opening of a reply is inspected: a synthesised image prompt may well contain "can't"
# or "sorry" ("a nurse who can't stop smiling"), but it does not open with a first-person
# refusal formula.
_REFUSAL_START = re.compile(
    r"""^(?:
        (?:i'm|i\s+am)\s+(?:really\s+|very\s+|so\s+|truly\s+)?sorry\s*(?:,|but\b|;|\.|!|-)
      | sorry\s*,?\s*(?:but\s+)?""" + _I_NEG + r"""
      | """ + _I_NEG + r"""\s+(?:\w+\s+)?""" + _ACT + r"""\b
      | i\s+apologi[sz]e\b
      | unfortunately\s*,?\s*""" + _I_NEG + r"""
      | as\s+an?\s+(?:ai|language\s+model|llm)(?:\s+(?:language\s+model|assistant|model))?\s*,
      | i\s+(?:must|have\s+to|need\s+to|will\s+have\s+to)\s+(?:respectfully\s+)?(?:decline|refuse)
      | i\s+(?:do\s+not|don't)\s+feel\s+comfortable\b
      | i'm\s+not\s+comfortable\b
    )""",
    re.IGNORECASE | re.VERBOSE,
)
# In a short reply, these phrases mean a refusal wherever they stand ("Understood. However, I
# can't help with that.").
_REFUSAL_ANYWHERE = re.compile(
    r"\b" + _I_NEG + r"\s+(?:help|assist|comply)\s+with\b"
    r"|\bi\s+(?:must|have\s+to|need\s+to)\s+(?:respectfully\s+)?decline\b"
    r"|\bagainst\s+my\s+(?:guidelines|policies|programming)\b",
    re.IGNORECASE,
)
_SHORT_REPLY = 300
_LEADING_NOISE = re.compile(r"^[\s\"'“”‘’`*_>#\-]+")


def looks_like_refusal(text: str) -> bool:
    """True when ``text`` reads like a model declining the request ("I'm sorry, but I can't").

    Deliberately conservative: only first-person refusal formulas at the start of the reply (or,
    in a short reply, a few unambiguous phrases anywhere) count, so an ordinary image prompt
    such as "A photo of a nurse who can't stop smiling" is never flagged.
    """
    normalised = text.replace("’", "'").replace("‘", "'").strip()
    normalised = _LEADING_NOISE.sub("", normalised)
    if not normalised:
        return False
    if _REFUSAL_START.match(normalised):
        return True
    return len(normalised) <= _SHORT_REPLY and bool(_REFUSAL_ANYWHERE.search(normalised))


# --------------------------------------------------------------------------------------------
# Shared machinery
# --------------------------------------------------------------------------------------------


class _RateLimiter:
    """At most ``per_minute`` request starts per minute: consecutive sends are spaced evenly."""

    def __init__(self, per_minute: float, sleep: Callable[[float], None] = time.sleep) -> None:
        self.interval = 60.0 / per_minute
        self._next = 0.0
        self._lock = threading.Lock()
        self._sleep = sleep

    def acquire(self) -> None:
        # Reserve the next slot under the lock, then sleep outside it so other threads can
        # reserve the slots after ours meanwhile.
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            self._sleep(start - now)


@dataclass(frozen=True)
class _Outcome:
    """What a backend's request produced, before refusal detection and caching."""

    status: LLMStatus
    text: str
    reason: str
    attempts: int


class LLMBackend(ABC):
    """A chat model answering (system, user) requests, with an on-disk reply cache.

    Subclasses implement :meth:`_request`; this class handles caching, refusal detection,
    ordering and concurrency in :meth:`complete_many`, and the request counter.
    """

    def __init__(self, name: str, params: LLMBackendParams, cache_dir: Path) -> None:
        self.name = name
        self.params = params
        self.cache_dir = Path(cache_dir)
        self._count = 0
        self._count_lock = threading.Lock()

    # ---- description and identity ---------------------------------------------------------

    @property
    def base_url(self) -> str | None:
        """The endpoint root this backend talks to (None for a local model)."""
        return self.params.base_url

    def describe(self) -> dict[str, Any]:
        """What produced the replies, for provenance records. Never includes the API key."""
        p = self.params
        return {
            "backend": self.name,
            "kind": p.kind,
            "model": p.model,
            "revision": p.revision,
            "base_url": _safe_url(self.base_url) if self.base_url else None,
            "temperature": p.temperature,
            "seed": p.seed,
            "max_tokens": p.max_tokens,
        }

    def call_id(self, system: str, user: str) -> str:
        """Cache key of one request: a hash of everything that determines the reply.

        The endpoint URL and the key are left out on purpose: the same model behind another
        mirror (or with a rotated key) gives the same answers, so the cache stays valid.
        """
        p = self.params
        return content_hash({
            "kind": p.kind,
            "model": p.model,
            "revision": p.revision,
            "system": system,
            "user": user,
            "temperature": p.temperature,
            "seed": p.seed,
            "max_tokens": p.max_tokens,
        })

    @property
    def request_count(self) -> int:
        """Requests actually sent by this instance (retries included; cache hits excluded)."""
        with self._count_lock:
            return self._count

    def _count_request(self) -> None:
        with self._count_lock:
            self._count += 1

    # ---- cache ------------------------------------------------------------------------------

    def _cache_path(self, call_id: str) -> Path:
        return self.cache_dir / call_id[:2] / f"{call_id}.json"

    def _cache_get(self, call_id: str) -> LLMReply | None:
        path = self._cache_path(call_id)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError):
            # A torn or hand-edited file: ask again, and the answer overwrites it.
            log.debug("ignoring unreadable LLM cache file %s", path)
            return None
        if (
            not isinstance(entry, dict)
            or entry.get("call_id") != call_id
            or entry.get("status") not in ("ok", "refused")
            or not isinstance(entry.get("text"), str)
            or not isinstance(entry.get("reason"), str)
        ):
            log.debug("ignoring malformed LLM cache file %s", path)
            return None
        return LLMReply(status=entry["status"], text=entry["text"], reason=entry["reason"],
                        call_id=call_id, cached=True, attempts=0)

    def _cache_put(self, reply: LLMReply, system: str, user: str) -> None:
        entry = {
            "call_id": reply.call_id,
            "status": reply.status,
            "text": reply.text,
            "reason": reply.reason,
            "backend": self.describe(),
            "request": {"system": system, "user": user},
        }
        with atomic_path(self._cache_path(reply.call_id)) as tmp:
            tmp.write_text(json.dumps(entry, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                           encoding="utf-8")

    # ---- requests ---------------------------------------------------------------------------

    def complete(self, system: str, user: str) -> LLMReply:
        """Answer one request: from the cache if it was answered before, else from the model.

        Returns an ``error`` reply (not cached) when the request failed after all retries or the
        response was malformed; raises :class:`ConfigError` when the credentials, model or
        endpoint are wrong, since no retry can fix that.
        """
        call_id = self.call_id(system, user)
        cached = self._cache_get(call_id)
        if cached is not None:
            return cached
        outcome = self._request(system, user)
        status, text, reason = outcome.status, outcome.text.strip(), outcome.reason
        if status == "ok" and text and looks_like_refusal(text):
            status, reason = "refused", "looks like a refusal"
        reply = LLMReply(status=status, text=text, reason=reason, call_id=call_id, cached=False,
                         attempts=outcome.attempts)
        if reply.status != "error":
            self._cache_put(reply, system, user)
        else:
            log.warning("LLM backend %r: request %s failed: %s", self.name, call_id, reason)
        return reply

    def _workers(self) -> int:
        return self.params.concurrency

    def complete_many(
        self, messages: Sequence[tuple[str, str]], *, desc: str = "LLM"
    ) -> list[LLMReply]:
        """Answer many (system, user) requests, in order, up to ``concurrency`` at a time.

        Cached answers are resolved first without threads; identical requests are sent once.
        A :class:`ConfigError` from any request stops the batch (requests not yet started are
        cancelled) and is raised.
        """
        replies: list[LLMReply | None] = [None] * len(messages)
        pending: dict[str, list[int]] = {}  # call_id -> positions waiting for that answer
        with tqdm(total=len(messages), desc=desc, disable=None, file=sys.stderr) as bar:
            for index, (system, user) in enumerate(messages):
                call_id = self.call_id(system, user)
                if call_id in pending:
                    pending[call_id].append(index)
                    continue
                hit = self._cache_get(call_id)
                if hit is not None:
                    replies[index] = hit
                    bar.update(1)
                else:
                    pending[call_id] = [index]

            def settle(positions: list[int], reply: LLMReply) -> None:
                replies[positions[0]] = reply
                # Duplicates of one request share its answer without another send.
                for other in positions[1:]:
                    replies[other] = replace(reply, attempts=0, cached=reply.status != "error")
                bar.update(len(positions))

            workers = min(self._workers(), len(pending))
            if workers <= 1:
                for positions in pending.values():
                    settle(positions, self.complete(*messages[positions[0]]))
            else:
                pool = ThreadPoolExecutor(max_workers=workers,
                                          thread_name_prefix=f"llm-{self.name}")
                try:
                    futures: dict[Future[LLMReply], list[int]] = {
                        pool.submit(self.complete, *messages[positions[0]]): positions
                        for positions in pending.values()
                    }
                    for future in as_completed(futures):
                        settle(futures[future], future.result())
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
        assert all(reply is not None for reply in replies)
        return [reply for reply in replies if reply is not None]

    @abstractmethod
    def _request(self, system: str, user: str) -> _Outcome:
        """Send one uncached request and return what came back."""

    def close(self) -> None:
        """Release connections or model memory. The backend must not be used afterwards."""
        return None

    def __enter__(self) -> LLMBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# HTTP backends
# --------------------------------------------------------------------------------------------


class _Transient(Exception):
    """A failure worth retrying: a timeout, a dropped connection, 429 or a 5xx."""

    def __init__(self, what: str, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.retry_after = retry_after


class _Malformed(Exception):
    """A 2xx response whose body is not what the protocol promises."""


def _safe_url(url: str) -> str:
    """``url`` without any user:password part, for messages and records."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


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


def _short(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class HTTPBackend(LLMBackend):
    """Shared HTTP plumbing: auth header, rate limit, retries and status-code handling."""

    default_base_url = ""

    def __init__(self, name: str, params: LLMBackendParams, cache_dir: Path) -> None:
        super().__init__(name, params, cache_dir)
        self._base_url = (params.base_url or self.default_base_url).rstrip("/")
        self._key = self._read_key()
        self._limiter = _RateLimiter(params.requests_per_minute)
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
        return key

    @property
    def base_url(self) -> str:
        return self._base_url

    def _redact(self, text: str) -> str:
        # Some servers echo the presented key in error bodies; never pass it on.
        return text.replace(self._key, "***") if self._key else text

    @abstractmethod
    def _endpoint(self) -> str: ...

    @abstractmethod
    def _auth_headers(self) -> dict[str, str]: ...

    @abstractmethod
    def _payload(self, system: str, user: str) -> dict[str, Any]: ...

    @abstractmethod
    def _parse(self, data: Any) -> tuple[LLMStatus, str, str]:
        """(status, text, reason) from a decoded 2xx body; raises _Malformed."""

    def _wait(self, state: RetryCallState) -> float:
        p = self.params
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, _Transient) and error.retry_after is not None:
            return min(error.retry_after, p.backoff_max_s)
        return min(p.backoff_s * 2 ** (state.attempt_number - 1), p.backoff_max_s)

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("LLM backend %r: %s (attempt %d/%d); retrying in %.2f s", self.name, error,
                    state.attempt_number, self.params.max_attempts, wait)

    def _request(self, system: str, user: str) -> _Outcome:
        url = self._endpoint()
        payload = self._payload(system, user)
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
                    f"LLM backend {self.name!r}: base_url {_safe_url(self._base_url)!r} is not "
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
            return _Outcome("error", "", f"{exc.what} after {attempts} {noun}", attempts)
        return self._interpret(response, attempts)

    def _interpret(self, response: httpx.Response, attempts: int) -> _Outcome:
        code = response.status_code
        where = f"LLM backend {self.name!r} ({_safe_url(self._base_url)})"
        if code in (401, 403):
            env = self.params.api_key_env
            fix = (f"set ${env} to a valid key with access to model {self.params.model!r}"
                   if env else "the endpoint wants a key: set api_key_env to the name of the "
                   "environment variable that holds it")
            raise ConfigError(f"{where} rejected the credentials (HTTP {code})", fix)
        if code == 404:
            raise ConfigError(
                f"{where} answered 404 Not Found for {_safe_url(str(response.request.url))} "
                f"(model {self.params.model!r})",
                "check the model name and base_url (an OpenAI-compatible base_url usually ends "
                "in /v1)",
            )
        if code >= 400 or code < 200:
            body = self._redact(_short(response.text))
            return _Outcome("error", "", f"HTTP {code}: {body}" if body else f"HTTP {code}",
                            attempts)
        try:
            data = response.json()
        except ValueError:
            detail = self._redact(_short(response.text, 80)) or "empty body"
            return _Outcome("error", "", f"malformed response: not JSON ({detail})", attempts)
        try:
            status, text, reason = self._parse(data)
        except _Malformed as exc:
            return _Outcome("error", "", f"malformed response: {exc}", attempts)
        return _Outcome(status, text, reason, attempts)

    def close(self) -> None:
        self._client.close()


class OpenAIBackend(HTTPBackend):
    """An OpenAI-compatible chat-completions endpoint."""

    default_base_url = OPENAI_BASE_URL

    def _endpoint(self) -> str:
        return f"{self._base_url}/chat/completions"

    def _auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"} if self._key else {}

    def _payload(self, system: str, user: str) -> dict[str, Any]:
        p = self.params
        return {
            "model": p.model,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}],
            "temperature": p.temperature,
            "max_tokens": p.max_tokens,
            "seed": p.seed,
        }

    def _parse(self, data: Any) -> tuple[LLMStatus, str, str]:
        if not isinstance(data, dict):
            raise _Malformed("body is not a JSON object")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _Malformed("no choices")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise _Malformed("choices[0].message missing")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise _Malformed("choices[0].message.content is not a string")
        text = content or ""
        refusal = message.get("refusal")
        if isinstance(refusal, str) and refusal.strip():
            return "refused", refusal, "message.refusal"
        if choice.get("finish_reason") == "content_filter":
            return "refused", text, "finish_reason=content_filter"
        return "ok", text, ""


class GeminiBackend(HTTPBackend):
    """Google's Gemini REST API (``generateContent``)."""

    default_base_url = GEMINI_BASE_URL

    def _endpoint(self) -> str:
        model = self.params.model.removeprefix("models/")
        return f"{self._base_url}/v1beta/models/{model}:generateContent"

    def _auth_headers(self) -> dict[str, str]:
        # A header rather than ?key=...: URLs end up in logs, headers do not.
        return {"x-goog-api-key": self._key} if self._key else {}

    def _payload(self, system: str, user: str) -> dict[str, Any]:
        p = self.params
        return {
            "systemInstruction": {"parts": [{"text": system}]},
            "contents": [{"role": "user", "parts": [{"text": user}]}],
            "generationConfig": {"temperature": p.temperature, "maxOutputTokens": p.max_tokens,
                                 "seed": p.seed},
        }

    def _parse(self, data: Any) -> tuple[LLMStatus, str, str]:
        if not isinstance(data, dict):
            raise _Malformed("body is not a JSON object")
        candidates = data.get("candidates")
        feedback = data.get("promptFeedback")
        block = feedback.get("blockReason") if isinstance(feedback, dict) else None
        if not candidates:
            if block:
                return "refused", "", f"blockReason={block}"
            raise _Malformed("no candidates")
        if not isinstance(candidates, list) or not isinstance(candidates[0], dict):
            raise _Malformed("candidates is not a list of objects")
        candidate = candidates[0]
        content = candidate.get("content") or {}
        parts = content.get("parts") if isinstance(content, dict) else None
        if parts is not None and not isinstance(parts, list):
            raise _Malformed("candidates[0].content.parts is not a list")
        # "thought" parts are a thinking model's scratchpad, not its answer.
        text = "".join(
            part["text"] for part in parts or []
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            and not part.get("thought")
        )
        finish = candidate.get("finishReason")
        if finish in GEMINI_REFUSAL_FINISH:
            return "refused", text, f"finishReason={finish}"
        return "ok", text, ""


# --------------------------------------------------------------------------------------------
# Local transformers backend
# --------------------------------------------------------------------------------------------


class TransformersBackend(LLMBackend):
    """A local Hugging Face causal LM, loaded on the first uncached request.

    Requests run one at a time under a lock (a single model instance is not a good fit for
    threads), and each generation is seeded with ``params.seed`` so replies are reproducible.
    """

    def __init__(self, name: str, params: LLMBackendParams, cache_dir: Path) -> None:
        super().__init__(name, params, cache_dir)
        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(
                f"LLM backend {name!r} (transformers, model {params.model!r}) needs "
                f"{' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
                "installed",
                "pip install 'acrb[llm-local]'",
            )
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._device: str | None = None

    def _workers(self) -> int:
        return 1

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        p = self.params
        device = p.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            tokenizer = AutoTokenizer.from_pretrained(p.model, revision=p.revision)
            model: Any = AutoModelForCausalLM.from_pretrained(p.model, revision=p.revision)
        except (OSError, ValueError) as exc:
            offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
            raise ConfigError(
                f"LLM backend {self.name!r} could not load the model {p.model!r}"
                f"{f' at revision {p.revision!r}' if p.revision else ''}: "
                f"{type(exc).__name__}: {_short(str(exc), 300)}",
                "give a local model folder, or download the model first (`hf download "
                f"{p.model}`) and point HF_HOME at the cache that holds it"
                + ("; HF_HUB_OFFLINE is set, so nothing is downloaded" if offline else
                   "; set HF_HUB_OFFLINE=1 to use the local cache only"),
            ) from exc
        try:
            model.to(device)
        except (RuntimeError, AssertionError) as exc:
            raise ConfigError(
                f"LLM backend {self.name!r}: cannot move model {p.model!r} to device {device!r}: "
                f"{_short(str(exc), 200)}",
                "set device: cpu (or auto) for this backend",
            ) from exc
        model.eval()
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
            tokenizer.pad_token = tokenizer.eos_token
        self._tokenizer, self._model, self._device = tokenizer, model, device

    def _prompt_ids(self, system: str, user: str) -> Any:
        tokenizer = self._tokenizer
        if getattr(tokenizer, "chat_template", None):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            try:
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     tokenize=False)
            except Exception:
                # Some chat templates reject a system turn; fold it into the user turn instead.
                merged = [{"role": "user", "content": f"{system}\n\n{user}"}]
                text = tokenizer.apply_chat_template(merged, add_generation_prompt=True,
                                                     tokenize=False)
            # The template already placed any BOS token.
            return tokenizer(text, return_tensors="pt", add_special_tokens=False)
        return tokenizer(f"{system}\n\n{user}\n", return_tensors="pt")

    def _request(self, system: str, user: str) -> _Outcome:
        import torch

        with self._lock:
            self._load()
            p = self.params
            tokenizer, model = self._tokenizer, self._model
            encoded = self._prompt_ids(system, user)
            # Only what every causal LM accepts (some tokenizers add token_type_ids).
            inputs = {key: encoded[key].to(self._device or "cpu")
                      for key in ("input_ids", "attention_mask") if key in encoded}
            sampling = p.temperature > 0
            options: dict[str, Any] = {
                "max_new_tokens": p.max_tokens,
                "do_sample": sampling,
                "pad_token_id": tokenizer.pad_token_id,
            }
            if sampling:
                options["temperature"] = p.temperature
            else:
                # Override sampling defaults a model's generation_config may carry, which
                # greedy decoding would otherwise warn about.
                options.update(temperature=None, top_p=None, top_k=None)
            self._count_request()
            device = self._device or "cpu"
            devices = [torch.device(device)] if device.startswith("cuda") else []
            try:
                # A private RNG state per call: the same request gives the same reply, and the
                # caller's global random state is left as it was.
                with torch.random.fork_rng(devices=devices), torch.inference_mode():
                    torch.manual_seed(p.seed)
                    output = model.generate(**inputs, **options)
            except RuntimeError as exc:
                return _Outcome("error", "", f"generation failed: {_short(str(exc), 200)}", 1)
            new_tokens = output[0, inputs["input_ids"].shape[1]:]
            text = tokenizer.decode(new_tokens, skip_special_tokens=True)
        return _Outcome("ok", text, "", 1)

    def close(self) -> None:
        with self._lock:
            self._model = None
            self._tokenizer = None


_KINDS: dict[str, type[LLMBackend]] = {
    "openai": OpenAIBackend,
    "gemini": GeminiBackend,
    "transformers": TransformersBackend,
}


def open_backend(name: str, params: LLMBackendParams, cache_dir: Path) -> LLMBackend:
    """The backend for ``params.kind``, caching replies under ``cache_dir``.

    Raises :class:`ConfigError` when the kind is unknown, the API key's environment variable is
    missing, or (for ``transformers``) torch/transformers are not installed.
    """
    try:
        cls = _KINDS[params.kind]
    except KeyError:
        raise ConfigError(
            f"LLM backend {name!r} has unknown kind {params.kind!r}",
            f"set kind to one of: {', '.join(_KINDS)}",
        ) from None
    return cls(name, params, Path(cache_dir))
