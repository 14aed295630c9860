"""The model registry: registry keys users type in params.yaml, mapped to lazy import targets.

Entries are ``"module:Class"`` strings, so a heavy backend (torch, diffusers) is imported only
when its key is used. Third-party packages can add models through the ``acrb.models`` entry
point group (name = registry key, value = ``module:Class``).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from acrb.errors import ConfigError

if TYPE_CHECKING:
    from acrb.models.base import Editor

_BUILTIN: dict[str, str] = {
    "synthetic:fair": "acrb.models.synthetic:SyntheticEditor",
    "synthetic:biased": "acrb.models.synthetic:SyntheticEditor",
}
_REGISTERED: dict[str, str] = {}


def register_model(key: str, target: str) -> None:
    """Register ``key`` -> ``"module:Class"`` (an :class:`~acrb.models.base.Editor` subclass)."""
    if ":" not in target:
        raise ValueError(f"model target must look like 'module:Class', got {target!r}")
    _REGISTERED[key] = target


def model_keys() -> dict[str, str]:
    """All known registry keys and their import targets."""
    keys = dict(_BUILTIN)
    for entry in entry_points(group="acrb.models"):
        keys.setdefault(entry.name, entry.value)
    keys.update(_REGISTERED)
    return dict(sorted(keys.items()))


def check_model_key(key: str) -> str:
    """Return ``key`` if it is registered, else raise a ConfigError listing the valid keys."""
    known = model_keys()
    if key not in known:
        raise ConfigError(
            f"unknown model key '{key}'",
            "use one of: " + ", ".join(known) + " (or register a new adapter with "
            "acrb.models.registry.register_model or an 'acrb.models' entry point)",
        )
    return key


def editor_class(key: str) -> type[Editor]:
    """Import and return the Editor class registered under ``key``."""
    check_model_key(key)
    module_name, _, class_name = model_keys()[key].partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name)  # type: ignore[no-any-return]
