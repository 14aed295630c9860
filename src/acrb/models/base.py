"""The Editor protocol: a batch of requests in, one outcome per request out.

Nothing else in ACRB knows how a particular model is called. An adapter declares a typed
``Config`` (pydantic, unknown keys rejected), reports a ``revision`` that pins its weights, and
turns each :class:`EditRequest` into an :class:`EditOutcome`: an image, an explicit refusal
(API policy error and its message) or an error (crash, timeout). A black or unchanged image is
returned as ``ok``: deciding that it is a refusal is the detectors' job, as for a real model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from acrb.errors import ConfigError


class EditorConfig(BaseModel):
    """Base of adapter configs: unknown keys are an error that names the valid ones."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class EditRequest:
    """One edit to perform. ``source_attributes`` (race, gender, age) is exposed only so that
    simulated editors can plant group-dependent behaviour; real adapters must ignore it."""

    request_id: str
    prompt_id: str
    prompt_text: str
    category: str
    attribute: str
    seed: int
    source_image: np.ndarray
    source_attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EditOutcome:
    status: Literal["ok", "refused", "error"]
    image: np.ndarray | None = None
    refusal_kind: str | None = None
    message: str = ""


class Editor(ABC):
    """An image editing model behind a uniform, batched interface."""

    Config: ClassVar[type[EditorConfig]] = EditorConfig
    #: True for instruments with planted behaviour; reports label their results as simulated.
    simulated: ClassVar[bool] = False

    def __init__(self, key: str, config: EditorConfig, pinned_revision: str | None = None) -> None:
        self.key = key
        self.config = config
        self.pinned_revision = pinned_revision

    @classmethod
    def resolve_revision(cls, key: str, config: EditorConfig, pinned_revision: str | None) -> str:
        """Pinned identity of the weights or service version; part of every request_id.

        A classmethod so that planning can compute request ids without loading weights. By
        default the revision pinned in params (``models.<name>.revision``) is required.
        """
        if not pinned_revision:
            raise ConfigError(
                f"model '{key}' has no pinned revision",
                "set models.<name>.revision in params.yaml (a commit hash or dated version)",
            )
        return pinned_revision

    @classmethod
    def check_categories(cls, name: str, config: EditorConfig, categories: set[str]) -> None:
        """Raise a ConfigError if this editor cannot take prompts of ``categories``; a
        classmethod so that planning can check without loading weights. Real editors take any
        prompt."""
        return None

    @property
    def revision(self) -> str:
        return self.resolve_revision(self.key, self.config, self.pinned_revision)

    @abstractmethod
    def edit(self, requests: Sequence[EditRequest]) -> list[EditOutcome]:
        """Return exactly one outcome per request, in order."""

    def library_versions(self) -> dict[str, Any]:
        """Versions of the packages that produced outputs (recorded per generation)."""
        return {}
