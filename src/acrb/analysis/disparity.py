"""Disparity Δ = max_a R(a) − min_a R(a) across source groups, its interval and its test.

For every prompt category (and the pooled ``"all"``) and every source dimension (race, gender,
age), :func:`disparities` reports the gap between the group with the highest and the group with
the lowest rate of an outcome, a confidence interval for that gap, and a test of whether the
groups differ at all, adjusted for the number of such tests (Holm).

Units: Δ and its interval are differences of proportions (in [0, 1]; multiply by 100 for
percentage points). p-values are probabilities.

Independence assumption: the interval and the tests treat requests as independent given their
group and category. That holds for the simulated editors (each request's outcome is drawn
independently); in real audits the same source images and prompts recur across requests, so
outcomes are clustered and these intervals are too narrow. The clustered version (bootstrap
over sources and prompts, mixed models) belongs to the statistics module.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import chi2_contingency, fisher_exact
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import confint_proportions_2indep

from acrb.analysis.rates import group_rates

DISPARITY_COLUMNS: tuple[str, ...] = (
    "outcome",
    "category",
    "dimension",
    "delta",
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

#: Below this expected cell count the chi-square approximation is not trusted (Cochran 1954).
MIN_EXPECTED_COUNT = 5.0
#: Monte-Carlo draws for the permutation test of tables with small expected counts.
DEFAULT_PERMUTATIONS = 20_000
#: Seed of the permutation test, fixed so that a report is reproducible to the digit.
DEFAULT_SEED = 20_240_601


def delta_interval(k: np.ndarray, n: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Confidence interval for Δ = max_i p_i − min_i p_i from k_i successes in n_i trials.

    Why not a bootstrap: Δ is a maximum over group differences, so its plug-in estimate is
    biased upwards and positive whenever the groups differ by chance; a percentile bootstrap
    of max − min therefore never covers Δ = 0, even when all groups are equal.

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
    are consistent with it. The price of simultaneity is conservatism: coverage is usually
    well above the nominal level.

    Only groups with n > 0 take part. One group gives (0, 0); none gives (NaN, NaN).
    Assumes independent requests given group (see the module docstring).
    """
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


def _pearson_statistic(k: np.ndarray, n: np.ndarray, total_true: int) -> np.ndarray:
    """Pearson X² of g x 2 tables sharing margins n (rows) and K = total_true; k is (..., g)."""
    total = n.sum()
    expected_true = n * total_true / total
    expected_false = n * (total - total_true) / total
    deviation = k - expected_true
    return np.sum(deviation**2 * (1.0 / expected_true + 1.0 / expected_false), axis=-1)


def _permutation_p_value(k: np.ndarray, n: np.ndarray, permutations: int, seed: int) -> float:
    """Monte-Carlo permutation p-value of Pearson's X² for a g x 2 table.

    Permuting the group labels of the requests while keeping group sizes fixed distributes the
    K True outcomes over the groups as a multivariate hypergeometric draw, so the tables are
    drawn directly from it (``numpy.random.Generator.multivariate_hypergeometric``): the same
    test as shuffling labels row by row, vectorised. p = (1 + #{X²* ≥ X²}) / (B + 1), which
    is never 0 and keeps the test valid (Phipson & Smyth 2010, "Permutation p-values should
    never be zero", Stat Appl Genet Mol Biol 9:39).
    """
    rng = np.random.default_rng(seed)
    total_true = int(k.sum())
    draws = rng.multivariate_hypergeometric(n.astype(np.int64), total_true, size=permutations)
    observed = float(_pearson_statistic(k, n, total_true))
    simulated = _pearson_statistic(draws.astype(float), n, total_true)
    # Tolerance so that tables with the same statistic as the observed one count as extreme.
    extreme = simulated >= observed - 1e-9 * max(1.0, observed)
    return float((1 + np.count_nonzero(extreme)) / (permutations + 1))


def homogeneity_test(
    k: np.ndarray,
    n: np.ndarray,
    *,
    permutations: int = DEFAULT_PERMUTATIONS,
    seed: int = DEFAULT_SEED,
) -> tuple[float, str]:
    """p-value of the hypothesis that all groups share one rate, and the method used.

    The data are the g x 2 table (k_i True, n_i − k_i False) over groups with n_i > 0.

    - ``"chi2"``: Pearson's chi-square test of homogeneity (``scipy.stats.chi2_contingency``
      without Yates' continuity correction, which is needlessly conservative; small tables are
      handled by the exact paths below) when every expected count is at least 5 (Cochran 1954,
      "Some methods for strengthening the common χ² tests", Biometrics 10:417-451).
    - ``"fisher"``: Fisher's exact test (``scipy.stats.fisher_exact``, two-sided) for a 2 x 2
      table with an expected count below 5.
    - ``"permutation"``: for larger tables with an expected count below 5, a Monte-Carlo
      permutation test of Pearson's X² with ``permutations`` draws and a fixed ``seed``
      (see :func:`_permutation_p_value`), so the result is deterministic. It conditions on
      both margins, like Fisher's test, and is its g x 2 analogue.
    - ``"degenerate"``: fewer than two groups, or every outcome True, or every outcome
      False: the data cannot show a difference, p = 1.
    - ``"no data"``: no group has an observation; p is NaN.
    """
    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    keep = n > 0
    k, n = k[keep], n[keep]
    if len(n) == 0:
        return float("nan"), "no data"
    total_true = k.sum()
    total = n.sum()
    if len(n) < 2 or total_true == 0 or total_true == total:
        return 1.0, "degenerate"
    table = np.column_stack([k, n - k])
    expected = np.outer(n, [total_true, total - total_true]) / total
    if expected.min() >= MIN_EXPECTED_COUNT:
        result = chi2_contingency(table, correction=False)
        return float(result.pvalue), "chi2"
    if len(n) == 2:
        return float(fisher_exact(table.astype(np.int64)).pvalue), "fisher"
    return _permutation_p_value(k, n, permutations, seed), "permutation"


def disparities(
    frame: pd.DataFrame,
    outcome: str,
    confidence: float = 0.95,
    alpha: float = 0.05,
    *,
    simultaneous: bool = True,
    permutations: int = DEFAULT_PERMUTATIONS,
    seed: int = DEFAULT_SEED,
) -> pd.DataFrame:
    """Δ of ``outcome`` for every category (and ``"all"``) x source dimension, with tests.

    Parameters
    ----------
    frame:
        The analysis frame of one model (one row per request); rows with status ``error`` are
        left out, as are rows where the outcome is NA.
    outcome:
        One of :data:`acrb.analysis.rates.OUTCOMES`.
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
        (see :func:`homogeneity_test`).

    Returns
    -------
    DataFrame with columns ``outcome, category, dimension, delta, ci_low, ci_high, max_group,
    min_group, n, p_value, p_adjusted, flagged, method``. ``delta`` = max − min of the group
    rates over groups with n > 0 (0 for one group, NaN for none); ``max_group``/``min_group``
    name the groups attaining them (first in vocabulary order on ties); ``n`` = requests with
    the outcome observed; ``p_value`` and ``method`` come from :func:`homogeneity_test`;
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
    result["p_adjusted"] = holm_adjust(result["p_value"].to_numpy(dtype=float))
    result["flagged"] = (result["p_adjusted"] < alpha).fillna(False).astype(bool)
    return result[list(DISPARITY_COLUMNS)]


def holm_adjust(p_values: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values over the finite entries of ``p_values``; NaN stays NaN."""
    p_values = np.asarray(p_values, dtype=float)
    adjusted = np.full(p_values.shape, np.nan)
    finite = np.isfinite(p_values)
    if finite.any():
        adjusted[finite] = multipletests(p_values[finite], method="holm")[1]
    return adjusted
