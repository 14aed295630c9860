"""Local fake LLM HTTP servers for offline tests of the chat backends.

A :class:`FakeLLMServer` listens on 127.0.0.1 (a free port) in a daemon thread and answers each
request with the next scripted :class:`Scripted` response, or, once the script is used up (or
for a 200 scripted without a body), with a normal reply that echoes the user message
(``"prompt for: <user>"``). Every request is recorded (path, headers, JSON body).

    with FakeLLMServer("openai") as server:
        server.push(Scripted(status=500), Scripted(body=openai_reply("hello")))
        ... LLMBackendParams(kind="openai", base_url=server.base_url, ...) ...
        assert server.request_count == 2
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Self

Protocol = Literal["openai", "gemini"]


def openai_reply(text: str | None, *, finish_reason: str = "stop",
                 refusal: str | None = None) -> dict[str, Any]:
    """A chat-completions response body in OpenAI's shape."""
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "fake-model",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": refusal},
            "finish_reason": finish_reason,
        }],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def gemini_reply(text: str | None, *, finish_reason: str = "STOP") -> dict[str, Any]:
    """A generateContent response body in Gemini's shape (text split over two parts)."""
    candidate: dict[str, Any] = {"finishReason": finish_reason, "index": 0}
    if text is not None:
        half = len(text) // 2
        candidate["content"] = {"role": "model",
                                "parts": [{"text": text[:half]}, {"text": text[half:]}]}
    return {"candidates": [candidate], "modelVersion": "fake-model"}


def gemini_blocked(reason: str = "SAFETY") -> dict[str, Any]:
    """A generateContent body for a prompt blocked before generation."""
    return {"promptFeedback": {"blockReason": reason}}


def reply_body(protocol: Protocol, text: str | None) -> dict[str, Any]:
    """A normal reply in the given protocol's shape."""
    return openai_reply(text) if protocol == "openai" else gemini_reply(text)


@dataclass
class Scripted:
    """One scripted response: status, body (dict/list → JSON, str/bytes sent as-is), headers, delay.

    A 200 with ``body=None`` gets the normal echo reply.
    """

    status: int = 200
    body: dict[str, Any] | list[Any] | str | bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # decoded JSON, or the raw text when it is not JSON


def user_text(protocol: Protocol, body: Any) -> str:
    """The text of the last user message of a recorded request body (its text parts joined
    by newlines when it also carries images)."""
    if protocol == "openai":
        content = body["messages"][-1]["content"]
        if isinstance(content, str):
            return content
        texts = [part["text"] for part in content if part["type"] == "text"]
    else:
        texts = [part["text"] for part in body["contents"][-1]["parts"] if "text" in part]
    if not texts:
        raise KeyError("no text part")
    return "\n".join(texts)


def send_scripted(handler: BaseHTTPRequestHandler, scripted: Scripted) -> None:
    """Answer the request ``handler`` holds with ``scripted``: after its delay, its status,
    headers and body (JSON for a dict or list); a client that gave up meanwhile (a timeout
    test) is left alone."""
    if scripted.delay:
        time.sleep(scripted.delay)
    payload = scripted.body
    if isinstance(payload, (dict, list)):
        data = json.dumps(payload).encode()
    elif isinstance(payload, str):
        data = payload.encode()
    else:
        data = payload or b""
    try:
        handler.send_response(scripted.status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for name, value in scripted.headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


class LoopbackServer:
    """An HTTP server on 127.0.0.1 (a free port) in a daemon thread, for ``with`` blocks: a
    subclass provides the request handler class (:meth:`_handler_class`)."""

    def __init__(self) -> None:
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    def start(self) -> Self:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True,
                         kwargs={"poll_interval": 0.05}).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError


class FakeLLMServer(LoopbackServer):
    """A scripted OpenAI- or Gemini-shaped HTTP server on 127.0.0.1; a context manager."""

    def __init__(self, protocol: Protocol = "openai",
                 responder: Callable[[str], Scripted] | None = None) -> None:
        """``responder``, if given, answers requests that no scripted response is queued for,
        from the user message; otherwise they get the echo reply."""
        self.protocol = protocol
        self.responder = responder
        self.requests: list[Recorded] = []
        self._script: deque[Scripted] = deque()
        self._lock = threading.Lock()
        super().__init__()

    # ---- control ------------------------------------------------------------------------------

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
        """What to put in ``base_url``: OpenAI-compatible servers live under /v1."""
        root = f"http://127.0.0.1:{self.port}"
        return f"{root}/v1" if self.protocol == "openai" else root

    # ---- serving ------------------------------------------------------------------------------

    def _next(self, recorded: Recorded) -> Scripted:
        with self._lock:
            self.requests.append(recorded)
            scripted = self._script.popleft() if self._script else None
        if scripted is None:
            try:
                user = user_text(self.protocol, recorded.body)
            except (KeyError, IndexError, TypeError):
                user = None
            scripted = self.responder(user) if self.responder and user is not None else Scripted()
        if scripted.status == 200 and scripted.body is None:
            # No body given: the normal echo reply (after any scripted delay or headers).
            try:
                text = f"prompt for: {user_text(self.protocol, recorded.body)}"
            except (KeyError, IndexError, TypeError):
                return Scripted(status=400, body={"error": {"message": "bad request"}})
            scripted = Scripted(body=reply_body(self.protocol, text), headers=scripted.headers,
                                delay=scripted.delay)
        return scripted

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode("utf-8", "replace")
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw
                recorded = Recorded(method="POST", path=self.path, body=body,
                                    headers={k.lower(): v for k, v in self.headers.items()})
                send_scripted(self, server._next(recorded))

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        return Handler
