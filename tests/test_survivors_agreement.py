"""Agreement numbers a planted bug once changed without any test failing (issue 31): the
bootstrap unit of :func:`acrb.analysis.agreement.raters.rater_agreement` and the weights of the
weighted kappa behind the judge-versus-people kappa of the paper's table 7.

Each test fails with its bug planted (``benchmarks/planted_bugs.py agreement-boot-units
kappa-linear``) and passes without it.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from acrb.analysis.agreement.raters import (
    intra_rater_consistency,
    judge_human_agreement,
    rater_agreement,
)
from tests.test_agreement import item, overall, rating

#: Every item of the paired design: the edited output rated 1 and 2, the feature output 4 and
#: 5 (by raters a and b).
PAIRED_ANSWERS = {"edited": (1, 2), "feature": (4, 5)}


def paired_frames(n_items: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``n_items`` items, each rated the same way on both of its outputs."""
    ratings = [rating(rater, f"i{i}", output, edit_success=answer)
               for i in range(n_items) for output, answers in PAIRED_ANSWERS.items()
               for rater, answer in zip("ab", answers, strict=True)]
    return pd.DataFrame(ratings), pd.DataFrame([item(f"i{i}") for i in range(n_items)])


def test_the_pooled_arm_resamples_items_with_both_their_outputs() -> None:
    """Both outputs of an item were rated side by side, so the bootstrap draws items and an
    item brings both its outputs into a replicate. Where every item is rated the same, every
    replicate is the same sample (n_items copies of one item), so the interval of the pooled
    arm is the estimate itself. Resampling output units instead would mix edited and feature
    outputs in varying shares and widen it."""
    ratings, items = paired_frames(12)
    table = rater_agreement(ratings, items, axes=("edit_success",), arms=("both",),
                            n_boot=400, seed=5)
    for statistic in ("fleiss_kappa", "alpha_ordinal", "alpha_interval"):
        row = overall(table, "edit_success", statistic)
        assert (row["n_items"], row["n_units"], row["n_ratings"]) == (12, 24, 48)
        assert np.isfinite(row["estimate"]), statistic
        assert row["ci_low"] == pytest.approx(row["estimate"], abs=1e-9), statistic
        assert row["ci_high"] == pytest.approx(row["estimate"], abs=1e-9), statistic


def quadratic_kappa(a: list[int], b: list[int]) -> Fraction:
    """Cohen's (1968) quadratic-weighted kappa by hand, exactly: 1 - sum of weighted observed
    disagreement / sum of weighted chance disagreement, weights (i - j)^2."""
    n = len(a)
    observed = sum((Fraction((x - y) ** 2) for x, y in zip(a, b, strict=True)), Fraction(0))
    chance = sum((Fraction((x - y) ** 2) for x in a for y in b), Fraction(0))
    return 1 - (observed / n) / (chance / (n * n))


def test_intra_rater_kappa_is_the_quadratic_weighted_one() -> None:
    first, again = [1, 2, 3, 4, 5, 5], [1, 2, 3, 4, 5, 4]
    assert quadratic_kappa(first, again) == Fraction(70, 73)  # linear weights: 26/29
    rows = [rating("a", f"i{i}", edit_success=v) for i, v in enumerate(first)]
    rows += [rating("a", f"i{i}", repeat=True, edit_success=v) for i, v in enumerate(again)]
    table = intra_rater_consistency(pd.DataFrame(rows), axes=("edit_success",))
    row = table[table["rater"] == "all"].iloc[0]
    assert row["weighted_kappa"] == pytest.approx(70 / 73, abs=1e-12)


def test_judge_human_kappa_is_the_quadratic_weighted_one() -> None:
    """The kappa of the paper's table 7, on units where the judge and people disagree by one
    and by two steps (a half score rounds to even first)."""
    human = [1, 2, 3, 4, 5, 2, 4, 3]
    judge = [1.0, 2.0, 4.0, 4.0, 3.0, 2.5, 4.0, 3.0]  # 2.5 -> 2
    expected = quadratic_kappa(human, [1, 2, 4, 4, 3, 2, 4, 3])
    units = pd.DataFrame({"output": "edited", "model": "m", "race": "White",
                          "gender": "Female", "age": "20s", "human_edit_success": human,
                          "judge_edit_success": judge})
    table = judge_human_agreement(units, axes=("edit_success",))
    row = table[table["dimension"] == "all"].iloc[0]
    assert row["n"] == len(human)
    assert row["weighted_kappa"] == pytest.approx(float(expected), abs=1e-12)
