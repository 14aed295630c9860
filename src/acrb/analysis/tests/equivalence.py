"""Equivalence: testing a "no bias" claim, Δ = max − min group rate below a margin.

A disparity test that is not significant is never evidence that the groups are treated alike;
:func:`tost_delta` tests that claim directly, by two one-sided tests on every pair of groups
(intersection-union), with the variances inflated by the design effect of clustering within
sources. See ``docs/statistics.md#equivalence``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from acrb.analysis.estimation.power import design_effect
from acrb.analysis.frame import checked_frame, outcome_rows


@dataclass(frozen=True, eq=False)
class TostResult:
    """Equivalence test of Δ = max − min group rate < margin (see :func:`tost_delta`).

    ``p_value`` is the intersection-union p-value (the largest pairwise TOST p-value) and
    ``statistic`` the TOST z statistic of that pair; ``equivalent`` is ``p_value < alpha``.
    ``pairs`` has one row per pair of groups: ``group_a, group_b, diff`` (rate a − rate b),
    ``p_value``. ``n`` counts requests before the design-effect deflation.
    """

    outcome: str
    dimension: str
    method: str
    statistic: float
    p_value: float
    equivalent: bool
    delta: float
    max_group: str | None
    min_group: str | None
    margin: float
    alpha: float
    deff: float
    n: int
    n_groups: int
    pairs: pd.DataFrame
    reason: str | None = None


def tost_delta(
    frame: pd.DataFrame,
    outcome: str,
    dimension: str,
    *,
    margin: float = 0.03,
    alpha: float = 0.05,
    deff: float | None = 1.0,
) -> TostResult:
    """Equivalence test of "no disparity": Δ = max − min group rate < ``margin``.

    Δ < margin holds iff |p_i − p_j| < margin for every pair of groups, so the claim is an
    intersection of pairwise equivalences and is tested by the intersection-union principle
    (Berger 1982, "Multiparameter hypothesis testing and acceptance sampling",
    Technometrics 24:295-300; Berger & Hsu 1996, Statistical Science 11:283-319): each pair
    is tested by two one-sided tests (Schuirmann 1987) of H0: |p_i − p_j| ≥ margin,
    ``statsmodels.stats.proportion.tost_proportions_2indep(compare="diff", low=−margin,
    upp=margin)`` (its default Agresti-Caffo interval method, which copes with zero counts),
    and p = max over pairs. No multiplicity adjustment is needed: the IUT is a level-α test
    of the union null. Equivalence is concluded when p < ``alpha``.

    Clustering: requests of one source are correlated, which inflates the variance of each rate by
    the design effect. ``deff`` (≥ 1) is applied by dividing each group's count and n by it
    (effective sample size, Kish 1965) before the test; ``deff=None`` estimates it by
    :func:`acrb.analysis.estimation.power.design_effect` (sources nested in ``dimension``). The
    default 1 assumes independence, which is anti-conservative here: for equivalence claims pass the
    estimated design effect.

    Filter ``frame`` to the requests the claim is about (e.g. neutral prompts) before calling.
    With fewer than two groups p is NaN (``reason``).
    """
    from statsmodels.stats.proportion import tost_proportions_2indep

    frame = checked_frame(frame)
    if margin <= 0:
        raise ValueError("margin must be positive")
    rows = outcome_rows(frame, outcome, dimension)
    if deff is None:
        deff = design_effect(frame, outcome, dimension).deff
    if not deff >= 1.0:
        raise ValueError("deff must be at least 1")
    counts = rows.groupby("group", observed=True)["y"].agg(["size", "sum"])
    names = [str(g) for g in counts.index]
    n = counts["size"].to_numpy(dtype=float)
    k = counts["sum"].to_numpy(dtype=float)
    rates = k / n
    method = "TOST (agresti-caffo) per pair, intersection-union"
    pair_columns = ["group_a", "group_b", "diff", "p_value"]
    if len(names) < 2:
        return TostResult(
            outcome, dimension, method, math.nan, math.nan, False,
            0.0 if names else math.nan, names[0] if names else None,
            names[0] if names else None, margin, alpha, float(deff), int(n.sum()), len(names),
            pd.DataFrame(columns=pair_columns), reason="fewer than two groups with observations",
        )
    pairs = []
    worst_statistic, worst_p = math.nan, -1.0
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            with np.errstate(divide="ignore", invalid="ignore"):
                test = tost_proportions_2indep(
                    k[i] / deff, n[i] / deff, k[j] / deff, n[j] / deff,
                    low=-margin, upp=margin, compare="diff",
                )
            p = float(test.pvalue)
            pairs.append((names[i], names[j], float(rates[i] - rates[j]), p))
            if p > worst_p:
                worst_p, worst_statistic = p, float(test.statistic)
    top, bottom = int(np.argmax(rates)), int(np.argmin(rates))
    return TostResult(
        outcome, dimension, method, worst_statistic, worst_p, bool(worst_p < alpha),
        float(rates[top] - rates[bottom]), names[top], names[bottom], margin, alpha,
        float(deff), int(n.sum()), len(names), pd.DataFrame(pairs, columns=pair_columns),
    )
