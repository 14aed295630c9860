"""The model protocols: a batch of requests in, one outcome per request out.

Nothing else in ACRB knows how a particular model is called. There are two kinds of model
under audit, with one shared base (:class:`ImageModel`):

* an :class:`Editor` (image to image) turns each :class:`EditRequest` (an instruction and one or
  several source portraits) into an :class:`Outcome`;
* a :class:`Generator` (text to image) turns each :class:`GenerationRequest` (a prompt) into an
  :class:`Outcome`.

An adapter declares a typed ``Config`` (pydantic, unknown keys rejected), reports a
``revision`` that pins its weights, and returns for each request an image, an explicit refusal
(API policy error, with the provider's code and message kept verbatim, or a safety filter that
blanked the image) or an error (crash, timeout, rate limit after retries). A black or unchanged
image returned without a refusal signal is ``ok``: deciding that it is a refusal is the
detectors' job, as for any model.

The code under audit never sees the labels it is audited on: a request carries the images and
the text, never the race, gender or age of the people pictured, nor the prompt's category or
attribute. Simulated models, whose planted behaviour depends on those labels, get them through
their own channel (:meth:`Simulated.attach_design`), which the generate stage opens only for
subclasses of :class:`Simulated`.
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

#: What a model does: edit source images (i2i) or generate from text alone (t2i).
Task = Literal["i2i", "t2i"]


class ModelConfig(BaseModel):
    """Base of adapter configs: unknown keys are an error that names the valid ones."""

    model_config = ConfigDict(extra="forbid")


#: The name the editor adapters have always used for their config base.
EditorConfig = ModelConfig


@dataclass(frozen=True)
class EditRequest:
    """One edit to perform: what a real image editor needs, and nothing else.

    ``request_id`` names the request (a content hash, see :func:`acrb.records.request_id_for`);
    ``instruction`` is the edit instruction as the user of the model would type it; ``seed``
    seeds the model's sampling; ``source_image`` is the portrait to edit, an RGB uint8 array of
    shape (height, width, 3); ``extra_images`` are further portraits shown with it, in order
    (the WinoBias experiment edits a male and a female portrait together). No demographic label
    of a source, and no prompt id, category or attribute: an audited model must not be able to
    condition on them.
    """

    request_id: str
    instruction: str
    seed: int
    source_image: np.ndarray
    extra_images: tuple[np.ndarray, ...] = ()

    @property
    def source_images(self) -> tuple[np.ndarray, ...]:
        """Every image of the request, the primary source first."""
        return (self.source_image, *self.extra_images)


@dataclass(frozen=True)
class GenerationRequest:
    """One text-to-image generation: the prompt as a user would type it, and the seed."""

    request_id: str
    prompt: str
    seed: int


@dataclass(frozen=True)
class Outcome:
    """What a model returned for one request.

    ``status`` is ``ok`` (an image), ``refused`` (the model or its provider declined:
    ``refusal_kind`` says how, e.g. ``policy`` or ``safety_filter``; ``refusal_code`` and
    ``message`` keep the provider's code and text verbatim) or ``error`` (no answer: a crash, a
    timeout, a 5xx or 429 after retries; never counted as a refusal). ``seconds`` and
    ``peak_gpu_memory_mb`` are what the adapter measured for this request (None: the stage
    records the batch's time divided by its size, and no memory); ``cost_usd`` is the
    provider's reported or list price where known.
    """

    status: Literal["ok", "refused", "error"]
    image: np.ndarray | None = None
    refusal_kind: str | None = None
    message: str = ""
    refusal_code: str | None = None
    seconds: float | None = None
    peak_gpu_memory_mb: float | None = None
    cost_usd: float | None = None


#: The name the editor adapters have always used for their outcome.
EditOutcome = Outcome


@dataclass(frozen=True)
class RecordedSeconds:
    """A model's seconds per request on named hardware, and where the figure comes from."""

    seconds: float
    hardware: str
    source: str


class ImageModel(ABC):
    """What every model under audit shares: a typed config, a pinned revision, the checks that
    planning runs without loading weights, and the versions recorded with each output."""

    Config: ClassVar[type[ModelConfig]] = ModelConfig
    #: True for instruments with planted behaviour; reports label their results as simulated.
    simulated: ClassVar[bool] = False
    #: i2i models get instructions and source images; t2i models get prompts alone.
    task: ClassVar[Task]
    #: How many source images one request may show the model (0 for text-to-image).
    max_source_images: ClassVar[int] = 1
    #: Seconds one request takes, as recorded on named hardware (with where the figure comes
    #: from); planning estimates GPU-hours from it. None when no figure is recorded.
    recorded_seconds: ClassVar[RecordedSeconds | None] = None
    #: The version of the adapter's own code where it decides an output: bump it when a change
    #: to the adapter (not to the weights, which the revision pins) makes the same request come
    #: out differently. Each generation record keeps it, and ``generate`` makes a finished
    #: request again when its record was made by another version (same request id, so a
    #: simulated model draws the same outcome); None for an adapter that passes requests to
    #: the weights unchanged.
    output_version: ClassVar[int | None] = None

    def __init__(self, key: str, config: ModelConfig, pinned_revision: str | None = None) -> None:
        self.key = key
        self.config = config
        self.pinned_revision = pinned_revision

    @classmethod
    def resolve_revision(cls, key: str, config: ModelConfig, pinned_revision: str | None) -> str:
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

    #: Config fields that change how a model is run but not what it returns (where and how
    #: fast it runs, how it is reached, what it costs): left out of :meth:`output_config`, so
    #: that changing them resumes finished requests instead of redoing them.
    runtime_fields: ClassVar[frozenset[str]] = frozenset({
        "batch_size", "device", "cpu_offload", "local_files_only", "api_key_env", "base_url",
        "timeout_s", "max_retries", "retry_initial_delay_s", "requests_per_minute",
        "concurrency", "prices", "max_input_images", "latency_seconds",
    })

    @classmethod
    def output_config(cls, config: ModelConfig) -> dict[str, Any]:
        """The config values that change this model's outputs (steps, guidance, resolution,
        the API model and size, ...): part of every request_id, so that a run with other
        settings never reuses images made with the old ones. Every field but
        :attr:`runtime_fields` by default; an adapter whose revision already covers its config
        returns ``{}``."""
        return config.model_dump(mode="json", exclude=set(cls.runtime_fields))

    @classmethod
    def id_config(cls, config: ModelConfig, arm: str, experiment: str) -> dict[str, Any]:
        """What of ``config`` enters the id of a request in ``arm`` of ``experiment``: the
        :meth:`output_config` for every request by default. A simulated model whose planted
        values for the feature arm or WinoBias change only those requests says so here, so
        that the audit's own requests keep their ids when those values change."""
        return cls.output_config(config)

    @classmethod
    def check_categories(cls, name: str, config: ModelConfig, categories: set[str]) -> None:
        """Raise a ConfigError if this model cannot take prompts of ``categories``; a
        classmethod so that planning can check without loading weights. Real models take any
        prompt."""
        return None

    @classmethod
    def source_image_limit(cls, config: ModelConfig) -> int:
        """How many source images one request may carry with ``config`` (default
        :attr:`max_source_images`; an adapter whose limit depends on its config overrides
        this)."""
        return cls.max_source_images

    @classmethod
    def check_source_count(cls, name: str, config: ModelConfig, count: int) -> None:
        """Raise a ConfigError at planning time if a request with ``count`` source images is
        more than this model takes, naming the model and the fix."""
        limit = cls.source_image_limit(config)
        if count > limit:
            shown = "no source image" if limit == 0 else (
                "one source image" if limit == 1 else f"at most {limit} source images")
            raise ConfigError(
                f"model '{name}' ({cls.__name__}) takes {shown} per request, but the plan has "
                f"requests with {count}",
                f"leave the prompts that show {count} portraits out of plan.prompt_sets for this "
                "model, or audit them with a model that takes several input images",
            )

    @property
    def revision(self) -> str:
        return self.resolve_revision(self.key, self.config, self.pinned_revision)

    def library_versions(self) -> dict[str, Any]:
        """Versions of the packages that produced outputs (recorded per generation)."""
        return {}

    def load(self) -> Any:
        """Load weights or open clients now. The generate stage calls it once before the first
        batch, so that a model that cannot load stops the stage with the reason instead of
        ending every request in ``error``. Nothing to do by default."""
        return None


class Editor(ImageModel):
    """An image editing model behind a uniform, batched interface."""

    task: ClassVar[Task] = "i2i"

    @abstractmethod
    def edit(self, requests: Sequence[EditRequest]) -> list[Outcome]:
        """Return exactly one outcome per request, in order."""


class Generator(ImageModel):
    """A text-to-image model behind a uniform, batched interface."""

    task: ClassVar[Task] = "t2i"
    max_source_images: ClassVar[int] = 0

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Outcome]:
        """Return exactly one outcome per request, in order."""


class Simulated:
    """A model whose behaviour is planted per prompt and source group: an instrument that tests
    the audit, never a model under audit. Mixed into :class:`SimulatedEditor` and
    :class:`SimulatedGenerator`.

    Its planted state depends on what an audited model must not see (the prompt's category and
    attribute, the source's race, gender and age), so it gets the plan rows of its requests
    through :meth:`attach_design` before it is called. The generate stage calls
    :meth:`attach_design` only on instances of this class; subclasses cannot unset
    ``simulated``, so every model that sees the labels is labelled a simulation in the results.
    """

    simulated: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.simulated:
            raise TypeError(f"{cls.__name__} is a simulated model: it cannot set simulated = "
                            "False (it sees the labels an audited model must not)")

    def __init__(self, key: str, config: ModelConfig, pinned_revision: str | None = None) -> None:
        super().__init__(key, config, pinned_revision)  # type: ignore[call-arg]
        self._design: dict[str, RequestRecord] = {}

    def attach_design(self, design: Mapping[str, RequestRecord]) -> None:
        """Add the plan rows (prompt id, category, attribute, race, gender, age, ...) of
        requests this model will be given, keyed by request_id."""
        self._design.update(design)

    def design_of(self, request: EditRequest | GenerationRequest) -> RequestRecord:
        """The plan row attached for ``request``; a LookupError if none was attached."""
        try:
            return self._design[request.request_id]
        except KeyError:
            raise LookupError(
                f"{type(self).__name__} has no design for request {request.request_id}: attach "
                "the plan rows of its requests with attach_design() before calling it"
            ) from None


class SimulatedEditor(Simulated, Editor):
    """An editor with planted behaviour (see :class:`Simulated`)."""


class SimulatedGenerator(Simulated, Generator):
    """A text-to-image generator with planted behaviour (see :class:`Simulated`)."""
