"""Hypothesis tests of group differences in an audit's outcomes, from tables to clustered models.

Every function takes an analysis frame (one row per request: ``request_id, source_id,
prompt_id, category, seed, race, gender, age, status`` and boolean outcomes; see
:mod:`acrb.analysis.rates`) and usually an ``outcome`` (``hard_refusal``, ``erasure``,
``lightening``) and a source ``dimension`` (``race``, ``gender``, ``age``). Only rows whose
status is ``ok`` or ``refused`` are used, and only where the outcome (or judge score) is
observed; groups are ordered as in :data:`acrb.demographics.SOURCE_DIMENSIONS` and groups
without observations take no part. Each function returns a small typed result with the
statistic, its degrees of freedom where there are any, the p-value, the method and n. Where a
test cannot be computed (fewer than two groups, a constant outcome, a model whose estimates
diverge) the p-value is NaN and ``reason`` says why; "cannot show a difference" cases that
the contingency-table tests handle by convention (every outcome the same) get p = 1, as in
:func:`acrb.analysis.disparity.homogeneity_test`.

Which test answers what
-----------------------
- :func:`category_tests`, :func:`cmh_test`: contingency-table tests (per category; across
  categories as strata). They treat requests as independent given group and category. In an
  audit the same source image and prompt recur across requests, so outcomes are clustered and
  these p-values are too small when sources differ beyond their group; read them as
  descriptive screens.
- :func:`gee_group_test`, :func:`model_interaction_test`: logistic GEE with a cluster-robust
  (sandwich) variance, clusters = source images. These are the confirmatory tests of group
  effects, because every source dimension is a property of the cluster.
- :func:`kruskal_dunn`, :func:`ordinal_model`: judge scores (ordinal 1-5).
- :func:`tost_delta`, :func:`design_effect`: equivalence ("no bias": Δ below a margin).
- :func:`minimum_detectable_gap`: design sensitivity (power).
- :func:`adjust`: Holm / Benjamini-Hochberg adjustment, NaN-safe.

Bootstrap and permutation procedures live in :mod:`acrb.analysis.resampling`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import scikit_posthocs
import statsmodels.api as sm
from scipy import stats
from statsmodels.miscmodels.ordinal_model import OrderedModel
from statsmodels.stats.contingency_tables import StratifiedTable
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import tost_proportions_2indep
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from acrb.analysis.disparity import DEFAULT_PERMUTATIONS, DEFAULT_SEED, homogeneity_test
from acrb.analysis.rates import check_columns
from acrb.demographics import SOURCE_DIMENSIONS

#: Request statuses whose rows carry an outcome: an ``error`` or ``missing`` request has none.
USABLE_STATUSES: tuple[str, ...] = ("ok", "refused")

#: The column that names the source image, the cluster of every clustered method here.
CLUSTER_COLUMN = "source_id"

#: A fitted logit coefficient larger than this (|log-odds ratio| > 15, odds ratio > 3e6) means
#: the estimates are running off to infinity: (quasi-)complete separation.
MAX_ABS_LOG_ODDS = 15.0

#: The adjustments :func:`adjust` offers (names of ``statsmodels.stats.multitest``).
ADJUST_METHODS: tuple[str, ...] = ("holm", "fdr_bh")

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

ODDS_RATIO_COLUMNS: tuple[str, ...] = ("group", "odds_ratio", "ci_low", "ci_high", "p_value")


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TestResult:
    """One hypothesis test: statistic, degrees of freedom, p-value, method, sample size.

    ``df`` is NaN for tests without degrees of freedom; ``reason`` says why ``p_value`` is NaN
    (or 1 by convention), and is None for an ordinary result.
    """

    __test__ = False  # not a pytest test class

    method: str
    statistic: float
    df: float
    p_value: float
    n: int
    reason: str | None = None


@dataclass(frozen=True)
class CMHResult(TestResult):
    """Cochran-Mantel-Haenszel test over category strata.

    ``odds_ratio`` is the Mantel-Haenszel common odds ratio (second group vs first, outcome
    True) for two groups, None otherwise.
    """

    n_strata: int = 0
    n_groups: int = 0
    odds_ratio: float | None = None


@dataclass(frozen=True, eq=False)
class GEEGroupResult:
    """Clustered logistic test of a source dimension (see :func:`gee_group_test`).

    ``statistic``/``df``/``p_value``: Wald χ² of every group term (main effects and group x
    category interactions) of ``y ~ C(group) * C(category)``: does the group matter in any
    category? ``interaction_*``: the interaction terms alone: does the group effect differ
    between categories? ``main_*``: the group terms of the additive model
    ``y ~ C(group) + C(category)``: is there a group effect common to all categories (more
    powerful when the effect is consistent)? ``odds_ratios``: per non-reference group, the
    category-adjusted population-averaged odds ratio against ``reference`` from the additive
    model, with its Wald interval and p-value (columns :data:`ODDS_RATIO_COLUMNS`).
    ``working_correlation``: the estimated exchangeable within-source correlation.
    ``reason`` / ``interaction_reason`` / ``main_reason`` say why a p-value is NaN; ``notes``
    list categories or terms left out.
    """

    outcome: str
    dimension: str
    method: str
    statistic: float
    df: float
    p_value: float
    interaction_statistic: float
    interaction_df: float
    interaction_p_value: float
    main_statistic: float
    main_df: float
    main_p_value: float
    n: int
    n_clusters: int
    reference: str | None
    odds_ratios: pd.DataFrame
    working_correlation: float = float("nan")
    reason: str | None = None
    interaction_reason: str | None = None
    main_reason: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelInteractionResult(TestResult):
    """Wald test of the model x group interaction (see :func:`model_interaction_test`)."""

    outcome: str = ""
    dimension: str = ""
    n_clusters: int = 0
    n_models: int = 0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class KruskalDunnResult(TestResult):
    """Kruskal-Wallis H test with Dunn's pairwise post hoc test.

    ``posthoc`` is the square matrix of Holm-adjusted pairwise p-values returned by
    ``scikit_posthocs.posthoc_dunn`` (groups as index and columns; empty when the omnibus
    test could not be computed). ``unit`` is what one observation is: a request, or a
    source's mean score. ``n_missing``: usable requests without a score (dropped).
    """

    n_missing: int = 0
    n_groups: int = 0
    unit: str = "request"
    posthoc: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass(frozen=True, eq=False)
class OrdinalResult(TestResult):
    """Proportional-odds (cumulative logit) test of a dimension on a judge score.

    ``odds_ratios`` (columns :data:`ODDS_RATIO_COLUMNS`): per non-reference group, the odds
    ratio of a *higher* score against ``reference``, with Wald interval and p-value from the
    covariance the test used. ``n_missing``: usable requests without a score (dropped).
    """

    n_missing: int = 0
    reference: str | None = None
    odds_ratios: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass(frozen=True)
class DesignEffect:
    """Design effect of clustering requests within sources (see :func:`design_effect`).

    ``icc`` is the ANOVA estimate (may be negative); ``deff`` = 1 + (m − 1)·max(icc, 0) ≥ 1
    with m = ``mean_cluster_size``.
    """

    deff: float
    icc: float
    mean_cluster_size: float
    n: int
    n_clusters: int


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


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def _check_dimension(dimension: str) -> tuple[str, ...]:
    if dimension not in SOURCE_DIMENSIONS:
        raise ValueError(
            f"unknown dimension '{dimension}'; expected one of {sorted(SOURCE_DIMENSIONS)}"
        )
    return SOURCE_DIMENSIONS[dimension]


def _check_single_model(frame: pd.DataFrame) -> None:
    if "model" in frame.columns and frame["model"].nunique(dropna=True) > 1:
        raise ValueError(
            "the frame pools several models; pass one model's rows "
            "(or use model_interaction_test to compare models)"
        )


def _usable(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.loc[frame["status"].isin(USABLE_STATUSES)]


def _group_series(rows: pd.DataFrame, dimension: str) -> pd.Series:
    """The dimension as a categorical in vocabulary order; values outside it become NaN."""
    vocabulary = _check_dimension(dimension)
    values = rows[dimension].astype("string")
    unknown = sorted(set(values.dropna().unique()) - set(vocabulary))
    if unknown:
        warnings.warn(
            f"{dimension} value(s) {unknown} are not in the ACRB vocabulary and are left out",
            stacklevel=3,
        )
    return pd.Series(
        pd.Categorical(values.astype(object), categories=list(vocabulary)), index=rows.index
    )


def _outcome_rows(
    frame: pd.DataFrame, outcome: str, dimension: str, extra: Sequence[str] = ()
) -> pd.DataFrame:
    """Usable rows with the outcome observed: columns ``y`` (0/1 float), ``group``,
    ``category`` and the ``extra`` columns; the group categorical keeps only present levels."""
    _check_dimension(dimension)
    check_columns(frame, ["status", "category", dimension, outcome, *extra])
    usable = _usable(frame)
    observed = usable[outcome].astype("boolean")
    group = _group_series(usable, dimension)
    keep = observed.notna().to_numpy() & group.notna().to_numpy()
    rows = pd.DataFrame(
        {
            "y": observed[keep].to_numpy(dtype=float),
            "group": group[keep].cat.remove_unused_categories().array,
            "category": usable["category"][keep].astype(str).to_numpy(),
        }
    )
    for column in extra:
        rows[column] = usable[column][keep].to_numpy()
    return rows


def _nan_odds_ratios() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float) for c in ODDS_RATIO_COLUMNS}).astype(
        {"group": object}
    )


# ---------------------------------------------------------------------------------------------
# 8. Multiple-testing adjustment
# ---------------------------------------------------------------------------------------------


def adjust(p_values: Sequence[float] | np.ndarray | pd.Series, method: str = "holm") -> np.ndarray:
    """Adjusted p-values over the finite entries of ``p_values``; NaN stays NaN.

    ``method``: ``"holm"`` (Holm 1979, family-wise error rate) or ``"fdr_bh"``
    (Benjamini & Hochberg 1995, false discovery rate), computed by
    ``statsmodels.stats.multitest.multipletests``. Returns an array of the input's shape.
    """
    if method not in ADJUST_METHODS:
        raise ValueError(f"unknown adjustment '{method}'; expected one of {ADJUST_METHODS}")
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full(p.shape, np.nan)
    finite = np.isfinite(p)
    if np.any((p[finite] < 0) | (p[finite] > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    if finite.any():
        adjusted[finite] = multipletests(p[finite], method=method)[1]
    return adjusted


# ---------------------------------------------------------------------------------------------
# 1. Per-category contingency tests
# ---------------------------------------------------------------------------------------------


def category_tests(
    frame: pd.DataFrame,
    outcome: str,
    dimension: str,
    *,
    permutations: int = DEFAULT_PERMUTATIONS,
    seed: int = DEFAULT_SEED,
) -> pd.DataFrame:
    """Per prompt category, a test of outcome x group independence (a g x 2 table).

    The p-value and method come from :func:`acrb.analysis.disparity.homogeneity_test`:
    Pearson's χ² without continuity correction (``scipy.stats.chi2_contingency``) when every
    expected count is at least 5 (Cochran 1954); otherwise Fisher's exact test for two groups
    (``scipy.stats.fisher_exact``) or, for more groups, a Monte-Carlo permutation test of X²
    conditioning on both margins (``permutations`` draws, fixed ``seed``). ``statistic`` is
    always Pearson's X² of the table (whatever test gives the p-value; NaN when fewer than
    two groups or a constant outcome), ``df`` = groups − 1. ``p_adjusted`` is Holm's
    adjustment over the categories. Groups with no observation in a category take no part.

    Returns one row per category present (sorted), columns :data:`CATEGORY_TEST_COLUMNS`.
    Requests are treated as independent (see the module docstring).
    """
    _check_single_model(frame)
    rows = _outcome_rows(frame, outcome, dimension)
    categories = sorted(
        {str(c) for c in _usable(frame)["category"].dropna().unique()} | set(rows["category"])
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


# ---------------------------------------------------------------------------------------------
# 2. Cochran-Mantel-Haenszel over category strata
# ---------------------------------------------------------------------------------------------


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
    (``reason``: degenerate), as in :func:`acrb.analysis.disparity.homogeneity_test`.
    Requests are treated as independent within strata (see the module docstring).
    """
    _check_single_model(frame)
    rows = _outcome_rows(frame, outcome, dimension)
    n = len(rows)
    groups = list(rows["group"].cat.categories)
    if n == 0:
        return CMHResult("no data", math.nan, math.nan, math.nan, 0, reason="no observations")
    if len(groups) < 2:
        return CMHResult(
            "degenerate", 0.0, 0.0, 1.0, n, reason="fewer than two groups", n_groups=len(groups)
        )
    counts = (
        rows.assign(true=rows["y"], false=1.0 - rows["y"])
        .groupby(["category", "group"], observed=False)[["true", "false"]]
        .sum()
    )
    categories = sorted(rows["category"].unique())
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


# ---------------------------------------------------------------------------------------------
# 3-4. GEE logistic models, clusters = source images
# ---------------------------------------------------------------------------------------------


def _dummies(values: pd.Series | np.ndarray, prefix: str) -> tuple[np.ndarray, list[str]]:
    """Treatment-coded indicator columns (first level = reference) and their names."""
    codes = pd.Categorical(values)
    levels = list(codes.categories)
    matrix = np.zeros((len(codes), max(len(levels) - 1, 0)))
    for j in range(1, len(levels)):
        matrix[:, j - 1] = codes.codes == j
    return matrix, [f"{prefix}[T.{level}]" for level in levels[1:]]


def _interact(
    a: tuple[np.ndarray, list[str]], b: tuple[np.ndarray, list[str]]
) -> tuple[np.ndarray, list[str]]:
    (ma, na), (mb, nb) = a, b
    columns = [ma[:, i] * mb[:, j] for i in range(ma.shape[1]) for j in range(mb.shape[1])]
    names = [f"{x}:{y}" for x in na for y in nb]
    matrix = np.column_stack(columns) if columns else np.zeros((ma.shape[0], 0))
    return matrix, names


def _full_rank(matrix: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str], list[str]]:
    """Drop columns that are all zero or linearly dependent on earlier columns (empty cells).

    Greedy left to right on the Gram matrix, so main effects are kept before interactions.
    Returns the reduced matrix, its names and the dropped names.
    """
    gram = matrix.T @ matrix
    kept: list[int] = []
    dropped: list[str] = []
    for j in range(matrix.shape[1]):
        trial = [*kept, j]
        sub = gram[np.ix_(trial, trial)]
        scale = max(float(np.abs(sub).max()), 1.0)
        if np.linalg.matrix_rank(sub / scale, tol=1e-9) == len(trial):
            kept.append(j)
        else:
            dropped.append(names[j])
    return matrix[:, kept], [names[j] for j in kept], dropped


@dataclass
class _Fit:
    """A GEE fit, or why there is none."""

    params: pd.Series | None = None
    cov: pd.DataFrame | None = None
    results: object | None = None
    reason: str | None = None
    dependence: float = float("nan")


def _fit_gee(
    y: np.ndarray,
    blocks: list[tuple[np.ndarray, list[str]]],
    clusters: np.ndarray,
    cov_type: str,
) -> tuple[_Fit, list[str]]:
    """Fit logistic GEE (exchangeable) of y on an intercept plus ``blocks``; check the fit."""
    matrix = np.column_stack([np.ones(len(y)), *[m for m, _ in blocks]])
    names = ["Intercept", *[n for _, ns in blocks for n in ns]]
    matrix, names, dropped = _full_rank(matrix, names)
    exog = pd.DataFrame(matrix, columns=names)
    model = sm.GEE(
        y,
        exog,
        groups=clusters,
        family=sm.families.Binomial(),
        cov_struct=sm.cov_struct.Exchangeable(),
    )
    with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
        warnings.simplefilter("always")
        try:
            results = model.fit(cov_type=cov_type)
        except (np.linalg.LinAlgError, ValueError, ZeroDivisionError) as error:
            return _Fit(reason=f"GEE could not be fitted: {error}"), dropped
    problems = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    if problems:
        return _Fit(reason=f"GEE did not converge: {problems[0]}"), dropped
    params = pd.Series(np.asarray(results.params), index=names)
    cov = pd.DataFrame(np.asarray(results.cov_params()), index=names, columns=names)
    if not (np.all(np.isfinite(params)) and np.all(np.isfinite(cov.to_numpy()))):
        return _Fit(reason="GEE estimates are not finite"), dropped
    if np.abs(params.to_numpy()[1:]).max(initial=0.0) > MAX_ABS_LOG_ODDS:
        return (
            _Fit(reason="a coefficient diverges (|log odds ratio| > 15): separation"),
            dropped,
        )
    dependence = float(np.asarray(results.model.cov_struct.dep_params).ravel()[0])
    return _Fit(params, cov, results, dependence=dependence), dropped


def _wald(fit: _Fit, terms: list[str]) -> tuple[float, float, float]:
    """Wald χ² test that the coefficients ``terms`` are all 0 (statsmodels ``wald_test``)."""
    assert fit.params is not None and fit.results is not None
    names = list(fit.params.index)
    if not terms:
        return math.nan, 0.0, math.nan
    constraints = np.zeros((len(terms), len(names)))
    for i, term in enumerate(terms):
        constraints[i, names.index(term)] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        test = fit.results.wald_test(constraints, scalar=True)  # type: ignore[attr-defined]
    return float(test.statistic), float(test.df_denom), float(test.pvalue)


def _constant_cells(rows: pd.DataFrame, by: list[str]) -> list[str]:
    means = rows.groupby(by, observed=True)["y"].mean()
    constant = means[(means == 0) | (means == 1)]
    return [" x ".join(map(str, i if isinstance(i, tuple) else (i,))) for i in constant.index]


def _drop_constant_categories(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Categories where every outcome is the same carry no information on group effects in a
    logit model (their category effect is infinite); they are left out, as CMH ignores them."""
    constant = _constant_cells(rows, ["category"])
    return rows.loc[~rows["category"].isin(constant)], constant


def _group_cluster_problem(rows: pd.DataFrame, column: str) -> str | None:
    sources = rows.groupby(column, observed=True)[CLUSTER_COLUMN].nunique()
    thin = sources[sources < 2]
    if len(thin):
        return (
            f"group(s) {list(map(str, thin.index))} have fewer than two sources: the "
            "cluster-robust variance of their effect is not defined"
        )
    return None


def gee_group_test(
    frame: pd.DataFrame,
    outcome: str,
    dimension: str,
    *,
    reference: str | None = None,
    cov_type: str = "robust",
    confidence: float = 0.95,
) -> GEEGroupResult:
    """Clustered logistic test of a source dimension: GEE, clusters = source images.

    Model: logit P(y = 1) = ``C(group) * C(category)`` (treatment coding, ``reference`` group
    and the first category as baselines; ``C(group)`` alone when there is one category),
    fitted by generalized estimating equations (Liang & Zeger 1986, "Longitudinal data
    analysis using generalized linear models", Biometrika 73:13-22;
    ``statsmodels.genmod.generalized_estimating_equations.GEE``) with a binomial family, logit
    link, an exchangeable working correlation within each source image, and the robust
    sandwich covariance (``cov_type="robust"``; ``"bias_reduced"`` applies the small-sample
    correction of Mancl & DeRouen 2001, Biometrics 57:126-134). Wald χ² tests
    (``GEEResults.wald_test(..., scalar=True)``): all group terms (main + interaction, the
    omnibus test), the interaction terms alone, and the group terms of the additive model
    ``C(group) + C(category)``, whose coefficients give the category-adjusted odds ratios.

    Why GEE: race, gender and age are properties of the source image, so all requests of a
    source share its group and every group contrast is a between-cluster contrast; a test
    that treats the requests as independent overstates the evidence by the design effect
    (see :func:`design_effect`). GEE estimates the population-averaged effect (the odds ratio
    between groups averaged over source images, the audit's question) and its sandwich
    variance is consistent whatever the true within-source correlation, given enough
    clusters: the paper design has 84 sources (12-42 per group), enough for the sandwich
    estimator at the usual ~40-50 cluster guideline (use ``bias_reduced`` for smaller audits).
    A mixed model (``BinomialBayesMixedGLM``) estimates subject-specific effects by
    variational Bayes and gives posterior summaries, not p-values; GLMM by Laplace/quadrature
    is not in statsmodels. Prompts are *crossed* with sources, not nested: the same prompt is
    applied to every source. Clustering on source alone leaves the prompt-level correlation
    to the category fixed effects; correlation between requests of one prompt beyond its
    category is not in the sandwich. Because every prompt is applied to every source of every
    group in the ACRB design, prompt effects are balanced across groups and do not bias the
    group contrast, but a crossed (two-way) cluster bootstrap
    (:mod:`acrb.analysis.resampling`) is the check for that.

    Guards (each gives NaN p-values with ``reason``, never an exception): fewer than two
    groups, a constant outcome, a group with fewer than two sources, a GEE that does not
    converge or whose coefficients diverge (|log OR| > 15). Categories where the outcome is
    constant are left out (``notes``). A group x category cell where the outcome is constant
    (quasi-complete separation in the saturated model) makes the omnibus and interaction
    tests NaN (``interaction_reason``) while the additive model may still be fitted; a group
    whose outcome is constant over all categories makes it NaN too (``main_reason``).
    Empty cells drop their (non-estimable) interaction columns, reducing df.
    """
    _check_single_model(frame)
    vocabulary = _check_dimension(dimension)
    rows = _outcome_rows(frame, outcome, dimension, extra=[CLUSTER_COLUMN])
    method = f"GEE logit, exchangeable, {cov_type} sandwich, clusters={CLUSTER_COLUMN}"
    present = list(rows["group"].cat.categories)
    if reference is not None and reference not in vocabulary:
        raise ValueError(f"reference '{reference}' is not a {dimension} value")
    base = reference if reference in present else (present[0] if present else None)

    def failed(reason: str, notes: tuple[str, ...] = ()) -> GEEGroupResult:
        nan = math.nan
        return GEEGroupResult(
            outcome, dimension, method, nan, nan, nan, nan, nan, nan, nan, nan, nan,
            len(rows), int(rows[CLUSTER_COLUMN].nunique()), base, _nan_odds_ratios(),
            reason=reason, interaction_reason=reason, main_reason=reason, notes=notes,
        )

    if len(rows) == 0:
        return failed("no observations")
    if len(present) < 2:
        return failed("fewer than two groups with observations")
    if rows["y"].nunique() < 2:
        return failed("the outcome is constant: nothing to model")
    rows, constant_categories = _drop_constant_categories(rows)
    notes: list[str] = []
    if constant_categories:
        notes.append(f"categories with a constant outcome left out: {constant_categories}")
    rows = rows.assign(group=rows["group"].cat.remove_unused_categories())
    present = list(rows["group"].cat.categories)
    if len(present) < 2:
        return failed("fewer than two groups outside constant categories", tuple(notes))
    if base not in present:
        base = present[0]
    problem = _group_cluster_problem(rows, "group")
    if problem:
        return failed(problem, tuple(notes))
    ordered = [base, *[g for g in present if g != base]]
    group = pd.Categorical(rows["group"].astype(str), categories=ordered)
    clusters = pd.factorize(rows[CLUSTER_COLUMN])[0]
    y = rows["y"].to_numpy()
    g_block = _dummies(group, "C(group)")
    c_block = _dummies(rows["category"].to_numpy(), "C(category)")
    one_category = rows["category"].nunique() < 2

    # Additive model: the odds ratios and the "common effect" test.
    main_fit, main_dropped = _fit_gee(
        y, [g_block] if one_category else [g_block, c_block], clusters, cov_type
    )
    constant_groups = _constant_cells(rows, ["group"])
    main_reason = main_fit.reason
    if constant_groups:
        main_reason = f"group(s) {constant_groups} have a constant outcome: separation"
    group_terms = [n for n in g_block[1] if main_fit.params is not None]
    if main_reason is None and main_fit.params is not None:
        group_terms = [n for n in g_block[1] if n in main_fit.params.index]
        main_statistic, main_df, main_p = _wald(main_fit, group_terms)
        odds_ratios = _odds_ratio_table(main_fit.params, main_fit.cov, group_terms, confidence)
        if main_dropped:
            notes.append(f"additive model: non-estimable columns dropped: {main_dropped}")
    else:
        main_statistic = main_df = main_p = math.nan
        odds_ratios = _nan_odds_ratios()

    if one_category:
        statistic, df, p_value = main_statistic, main_df, main_p
        reason = main_reason
        interaction = (math.nan, math.nan, math.nan)
        interaction_reason: str | None = "one category: no group x category interaction"
        dependence = main_fit.dependence
    else:
        separated = _constant_cells(rows, ["group", "category"])
        if separated:
            reason = interaction_reason = (
                "group x category cell(s) with a constant outcome (quasi-complete "
                f"separation in the saturated model): {separated}"
            )
            statistic = df = p_value = math.nan
            interaction = (math.nan, math.nan, math.nan)
            dependence = main_fit.dependence
        else:
            full_fit, full_dropped = _fit_gee(
                y, [g_block, c_block, _interact(g_block, c_block)], clusters, cov_type
            )
            reason = interaction_reason = full_fit.reason
            dependence = full_fit.dependence
            if full_fit.params is not None:
                names = list(full_fit.params.index)
                terms = [n for n in names if n.startswith("C(group)")]
                statistic, df, p_value = _wald(full_fit, terms)
                interaction = _wald(full_fit, [n for n in terms if ":" in n])
                if full_dropped:
                    notes.append(f"interaction model: empty-cell columns dropped: {full_dropped}")
            else:
                statistic = df = p_value = math.nan
                interaction = (math.nan, math.nan, math.nan)
    return GEEGroupResult(
        outcome,
        dimension,
        method,
        statistic,
        df,
        p_value,
        *interaction,
        main_statistic,
        main_df,
        main_p,
        len(rows),
        int(rows[CLUSTER_COLUMN].nunique()),
        base,
        odds_ratios,
        working_correlation=dependence,
        reason=reason,
        interaction_reason=interaction_reason,
        main_reason=main_reason,
        notes=tuple(notes),
    )


def _odds_ratio_table(
    params: pd.Series, cov: pd.DataFrame, terms: list[str], confidence: float
) -> pd.DataFrame:
    """exp(coefficient) with its Wald interval and p-value, one row per ``X[T.level]`` term."""
    z = stats.norm.ppf(0.5 + confidence / 2.0)
    rows = []
    for term in terms:
        estimate = float(params[term])
        se = math.sqrt(max(float(cov.loc[term, term]), 0.0))
        rows.append(
            {
                "group": term.split("[T.", 1)[1].rstrip("]"),
                "odds_ratio": math.exp(estimate),
                "ci_low": math.exp(estimate - z * se),
                "ci_high": math.exp(estimate + z * se),
                "p_value": float(2.0 * stats.norm.sf(abs(estimate) / se)) if se > 0 else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=list(ODDS_RATIO_COLUMNS)) if rows else _nan_odds_ratios()


def model_interaction_test(
    frame: pd.DataFrame,
    outcome: str,
    dimension: str,
    *,
    cov_type: str = "robust",
) -> ModelInteractionResult:
    """Do the models treat the groups differently? Wald test of model x group interaction.

    ``frame`` pools several models' analysis frames with a ``model`` column. Model:
    logit P(y = 1) = ``C(model) * C(group) + C(category)``, logistic GEE with an exchangeable
    working correlation and the robust sandwich variance, clustered on ``source_id``: every
    model edits the same source images, so a source's requests are correlated across models
    too and the source remains the independent unit. The test is the Wald χ² of all
    model x group interaction coefficients ((models − 1)(groups − 1) df): it rejects when
    the group odds ratios (on the logit scale, adjusted for category) differ between models.
    See :func:`gee_group_test` for why GEE, and the guards: NaN ``p_value`` with ``reason``
    for fewer than two models or groups, a constant outcome, a group with fewer than two
    sources, a model x group cell with a constant outcome (separation) or a failed fit.
    Categories whose outcome is constant across all models are left out (``notes``).
    """
    _check_dimension(dimension)
    check_columns(frame, ["model"])
    rows = _outcome_rows(frame, outcome, dimension, extra=[CLUSTER_COLUMN, "model"])
    rows["model"] = rows["model"].astype(str)
    method = f"GEE logit, exchangeable, {cov_type} sandwich, clusters={CLUSTER_COLUMN}"
    models = sorted(rows["model"].unique())
    notes: list[str] = []

    def failed(reason: str) -> ModelInteractionResult:
        return ModelInteractionResult(
            method, math.nan, math.nan, math.nan, len(rows), reason=reason,
            outcome=outcome, dimension=dimension,
            n_clusters=int(rows[CLUSTER_COLUMN].nunique()), n_models=len(models),
            notes=tuple(notes),
        )

    if len(models) < 2:
        return failed("fewer than two models")
    if rows["group"].nunique() < 2:
        return failed("fewer than two groups with observations")
    if rows["y"].nunique() < 2:
        return failed("the outcome is constant: nothing to model")
    rows, constant_categories = _drop_constant_categories(rows)
    if constant_categories:
        notes.append(f"categories with a constant outcome left out: {constant_categories}")
    rows = rows.assign(group=rows["group"].cat.remove_unused_categories())
    problem = _group_cluster_problem(rows, "group")
    if problem:
        return failed(problem)
    separated = _constant_cells(rows, ["model", "group"])
    if separated:
        return failed(f"model x group cell(s) with a constant outcome (separation): {separated}")
    m_block = _dummies(pd.Categorical(rows["model"], categories=models), "C(model)")
    g_block = _dummies(rows["group"], "C(group)")
    blocks = [m_block, g_block, _interact(m_block, g_block)]
    if rows["category"].nunique() > 1:
        blocks.append(_dummies(rows["category"].to_numpy(), "C(category)"))
    fit, dropped = _fit_gee(
        rows["y"].to_numpy(), blocks, pd.factorize(rows[CLUSTER_COLUMN])[0], cov_type
    )
    if dropped:
        notes.append(f"non-estimable columns dropped: {dropped}")
    if fit.params is None:
        return failed(fit.reason or "GEE could not be fitted")
    terms = [n for n in fit.params.index if n.startswith("C(model)") and ":C(group)" in n]
    statistic, df, p_value = _wald(fit, terms)
    return ModelInteractionResult(
        method, statistic, df, p_value, len(rows), outcome=outcome, dimension=dimension,
        n_clusters=int(rows[CLUSTER_COLUMN].nunique()), n_models=len(models),
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------------
# 5. Judge scores
# ---------------------------------------------------------------------------------------------


def _score_rows(
    frame: pd.DataFrame, score_column: str, dimension: str, extra: Sequence[str] = ()
) -> tuple[pd.DataFrame, int]:
    """Usable rows with a score: columns ``score`` (float), ``group`` (+ ``extra``); and how
    many usable rows had no score (NaN, NA: abstentions, refused requests)."""
    _check_single_model(frame)
    _check_dimension(dimension)
    check_columns(frame, ["status", dimension, score_column, *extra])
    usable = _usable(frame)
    group = _group_series(usable, dimension)
    score = pd.to_numeric(usable[score_column], errors="coerce").astype("Float64")
    has_group = group.notna().to_numpy()
    has_score = score.notna().to_numpy()
    keep = has_group & has_score
    rows = pd.DataFrame(
        {
            "score": score[keep].to_numpy(dtype=float),
            "group": group[keep].cat.remove_unused_categories().array,
        }
    )
    for column in extra:
        rows[column] = usable[column][keep].to_numpy()
    return rows, int((has_group & ~has_score).sum())


def kruskal_dunn(
    frame: pd.DataFrame,
    score_column: str,
    dimension: str,
    *,
    unit: str = "request",
) -> KruskalDunnResult:
    """Kruskal-Wallis test of a judge score across groups, with Dunn's post hoc test.

    Omnibus: ``scipy.stats.kruskal`` (Kruskal & Wallis 1952; tie-corrected H, df = groups − 1).
    Pairwise: ``scikit_posthocs.posthoc_dunn(p_adjust="holm")`` (Dunn 1964, "Multiple
    comparisons using rank sums", Technometrics 6:241-252, with the tie correction), Holm
    adjusted over the pairs. Usable requests whose score is missing (NaN / NA: abstention,
    refusal) are dropped and counted in ``n_missing``.

    ``unit="request"`` ranks every request's score, which treats the requests as independent;
    because a source's requests share its group and its image, that overstates the evidence
    when scores cluster by source. ``unit="source"`` first averages each source's scores
    (needs ``source_id``) and compares the source means: a valid test with the source as the
    independent unit, and the conservative choice for race, gender and age.
    """
    if unit not in ("request", "source"):
        raise ValueError("unit must be 'request' or 'source'")
    extra = [CLUSTER_COLUMN] if unit == "source" else []
    rows, missing = _score_rows(frame, score_column, dimension, extra)
    if unit == "source":
        rows = rows.groupby([CLUSTER_COLUMN, "group"], observed=True, as_index=False)[
            "score"
        ].mean()
    method = f"kruskal-wallis + dunn (holm), unit={unit}"
    samples = [s["score"].to_numpy() for _, s in rows.groupby("group", observed=True)]
    groups = len(samples)

    def failed(reason: str) -> KruskalDunnResult:
        return KruskalDunnResult(
            method, math.nan, math.nan, math.nan, len(rows), reason=reason,
            n_missing=missing, n_groups=groups, unit=unit,
        )

    if groups < 2:
        return failed("fewer than two groups with scores")
    if rows["score"].nunique() < 2:
        return failed("every score is the same: no ranks to compare")
    result = stats.kruskal(*samples)
    posthoc = scikit_posthocs.posthoc_dunn(
        rows.assign(group=rows["group"].astype(str)),
        val_col="score",
        group_col="group",
        p_adjust="holm",
    )
    order = [str(g) for g in rows["group"].cat.categories]
    posthoc = posthoc.reindex(index=order, columns=order)
    return KruskalDunnResult(
        method, float(result.statistic), float(groups - 1), float(result.pvalue), len(rows),
        n_missing=missing, n_groups=groups, unit=unit, posthoc=posthoc,
    )


def ordinal_model(
    frame: pd.DataFrame,
    score_column: str,
    dimension: str,
    *,
    reference: str | None = None,
    cluster: str | None = CLUSTER_COLUMN,
    confidence: float = 0.95,
) -> OrdinalResult:
    """Proportional-odds (cumulative logit) model of a judge score on group dummies.

    Model: logit P(score ≤ j) = θ_j − x'β with x the treatment-coded group indicators
    (``reference`` group, default the first present in vocabulary order), fitted by maximum
    likelihood (McCullagh 1980, "Regression models for ordinal data", JRSS-B 42:109-142;
    ``statsmodels.miscmodels.ordinal_model.OrderedModel(distr="logit")``). exp(β) is the odds
    ratio of a higher score against the reference group. Only the score levels observed are
    modelled (an unused level has no estimable threshold).

    Test that all β = 0: with ``cluster`` (default ``source_id``, when the frame has it), a
    Wald χ² with the cluster-robust covariance (clusters = source images), because scores of
    one source are correlated and a likelihood-ratio test would treat them as independent;
    with ``cluster=None``, the likelihood-ratio test against the thresholds-only model
    (df = groups − 1). Missing scores are dropped and counted (``n_missing``). NaN
    ``p_value`` with ``reason``: fewer than two groups or score levels, a fit that does not
    converge, or diverging coefficients (a group whose scores all lie at one end).
    """
    vocabulary = _check_dimension(dimension)
    if reference is not None and reference not in vocabulary:
        raise ValueError(f"reference '{reference}' is not a {dimension} value")
    use_cluster = cluster is not None and cluster in frame.columns
    extra = [cluster] if use_cluster and cluster is not None else []
    rows, missing = _score_rows(frame, score_column, dimension, extra)
    present = list(rows["group"].cat.categories)
    base = reference if reference in present else (present[0] if present else None)
    method = "proportional odds (logit), " + (
        f"Wald, cluster-robust ({cluster})" if use_cluster else "likelihood ratio"
    )

    def failed(reason: str) -> OrdinalResult:
        return OrdinalResult(
            method, math.nan, math.nan, math.nan, len(rows), reason=reason,
            n_missing=missing, reference=base, odds_ratios=_nan_odds_ratios(),
        )

    if len(present) < 2:
        return failed("fewer than two groups with scores")
    levels = np.sort(rows["score"].unique())
    if len(levels) < 2:
        return failed("fewer than two score levels observed")
    ordered = [base, *[g for g in present if g != base]]
    matrix, names = _dummies(pd.Categorical(rows["group"].astype(str), categories=ordered), "g")
    names = [n.split("[T.", 1)[1].rstrip("]") for n in names]
    exog = pd.DataFrame(matrix, columns=names)
    endog = pd.Series(pd.Categorical(rows["score"], categories=levels, ordered=True))
    model = OrderedModel(endog, exog, distr="logit")
    fit_kwargs: dict[str, object] = {"method": "bfgs", "disp": False, "maxiter": 500}
    if use_cluster:
        fit_kwargs["cov_type"] = "cluster"
        fit_kwargs["cov_kwds"] = {"groups": pd.factorize(rows[cluster])[0]}
    with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
        warnings.simplefilter("always")
        results = model.fit(**fit_kwargs)
        null = None
        if not use_cluster:
            null = OrderedModel(endog, None, distr="logit").fit(method="bfgs", disp=False)
    problems = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    converged = results.mle_retvals.get("converged", True) and (
        null is None or null.mle_retvals.get("converged", True)
    )
    if problems or not converged:
        return failed(f"ordinal model did not converge{': ' + problems[0] if problems else ''}")
    params = pd.Series(np.asarray(results.params), index=list(results.model.exog_names))
    cov = pd.DataFrame(np.asarray(results.cov_params()), index=params.index, columns=params.index)
    if not np.all(np.isfinite(params)) or np.abs(params[names]).max() > MAX_ABS_LOG_ODDS:
        return failed("a coefficient diverges (|log odds ratio| > 15): separation")
    if use_cluster:
        constraints = np.eye(len(params))[: len(names)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            test = results.wald_test(constraints, scalar=True)
        statistic, p_value = float(test.statistic), float(test.pvalue)
    else:
        assert null is not None
        statistic = max(2.0 * float(results.llf - null.llf), 0.0)
        p_value = float(stats.chi2.sf(statistic, len(names)))
    odds = _odds_ratio_table(
        params.rename(lambda n: f"g[T.{n}]"),
        cov.rename(index=lambda n: f"g[T.{n}]", columns=lambda n: f"g[T.{n}]"),
        [f"g[T.{n}]" for n in names],
        confidence,
    )
    return OrdinalResult(
        method, statistic, float(len(names)), p_value, len(rows),
        n_missing=missing, reference=base, odds_ratios=odds,
    )


# ---------------------------------------------------------------------------------------------
# 6. Equivalence: "no bias" claims
# ---------------------------------------------------------------------------------------------


def design_effect(
    frame: pd.DataFrame, outcome: str, dimension: str | None = None
) -> DesignEffect:
    """Design effect of clustering requests within source images, from the ANOVA ICC.

    One-way ANOVA estimator of the intraclass correlation of the (0/1) outcome within sources
    (Fleiss 1981; for binary data Ridout, Demétrio & Firth 1999, "Estimating intraclass
    correlation for binary data", Biometrics 55:137-148, where it performs well):
    ICC = (MSB − MSW) / (MSB + (m₀ − 1)·MSW) with m₀ = (N − Σ nᵢ²/N)/(k − 1) for k sources
    of sizes nᵢ. With ``dimension`` given, sources are nested in its groups and MSB is taken
    around the group means (df k − G, m₀ = (N − Σ_g Σ_{i∈g} nᵢ²/N_g)/(k − G)), so a real group
    difference is not mistaken for clustering. deff = 1 + (m − 1)·ICC with m the mean number
    of requests per source (Kish 1965), floored at 1 (a negative ICC estimate gives 1).
    A constant outcome gives ICC 0, deff 1. Prompt-level clustering (prompts are crossed
    with sources) is not included.
    """
    _check_single_model(frame)
    check_columns(frame, ["status", CLUSTER_COLUMN, outcome])
    usable = _usable(frame)
    observed = usable[outcome].astype("boolean")
    keep = observed.notna().to_numpy()
    rows = pd.DataFrame(
        {"y": observed[keep].to_numpy(dtype=float), "source": usable[CLUSTER_COLUMN][keep]}
    )
    if dimension is not None:
        rows["group"] = _group_series(usable, dimension)[keep].astype(object).to_numpy()
        rows = rows.loc[rows["group"].notna()]
    else:
        rows["group"] = "all"
    n = len(rows)
    per_source = rows.groupby(["group", "source"])["y"].agg(["size", "mean"]).reset_index()
    k = len(per_source)
    groups = per_source["group"].nunique()
    if n == 0 or k - groups < 1 or n - k < 1:
        mean_size = n / k if k else math.nan
        return DesignEffect(1.0, math.nan, mean_size, n, k)
    sizes = per_source["size"].to_numpy(dtype=float)
    group_n = per_source.groupby("group")["size"].transform("sum").to_numpy(dtype=float)
    group_mean = rows.groupby("group")["y"].mean()
    centre = per_source["group"].map(group_mean).to_numpy(dtype=float)
    means = per_source["mean"].to_numpy(dtype=float)
    ss_between = float(np.sum(sizes * (means - centre) ** 2))
    source_mean = rows.groupby(["group", "source"])["y"].transform("mean").to_numpy()
    ss_within = float(np.sum((rows["y"].to_numpy() - source_mean) ** 2))
    ms_between = ss_between / (k - groups)
    ms_within = ss_within / (n - k)
    m0 = (n - float(np.sum(sizes**2 / group_n))) / (k - groups)
    denominator = ms_between + (m0 - 1.0) * ms_within
    icc = (ms_between - ms_within) / denominator if denominator > 0 else 0.0
    mean_size = n / k
    return DesignEffect(max(1.0, 1.0 + (mean_size - 1.0) * icc), float(icc), mean_size, n, k)


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

    Clustering: requests of one source are correlated, which inflates the variance of each
    rate by the design effect. ``deff`` (≥ 1) is applied by dividing each group's count and
    n by it (effective sample size, Kish 1965) before the test; ``deff=None`` estimates it by
    :func:`design_effect` (sources nested in ``dimension``). The default 1 assumes
    independence, which is anti-conservative here: for equivalence claims pass the
    estimated design effect.

    Filter ``frame`` to the requests the claim is about (e.g. neutral prompts) before calling.
    With fewer than two groups p is NaN (``reason``).
    """
    _check_single_model(frame)
    if margin <= 0:
        raise ValueError("margin must be positive")
    rows = _outcome_rows(frame, outcome, dimension)
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


# ---------------------------------------------------------------------------------------------
# 7. Sensitivity of the design
# ---------------------------------------------------------------------------------------------


def minimum_detectable_gap(
    n_sources_per_group: float,
    requests_per_source: float,
    base_rate: float,
    alpha: float = 0.05,
    power: float = 0.8,
    n_groups: int = 2,
    deff: float | None = None,
    icc: float | None = None,
) -> float:
    """Smallest rate gap above ``base_rate`` between two groups detectable with ``power``.

    Two-sided test of two independent proportions at the Bonferroni level
    α / (g(g − 1)/2) (all pairs of ``n_groups`` groups), on Cohen's effect size
    h = 2·asin(√p₂) − 2·asin(√p₁) (Cohen 1988, §6.2), the arcsine test whose power is
    normal and depends on h only: ``statsmodels.stats.power.NormalIndPower().solve_power``
    with equal groups of effective size n = n_sources · requests_per_source / deff. The
    design effect is ``deff``, or 1 + (requests_per_source − 1)·``icc`` from the within-source
    intraclass correlation (give at most one; neither means independent requests, deff 1).
    The h found is converted back with p₂ = sin²(asin(√p₁) + h/2) and the gap p₂ − p₁ is
    returned, in rate units (a proportion: 0.05 = 5 pp). Returns ``inf`` when no p₂ ≤ 1 is
    far enough from ``base_rate``.
    """
    if deff is not None and icc is not None:
        raise ValueError("give deff or icc, not both")
    if icc is not None:
        if not -1.0 < icc <= 1.0:
            raise ValueError("icc must lie in (-1, 1]")
        deff = 1.0 + (requests_per_source - 1.0) * icc
    deff = 1.0 if deff is None else float(deff)
    if deff < 1.0:
        raise ValueError("deff must be at least 1")
    if not 0.0 <= base_rate < 1.0:
        raise ValueError("base_rate must lie in [0, 1)")
    if n_groups < 2:
        raise ValueError("n_groups must be at least 2")
    if n_sources_per_group <= 0 or requests_per_source <= 0:
        raise ValueError("sample sizes must be positive")
    level = alpha / (n_groups * (n_groups - 1) / 2.0)
    n_effective = n_sources_per_group * requests_per_source / deff
    h = float(
        NormalIndPower().solve_power(
            effect_size=None, nobs1=n_effective, alpha=level, power=power, ratio=1.0,
            alternative="two-sided",
        )
    )
    angle = math.asin(math.sqrt(base_rate)) + abs(h) / 2.0
    if angle > math.pi / 2.0:
        return math.inf
    return math.sin(angle) ** 2 - base_rate
