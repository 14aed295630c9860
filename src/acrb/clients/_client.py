"""The chat client base: reply cache keyed by content hash, rate limit, ordered concurrent batches.

Every reply is keyed by a call id, a content hash of everything that determines it (backend
kind, model, revision, messages with each image's sha256, sampling settings), and ``ok`` and
``refused`` replies are cached on disk, so a rerun sends no request it has already had
answered. Errors are never cached: a rerun retries them. API keys are read from the environment
variable named in the params and are never written to the cache, logs, exceptions or
:meth:`ChatClient.describe`; a key the endpoint echoes in a reply is masked as the reply
enters (:mod:`acrb.redaction`).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from tqdm import tqdm

from acrb.clients._messages import ChatMessage, as_system_user, text_messages
from acrb.clients._refusal import looks_like_refusal
from acrb.redaction import redact
from acrb.storage import atomic_path, content_hash

if TYPE_CHECKING:
    from acrb.sections import ChatBackendParams

log = logging.getLogger("acrb.clients")

ChatStatus = Literal["ok", "refused", "error"]
Conversation = Sequence[ChatMessage]
#: The JSON schema a reply should follow (a judge's answer), or None for free text.
AnswerSchema = Mapping[str, Any] | None


@dataclass(frozen=True)
class ChatReply:
    """One answer to one request.

    ``text`` is the stripped reply ("" when there is none); ``reason`` is "" when ``status`` is
    ``ok`` and otherwise says why (``finish_reason=content_filter``, ``looks like a refusal``,
    ``HTTP 500 after 5 attempts``, ``malformed response: ...``). ``attempts`` counts requests
    actually sent for this reply (0 when it came from the cache).
    """

    status: ChatStatus
    text: str
    reason: str
    call_id: str
    cached: bool
    attempts: int


@dataclass(frozen=True)
class RequestOutcome:
    """What a backend's request produced, before refusal detection and caching."""

    status: ChatStatus
    text: str
    reason: str
    attempts: int


class RateLimiter:
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


def safe_url(url: str) -> str:
    """``url`` without any user:password part, for messages and records."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def short(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut to ``limit`` characters, for messages."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class ChatClient(ABC):
    """A chat model answering conversations (text and images), with an on-disk reply cache.

    :meth:`chat` and :meth:`chat_many` take conversations of :class:`ChatMessage`;
    :meth:`complete` and :meth:`complete_many` are the (system, user) text form that prompt
    synthesis uses. Subclasses implement :meth:`_request`; this class handles caching, refusal
    detection, ordering and concurrency, and the request counter.
    """

    def __init__(self, name: str, params: ChatBackendParams, cache_dir: Path) -> None:
        self.name = name
        self.params = params
        self.cache_dir = Path(cache_dir)
        self._count = 0
        self._count_lock = threading.Lock()

    # ---- description and identity ---------------------------------------------------------

    @property
    def base_url(self) -> str | None:
        """The endpoint root this client talks to (None for a local model)."""
        return self.params.base_url

    def describe(self) -> dict[str, Any]:
        """What produced the replies, for provenance records. Never includes the API key."""
        p = self.params
        return {
            "backend": self.name,
            "kind": p.kind,
            "model": p.model,
            "revision": p.revision,
            "base_url": safe_url(self.base_url) if self.base_url else None,
            "temperature": p.temperature,
            "seed": p.seed,
            "max_tokens": p.max_tokens,
        }

    @staticmethod
    def _request_record(messages: Conversation) -> dict[str, Any]:
        """The request as the cache file records it: texts, and images by sha256."""
        pair = as_system_user(messages)
        if pair is not None:
            return {"system": pair[0], "user": pair[1]}
        return {"messages": [m.identity() for m in messages]}

    def response_format(self, schema: AnswerSchema) -> dict[str, Any] | None:
        """The request options this backend sends to constrain a reply to ``schema``, or None
        when it sends none (no schema, ``structured_output`` off, or a backend without the
        feature). They change the reply, so they are part of the call id."""
        return None

    def chat_call_id(self, messages: Conversation, schema: AnswerSchema = None) -> str:
        """Cache key of one request: a hash of everything that determines the reply.

        Images count by the sha256 of their bytes. A (system, user) text request hashes the
        same fields as before messages could carry images, so its key is unchanged; so does a
        request whose schema the backend does not send. The endpoint URL and the key are left
        out on purpose: the same model behind another mirror (or with a rotated key) gives the
        same answers, so the cache stays valid.
        """
        p = self.params
        fields: dict[str, Any] = {
            "kind": p.kind,
            "model": p.model,
            "revision": p.revision,
            **self._request_record(messages),
            "temperature": p.temperature,
            "seed": p.seed,
            "max_tokens": p.max_tokens,
        }
        options = self.response_format(schema)
        if options is not None:
            fields["response_format"] = options
        return content_hash(fields)

    def call_id(self, system: str, user: str) -> str:
        """Cache key of a (system, user) text request; see :meth:`chat_call_id`."""
        return self.chat_call_id(text_messages(system, user))

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

    def _cache_get(self, call_id: str) -> ChatReply | None:
        path = self._cache_path(call_id)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError):
            # A torn or hand-edited file: ask again, and the answer overwrites it.
            log.debug("ignoring unreadable chat reply cache file %s", path)
            return None
        if (
            not isinstance(entry, dict)
            or entry.get("call_id") != call_id
            or entry.get("status") not in ("ok", "refused")
            or not isinstance(entry.get("text"), str)
            or not isinstance(entry.get("reason"), str)
        ):
            log.debug("ignoring malformed chat reply cache file %s", path)
            return None
        # A cache written before the key was masked must not bring it back.
        return ChatReply(status=entry["status"], text=redact(entry["text"]),
                         reason=redact(entry["reason"]), call_id=call_id, cached=True, attempts=0)

    def _cache_put(self, reply: ChatReply, messages: Conversation, schema: AnswerSchema = None
                   ) -> None:
        entry = {
            "call_id": reply.call_id,
            "status": reply.status,
            "text": reply.text,
            "reason": reply.reason,
            "backend": self.describe(),
            "request": self._request_record(messages),
        }
        options = self.response_format(schema)
        if options is not None:
            entry["response_format"] = options
        with atomic_path(self._cache_path(reply.call_id)) as tmp:
            tmp.write_text(json.dumps(entry, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                           encoding="utf-8")

    # ---- requests ---------------------------------------------------------------------------

    def check_request(self, messages: Conversation) -> None:
        """Raise :class:`ConfigError` if this client cannot take ``messages`` at all (a
        text-only model given an image); called before the cache is consulted."""
        if not messages:
            raise ValueError("a chat request needs at least one message")

    def chat(self, messages: Conversation, *, schema: AnswerSchema = None) -> ChatReply:
        """Answer one request: from the cache if it was answered before, else from the model.

        ``schema``, when given, is the JSON schema the answer should follow; backends that can
        constrain their output to it do so when ``structured_output`` is on
        (:meth:`response_format`), the others ignore it.

        Returns an ``error`` reply (not cached) when the request failed after all retries or the
        response was malformed; raises :class:`ConfigError` when the credentials, model or
        endpoint are wrong, or the model cannot take the request's content, since no retry can
        fix that.
        """
        messages = tuple(messages)
        self.check_request(messages)
        call_id = self.chat_call_id(messages, schema)
        cached = self._cache_get(call_id)
        if cached is not None:
            return cached
        return self._settle(call_id, messages, schema, self._request(messages, schema))

    def _settle(self, call_id: str, messages: Conversation, schema: AnswerSchema,
                outcome: RequestOutcome) -> ChatReply:
        """The reply for a backend's outcome: refusal detection, then the cache (not errors)."""
        # Where a reply enters the program: a key the endpoint echoed goes no further.
        status, text, reason = outcome.status, redact(outcome.text).strip(), redact(outcome.reason)
        if status == "ok" and text and looks_like_refusal(text):
            status, reason = "refused", "looks like a refusal"
        reply = ChatReply(status=status, text=text, reason=reason, call_id=call_id, cached=False,
                          attempts=outcome.attempts)
        if reply.status != "error":
            self._cache_put(reply, messages, schema)
        else:
            log.warning("chat backend %r: request %s failed: %s", self.name, call_id, reason)
        return reply

    def complete(self, system: str, user: str) -> ChatReply:
        """Answer one (system, user) text request; see :meth:`chat`."""
        return self.chat(text_messages(system, user))

    def _workers(self) -> int:
        return self.params.concurrency

    def _batch_size(self) -> int:
        """Requests one :meth:`_request_batch` call takes; 1 for backends that send one at a
        time (concurrency comes from threads instead)."""
        return 1

    def _request_batch(self, batch: Sequence[tuple[Conversation, AnswerSchema]]
                       ) -> list[RequestOutcome]:
        """Send several uncached requests together (a local model's batched generate)."""
        return [self._request(messages, schema) for messages, schema in batch]

    def chat_many(self, conversations: Sequence[Conversation], *, desc: str = "chat",
                  schemas: Sequence[AnswerSchema] | None = None) -> list[ChatReply]:
        """Answer many requests, in order, up to ``concurrency`` at a time (or, for a local
        model, ``batch_size`` per generate call). ``schemas`` gives each request's answer
        schema (see :meth:`chat`).

        Cached answers are resolved first without threads; identical requests are sent once.
        A :class:`ConfigError` from any request stops the batch (requests not yet started are
        cancelled) and is raised.
        """
        requests = [tuple(messages) for messages in conversations]
        wanted: list[AnswerSchema] = list(schemas) if schemas is not None else \
            [None] * len(requests)
        if len(wanted) != len(requests):
            raise ValueError(f"chat_many got {len(requests)} conversations and {len(wanted)} "
                             "schemas")
        for messages in requests:
            self.check_request(messages)
        replies: list[ChatReply | None] = [None] * len(requests)
        pending: dict[str, list[int]] = {}  # call_id -> positions waiting for that answer
        with tqdm(total=len(requests), desc=desc, disable=None, file=sys.stderr) as bar:
            for index, messages in enumerate(requests):
                call_id = self.chat_call_id(messages, wanted[index])
                if call_id in pending:
                    pending[call_id].append(index)
                    continue
                hit = self._cache_get(call_id)
                if hit is not None:
                    replies[index] = hit
                    bar.update(1)
                else:
                    pending[call_id] = [index]

            def settle(positions: list[int], reply: ChatReply) -> None:
                replies[positions[0]] = reply
                # Duplicates of one request share its answer without another send.
                for other in positions[1:]:
                    replies[other] = replace(reply, attempts=0, cached=reply.status != "error")
                bar.update(len(positions))

            workers = min(self._workers(), len(pending))
            size = self._batch_size()
            if size > 1:
                waiting = list(pending.items())
                for start in range(0, len(waiting), size):
                    chunk = waiting[start:start + size]
                    batch = [(requests[positions[0]], wanted[positions[0]])
                             for _, positions in chunk]
                    outcomes = self._request_batch(batch)
                    for (call_id, positions), (messages, schema), outcome in zip(
                            chunk, batch, outcomes, strict=True):
                        settle(positions, self._settle(call_id, messages, schema, outcome))
            elif workers <= 1:
                for positions in pending.values():
                    settle(positions, self.chat(requests[positions[0]],
                                                schema=wanted[positions[0]]))
            else:
                pool = ThreadPoolExecutor(max_workers=workers,
                                          thread_name_prefix=f"chat-{self.name}")
                try:
                    futures: dict[Future[ChatReply], list[int]] = {
                        pool.submit(self.chat, requests[positions[0]],
                                    schema=wanted[positions[0]]): positions
                        for positions in pending.values()
                    }
                    for future in as_completed(futures):
                        settle(futures[future], future.result())
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
        assert all(reply is not None for reply in replies)
        return [reply for reply in replies if reply is not None]

    def complete_many(self, messages: Sequence[tuple[str, str]], *, desc: str = "LLM"
                      ) -> list[ChatReply]:
        """Answer many (system, user) text requests, in order; see :meth:`chat_many`."""
        return self.chat_many([text_messages(system, user) for system, user in messages],
                              desc=desc)

    @abstractmethod
    def _request(self, messages: Conversation, schema: AnswerSchema = None) -> RequestOutcome:
        """Send one uncached request and return what came back."""

    def close(self) -> None:
        """Release connections or model memory. The client must not be used afterwards."""
        return None

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
