"""The Editor protocol: a batch of requests in, one outcome per request out.

Nothing else in ACRB knows how a particular model is called. An adapter declares a typed
``Config`` (pydantic, unknown keys rejected), reports a ``revision`` that pins its weights, and
turns each :class:`EditRequest` into an :class:`EditOutcome`: an image, an explicit refusal
(API policy error and its message) or an error (crash, timeout). A black or unchanged image is
returned as ``ok``: deciding that it is a refusal is the detectors' job, as for a real model.

The code under audit never sees the labels it is audited on: a request carries the image and
the instruction, never the race, gender or age of the person pictured, nor the prompt's
category or attribute. Simulated editors, whose planted behaviour depends on those labels, get
them through their own channel (:meth:`SimulatedEditor.attach_design`), which the generate
stage opens only for subclasses of :class:`SimulatedEditor`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from acrb.errors import ConfigError
from acrb.records import RequestRecord


class EditorConfig(BaseModel):
    """Base of adapter configs: unknown keys are an error that names the valid ones."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class EditRequest:
    """One edit to perform: what a real image editor needs, and nothing else.

    ``request_id`` names the request (a content hash, see :func:`acrb.records.request_id_for`);
    ``instruction`` is the edit instruction as the user of the model would type it; ``seed``
    seeds the model's sampling; ``source_image`` is the portrait to edit, an RGB uint8 array of
    shape (height, width, 3). No demographic label of the source, and no prompt id, category or
    attribute: an audited model must not be able to condition on them. (Requests that show the
    model several images will add a field beside ``source_image``.)
    """

    request_id: str
    instruction: str
    seed: int
    source_image: np.ndarray


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


class SimulatedEditor(Editor):
    """An editor whose behaviour is planted per prompt and source group: an instrument that
    tests the audit, never a model under audit.

    Its planted state depends on what an audited model must not see (the prompt's category and
    the source's race, gender and age), so it gets the plan rows of its requests through
    :meth:`attach_design` before :meth:`edit`. The generate stage calls :meth:`attach_design`
    only on instances of this class; subclasses cannot unset ``simulated``, so every editor that
    sees the labels is labelled a simulation in the results.
    """

    simulated: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.simulated:
            raise TypeError(f"{cls.__name__} is a SimulatedEditor: it cannot set simulated = "
                            "False (it sees the labels an audited model must not)")

    def __init__(self, key: str, config: EditorConfig, pinned_revision: str | None = None) -> None:
        super().__init__(key, config, pinned_revision)
        self._design: dict[str, RequestRecord] = {}

    def attach_design(self, design: Mapping[str, RequestRecord]) -> None:
        """Add the plan rows (prompt id, category, attribute, race, gender, age, ...) of
        requests this editor will be given, keyed by request_id."""
        self._design.update(design)

    def design_of(self, request: EditRequest) -> RequestRecord:
        """The plan row attached for ``request``; a LookupError if none was attached."""
        try:
            return self._design[request.request_id]
        except KeyError:
            raise LookupError(
                f"{type(self).__name__} has no design for request {request.request_id}: attach "
                "the plan rows of its requests with attach_design() before edit()"
            ) from None
