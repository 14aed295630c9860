"""The published behaviour of a simulated judge: its planted error rates by source group.

Kept apart from :mod:`acrb.judges.simulated` (which reads pixels) so that the analysis can list
the planted rates beside the disparities they cause without importing the detectors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field


class GroupRates(BaseModel):
    """A probability by source group: ``base`` plus one offset per dimension's value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: float = Field(default=0.0, ge=0.0, le=1.0)
    race: dict[str, float] = Field(default_factory=dict)
    gender: dict[str, float] = Field(default_factory=dict)
    age: dict[str, float] = Field(default_factory=dict)

    def rate(self, design: Mapping[str, str]) -> float:
        """The probability for a source of groups ``design`` (race, gender, age)."""
        total = self.base
        for dimension in ("race", "gender", "age"):
            offsets: dict[str, float] = getattr(self, dimension)
            total += offsets.get(design.get(dimension, ""), 0.0)
        return float(min(1.0, max(0.0, total)))


class SimulatedJudgeConfig(BaseModel):
    """The planted behaviour of a simulated judge (params ``judges.<name>.config``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(default=0, description="seed of this judge's error draws")
    noise: float = Field(default=0.0, ge=0.0, le=1.0,
                         description="probability that a 1-5 score moves one step")
    abstention: GroupRates = Field(default_factory=GroupRates)
    false_erasure: GroupRates = Field(default_factory=GroupRates)
    false_lightening: GroupRates = Field(default_factory=GroupRates)
    role_error: GroupRates = Field(
        default_factory=GroupRates, description="WinoBias: probability that an answer names "
        "the other person than the one wearing the occupation (rates by the first portrait's "
        "group)")


#: The planted error kinds of a simulated judge, in the order the report lists them.
#: (``role_error`` is about the WinoBias question; the WinoBias analysis lists it.)
PLANTED_ERRORS: tuple[str, ...] = ("abstention", "false_erasure", "false_lightening")


def planted_errors(name: str, config: SimulatedJudgeConfig | Mapping[str, Any]) -> pd.DataFrame:
    """A simulated judge's published error rates, for the report: one row per error kind and
    group that has an offset (``dimension`` ``all`` for the base rate), with the rate that
    group gets (base + offset, clipped). Columns ``judge, error, dimension, group, rate``;
    ``noise`` is one row (dimension ``all``)."""
    cfg = (config if isinstance(config, SimulatedJudgeConfig)
           else SimulatedJudgeConfig.model_validate(config))
    rows: list[dict[str, Any]] = []
    for error in PLANTED_ERRORS:
        rates: GroupRates = getattr(cfg, error)
        rows.append({"judge": name, "error": error, "dimension": "all", "group": "base",
                     "rate": rates.base})
        for dimension in ("race", "gender", "age"):
            for group in getattr(rates, dimension):
                rows.append({"judge": name, "error": error, "dimension": dimension,
                             "group": group, "rate": rates.rate({dimension: group})})
    rows.append({"judge": name, "error": "noise", "dimension": "all", "group": "base",
                 "rate": cfg.noise})
    return pd.DataFrame(rows, columns=["judge", "error", "dimension", "group", "rate"])
