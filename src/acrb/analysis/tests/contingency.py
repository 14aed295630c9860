"""Contingency-table tests of group differences: requests counted as independent.

- :func:`homogeneity_test`: do the groups of a g x 2 table (outcome True / False) share one
  rate? Pearson's chi-square, Fisher's exact test or a permutation test by table size.
- :func:`category_tests`: that test in every prompt category, Holm over the categories.
- :func:`cmh_test`: Cochran-Mantel-Haenszel across categories as strata (generalized CMH for
  more than two groups, :func:`generalized_cmh`).

Every function counts requests as independent given group and category. An audit edits the
same source image under every prompt, so outcomes cluster within sources and these p-values
are too small whenever sources differ beyond their group: read them as descriptive screens,
not as evidence of bias. Why, and how badly they fail under clustering:
``docs/statistics.md#contingency-tests``; the cluster-robust tests are in
:mod:`acrb.analysis.estimation.resampling` and :mod:`acrb.analysis.tests.gee`.

Frames are analysis frames (:mod:`acrb.analysis.frame`); only requests that count and whose
outcome is observed take part, and groups without observations take no part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from acrb.analysis import defaults
from acrb.analysis.frame import checked_frame, outcome_rows, usable_rows
from acrb.analysis.tests.pvalues import TestResult, adjust

#: Below this expected cell count the chi-square approximation is not trusted (Cochran 1954).
MIN_EXPECTED_COUNT = 5.0

CATEGORY_TEST_COLUMNS: tuple[str, ...] = (
    "outcome",
    "dimension",
    "category",
    "statistic",
    "df",
    "p_value",
    "p_adjusted",
    "method",
    "n",
    "n_groups",
)


@dataclass(frozen=True)
class CMHResult(TestResult):
    """Cochran-Mantel-Haenszel test over category strata.

    ``odds_ratio`` is the Mantel-Haenszel common odds ratio (second group vs first, outcome
    True) for two groups, None otherwise.
    """

    n_strata: int = 0
    n_groups: int = 0
    odds_ratio: float | None = None


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
    permutations: int = defaults.PERMUTATIONS,
    seed: int = defaults.SEED,
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
    from scipy.stats import chi2_contingency, fisher_exact

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


def category_tests(
    frame: pd.DataFrame,
    outcome: str,
    dimension: str,
    *,
    permutations: int = defaults.PERMUTATIONS,
    seed: int = defaults.SEED,
) -> pd.DataFrame:
    """Per prompt category, a test of outcome x group independence (a g x 2 table).

    The p-value and method come from :func:`homogeneity_test`: Pearson's χ² without continuity
    correction (``scipy.stats.chi2_contingency``) when every expected count is at least 5
    (Cochran 1954); otherwise Fisher's exact test for two groups (``scipy.stats.fisher_exact``)
    or, for more groups, a Monte-Carlo permutation test of X² conditioning on both margins
    (``permutations`` draws, fixed ``seed``). ``statistic`` is
    always Pearson's X² of the table (whatever test gives the p-value; NaN when fewer than
    two groups or a constant outcome), ``df`` = groups − 1. ``p_adjusted`` is Holm's
    adjustment over the categories. Groups with no observation in a category take no part.

    Returns one row per category present (sorted), columns :data:`CATEGORY_TEST_COLUMNS`.
    Requests are treated as independent (see the module docstring).
    """
    from scipy import stats

    frame = checked_frame(frame)
    rows = outcome_rows(frame, outcome, dimension)
    categories = sorted(
        {str(c) for c in usable_rows(frame)["category"].dropna().unique()} | set(rows["category"])
    )
    records = []
    for category in categories:
        block = rows.loc[rows["category"] == category]
        counts = block.groupby("group", observed=True)["y"].agg(["size", "sum"])
        n = counts["size"].to_numpy(dtype=float)
        k = counts["sum"].to_numpy(dtype=float)
        p_value, method = homogeneity_test(k, n, permutations=permutations, seed=seed)
        statistic = float("nan")
        if method not in ("degenerate", "no data"):
            table = np.column_stack([k, n - k])
            statistic = float(stats.chi2_contingency(table, correction=False).statistic)
        groups = len(n)
        records.append(
            {
                "outcome": outcome,
                "dimension": dimension,
                "category": category,
                "statistic": statistic,
                "df": float(groups - 1) if groups >= 2 else float("nan"),
                "p_value": p_value,
                "method": method,
                "n": int(n.sum()),
                "n_groups": groups,
            }
        )
    result = pd.DataFrame(records, columns=[c for c in CATEGORY_TEST_COLUMNS if c != "p_adjusted"])
    result["p_adjusted"] = adjust(result["p_value"].to_numpy(dtype=float), "holm")
    return result[list(CATEGORY_TEST_COLUMNS)]


def generalized_cmh(tables: np.ndarray) -> tuple[float, int]:
    """Generalized CMH general-association statistic Q and its degrees of freedom.

    ``tables`` has shape (K, r, c): K strata of r x c count tables. Under the null of no
    association in any stratum, conditioning on every stratum's margins, the counts of the
    first (r−1) x (c−1) cells have hypergeometric mean m_h = n_h (p_h ⊗ q_h) and covariance
    V_h = n_h² / (n_h − 1) · (D_p − p p') ⊗ (D_q − q q'), with p_h, q_h the first r−1 row and
    c−1 column proportions of stratum h (Landis, Heyman & Koch 1978, "Average partial
    association in three-way contingency tables: a review and discussion of alternative
    tests", Int Stat Rev 46:237-254; Agresti 2002, Categorical Data Analysis, 2nd ed., §7.5).
    Q = d' V⁻ d with d = Σ_h (n_h − m_h), V = Σ_h V_h and V⁻ the Moore-Penrose inverse;
    df = rank(V) (= (r−1)(c−1) when no row or column is empty in every stratum), and Q is
    asymptotically χ²_df. Strata with fewer than two observations carry no information and
    are skipped. For one stratum Q = (N − 1)/N · Pearson X²; for 2 x 2 tables Q is the
    Mantel-Haenszel statistic without continuity correction.
    """
    tables = np.asarray(tables, dtype=float)
    if tables.ndim != 3:
        raise ValueError("tables must have shape (strata, rows, columns)")
    _, r, c = tables.shape
    size = (r - 1) * (c - 1)
    d = np.zeros(size)
    v = np.zeros((size, size))
    for table in tables:
        n = table.sum()
        if n < 2:
            continue
        p = table.sum(axis=1)[: r - 1] / n
        q = table.sum(axis=0)[: c - 1] / n
        d += table[: r - 1, : c - 1].ravel() - n * np.outer(p, q).ravel()
        v += n**2 / (n - 1) * np.kron(np.diag(p) - np.outer(p, p), np.diag(q) - np.outer(q, q))
    if size == 0 or not np.any(v):
        return 0.0, 0
    scale = float(np.abs(v).max())
    rank = int(np.linalg.matrix_rank(v / scale, tol=1e-10 * size))
    statistic = float(d @ np.linalg.pinv(v / scale, rcond=1e-10, hermitian=True) @ d) / scale
    return max(statistic, 0.0), rank


def cmh_test(frame: pd.DataFrame, outcome: str, dimension: str) -> CMHResult:
    """Cochran-Mantel-Haenszel test of outcome x group association across category strata.

    Tests whether the outcome depends on the group after conditioning on the prompt category,
    pooling the evidence of every category (most powerful when the group difference points
    the same way in every category).

    - Two groups: ``statsmodels.stats.contingency_tables.StratifiedTable(...)
      .test_null_odds(correction=False)`` (Mantel & Haenszel 1959), with the MH common
      odds ratio (second group vs first, in vocabulary order) in ``odds_ratio``.
    - More groups: the generalized CMH general-association statistic, df = groups − 1
      (:func:`generalized_cmh`, Landis, Heyman & Koch 1978), p from ``scipy.stats.chi2``.

    Strata are the categories present; strata with fewer than two requests are dropped, as
    are groups with no request at all. Every outcome the same gives statistic 0 and p = 1
    (``reason``: degenerate), as in :func:`homogeneity_test`. Requests are treated as
    independent within strata (see the module docstring).
    """
    from scipy import stats
    from statsmodels.stats.contingency_tables import StratifiedTable

    frame = checked_frame(frame)
    rows = outcome_rows(frame, outcome, dimension)
    n = len(rows)
    groups = list(rows["group"].cat.categories)
    if n == 0:
        return CMHResult("no data", math.nan, math.nan, math.nan, 0, reason="no observations")
    if len(groups) < 2:
        return CMHResult(
            "degenerate", 0.0, 0.0, 1.0, n, reason="fewer than two groups", n_groups=len(groups)
        )
    categories = sorted(rows["category"].unique())
    counts = (
        rows.assign(true=rows["y"], false=1.0 - rows["y"])
        .groupby(["category", "group"], observed=True)[["true", "false"]]
        .sum()
        .reindex(pd.MultiIndex.from_product([categories, groups]), fill_value=0.0)
    )
    tables = counts.to_numpy().reshape(len(categories), len(groups), 2)
    tables = tables[tables.sum(axis=(1, 2)) >= 2]
    strata = len(tables)
    if rows["y"].nunique() < 2:
        return CMHResult(
            "degenerate", 0.0, 0.0, 1.0, n, reason="every outcome is the same",
            n_strata=strata, n_groups=len(groups),
        )
    if len(groups) == 2:
        # StratifiedTable wants 2 x 2 x K; drop strata with an empty margin, which carry
        # no information and would make its variance terms 0/0.
        informative = (tables.sum(axis=1).min(axis=1) > 0) & (tables.sum(axis=2).min(axis=1) > 0)
        table = np.transpose(tables[informative], (1, 2, 0))
        if table.shape[2] == 0:
            return CMHResult(
                "degenerate", 0.0, 0.0, 1.0, n,
                reason="no stratum has both groups and both outcomes",
                n_strata=strata, n_groups=2,
            )
        stratified = StratifiedTable(table)
        test = stratified.test_null_odds(correction=False)
        with np.errstate(divide="ignore", invalid="ignore"):
            # MH odds ratio of True for the first group vs the second; report second vs first.
            pooled = float(stratified.oddsratio_pooled)
        return CMHResult(
            "cmh (mantel-haenszel)", float(test.statistic), 1.0, float(test.pvalue), n,
            n_strata=strata, n_groups=2,
            odds_ratio=1.0 / pooled if pooled > 0 else math.inf,
        )
    statistic, df = generalized_cmh(tables)
    if df == 0:
        return CMHResult(
            "degenerate", 0.0, 0.0, 1.0, n, reason="no stratum varies in both margins",
            n_strata=strata, n_groups=len(groups),
        )
    return CMHResult(
        "generalized cmh (general association)", statistic, float(df),
        float(stats.chi2.sf(statistic, df)), n, n_strata=strata, n_groups=len(groups),
    )
