"""Running a tool: one uvicorn worker in this process, and the warning for a non-loopback host.

One worker, because a tool's store keeps per-process state (its connections); several
curators or raters are served by that worker's thread pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp

#: The ``--host`` values that keep a tool on this machine.
LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1")


def exposure_warning(host: str) -> str | None:
    """The warning to show before listening on ``host``, or None for a loopback address:
    anyone who can reach another address can try tokens, and the tools have no TLS."""
    if host in LOOPBACK_ADDRESSES:
        return None
    return (f"warning: listening on {host}: anyone who can reach this address can try "
            "tokens; the tool has no TLS")


def serve(app: ASGIApp, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run ``app`` on ``host:port`` until interrupted (uvicorn, one worker, no Server
    header). Build ``app`` with ``allowed_hosts=local_hosts(host)`` so it answers there."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)
