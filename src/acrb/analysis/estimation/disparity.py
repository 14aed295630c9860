"""Disparity Δ = max_a R(a) − min_a R(a) across source groups, requests counted as independent.

For every prompt category (and the pooled ``"all"``) and every source dimension (race, gender,
age), :func:`disparities` reports the gap between the group with the highest and the group with
the lowest rate of an outcome, a simultaneous confidence interval for that gap (Newcombe
intervals of every pair, Bonferroni) and a test of whether the groups differ at all
(:func:`acrb.analysis.tests.contingency.homogeneity_test`), Holm-adjusted over the table.

Units: Δ and its interval are differences of proportions (in [0, 1]; multiply by 100 for
percentage points). p-values are probabilities.

Independence assumption: the interval and the tests treat requests as independent given their group
and category. In an audit the same source images and prompts recur across requests, so outcomes are
clustered and these intervals are too narrow and the tests too eager to flag (measured in
``docs/statistics.md#validation-by-simulation``). The pipeline therefore reports the cluster-robust
table of :mod:`acrb.analysis.estimation.resampling`, which has the same columns; this one is the
independent-requests reference that the benchmarks compare against, and the quick table
:func:`acrb.analysis.outputs.section.build_model_section` computes without a bootstrap.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from acrb.analysis import defaults
from acrb.analysis.estimation.rates import group_rates
from acrb.analysis.tests.contingency import homogeneity_test
from acrb.analysis.tests.pvalues import adjust

DISPARITY_COLUMNS: tuple[str, ...] = (
    "outcome",
    "category",
    "dimension",
    "delta",
    "delta_corrected",
    "ci_low",
    "ci_high",
    "max_group",
    "min_group",
    "n",
    "p_value",
    "p_adjusted",
    "flagged",
    "method",
)


def delta_interval(k: np.ndarray, n: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Confidence interval for Δ = max_i p_i − min_i p_i from k_i successes in n_i trials.

    Construction: Δ = max_{i,j} (p_i − p_j). Take simultaneous intervals [L_ij, U_ij] for all
    m = g(g−1)/2 pairwise differences: Newcombe's hybrid score interval (Newcombe 1998,
    "Interval estimation for the difference between independent proportions: comparison of
    eleven methods", Statistics in Medicine 17:873-890, method 10), each at level
    1 − (1 − confidence)/m (Bonferroni), from
    ``statsmodels.stats.proportion.confint_proportions_2indep(method="newcomb")``. With
    probability at least ``confidence`` every pairwise difference is covered, and then so is
    their maximum: Δ ≥ p_i − p_j ≥ L_ij for every pair and Δ ≥ 0, while Δ = p_i* − p_j* ≤
    U_i*j*. Hence Δ ∈ [max(0, max_ij L_ij), max_ij U_ij] with coverage ≥ ``confidence``,
    clipped to [0, 1]. The lower bound is 0 exactly when no pairwise difference is
    significant at the Bonferroni level, so the interval covers "no disparity" when the data
    are consistent with it. Why this construction rather than a bootstrap of max − min, and
    its price (conservatism): ``docs/statistics.md#disparity-counting-requests-as-independent``.

    Only groups with n > 0 take part. One group gives (0, 0); none gives (NaN, NaN).
    Assumes independent requests given group (see the module docstring).
    """
    from statsmodels.stats.proportion import confint_proportions_2indep

    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    keep = n > 0
    k, n = k[keep], n[keep]
    g = len(n)
    if g == 0:
        return float("nan"), float("nan")
    if g == 1:
        return 0.0, 0.0
    m = g * (g - 1) // 2
    i, j = np.triu_indices(g, k=1)
    low, high = confint_proportions_2indep(
        k[i], n[i], k[j], n[j], method="newcomb", compare="diff", alpha=(1.0 - confidence) / m
    )
    low = np.asarray(low, dtype=float)
    high = np.asarray(high, dtype=float)
    # The interval of p_j − p_i is [−U_ij, −L_ij]: cover both orientations of every pair.
    lower = max(0.0, float(np.max(np.maximum(low, -high))))
    upper = float(np.max(np.maximum(high, -low)))
    return float(np.clip(lower, 0.0, 1.0)), float(np.clip(upper, 0.0, 1.0))


def disparities(
    frame: pd.DataFrame,
    outcome: str,
    confidence: float = 0.95,
    alpha: float = 0.05,
    *,
    simultaneous: bool = True,
    permutations: int = defaults.PERMUTATIONS,
    seed: int = defaults.SEED,
) -> pd.DataFrame:
    """Δ of ``outcome`` for every category (and ``"all"``) x source dimension, with tests.

    Parameters
    ----------
    frame:
        The analysis frame of one model (one row per request); only the rows that count
        (:func:`acrb.analysis.frame.usable_rows`) and whose outcome is observed take part.
    outcome:
        One of :data:`acrb.analysis.outcomes.OUTCOMES`.
    confidence:
        Coverage of the Δ intervals (see :func:`delta_interval`).
    simultaneous:
        If true (the default), ``confidence`` is the joint coverage of all the Δ intervals
        returned: each row's interval is computed at level 1 − (1 − confidence)/F, with F the
        number of rows that compare at least two groups (Bonferroni over the family, the same
        family the Holm adjustment runs over). Then, with probability at least
        ``confidence``, *every* true Δ of the table lies in its interval, which is the claim a
        reader makes when scanning a table of gaps. If false, each interval covers its own Δ
        with probability ``confidence``, and about one row in twenty misses by chance.
    alpha:
        Family-wise error rate: a row is ``flagged`` when its Holm-adjusted p-value is below it.
    permutations, seed:
        Monte-Carlo draws and seed of the permutation test for sparse tables
        (see :func:`acrb.analysis.tests.contingency.homogeneity_test`).

    Returns
    -------
    DataFrame with columns ``outcome, category, dimension, delta, ci_low, ci_high, max_group,
    min_group, n, p_value, p_adjusted, flagged, method``. ``delta`` = max − min of the group
    rates over groups with n > 0 (0 for one group, NaN for none); ``max_group``/``min_group``
    name the groups attaining them (first in vocabulary order on ties); ``n`` = requests with
    the outcome observed; ``p_value`` and ``method`` come from
    :func:`acrb.analysis.tests.contingency.homogeneity_test`;
    ``p_adjusted`` is Holm's step-down adjustment (Holm 1979, "A simple sequentially rejective
    multiple test procedure", Scand J Statist 6:65-70;
    ``statsmodels.stats.multitest.multipletests(method="holm")``) over every row of the
    returned family that has a p-value (all categories and dimensions of this outcome,
    degenerate rows with p = 1 included, which is conservative).

    Assumes requests are independent given group and category (see the module docstring).
    """
    rates = group_rates(frame, outcome, confidence)
    blocks = list(rates.groupby(["category", "dimension"], sort=False))
    family = sum(int((block["n"] > 0).sum() >= 2) for _, block in blocks)
    row_confidence = 1.0 - (1.0 - confidence) / max(family, 1) if simultaneous else confidence
    rows = []
    for (category, dimension), block in blocks:
        observed = block.loc[block["n"] > 0]
        k = observed["k"].to_numpy()
        n = observed["n"].to_numpy()
        low, high = delta_interval(k, n, row_confidence)
        p_value, method = homogeneity_test(k, n, permutations=permutations, seed=seed)
        if len(observed):
            group_rate = observed["rate"].to_numpy()
            top, bottom = int(np.argmax(group_rate)), int(np.argmin(group_rate))
            delta = float(group_rate[top] - group_rate[bottom])
            max_group, min_group = observed["value"].iloc[top], observed["value"].iloc[bottom]
        else:
            delta, max_group, min_group = float("nan"), None, None
        rows.append(
            {
                "outcome": outcome,
                "category": category,
                "dimension": dimension,
                "delta": delta,
                "delta_corrected": float("nan"),
                "ci_low": low,
                "ci_high": high,
                "max_group": max_group,
                "min_group": min_group,
                "n": int(n.sum()),
                "p_value": p_value,
                "method": method,
            }
        )
    result = pd.DataFrame(rows)
    result["p_adjusted"] = adjust(result["p_value"].to_numpy(dtype=float), "holm")
    result["flagged"] = (result["p_adjusted"] < alpha).fillna(False).astype(bool)
    return result[list(DISPARITY_COLUMNS)]
