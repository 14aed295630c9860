"""Running a tool: one uvicorn worker in this process, and the warning for a non-loopback host.

One worker, because a tool's store keeps per-process state (its connections); several
curators or raters are served by that worker's thread pool.

Proxy headers are off unless the user names the proxies to trust: uvicorn otherwise believes
``X-Forwarded-For`` and ``X-Forwarded-Proto`` from 127.0.0.1, and every client reaching the
tool through an SSH tunnel arrives from 127.0.0.1, so a client could pick its own address
for each request and escape the login throttle (keyed by client address), or its own scheme.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module
from typing import TYPE_CHECKING, Any

from acrb.errors import ConfigError

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

#: What a web tool imports beyond the core install: (package to install, modules that provide
#: it; any one will do). Starlette parses forms with python-multipart only when a form
#: arrives, so without this check a tool would start and answer 500 at the first login.
WEB_PACKAGES = (("starlette", ("starlette",)), ("uvicorn", ("uvicorn",)),
                ("python-multipart", ("python_multipart", "multipart.multipart")))

#: The ``--host`` values that keep a tool on this machine.
LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1")


def exposure_warning(host: str) -> str | None:
    """The warning to show before listening on ``host``, or None for a loopback address:
    anyone who can reach another address can try tokens, and the tools have no TLS."""
    if host in LOOPBACK_ADDRESSES:
        return None
    return (f"warning: listening on {host}: anyone who can reach this address can try "
            "tokens; the tool has no TLS")


def server_options(host: str = "127.0.0.1", port: int = 8765,
                   trusted_proxies: Sequence[str] = ()) -> dict[str, Any]:
    """uvicorn's settings for a tool on ``host:port``: warnings only, no Server header, and
    proxy headers read only from the addresses in ``trusted_proxies`` (a reverse proxy the
    user put in front of the tool); with none, not at all, so the client address the tool
    sees (and throttles logins by) is the connection's own peer."""
    proxies = [address.strip() for address in trusted_proxies if address.strip()]
    return {"host": host, "port": port, "log_level": "warning", "server_header": False,
            "proxy_headers": bool(proxies), "forwarded_allow_ips": proxies}


def server_config(app: ASGIApp, host: str = "127.0.0.1", port: int = 8765,
                  trusted_proxies: Sequence[str] = ()) -> uvicorn.Config:
    """The uvicorn configuration :func:`serve` runs ``app`` under (:func:`server_options`)."""
    import uvicorn

    return uvicorn.Config(app, **server_options(host, port, trusted_proxies))


def serve(app: ASGIApp, host: str = "127.0.0.1", port: int = 8765,
          trusted_proxies: Sequence[str] = ()) -> None:
    """Run ``app`` on ``host:port`` until interrupted (uvicorn, one worker, no Server
    header, proxy headers only from ``trusted_proxies``: see :func:`server_options`). Build
    ``app`` with ``allowed_hosts=local_hosts(host)`` so it answers there."""
    import uvicorn

    uvicorn.run(app, **server_options(host, port, trusted_proxies))


def require_web_extra(command: str, extra: str) -> None:
    """Refuse to start ``command`` (``acrb curate serve``) when a package of its optional
    ``extra`` is missing: :class:`~acrb.errors.ConfigError` naming the packages and the
    install command."""
    missing = [package for package, modules in WEB_PACKAGES
               if not any(_importable(module) for module in modules)]
    if missing:
        raise ConfigError(f"`{command}` needs {', '.join(missing)} (the `{extra}` extra), "
                          "which is not installed",
                          f'pip install -e ".[{extra}]"')


def _importable(module: str) -> bool:
    try:
        import_module(module)
    except ImportError:
        return False
    return True
