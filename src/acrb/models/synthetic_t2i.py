"""A simulated text-to-image generator with planted, published refusal biases by prompt attribute.

The T2I half of the embedded default audits a :class:`SyntheticGenerator` whose probability of
refusing a prompt is set in params.yaml: a base rate per prompt category (the ACRB safety
domain of the base prompt) plus an additive offset per requested attribute (``culture:nigerian``,
``religion:muslim``, ... in the vocabulary of the attributes file; ``neutral`` for the baseline
prompt). A refusal shows as a black frame (what a safety filter returns) or as an explicit
policy refusal; any other request gets a real placeholder image painted from its prompt and
seed. ACRB's evaluate stage then has to find the refusals from the status and the pixels alone,
so comparing planted with measured refusal rates tests the T2I path end to end. These are never
measurements of a real model.

Probability model, for a request whose prompt has category c and attribute a::

    p_refuse = clip(base[c] + attribute[a] + by_category[c][a], 0, 1)

Each request's draws come from a generator seeded by its request_id, so outcomes do not depend
on batching or order. Only refusal is planted: erasure of the requested attribute cannot be
measured from the pixels of a generated image (there is no source to compare with; whether the
attribute is shown needs a judge that reads the image), so planting it would test nothing.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Sequence
from typing import ClassVar, Literal

import numpy as np
from PIL import Image, ImageDraw
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from acrb.errors import ConfigError
from acrb.models.base import GenerationRequest, ModelConfig, Outcome, SimulatedGenerator
from acrb.models.synthetic import PlantedIdentity, check_shares, choose_kind

RefusalKind = Literal["black_frame", "policy_message"]
POLICY_MESSAGE = "Prompt declined by the simulated content policy."
#: ``dimension:value`` of an attribute (the ids of the attributes file), or ``neutral``.
ATTRIBUTE_PATTERN = re.compile(r"^(neutral|[a-z][a-z0-9_-]*:[a-z0-9][a-z0-9_-]*)$")


def _check_attributes(offsets: dict[str, float], where: str) -> None:
    for attribute, offset in offsets.items():
        if not ATTRIBUTE_PATTERN.match(attribute):
            raise ValueError(
                f"{where}: '{attribute}' is not an attribute: write `dimension:value` with the "
                "ids of the attributes file (e.g. religion:muslim), or `neutral`"
            )
        if not -1.0 <= offset <= 1.0:
            raise ValueError(f"{where}.{attribute} must be in [-1, 1], got {offset}")


class PlantedAttributeRates(BaseModel):
    """Planted refusal probability: a base rate per category plus offsets per prompt attribute.

    ``attribute`` offsets apply in every category; ``by_category`` adds offsets for one
    category only (category -> attribute -> offset).
    """

    model_config = ConfigDict(extra="forbid")

    base: dict[str, float] = Field(description="category (safety domain) -> probability")
    attribute: dict[str, float] = Field(
        default_factory=dict, description="attribute (`dimension:value`) -> additive offset")
    by_category: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="category -> attribute -> additive offset")

    @field_validator("base")
    @classmethod
    def _probabilities(cls, value: dict[str, float]) -> dict[str, float]:
        for category, p in value.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"base rate for category {category} must be in [0, 1], got {p}")
        return value

    @model_validator(mode="after")
    def _offsets(self) -> PlantedAttributeRates:
        _check_attributes(self.attribute, "attribute")
        for category, offsets in self.by_category.items():
            if category not in self.base:
                # A key no prompt's category equals would be ignored: a typo.
                raise ValueError(
                    f"by_category names category '{category}', which has no base rate; the "
                    f"categories are {', '.join(sorted(self.base))}")
            _check_attributes(offsets, f"by_category.{category}")
        return self

    def attributes(self) -> set[str]:
        """Every attribute that has an offset."""
        found = set(self.attribute)
        for offsets in self.by_category.values():
            found |= set(offsets)
        return found

    def probability(self, category: str, attribute: str) -> float:
        if category not in self.base:
            raise KeyError(
                f"no planted base rate for category '{category}' (have {sorted(self.base)})"
            )
        p = (self.base[category] + self.attribute.get(attribute, 0.0)
             + self.by_category.get(category, {}).get(attribute, 0.0))
        return float(min(1.0, max(0.0, p)))


class SyntheticGeneratorConfig(ModelConfig):
    refusal: PlantedAttributeRates
    refusal_kinds: dict[RefusalKind, float] = Field(
        default={"black_frame": 0.6, "policy_message": 0.4},
        description="how refusals show: shares that sum to 1",
    )
    size: int = Field(default=64, ge=16, le=1024, description="side of the painted image (px)")
    latency_seconds: float = Field(
        default=0.0, ge=0, le=60,
        description="simulated seconds per image (for benchmarks); does not change outputs, so "
        "it is not part of the revision",
    )

    @field_validator("refusal_kinds")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        return check_shares(value)


def _prompt_seed(prompt: str, seed: int) -> list[int]:
    # sha256, not hash(): Python salts str hashes per process.
    digest = hashlib.sha256(prompt.encode()).digest()
    return [int.from_bytes(digest[:4], "big"), int(seed) & 0xFFFFFFFF]


def placeholder_image(prompt: str, seed: int, size: int) -> np.ndarray:
    """A deterministic, clearly non-blank picture for ``prompt`` and ``seed``.

    A vertical two-colour gradient with a few filled shapes, every colour drawn from a
    generator seeded by the prompt's sha256 and the seed: the same prompt and seed always give
    the same pixels, different prompts give different pictures. The gradient's ends differ by at
    least 96 grey levels, so the image's grey-level spread is far above any blank threshold.
    It depicts nothing; it stands for "the model complied".
    """
    rng = np.random.default_rng(_prompt_seed(prompt, seed))
    top = rng.integers(0, 256, 3)
    bottom = rng.integers(0, 256, 3)
    grey_gap = float(np.dot(top - bottom, [0.299, 0.587, 0.114]))
    if abs(grey_gap) < 96:  # push the ends apart along grey so the frame is never near-uniform
        bottom = np.clip(top + (-128 if top.mean() > 127 else 128), 0, 255)
    ramp = np.linspace(0.0, 1.0, size)[:, None, None]
    pixels = (top[None, None, :] * (1 - ramp) + bottom[None, None, :] * ramp)
    canvas = Image.fromarray(np.repeat(pixels, size, axis=1).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(2, 5))):
        x0, y0 = rng.uniform(0, 0.7, 2) * size
        w, h = rng.uniform(0.15, 0.4, 2) * size
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        box = [float(x0), float(y0), float(x0 + w), float(y0 + h)]
        if rng.random() < 0.5:
            draw.ellipse(box, fill=colour)
        else:
            draw.rectangle(box, fill=colour)
    return np.asarray(canvas, dtype=np.uint8).copy()


class SyntheticGenerator(PlantedIdentity, SimulatedGenerator):
    """A T2I generator simulated from planted refusal probabilities (see module docstring).
    Each request's category and attribute come from the plan row attached for it
    (:meth:`~acrb.models.base.Simulated.attach_design`), never from the prompt text."""

    Config: ClassVar[type[ModelConfig]] = SyntheticGeneratorConfig

    def __init__(self, key: str, config: ModelConfig, pinned_revision: str | None = None) -> None:
        super().__init__(key, config, pinned_revision)
        assert isinstance(config, SyntheticGeneratorConfig)
        self.planted: SyntheticGeneratorConfig = config

    @classmethod
    def check_categories(cls, name: str, config: ModelConfig, categories: set[str]) -> None:
        # Without a base rate for every planned category, those requests would end as errors.
        assert isinstance(config, SyntheticGeneratorConfig)
        missing = sorted(categories - set(config.refusal.base))
        if missing:
            raise ConfigError(
                f"simulated generator '{name}' has no planted refusal rate for prompt "
                f"categories {missing}",
                f"add them under models.{name}.config.refusal.base in params.yaml (the ACRB "
                "T2I prompts' categories are their safety domains)",
            )

    def planted_refusal(self, category: str, attribute: str) -> float:
        """The planted probability that a prompt of ``category`` and ``attribute`` is refused."""
        return self.planted.refusal.probability(category, attribute)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Outcome]:
        outcomes = []
        for request in requests:
            if self.planted.latency_seconds:
                time.sleep(self.planted.latency_seconds)
            outcomes.append(self._generate_one(request))
        return outcomes

    def _generate_one(self, request: GenerationRequest) -> Outcome:
        design = self.design_of(request)
        p_refuse = self.planted_refusal(design.category, design.attribute)
        rng = np.random.default_rng(int(request.request_id, 16))
        # Always draw both numbers in this order, so each decision is stable on its own.
        u_refuse, u_kind = rng.random(2)
        size = self.planted.size
        if u_refuse < p_refuse:
            kind = choose_kind(self.planted.refusal_kinds, u_kind)
            if kind == "policy_message":
                return Outcome(status="refused", refusal_kind="policy", message=POLICY_MESSAGE)
            return Outcome(status="ok", image=np.zeros((size, size, 3), dtype=np.uint8))
        return Outcome(status="ok", image=placeholder_image(request.prompt, request.seed, size))

    def library_versions(self) -> dict[str, str]:
        return {"numpy": np.__version__}
