"""Running a tool: one uvicorn worker in this process, and the warning for a non-loopback host.

One worker, because a tool's store keeps per-process state (its connections); several
curators or raters are served by that worker's thread pool.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from acrb.errors import ConfigError

if TYPE_CHECKING:
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


def serve(app: ASGIApp, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run ``app`` on ``host:port`` until interrupted (uvicorn, one worker, no Server
    header). Build ``app`` with ``allowed_hosts=local_hosts(host)`` so it answers there."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)


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
