"""Simulated editors with planted, published biases: the instruments of the embedded default.

A :class:`SyntheticEditor` behaves like an image editor whose refusal, erasure and skin-lightening
probabilities per category and source group are set in params.yaml. It produces real images:
a hard refusal is a black frame (as a safety filter returns), the source returned unchanged, or
an explicit policy message; an erasure is a minimal edit; a compliant edit is a visible change;
lightening raises the skin's lightness. ACRB's detectors then measure these outcomes from pixels
alone, so comparing planted with measured values tests the whole pipeline. These are never
measurements of real models.

Probability model, for a request in category c on a source with race r, gender g, age a::

    p = clip(base[c] + race[c][r] + gender[c][g] + age[c][a], 0, 1)

where each offset table may use ``"*"`` for "every category"; any other category an offset
table names must have a base rate (a key no request's category equals, such as ``c`` for
``C``, would be ignored, so it is refused). Refusal is drawn first; erasure
and lightening only for requests not refused (they are conditional rates). Each request's draws
come from a generator seeded by its request_id, so outcomes do not depend on batching, sharding
or the order of execution.

In the feature-prompt arm (``design.arm == "feature"``) each probability is multiplied by its
``feature_arm`` multiplier, and the draws are those of the plain request the feature-arm request
repeats (``design.pair_of``): the two arms of a cell share their uniforms, so a multiplier below
1 can only remove an outcome the plain request had, never add one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import ConfigError
from acrb.models import synthetic_edits
from acrb.models.base import EditorConfig, EditOutcome, EditRequest, SimulatedEditor
from acrb.storage import content_hash

RefusalKind = Literal["black_frame", "returned_unchanged", "policy_message"]
POLICY_MESSAGE = "Request declined by the simulated content policy."


class PlantedRates(BaseModel):
    """Planted probabilities: a base rate per category plus additive offsets per source group."""

    model_config = ConfigDict(extra="forbid")

    base: dict[str, float] = Field(description="category -> probability")
    race: dict[str, dict[str, float]] = Field(default_factory=dict)
    gender: dict[str, dict[str, float]] = Field(default_factory=dict)
    age: dict[str, dict[str, float]] = Field(default_factory=dict)

    @field_validator("base")
    @classmethod
    def _probabilities(cls, value: dict[str, float]) -> dict[str, float]:
        for category, p in value.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"base rate for category {category} must be in [0, 1], got {p}")
        return value

    @model_validator(mode="after")
    def _known_groups(self) -> PlantedRates:
        for dimension, values in SOURCE_DIMENSIONS.items():
            for category, offsets in getattr(self, dimension).items():
                if category != "*" and category not in self.base:
                    # A key no request's category equals would be ignored: a typo ('c' for C).
                    raise ValueError(
                        f"{dimension} offsets for category '{category}', which has no base "
                        f"rate; the categories are {', '.join(sorted(self.base))} (or '*' for "
                        "every category)")
                for group, offset in offsets.items():
                    if group not in values:
                        raise ValueError(
                            f"{dimension} offset for unknown group '{group}' (category "
                            f"{category}); valid: {', '.join(values)}"
                        )
                    if not -1.0 <= offset <= 1.0:
                        raise ValueError(f"{dimension}.{category}.{group} must be in [-1, 1]")
        return self

    def probability(self, category: str, groups: dict[str, str]) -> float:
        if category not in self.base:
            raise KeyError(
                f"no planted base rate for category '{category}' (have {sorted(self.base)})"
            )
        p = self.base[category]
        for dimension in SOURCE_DIMENSIONS:
            table = getattr(self, dimension)
            group = groups.get(dimension)
            for key in ("*", category):
                p += table.get(key, {}).get(group, 0.0)
        return float(min(1.0, max(0.0, p)))


class StereotypeRates(BaseModel):
    """A probability by the race of the pair: ``base`` plus an offset per race."""

    model_config = ConfigDict(extra="forbid")

    base: float = Field(default=0.5, ge=0.0, le=1.0)
    race: dict[str, float] = Field(default_factory=dict)

    @field_validator("race")
    @classmethod
    def _known_races(cls, value: dict[str, float]) -> dict[str, float]:
        for race, offset in value.items():
            if race not in SOURCE_DIMENSIONS["race"]:
                raise ValueError(f"race offset for unknown group '{race}'; valid: "
                                 + ", ".join(SOURCE_DIMENSIONS["race"]))
            if not -1.0 <= offset <= 1.0:
                raise ValueError(f"race offset {race} must be in [-1, 1]")
        return value

    def probability(self, race: str) -> float:
        return float(min(1.0, max(0.0, self.base + self.race.get(race, 0.0))))


class WinoBiasPlanted(BaseModel):
    """Planted WinoBias behaviour: ``stereotype`` is the probability that the male-coded
    occupation goes to the man (and the female-coded one to the woman), by the pair's race;
    otherwise the roles are swapped. ``refusal``: the probability of a hard refusal."""

    model_config = ConfigDict(extra="forbid")

    stereotype: StereotypeRates = Field(default_factory=StereotypeRates)
    refusal: float = Field(default=0.0, ge=0.0, le=1.0)
class FeatureArmEffect(BaseModel):
    """How a simulated editor answers the feature-prompt arm: each planted probability of a
    feature-arm request is the plain one times its multiplier (clipped to [0, 1]). A multiplier
    below 1 plants a mitigation (the study's hypothesis: describing the face lowers drift)."""

    model_config = ConfigDict(extra="forbid")

    refusal: float = Field(default=1.0, ge=0, le=10)
    erasure: float = Field(default=1.0, ge=0, le=10)
    lightening: float = Field(default=0.35, ge=0, le=10)


class SyntheticEditorConfig(EditorConfig):
    refusal: PlantedRates
    erasure: PlantedRates
    lightening: PlantedRates
    feature_arm: FeatureArmEffect = Field(
        default_factory=FeatureArmEffect,
        description="multipliers of the planted probabilities in the feature-prompt arm")
    refusal_kinds: dict[RefusalKind, float] = Field(
        default={"black_frame": 0.5, "returned_unchanged": 0.3, "policy_message": 0.2},
        description="how hard refusals show: shares that sum to 1",
    )
    lightening_delta: float = Field(
        default=8.0, gt=0, le=40, description="CIELAB L* added to skin when lightening"
    )
    winobias: WinoBiasPlanted = Field(
        default_factory=WinoBiasPlanted, description="planted behaviour on WinoBias pairs "
        "(default: no stereotype, no refusal)")
    latency_seconds: float = Field(
        default=0.0, ge=0, le=60,
        description="simulated seconds per edit (for benchmarks and crash tests); does not "
        "change outputs, so it is not part of the revision",
    )

    @field_validator("refusal_kinds")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        return check_shares(value)


Kind = TypeVar("Kind", bound=str)


def check_shares(shares: dict[str, float]) -> dict[str, float]:
    """``shares`` if they are a distribution (none negative, summing to 1), else a ValueError
    pydantic reports against the config key."""
    if not shares or abs(sum(shares.values()) - 1.0) > 1e-6 or min(shares.values()) < 0:
        raise ValueError(f"refusal_kinds shares must be >= 0 and sum to 1, got {shares}")
    return shares


def choose_kind(shares: Mapping[Kind, float], u: float) -> Kind:
    """The kind whose slice of [0, 1) holds the uniform draw ``u``, slices laid out in the
    order of ``shares`` (the last kind where rounding leaves ``u`` past their sum)."""
    kinds = list(shares)
    edges = np.cumsum([shares[kind] for kind in kinds])
    return kinds[min(int(np.searchsorted(edges, u, side="right")), len(kinds) - 1)]


class PlantedIdentity:
    """What names a simulated model: its planted values are its "weights", so its revision is
    their hash (changing them makes another model) and no config enters request ids besides.
    Mixed in before :class:`SimulatedEditor` or :class:`SimulatedGenerator`."""

    #: Planted values that act only on the feature arm or on WinoBias requests: they enter the
    #: ids of those requests (:meth:`id_config`), not the revision every request carries.
    arm_blocks: ClassVar[dict[tuple[str, str], str]] = {("feature", "audit"): "feature_arm",
                                                          ("none", "winobias"): "winobias"}

    @classmethod
    def resolve_revision(cls, key: str, config: EditorConfig, pinned_revision: str | None) -> str:
        exclude = {"latency_seconds", *cls.arm_blocks.values()}
        planted = config.model_dump(mode="json", exclude=exclude)
        return "planted-" + content_hash(planted, 12)

    @classmethod
    def output_config(cls, config: EditorConfig) -> dict[str, Any]:
        return {}

    @classmethod
    def id_config(cls, config: EditorConfig, arm: str, experiment: str) -> dict[str, Any]:
        block = cls.arm_blocks.get((arm, experiment))
        if block is None or not hasattr(config, block):
            return {}
        return {block: getattr(config, block).model_dump(mode="json")}


class SyntheticEditor(PlantedIdentity, SimulatedEditor):
    """An editor simulated from planted probabilities (see module docstring). Each request's
    prompt, category and source groups come from the plan row attached for it
    (:meth:`~acrb.models.base.SimulatedEditor.attach_design`), not from the request."""

    Config: ClassVar[type[EditorConfig]] = SyntheticEditorConfig
    #: Takes the two portraits of a WinoBias request.
    max_source_images: ClassVar[int] = 2
    output_version: ClassVar[int | None] = synthetic_edits.RENDERING_VERSION

    def __init__(self, key: str, config: EditorConfig, pinned_revision: str | None = None) -> None:
        super().__init__(key, config, pinned_revision)
        assert isinstance(config, SyntheticEditorConfig)
        self.planted: SyntheticEditorConfig = config

    @classmethod
    def check_categories(cls, name: str, config: EditorConfig, categories: set[str]) -> None:
        # A simulated editor only knows the categories it has planted rates for; without this
        # check every other request would end as an `error` at generation time.
        assert isinstance(config, SyntheticEditorConfig)
        for outcome in ("refusal", "erasure", "lightening"):
            base = set(getattr(config, outcome).base)
            missing = sorted(categories - base)
            if missing:
                unused = sorted(base - categories)
                raise ConfigError(
                    f"simulated model '{name}' has no planted {outcome} rate for prompt "
                    f"categories {missing}" + (
                        f" (it has rates for {unused}, which no planned prompt has: a typo?)"
                        if unused else ""),
                    f"add them under models.{name}.config.{outcome}.base in params.yaml (the "
                    "ACRB prompt set's categories are its domains), or use plan.prompt_sets: "
                    "[catalog]",
                )

    def planted_probabilities(self, category: str, groups: dict[str, str],
                              arm: str = "none") -> dict[str, float]:
        """Planted refusal (unconditional), erasure and lightening (given not refused); in the
        ``feature`` arm each times its ``feature_arm`` multiplier, clipped to [0, 1]."""
        effect = self.planted.feature_arm if arm == "feature" else FeatureArmEffect(
            refusal=1.0, erasure=1.0, lightening=1.0)
        return {
            outcome: float(min(1.0, getattr(self.planted, outcome).probability(category, groups)
                               * getattr(effect, outcome)))
            for outcome in ("refusal", "erasure", "lightening")
        }

    def edit(self, requests: Sequence[EditRequest]) -> list[EditOutcome]:
        outcomes = []
        for request in requests:
            if self.planted.latency_seconds:
                time.sleep(self.planted.latency_seconds)
            outcomes.append(self._edit_one(request))
        return outcomes

    def _edit_one(self, request: EditRequest) -> EditOutcome:
        design = self.design_of(request)
        if design.experiment == "winobias":
            return self._edit_winobias(request, design.race, design.gender)
        groups = {dimension: getattr(design, dimension) for dimension in SOURCE_DIMENSIONS}
        p = self.planted_probabilities(design.category, groups, design.arm)
        # A feature-arm request draws the uniforms of the plain request it repeats: paired
        # draws, so with a multiplier below 1 it is lightened only where its twin was.
        rng = np.random.default_rng(int(design.pair_of or request.request_id, 16))
        # Always draw all four numbers in this order so each decision is stable on its own.
        u_refuse, u_kind, u_erase, u_lighten = rng.random(4)
        source = request.source_image
        if u_refuse < p["refusal"]:
            kind = choose_kind(self.planted.refusal_kinds, u_kind)
            if kind == "policy_message":
                return EditOutcome(status="refused", refusal_kind="policy", message=POLICY_MESSAGE)
            if kind == "black_frame":
                return EditOutcome(status="ok", image=synthetic_edits.black_frame(source))
            return EditOutcome(status="ok", image=synthetic_edits.returned_unchanged(source))
        if u_erase < p["erasure"]:
            image = synthetic_edits.weak_edit(source, design.prompt_id, request.seed)
        else:
            image = synthetic_edits.compliant_edit(source, design.prompt_id, request.seed)
        if u_lighten < p["lightening"]:
            image = synthetic_edits.lighten_skin(image, self.planted.lightening_delta)
        return EditOutcome(status="ok", image=image)

    def _edit_winobias(self, request: EditRequest, race: str, first_gender: str
                       ) -> EditOutcome:
        """The two portraits side by side, each dressed in one occupation's garment; the man
        gets the male-coded occupation with the planted stereotype probability of the pair's
        race (the roles are swapped otherwise). Refusals as for one portrait."""
        planted = self.planted.winobias
        rng = np.random.default_rng(int(request.request_id, 16))
        u_refuse, u_kind, u_follow = rng.random(3)
        if len(request.source_images) != 2:
            return EditOutcome(status="error", message="a WinoBias request carries two images, "
                               f"got {len(request.source_images)}")
        composite = synthetic_edits.side_by_side(*request.source_images)
        if u_refuse < planted.refusal:
            kind = choose_kind(self.planted.refusal_kinds, u_kind)
            if kind == "policy_message":
                return EditOutcome(status="refused", refusal_kind="policy", message=POLICY_MESSAGE)
            if kind == "black_frame":
                return EditOutcome(status="ok", image=synthetic_edits.black_frame(composite))
            return EditOutcome(status="ok",
                               image=synthetic_edits.returned_unchanged(request.source_image))
        follows = u_follow < planted.stereotype.probability(race)
        man_first = first_gender == "Male"
        image = synthetic_edits.mark_roles(composite, male_role_left=man_first == follows)
        return EditOutcome(status="ok", image=image)

    def library_versions(self) -> dict[str, str]:
        return {"numpy": np.__version__}
