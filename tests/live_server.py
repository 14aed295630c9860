"""An ASGI app served by uvicorn on a free port of 127.0.0.1 in a background thread.

For tests that need real HTTP: concurrent clients, raw request bytes, a real browser. The
socket is bound before the server starts, so the port is known and never raced for::

    with LiveServer(create_app(store)) as server:
        httpx.get(server.url + "/login")

The app must answer to Host ``127.0.0.1`` (the web tools' default allowed hosts do).
"""

from __future__ import annotations

import re
import shutil
import socket
import threading
import time
from types import TracebackType

import uvicorn
from starlette.types import ASGIApp


class LiveServer:
    """``app`` on ``http://127.0.0.1:<port>`` (``port=0``: a free one) while in the ``with``."""

    def __init__(self, app: ASGIApp, port: int = 0, *, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", port))
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", server_header=False,
                                timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name=f"acrb-live-server-{self.port}", daemon=True)

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + self.timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"the server on port {self.port} did not start")
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout):
            pass
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop()

    def _stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(self.timeout)
        self._socket.close()


#: The system's Chromium for the browser tests (Debian's `chromium`), or None.
CHROMIUM = next((found for name in ("chromium", "chromium-browser")
                 if (found := shutil.which(name))), None)
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token of a web tool's form page."""
    found = _CSRF.search(html)
    assert found, "no csrf field in the page"
    return found.group(1)
