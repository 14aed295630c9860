"""Local fake image-API servers for offline tests of the OpenAI and Gemini image adapters.

A :class:`FakeImageServer` speaks one provider's protocol on 127.0.0.1 (a free port, a daemon
thread), reached by the official SDK through its base URL. It answers each request with the
next queued :class:`~tests.llm_servers.Scripted` response, else with its ``responder``'s, else
with a success carrying a real PNG. Every request is kept as an :class:`ImageRequest`: path,
headers, the JSON body, and for OpenAI's multipart edits the form fields and every uploaded
file, so tests can assert on exactly what reached the provider.

    with FakeImageServer("openai") as server:
        server.push(Scripted(status=429, headers=FAST_RETRY), Scripted(body=openai_image()))
        ... OpenAIImagesConfig(base_url=server.base_url, ...) ...
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import io
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal

import numpy as np
from PIL import Image

from tests.llm_servers import LoopbackServer, Scripted, send_scripted

ImageProtocol = Literal["openai", "gemini"]
#: Makes the OpenAI SDK retry at once (it honours retry-after-ms).
FAST_RETRY = {"retry-after-ms": "5"}


def png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8), "RGB").save(buffer, "PNG")
    return buffer.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB")).copy()


def pattern_image(seed: int = 0, size: int = 24) -> np.ndarray:
    """A small RGB image that differs by ``seed``."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)


def openai_image(pixels: np.ndarray | None = None, *, usage: bool = True) -> dict[str, Any]:
    """An Images API success body: one b64_json PNG and, like gpt-image-1, token usage."""
    image = pattern_image() if pixels is None else pixels
    body: dict[str, Any] = {"created": 1_700_000_000,
                            "data": [{"b64_json": base64.b64encode(png_bytes(image)).decode()}]}
    if usage:
        body["usage"] = {"input_tokens": 50, "output_tokens": 4160, "total_tokens": 4210,
                         "input_tokens_details": {"text_tokens": 40, "image_tokens": 10}}
    return body


def openai_error(code: str, message: str, *, kind: str = "invalid_request_error"
                 ) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def gemini_image(pixels: np.ndarray | None = None, *, text: str | None = None,
                 finish_reason: str = "STOP") -> dict[str, Any]:
    """A generateContent success body with an inline PNG (and optional text) and usage."""
    image = pattern_image() if pixels is None else pixels
    parts: list[dict[str, Any]] = [] if text is None else [{"text": text}]
    parts.append({"inlineData": {"mimeType": "image/png",
                                 "data": base64.b64encode(png_bytes(image)).decode()}})
    return {"candidates": [{"content": {"role": "model", "parts": parts},
                            "finishReason": finish_reason, "index": 0}],
            "usageMetadata": {"promptTokenCount": 20, "candidatesTokenCount": 1290,
                              "totalTokenCount": 1310,
                              "candidatesTokensDetails": [{"modality": "IMAGE",
                                                           "tokenCount": 1290}]},
            "modelVersion": "fake-image-model"}


def gemini_no_image(*, text: str | None = None, finish_reason: str = "STOP",
                    finish_message: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"finishReason": finish_reason, "index": 0}
    if text is not None:
        candidate["content"] = {"role": "model", "parts": [{"text": text}]}
    if finish_message is not None:
        candidate["finishMessage"] = finish_message
    return {"candidates": [candidate], "modelVersion": "fake-image-model"}


def gemini_blocked(reason: str, message: str) -> dict[str, Any]:
    return {"promptFeedback": {"blockReason": reason, "blockReasonMessage": message},
            "modelVersion": "fake-image-model"}


@dataclass
class Upload:
    """One file part of a multipart request."""

    field: str
    filename: str | None
    content_type: str
    data: bytes


@dataclass
class ImageRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    raw: bytes
    json: Any = None  # the decoded JSON body, if it was JSON
    form: dict[str, list[str]] = field(default_factory=dict)  # multipart text fields
    files: list[Upload] = field(default_factory=list)  # multipart file parts, in order

    @property
    def prompt(self) -> str:
        """The prompt or instruction the request carries (either protocol)."""
        if self.form.get("prompt"):
            return self.form["prompt"][0]
        if isinstance(self.json, dict):
            if "prompt" in self.json:
                return str(self.json["prompt"])
            parts = self.json.get("contents", [{}])[-1].get("parts", [])
            return "\n".join(part["text"] for part in parts if "text" in part)
        return ""

    def input_images(self) -> list[np.ndarray]:
        """The images the request carries, in order (multipart files or inline parts)."""
        if self.files:
            return [decode_png(upload.data) for upload in self.files]
        if isinstance(self.json, dict) and "contents" in self.json:
            images = []
            for part in self.json["contents"][-1].get("parts", []):
                inline = part.get("inlineData") or part.get("inline_data")
                if inline:
                    data = inline["data"]
                    padded = data + "=" * (-len(data) % 4)
                    images.append(decode_png(base64.urlsafe_b64decode(padded)))
            return images
        return []


def parse_multipart(content_type: str, raw: bytes) -> tuple[dict[str, list[str]], list[Upload]]:
    """The text fields and file parts of a multipart/form-data body."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
    form: dict[str, list[str]] = {}
    files: list[Upload] = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        if filename is not None or part.get_content_type() != "text/plain":
            files.append(Upload(str(name), filename, part.get_content_type(), data))
        else:
            form.setdefault(str(name), []).append(data.decode())
    return form, files


class FakeImageServer(LoopbackServer):
    """A scripted OpenAI-images- or Gemini-shaped HTTP server on 127.0.0.1; a context manager."""

    def __init__(self, protocol: ImageProtocol,
                 responder: Callable[[ImageRequest], Scripted | None] | None = None) -> None:
        self.protocol = protocol
        self.responder = responder
        self.requests: list[ImageRequest] = []
        self._script: deque[Scripted] = deque()
        self._lock = threading.Lock()
        super().__init__()

    def push(self, *responses: Scripted) -> None:
        """Queue responses, answered in order to the next requests."""
        with self._lock:
            self._script.extend(responses)

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        root = f"http://127.0.0.1:{self.port}"
        return f"{root}/v1" if self.protocol == "openai" else root

    def default_reply(self, request: ImageRequest) -> Scripted:
        """A success: an edit gets its first input image back mirrored, a generation a pattern
        seeded by the prompt's length."""
        inputs = request.input_images()
        pixels = (np.ascontiguousarray(inputs[0][:, ::-1]) if inputs
                  else pattern_image(len(request.prompt)))
        body = openai_image(pixels) if self.protocol == "openai" else gemini_image(pixels)
        return Scripted(body=body)

    def _next(self, request: ImageRequest) -> Scripted:
        with self._lock:
            self.requests.append(request)
            scripted = self._script.popleft() if self._script else None
        if scripted is None and self.responder is not None:
            scripted = self.responder(request)
        if scripted is None or (scripted.status == 200 and scripted.body is None):
            reply = self.default_reply(request)
            if scripted is not None:
                reply = Scripted(body=reply.body, headers=scripted.headers, delay=scripted.delay)
            scripted = reply
        return scripted

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = ImageRequest(method="POST", path=self.path, headers=headers, raw=raw)
                content_type = headers.get("content-type", "")
                if content_type.startswith("multipart/form-data"):
                    request.form, request.files = parse_multipart(content_type, raw)
                else:
                    try:
                        request.json = json.loads(raw.decode("utf-8"))
                    except ValueError:
                        request.json = None
                send_scripted(self, server._next(request))

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
