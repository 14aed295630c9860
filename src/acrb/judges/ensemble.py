"""Combining judges: the seed study's two-judge rule, mean, median or first, and the outcomes.

The study rule, per axis, for judges a (first) and b: when both scored and differ by at most
one step, the score is ``round((a + b) / 2)``; otherwise it is a's score and the item is marked
``needs_review``. One step is 1 on a 1-5 scale; on a fraction axis (cue retention, 0-1) it is a
quarter of the range, the same share of the scale, and the mean is not rounded. ``round`` is
Python's, which rounds halves to the even integer (2.5 -> 2, 3.5 -> 4): the formula as written,
evaluated in Python. When only one judge scored an axis (the other abstained), its score is
used and the axis is marked for review. ``mean`` and ``median`` combine every judge that scored
(no review marks); ``first`` takes the first judge's score alone.

An outcome (params ``judge.outcomes``) compares one axis's combined score with its bound; it is
None where the axis has no combined score (not judged, or every judge abstained).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from acrb.config import EnsembleRule, OutcomeRule
from acrb.errors import ConfigError
from acrb.judges.rubric import Rubric
from acrb.records import SCORE_AXES

Score = float | int | None


@dataclass(frozen=True)
class Combined:
    """The combined scores of one item (None where no judge scored the axis) and the axes
    marked for review."""

    scores: Mapping[str, float | None]
    review_axes: tuple[str, ...]


def check_rule(rule: EnsembleRule, judges: Sequence[str]) -> None:
    """ConfigError when ``rule`` cannot combine ``judges`` (the study rule takes two)."""
    if rule == "study" and len(judges) > 2:
        raise ConfigError(
            f"the study ensemble rule combines two judges; judge.use lists {len(judges)} "
            f"({', '.join(judges)})",
            "list two judges in judge.use (the first is the study's first judge), or set "
            "judge.ensemble to mean or median",
        )


def _is_score(value: Score) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def combine_axis(values: Sequence[Score], rule: EnsembleRule, step: float, integer: bool
                 ) -> tuple[float | None, bool]:
    """The combined score of one axis from each judge's value (first judge first; None for a
    judge that did not score it) and whether it needs review."""
    present = [float(v) for v in values if _is_score(v)]  # type: ignore[arg-type]
    if rule == "first":
        first = values[0] if values else None
        return (float(first) if _is_score(first) else None), False  # type: ignore[arg-type]
    if not present:
        return None, False
    if rule == "mean":
        return statistics.fmean(present), False
    if rule == "median":
        return float(statistics.median(present)), False
    # study
    if len(values) == 1:
        return present[0], False
    a, b = values[0], values[1]
    if not (_is_score(a) and _is_score(b)):
        return present[0], True
    fa, fb = float(a), float(b)  # type: ignore[arg-type]
    if abs(fa - fb) <= step + 1e-12:
        mean = (fa + fb) / 2
        return (float(round(mean)) if integer else mean), False
    return fa, True


def combine(per_judge: Sequence[Mapping[str, Score]], rubric: Rubric, rule: EnsembleRule
            ) -> Combined:
    """Combine the judges' scores of one item, axis by axis (see the module docstring)."""
    scores: dict[str, float | None] = {}
    review = []
    for axis in SCORE_AXES:
        spec = rubric.axes.get(axis)
        if spec is None:
            scores[axis] = None
            continue
        low, high = spec.range
        integer = spec.kind == "score"
        step = 1.0 if integer else (high - low) / 4
        value, flag = combine_axis([j.get(axis) for j in per_judge], rule, step, integer)
        scores[axis] = value
        if flag:
            review.append(axis)
    return Combined(scores, tuple(review))


def read_outcomes(scores: Mapping[str, float | None], rules: Mapping[str, OutcomeRule]
                  ) -> dict[str, bool | None]:
    """Each outcome of ``rules`` read from the combined ``scores``."""
    return {name: rule.applies(scores.get(rule.axis)) for name, rule in rules.items()}
