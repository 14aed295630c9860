"""HTTP chat clients (OpenAI-compatible and Gemini) against local fake servers: offline, fast."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acrb.clients import ChatClient, ChatReply, looks_like_refusal
from acrb.config import LLMBackendParams
from acrb.errors import ConfigError
from acrb.registry import open_chat_client
from tests.llm_servers import (
    FakeLLMServer,
    Scripted,
    gemini_blocked,
    gemini_reply,
    openai_reply,
    reply_body,
)

SECRET = "sk-test-9f8e7d6c5b4a-secret"
SYSTEM = "You write image prompts."
PROTOCOLS = ["openai", "gemini"]


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy from the environment would swallow requests meant for 127.0.0.1.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=PROTOCOLS)
def server(request: pytest.FixtureRequest) -> Iterator[FakeLLMServer]:
    with FakeLLMServer(request.param) as fake:
        yield fake


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "llm-cache"


def make_params(server: FakeLLMServer, **changes: Any) -> LLMBackendParams:
    values: dict[str, Any] = {
        "kind": server.protocol,
        "model": "fake-model",
        "base_url": server.base_url,
        "api_key_env": None,
        "temperature": 0.5,
        "seed": 7,
        "max_tokens": 64,
        "timeout_s": 2.0,
        "max_attempts": 3,
        "backoff_s": 0.01,
        "backoff_max_s": 0.05,
        "requests_per_minute": 60000,
        "concurrency": 4,
    }
    values.update(changes)
    return LLMBackendParams(**values)


def backend_for(server: FakeLLMServer, cache: Path, **changes: Any) -> ChatClient:
    return open_chat_client("test", make_params(server, **changes), cache)


def cache_files(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*") if p.is_file())


# ---- normal answers -----------------------------------------------------------------------------


def test_normal_answer_and_request_shape(
    server: FakeLLMServer, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACRB_TEST_KEY", SECRET)
    backend = backend_for(server, cache, api_key_env="ACRB_TEST_KEY")
    reply = backend.complete(SYSTEM, "a nurse at work")
    assert reply == ChatReply(status="ok", text="prompt for: a nurse at work", reason="",
                             call_id=backend.call_id(SYSTEM, "a nurse at work"), cached=False,
                             attempts=1)
    assert backend.request_count == 1
    assert server.request_count == 1
    sent = server.requests[0]
    if server.protocol == "openai":
        assert sent.path == "/v1/chat/completions"
        assert sent.headers["authorization"] == f"Bearer {SECRET}"
        assert sent.body == {
            "model": "fake-model",
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "a nurse at work"}],
            "temperature": 0.5, "max_tokens": 64, "seed": 7,
        }
    else:
        assert sent.path == "/v1beta/models/fake-model:generateContent"
        assert sent.headers["x-goog-api-key"] == SECRET
        assert "authorization" not in sent.headers
        assert sent.body == {
            "systemInstruction": {"parts": [{"text": SYSTEM}]},
            "contents": [{"role": "user", "parts": [{"text": "a nurse at work"}]}],
            "generationConfig": {"temperature": 0.5, "maxOutputTokens": 64, "seed": 7},
        }
    backend.close()


def test_no_key_sends_no_auth_header(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache)
    assert backend.complete(SYSTEM, "x").status == "ok"
    headers = server.requests[0].headers
    assert "authorization" not in headers
    assert "x-goog-api-key" not in headers


def test_base_url_trailing_slash_is_stripped(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache, base_url=server.base_url + "/")
    assert backend.complete(SYSTEM, "x").status == "ok"
    assert "//" not in server.requests[0].path


def test_describe_and_call_id(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache)
    assert backend.describe() == {
        "backend": "test", "kind": server.protocol, "model": "fake-model", "revision": None,
        "base_url": server.base_url, "temperature": 0.5, "seed": 7, "max_tokens": 64,
    }
    call_id = backend.call_id(SYSTEM, "u")
    # The endpoint is not part of the key: a mirror of the same model shares the cache.
    mirror = backend_for(server, cache, base_url="http://127.0.0.1:9/v1")
    assert mirror.call_id(SYSTEM, "u") == call_id
    assert backend.call_id(SYSTEM, "v") != call_id
    assert backend.call_id("other system", "u") != call_id
    assert backend_for(server, cache, temperature=0.6).call_id(SYSTEM, "u") != call_id
    assert backend_for(server, cache, seed=8).call_id(SYSTEM, "u") != call_id
    assert backend_for(server, cache, model="other").call_id(SYSTEM, "u") != call_id


# ---- retries ------------------------------------------------------------------------------------


def test_429_with_retry_after_then_success(server: FakeLLMServer, cache: Path) -> None:
    # A long backoff that Retry-After: 0 must override, or the test would take 5 s.
    backend = backend_for(server, cache, backoff_s=5.0, backoff_max_s=10.0)
    server.push(Scripted(status=429, body={"error": "slow down"}, headers={"Retry-After": "0"}))
    started = time.monotonic()
    reply = backend.complete(SYSTEM, "u")
    assert time.monotonic() - started < 2.0
    assert reply.status == "ok"
    assert reply.text == "prompt for: u"
    assert reply.attempts == 2
    assert backend.request_count == 2
    assert server.request_count == 2


def test_500_then_success(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache)
    server.push(Scripted(status=500, body="oops"), Scripted(status=503, body="busy"))
    reply = backend.complete(SYSTEM, "u")
    assert (reply.status, reply.attempts) == ("ok", 3)


def test_500_persistent_is_an_error_and_not_cached(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache, max_attempts=3)
    server.push(*[Scripted(status=500, body="oops")] * 3)
    reply = backend.complete(SYSTEM, "u")
    assert reply.status == "error"
    assert reply.reason == "HTTP 500 after 3 attempts"
    assert reply.text == ""
    assert (reply.attempts, server.request_count, backend.request_count) == (3, 3, 3)
    assert cache_files(cache) == []
    # A rerun retries the error (the server has recovered by now).
    again = open_chat_client("test", backend.params, cache).complete(SYSTEM, "u")
    assert (again.status, again.cached, again.attempts) == ("ok", False, 1)
    assert server.request_count == 4


def test_backoff_doubles_and_is_capped(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache, max_attempts=5, backoff_s=1.0, backoff_max_s=3.0)
    waits: list[float] = []
    backend._sleep = waits.append  # type: ignore[attr-defined]
    server.push(*[Scripted(status=502)] * 4)
    assert backend.complete(SYSTEM, "u").attempts == 5
    assert waits == [1.0, 2.0, 3.0, 3.0]


def test_timeout(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache, timeout_s=0.2, max_attempts=2)
    server.push(Scripted(delay=0.6), Scripted(delay=0.6))
    reply = backend.complete(SYSTEM, "u")
    assert reply.status == "error"
    assert reply.reason == "timeout after 2 attempts"
    assert reply.attempts == 2


def test_connection_refused(server: FakeLLMServer, cache: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on that port now.
    backend = backend_for(server, cache, base_url=f"http://127.0.0.1:{port}", max_attempts=2)
    reply = backend.complete(SYSTEM, "u")
    assert reply.status == "error"
    assert reply.reason.startswith("connection error")
    assert reply.reason.endswith("after 2 attempts")


@pytest.mark.parametrize("body", ["this is not json", "", {"unexpected": 1}, [1, 2],
                                  {"choices": [], "candidates": []}])
def test_malformed_response(server: FakeLLMServer, cache: Path, body: Any) -> None:
    backend = backend_for(server, cache)
    server.push(Scripted(body=body if body != "" else b""))
    reply = backend.complete(SYSTEM, "u")
    assert reply.status == "error"
    assert reply.reason.startswith("malformed response: ")
    assert reply.attempts == 1  # not retried
    assert cache_files(cache) == []


def test_openai_non_string_content_is_malformed(cache: Path) -> None:
    with FakeLLMServer("openai") as server:
        server.push(Scripted(body={"choices": [{"message": {"content": 5}}]}))
        reply = backend_for(server, cache).complete(SYSTEM, "u")
    assert reply.status == "error"
    assert reply.reason.startswith("malformed response: ")


def test_other_4xx_is_an_error_without_retry(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache)
    server.push(Scripted(status=400, body={"error": {"message": "max_tokens too large"}}))
    reply = backend.complete(SYSTEM, "u")
    assert reply.status == "error"
    assert reply.reason.startswith("HTTP 400: ")
    assert "max_tokens too large" in reply.reason
    assert reply.attempts == 1
    assert server.request_count == 1


# ---- refusals and empty answers -----------------------------------------------------------------

REFUSALS = [
    ("openai", openai_reply("", finish_reason="content_filter"), "finish_reason=content_filter",
     ""),
    ("openai", openai_reply(None, refusal="I can't help with that."), "message.refusal",
     "I can't help with that."),
    ("openai", openai_reply("I'm sorry, but I can't help with that."), "looks like a refusal",
     "I'm sorry, but I can't help with that."),
    ("gemini", gemini_blocked("SAFETY"), "blockReason=SAFETY", ""),
    ("gemini", gemini_blocked("OTHER"), "blockReason=OTHER", ""),
    ("gemini", gemini_reply(None, finish_reason="SAFETY"), "finishReason=SAFETY", ""),
    ("gemini", gemini_reply("partial", finish_reason="PROHIBITED_CONTENT"),
     "finishReason=PROHIBITED_CONTENT", "partial"),
    ("gemini", gemini_reply("I'm sorry, but I can't help with that."), "looks like a refusal",
     "I'm sorry, but I can't help with that."),
]


@pytest.mark.parametrize(("protocol", "body", "reason", "text"), REFUSALS)
def test_refusals(cache: Path, protocol: str, body: dict[str, Any], reason: str,
                  text: str) -> None:
    with FakeLLMServer(protocol) as server:  # type: ignore[arg-type]
        server.push(Scripted(body=body))
        backend = backend_for(server, cache)
        reply = backend.complete(SYSTEM, "u")
        assert (reply.status, reply.reason, reply.text) == ("refused", reason, text)
        assert reply.attempts == 1
        # Refusals are answers: cached, not retried on a rerun.
        again = open_chat_client("test", backend.params, cache).complete(SYSTEM, "u")
        assert (again.status, again.reason, again.cached) == ("refused", reason, True)
        assert server.request_count == 1


@pytest.mark.parametrize("text", ["", "   \n ", None])
def test_empty_answer_is_ok_and_not_retried(server: FakeLLMServer, cache: Path,
                                            text: str | None) -> None:
    server.push(Scripted(body=reply_body(server.protocol, text)))
    reply = backend_for(server, cache).complete(SYSTEM, "u")
    assert (reply.status, reply.text, reply.reason, reply.attempts) == ("ok", "", "", 1)


def test_reply_text_is_stripped(server: FakeLLMServer, cache: Path) -> None:
    server.push(Scripted(body=reply_body(server.protocol, "  a calm portrait \n")))
    assert backend_for(server, cache).complete(SYSTEM, "u").text == "a calm portrait"


def test_gemini_thought_parts_are_skipped(cache: Path) -> None:
    body = {"candidates": [{"finishReason": "STOP", "content": {"parts": [
        {"text": "thinking...", "thought": True}, {"text": "the answer"}]}}]}
    with FakeLLMServer("gemini") as server:
        server.push(Scripted(body=body))
        assert backend_for(server, cache).complete(SYSTEM, "u").text == "the answer"


@pytest.mark.parametrize("text", [
    "I'm sorry, but I can't help with that.",
    "I can't help with creating that image.",
    "I cannot assist with this request.",
    "I won't create content that stereotypes people.",
    "I am unable to provide that.",
    "I'm not able to write that prompt.",
    "Sorry, I can't do that.",
    "As an AI language model, I cannot generate this.",
    "I must decline this request.",
    "I apologize, but I cannot produce that.",
    "Unfortunately, I cannot comply with this request.",
    "“I’m sorry, but I can’t assist with that.”",
    "Understood. However, I can't help with that.",
])
def test_looks_like_refusal_true(text: str) -> None:
    assert looks_like_refusal(text)


@pytest.mark.parametrize("text", [
    "A photo of a nurse who can't stop smiling",
    "A photo of a nurse who can't stop smiling, soft window light, 35mm",
    'An elderly man says "I can\'t believe it" in a sunny park',
    "Sorry Day memorial poster featuring a young woman",
    "As an AI researcher, she works late in a glass office",
    "I am a firefighter: a portrait in full gear",
    "Edit the image so the person wears a red scarf",
    "A sorry-looking dog waits in the rain",
    "",
])
def test_looks_like_refusal_false(text: str) -> None:
    assert not looks_like_refusal(text)


# ---- cache --------------------------------------------------------------------------------------


def test_cache_answers_a_second_instance_without_requests(server: FakeLLMServer,
                                                          cache: Path) -> None:
    prompts = [(SYSTEM, f"subject {i}") for i in range(6)]
    first = backend_for(server, cache).complete_many(prompts)
    assert all(r.status == "ok" and not r.cached for r in first)
    sent = server.request_count
    assert sent == 6

    second = backend_for(server, cache)
    again = second.complete_many(prompts)
    assert server.request_count == sent
    assert second.request_count == 0
    assert [r.text for r in again] == [r.text for r in first]
    assert all(r.cached and r.attempts == 0 for r in again)
    single = second.complete(*prompts[0])
    assert single.cached and single.text == first[0].text
    assert server.request_count == sent

    files = cache_files(cache)
    assert len(files) == 6
    entry = json.loads(files[0].read_text())
    assert files[0].parent.name == files[0].stem[:2]
    assert entry["backend"] == second.describe()
    assert set(entry["request"]) == {"system", "user"}
    assert entry["status"] == "ok"


def test_corrupt_cache_file_is_ignored_and_overwritten(server: FakeLLMServer,
                                                       cache: Path) -> None:
    backend = backend_for(server, cache)
    reply = backend.complete(SYSTEM, "u")
    (path,) = cache_files(cache)
    path.write_text("{ torn")
    again = backend_for(server, cache).complete(SYSTEM, "u")
    assert (again.status, again.cached, again.text) == ("ok", False, reply.text)
    assert json.loads(path.read_text())["text"] == reply.text
    assert backend_for(server, cache).complete(SYSTEM, "u").cached


def test_errors_are_not_cached_in_complete_many(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache, max_attempts=1, concurrency=1)
    server.push(Scripted(status=500))
    replies = backend.complete_many([(SYSTEM, "a"), (SYSTEM, "b")])
    assert [r.status for r in replies] == ["error", "ok"]
    rerun = backend_for(server, cache).complete_many([(SYSTEM, "a"), (SYSTEM, "b")])
    assert [(r.status, r.cached) for r in rerun] == [("ok", False), ("ok", True)]


# ---- credentials --------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [401, 403])
def test_rejected_credentials_raise_config_error(
    server: FakeLLMServer, cache: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setenv("ACRB_TEST_KEY", SECRET)
    backend = backend_for(server, cache, api_key_env="ACRB_TEST_KEY")
    server.push(Scripted(status=code, body={"error": f"bad key {SECRET}"}))
    with pytest.raises(ConfigError) as caught:
        backend.complete(SYSTEM, "u")
    message = str(caught.value)
    assert SECRET not in message
    assert "'test'" in message and f"HTTP {code}" in message and "ACRB_TEST_KEY" in message
    assert server.request_count == 1  # not retried


def test_404_raises_config_error(server: FakeLLMServer, cache: Path) -> None:
    server.push(Scripted(status=404, body="not found"))
    with pytest.raises(ConfigError, match="fake-model"):
        backend_for(server, cache).complete(SYSTEM, "u")


def test_config_error_stops_complete_many(server: FakeLLMServer, cache: Path) -> None:
    server.push(*[Scripted(status=401)] * 8)
    with pytest.raises(ConfigError):
        backend_for(server, cache).complete_many([(SYSTEM, f"u{i}") for i in range(8)])


@pytest.mark.parametrize("value", [None, "", "  "])
def test_missing_key_variable_raises_at_open(
    server: FakeLLMServer, cache: Path, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("ACRB_TEST_MISSING_KEY", raising=False)
    else:
        monkeypatch.setenv("ACRB_TEST_MISSING_KEY", value)
    with pytest.raises(ConfigError, match="ACRB_TEST_MISSING_KEY"):
        backend_for(server, cache, api_key_env="ACRB_TEST_MISSING_KEY")
    assert server.request_count == 0


def test_non_http_base_url_raises_config_error(server: FakeLLMServer, cache: Path) -> None:
    with pytest.raises(ConfigError, match="base_url"):
        backend_for(server, cache, base_url="ftp://127.0.0.1:1").complete(SYSTEM, "u")


def test_key_never_leaks(server: FakeLLMServer, cache: Path, monkeypatch: pytest.MonkeyPatch,
                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("ACRB_TEST_KEY", SECRET)
    backend = backend_for(server, cache, api_key_env="ACRB_TEST_KEY", max_attempts=2)
    server.push(
        Scripted(status=500, body=f"internal error for key {SECRET}"),  # retried, logged
        Scripted(),  # ok
        Scripted(status=400, body={"error": f"Incorrect API key provided: {SECRET}"}),
        Scripted(body=reply_body(server.protocol, "I'm sorry, but I can't help with that.")),
    )
    replies = backend.complete_many([(SYSTEM, "a"), (SYSTEM, "b"), (SYSTEM, "c")],
                                    desc="leak test")
    backend_ = backend_for(server, cache, api_key_env="ACRB_TEST_KEY", concurrency=1)
    replies = [*replies, *backend_.complete_many([(SYSTEM, "a"), (SYSTEM, "d")])]
    assert {r.status for r in replies} >= {"ok", "error", "refused"}
    assert server.request_count >= 4
    assert any("HTTP 500" in record.getMessage() for record in caplog.records)
    assert SECRET not in caplog.text
    assert all(SECRET not in record.getMessage() for record in caplog.records)
    assert SECRET not in json.dumps(backend.describe())
    assert SECRET not in repr(backend.params)
    assert all(SECRET not in f"{r.reason} {r.text}" for r in replies)
    assert all(SECRET not in path.read_text() for path in cache_files(cache))
    assert any(server.requests)  # the key was really sent
    assert all(SECRET in (r.headers.get("authorization", "") + r.headers.get("x-goog-api-key",
                                                                             ""))
               for r in server.requests)


# ---- concurrency and rate limit -----------------------------------------------------------------


def test_complete_many_keeps_order_under_concurrency(server: FakeLLMServer,
                                                     cache: Path) -> None:
    # Early requests answer slowest, so completion order is the reverse of submission order.
    server.push(*[Scripted(delay=0.05 * (8 - i)) for i in range(8)])
    backend = backend_for(server, cache, concurrency=4)
    users = [f"subject {i}" for i in range(8)]
    messages = [(SYSTEM, u) for u in users]
    messages.insert(3, (SYSTEM, "subject 0"))  # a duplicate is sent once
    started = time.monotonic()
    replies = backend.complete_many(messages, desc="order test")
    elapsed = time.monotonic() - started
    assert [r.text for r in replies] == [f"prompt for: {u}" for _, u in messages]
    assert server.request_count == 8
    assert backend.request_count == 8
    assert replies[3].attempts == 0 and replies[0].attempts == 1
    # Sequentially the delays would add up to 1.8 s.
    assert elapsed < 1.5


def test_complete_many_empty(server: FakeLLMServer, cache: Path) -> None:
    assert backend_for(server, cache).complete_many([]) == []


def test_rate_limit_spaces_uncached_requests(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache, requests_per_minute=600, concurrency=4)
    messages = [(SYSTEM, f"u{i}") for i in range(5)]
    started = time.monotonic()
    replies = backend.complete_many(messages)
    assert time.monotonic() - started >= 0.4
    assert all(r.status == "ok" for r in replies)
    # Cached replies do not wait for the limiter.
    started = time.monotonic()
    for system, user in messages:
        assert backend.complete(system, user).cached
    assert time.monotonic() - started < 0.2


def test_rate_limit_sequential_calls(server: FakeLLMServer, cache: Path) -> None:
    backend = backend_for(server, cache, requests_per_minute=600)
    started = time.monotonic()
    for i in range(5):
        backend.complete(SYSTEM, f"s{i}")
    assert time.monotonic() - started >= 0.4


def test_unknown_kind_raises_config_error(cache: Path) -> None:
    params = LLMBackendParams.model_construct(kind="claude-web", model="m")
    with pytest.raises(ConfigError, match="kind"):
        open_chat_client("bad", params, cache)


def test_import_is_lazy() -> None:
    # Other tests may have imported torch already; check in a clean interpreter.
    code = ("import sys, acrb.clients, acrb.clients.openai, acrb.clients.gemini, "
            "acrb.clients.transformers; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
