"""Chat messages with images: what reaches each protocol, the call ids, cache and key hygiene."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from acrb.clients import (
    ChatMessage,
    ImagePart,
    TextPart,
    as_system_user,
    text_messages,
)
from acrb.clients.transformers import TransformersChatClient
from acrb.config import LLMBackendParams
from acrb.errors import ConfigError, InputDataError
from acrb.registry import open_chat_client
from acrb.storage import encode_png, sha256_bytes
from tests.llm_servers import FakeLLMServer, Scripted, reply_body
from tests.test_clients_http import SECRET, SYSTEM, cache_files, make_params

RNG = np.random.default_rng(7)
PIXELS = RNG.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
OTHER_PIXELS = PIXELS.copy()
OTHER_PIXELS[0, 0, 0] ^= 1  # one bit of one pixel differs


def jpeg_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


PNG = encode_png(PIXELS)
OTHER_PNG = encode_png(OTHER_PIXELS)
JPEG = jpeg_bytes(PIXELS)
QUESTION = "Does the edited image show the requested attribute?"


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=["openai", "gemini"])
def server(request: pytest.FixtureRequest) -> Iterator[FakeLLMServer]:
    with FakeLLMServer(request.param) as fake:
        yield fake


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "chat-cache"


def vision_request(*images: bytes | np.ndarray) -> list[ChatMessage]:
    return [ChatMessage.system(SYSTEM), ChatMessage.user(QUESTION, *images)]


# ---- call ids ----------------------------------------------------------------------------------

# Computed with the client as it was before messages could carry images (acrb.prompts.llm at
# the commit that introduced acrb.clients): text requests must keep these ids, or every
# existing reply cache and synthesis log would be orphaned.
PINNED = [
    ({"kind": "openai", "model": "fake-model", "temperature": 0.5, "seed": 7, "max_tokens": 64},
     "You write image prompts.", "a nurse at work", "c3a2fcfb12f734b9afeb"),
    ({"kind": "gemini", "model": "gemini-2.0-flash", "temperature": 0.3, "seed": 20261123,
      "max_tokens": 160}, "sys", "user", "181d41ec2743bb8d3622"),
    ({"kind": "transformers", "model": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "abc",
      "temperature": 0.0, "seed": 11, "max_tokens": 12}, "sys", "user", "551d04e9d649b55d99ed"),
]


@pytest.mark.parametrize(("values", "system", "user", "expected"), PINNED)
def test_text_call_ids_are_unchanged(tmp_path: Path, values: dict, system: str, user: str,
                                     expected: str) -> None:
    params = LLMBackendParams(**values, base_url="http://127.0.0.1:9/v1")
    # The transformers client is built directly: its module needs no torch until it generates.
    client = (TransformersChatClient("pinned", params, tmp_path) if params.kind == "transformers"
              else open_chat_client("pinned", params, tmp_path))
    assert client.call_id(system, user) == expected
    assert client.chat_call_id([ChatMessage.system(system), ChatMessage.user(user)]) == expected


def test_other_text_shapes_do_not_collide_with_the_pair_form(tmp_path: Path) -> None:
    client = open_chat_client("t", LLMBackendParams(kind="openai", model="m"), tmp_path)
    pair = client.call_id("", "u")
    assert client.chat_call_id([ChatMessage.user("u")]) != pair
    split = [ChatMessage.system("s"), ChatMessage("user", (TextPart("a"), TextPart("b")))]
    assert client.chat_call_id(split) != client.call_id("s", "a\nb")
    turns = [*text_messages("s", "u"), ChatMessage.assistant("x"), ChatMessage.user("y")]
    assert client.chat_call_id(turns) != client.call_id("s", "u")


def test_image_bytes_change_the_call_id(tmp_path: Path) -> None:
    client = open_chat_client("t", LLMBackendParams(kind="openai", model="m"), tmp_path)
    with_png = client.chat_call_id(vision_request(PNG))
    assert client.chat_call_id(vision_request(PNG)) == with_png
    assert client.chat_call_id(vision_request(PIXELS)) == with_png  # the same PNG encoding
    assert client.chat_call_id(vision_request(OTHER_PNG)) != with_png
    assert client.chat_call_id(vision_request(JPEG)) != with_png
    assert client.chat_call_id(vision_request(PNG, PNG)) != with_png
    assert client.chat_call_id([ChatMessage.system(SYSTEM), ChatMessage.user(PNG, QUESTION)]) \
        != with_png  # order of parts matters
    assert client.call_id(SYSTEM, QUESTION) != with_png


# ---- what reaches the servers ------------------------------------------------------------------


def decoded(data: str) -> bytes:
    return base64.b64decode(data, validate=True)


def test_openai_images_are_data_urls(cache: Path) -> None:
    with FakeLLMServer("openai") as server:
        client = open_chat_client("vision", make_params(server), cache)
        reply = client.chat(vision_request(PNG, PIXELS, JPEG))
        assert (reply.status, reply.text) == ("ok", f"prompt for: {QUESTION}")
        (sent,) = server.requests
    system, user = sent.body["messages"]
    assert system == {"role": "system", "content": SYSTEM}
    assert user["role"] == "user"
    text, png, array, jpeg = user["content"]
    assert text == {"type": "text", "text": QUESTION}
    assert [part["type"] for part in (png, array, jpeg)] == ["image_url"] * 3
    png_url, array_url, jpeg_url = (part["image_url"]["url"] for part in (png, array, jpeg))
    header, _, data = png_url.partition(",")
    assert header == "data:image/png;base64"
    assert decoded(data) == PNG
    header, _, data = array_url.partition(",")
    assert header == "data:image/png;base64"
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(decoded(data)))), PIXELS)
    header, _, data = jpeg_url.partition(",")
    assert header == "data:image/jpeg;base64"
    assert decoded(data) == JPEG


def test_gemini_images_are_inline_data(cache: Path) -> None:
    with FakeLLMServer("gemini") as server:
        client = open_chat_client("vision", make_params(server), cache)
        reply = client.chat(vision_request(PNG, JPEG))
        assert (reply.status, reply.text) == ("ok", f"prompt for: {QUESTION}")
        (sent,) = server.requests
    assert sent.body["systemInstruction"] == {"parts": [{"text": SYSTEM}]}
    (turn,) = sent.body["contents"]
    assert turn["role"] == "user"
    text, png, jpeg = turn["parts"]
    assert text == {"text": QUESTION}
    assert png["inline_data"]["mime_type"] == "image/png"
    assert decoded(png["inline_data"]["data"]) == PNG
    assert jpeg["inline_data"]["mime_type"] == "image/jpeg"
    assert decoded(jpeg["inline_data"]["data"]) == JPEG
    assert sent.body["generationConfig"] == {"temperature": 0.5, "maxOutputTokens": 64,
                                             "seed": 7}


def test_gemini_turns_and_no_system(cache: Path) -> None:
    with FakeLLMServer("gemini") as server:
        client = open_chat_client("chat", make_params(server), cache)
        turns = [ChatMessage.user("a", PNG), ChatMessage.assistant("b"), ChatMessage.user("c")]
        assert client.chat(turns).text == "prompt for: c"
        body = server.requests[0].body
    assert "systemInstruction" not in body
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    assert body["contents"][1]["parts"] == [{"text": "b"}]


# ---- cache -------------------------------------------------------------------------------------


def test_requests_differing_only_in_image_bytes_are_cached_apart(server: FakeLLMServer,
                                                                 cache: Path) -> None:
    first, second = vision_request(PNG), vision_request(OTHER_PNG)
    client = open_chat_client("vision", make_params(server), cache)
    replies = client.chat_many([first, second, first])
    assert [r.status for r in replies] == ["ok"] * 3
    assert replies[0].call_id != replies[1].call_id
    assert replies[2].call_id == replies[0].call_id
    assert server.request_count == 2  # the duplicate is sent once

    files = cache_files(cache)
    assert len(files) == 2
    recorded = {}
    for path in files:
        entry = json.loads(path.read_text())
        assert path.stem == entry["call_id"]
        (image,) = [part for part in entry["request"]["messages"][1]["parts"]
                    if "image_sha256" in part]
        recorded[image["image_sha256"]] = entry["call_id"]
        # Images are named by hash, never stored: the cache stays small and holds no pixels.
        assert base64.b64encode(PNG).decode()[:40] not in path.read_text()
        assert base64.b64encode(OTHER_PNG).decode()[:40] not in path.read_text()
    assert recorded == {sha256_bytes(PNG): replies[0].call_id,
                        sha256_bytes(OTHER_PNG): replies[1].call_id}

    again = open_chat_client("vision", make_params(server), cache).chat_many([second, first])
    assert [(r.cached, r.call_id) for r in again] == [(True, replies[1].call_id),
                                                       (True, replies[0].call_id)]
    assert server.request_count == 2


# ---- key hygiene -------------------------------------------------------------------------------


def test_key_never_leaks_with_images(server: FakeLLMServer, cache: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("ACRB_TEST_KEY", SECRET)
    client = open_chat_client("vision", make_params(server, api_key_env="ACRB_TEST_KEY",
                                                    max_attempts=2, concurrency=1), cache)
    server.push(
        Scripted(status=500, body=f"internal error for key {SECRET}"),  # retried, logged
        Scripted(),  # ok
        Scripted(status=400, body={"error": f"Incorrect API key provided: {SECRET}"}),
        Scripted(body=reply_body(server.protocol, "I'm sorry, but I can't help with that.")),
    )
    replies = client.chat_many([vision_request(PNG), vision_request(JPEG),
                                vision_request(PIXELS, OTHER_PNG)])
    assert [r.status for r in replies] == ["ok", "error", "refused"]
    assert any("HTTP 500" in record.getMessage() for record in caplog.records)
    assert SECRET not in caplog.text
    assert all(SECRET not in f"{r.reason} {r.text}" for r in replies)
    assert all(SECRET not in path.read_text() for path in cache_files(cache))
    assert SECRET not in json.dumps(client.describe())
    assert server.request_count == 4
    for sent in server.requests:
        # The key travels in a header only, never in a body that a server or proxy may log.
        assert SECRET not in json.dumps(sent.body)
        assert SECRET in (sent.headers.get("authorization", "")
                          + sent.headers.get("x-goog-api-key", ""))


# ---- text-only local models --------------------------------------------------------------------


def test_transformers_client_refuses_images_before_loading(tmp_path: Path) -> None:
    params = LLMBackendParams(kind="transformers", model=str(tmp_path / "no-model"))
    client = TransformersChatClient("local", params, tmp_path / "cache")
    with pytest.raises(ConfigError) as err:
        client.chat(vision_request(PNG))
    assert "text-only" in err.value.problem and "'local'" in err.value.problem
    with pytest.raises(ConfigError, match="text-only"):
        client.chat_many([text_messages(SYSTEM, "u"), vision_request(PNG)])
    assert client.request_count == 0
    assert not (tmp_path / "cache").exists()


# ---- the message type --------------------------------------------------------------------------


def test_message_parts() -> None:
    message = ChatMessage.user("look", PNG, PIXELS, JPEG, TextPart("and answer"))
    kinds = [type(p).__name__ for p in message.parts]
    assert kinds == ["TextPart", "ImagePart", "ImagePart", "ImagePart", "TextPart"]
    assert [image.mime_type for image in message.images] == ["image/png", "image/png",
                                                             "image/jpeg"]
    assert message.text == "look\nand answer"
    assert message.single_text is None
    assert message.images[0].sha256 == sha256_bytes(PNG)
    assert message.images[0].data_url() == "data:image/png;base64," + \
        base64.b64encode(PNG).decode()
    assert "bytes" in repr(message.images[0]) and PNG.hex()[:32] not in repr(message.images[0])
    assert as_system_user(text_messages("s", "u")) == ("s", "u")
    assert as_system_user(vision_request(PNG)) is None
    assert as_system_user([ChatMessage.user("u"), ChatMessage.system("s")]) is None


def test_bad_images_and_messages_are_refused() -> None:
    with pytest.raises(InputDataError, match="neither PNG nor JPEG"):
        ImagePart(b"GIF89a" + bytes(20))
    with pytest.raises(InputDataError, match="uint8"):
        ImagePart.from_array(PIXELS.astype(np.float32))
    with pytest.raises(InputDataError, match="shape"):
        ImagePart.from_array(PIXELS[..., 0])
    with pytest.raises(ValueError, match="images go in user messages"):
        ChatMessage("system", (TextPart("s"), ImagePart(PNG)))
    with pytest.raises(ValueError, match="at least one part"):
        ChatMessage.user()
    with pytest.raises(ValueError, match="role"):
        ChatMessage("tool", (TextPart("x"),))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ChatMessage.user(3.5)  # type: ignore[arg-type]
